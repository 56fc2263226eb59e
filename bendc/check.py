"""Self-check mode: ``bendc.jit(..., check="reference")`` or ``BENDC_CHECK=1``.

The first call of each signature runs the compiled program step by step beside
the reference interpreter (the executable spec) on the same inputs, and
compares every value each kernel writes with the interpreter's value of that
IR node, before the next kernel may reuse its buffer. The first kernel (plan
step, in launch order) whose outputs leave the tolerance raises a
:class:`KernelMismatchError` naming it, its op, its IR nodes, the user's
source lines and the worst element. Later calls run the fast path.

Tolerance: ``|kernel - reference| <= ATOL + RTOL * |reference|`` for float
values (NaN where both are NaN, and infinities of the same sign, agree),
exact equality for integers and booleans. Kernels may sum in another order
than numpy and call BLAS, hence not bit for bit.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bendc.errors import InternalError, SourceLoc
from bendc.ir.graph import Graph
from bendc.ir.interp import Interpreter
from bendc.ir.printer import format_context
from bendc.reporting import node_name

RTOL = 1e-3
ATOL = 1e-5
MODES = ("reference",)


class KernelMismatchError(InternalError):
    """A compiled kernel's output differs from the reference interpreter's beyond the tolerance."""

    def __init__(self, message: str, *, step: str, node: int, index: tuple[int, ...], got: Any, want: Any,
                 loc: SourceLoc | None, op: str, context: str) -> None:
        self.step, self.node, self.index, self.got, self.want = step, node, index, got, want
        self.nodes: list[int] = []  # the kernel's IR nodes
        self.graph: Graph | None = None
        self.reference: dict[int, np.ndarray] = {}  # every node's reference value at the failing call
        super().__init__(message, loc=loc, op=op, context=context)


def reference_values(graph: Graph, inputs: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
    """Every node's value under the reference interpreter (none dropped)."""
    interpreter = Interpreter(graph)
    values = interpreter.initial([np.asarray(a) for a in inputs])
    for node, reference in interpreter.steps:
        values[node.id] = np.asarray(reference([values[i] for i in node.inputs], node.attr),
                                     dtype=node.type.np_dtype)
    return values


def worst_element(got: np.ndarray, want: np.ndarray) -> tuple[tuple[int, ...], float] | None:
    """(index, excess over the tolerance) of the worst element outside it, None when all agree."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return (), float("inf")
    if got.size == 0:
        return None
    if not np.issubdtype(want.dtype, np.floating):
        bad = got != want
        if not bad.any():
            return None
        return tuple(int(i) for i in np.argwhere(bad)[0]), float("inf")
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (np.isnan(g) & np.isnan(w)) | (np.isinf(g) & (g == w))
        excess = np.abs(g - w) - (ATOL + RTOL * np.abs(w))
    excess = np.where(same, -1.0, np.where(np.isnan(excess), np.inf, excess))
    flat = int(np.argmax(excess))
    if excess.reshape(-1)[flat] <= 0:
        return None
    return tuple(int(i) for i in np.unravel_index(flat, excess.shape)), float(excess.reshape(-1)[flat])


def checked_run(run: Any, graph: Graph, inputs: Sequence[np.ndarray]) -> list:
    """One call through the self-check: the outputs of ``run`` (an Executable's), or a
    KernelMismatchError for the first kernel leaving the tolerance. Targets without a steppable
    program (reference, cuda) run as they are."""
    program, plan = getattr(run, "program", None), getattr(run, "plan", None)
    if program is None or not hasattr(program, "run_steps"):
        return run(inputs)
    # Copies for the stepped run and the interpreter: a donated input is overwritten by a kernel.
    from bendc.ops.gather import IndexRangeError

    try:
        want = reference_values(graph, [np.array(a) for a in inputs])
    except IndexRangeError:
        return run(inputs)  # an index out of range: the call raises it at the user's line
    from runtime.cpu import KernelError, KernelFailure

    steps = {step["name"]: step for step in plan["steps"]}
    try:
        for name, written in program.run_steps([np.array(a) for a in inputs]):
            for value, got in written.items():
                if value not in want:
                    continue
                found = worst_element(got, want[value])
                if found is not None:
                    error = mismatch(graph, steps[name], value, found[0], got, want[value])
                    error.graph, error.reference = graph, want  # for bendc/minify.py's repro
                    raise error
    except (KernelError, KernelFailure):
        pass  # the real call below raises it as a call does (at the user's line, or as an InternalError)
    return run(inputs)  # the real call (outputs as the fast path returns them)


def mismatch(graph: Graph, step: dict, value: int, index: tuple[int, ...], got: np.ndarray,
             want: np.ndarray) -> KernelMismatchError:
    path, _, line = step.get("loc", "").rpartition(":")
    loc = SourceLoc(path, int(line)) if path and line.isdigit() else None
    got_value = np.asarray(got)[index] if np.asarray(got).shape == np.asarray(want).shape else got
    want_value = np.asarray(want)[index] if np.asarray(got).shape == np.asarray(want).shape else want
    got_value, want_value = (v.item() if isinstance(v, np.generic) else v for v in (got_value, want_value))
    nodes = ", ".join(node_name(graph, n) for n in step["nodes"][:8]) + (" ..." if len(step["nodes"]) > 8 else "")
    message = (f"self-check: kernel {step['name']} ({step['kind']}, module {step.get('module', '?')}) leaves the "
               f"tolerance (rtol {RTOL:g}, atol {ATOL:g}) on {node_name(graph, value)}: worst element "
               f"{list(index)}: kernel {got_value!r}, reference {want_value!r}; nodes {nodes}; "
               f"lines {', '.join(step.get('lines', [])) or '?'}")
    error = KernelMismatchError(message, step=step["name"], node=value, index=index, got=got_value, want=want_value,
                                loc=loc, op=step["op"], context=format_context(graph, step["nodes"]))
    error.nodes = list(step["nodes"])
    return error
