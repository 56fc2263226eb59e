"""Collapsing contiguous loop axes of a fused elementwise CPU kernel.

A fused kernel over [64,16,8,8] writes four loops, the innermost of 8 trips:
LLVM vectorizes and pipelines a long inner loop, a short one pays loop
overhead and remainder code on every row (the CNN's silu and silu VJP over
[64,16,8,8] at 1 thread: 147 and 187 µs as four loops, 77 and 81 µs as two). Adjacent domain axes (a, a+1) merge into one when every
array the kernel indexes (inputs, outputs, epilogue sums) indexes both of them
as adjacent dims whose merge is a free reshape (stride[d] == stride[d+1] *
shape[d+1]: a dense buffer, or a strided view the plan passes where its
strides allow), or indexes neither (a broadcast size-1 or absent pair); an
epilogue sum must keep both or reduce both. The parallel axis (the first
loop of more than one cell of a large kernel) never merges with the next, so
its prange and the fixed REDUCTION_CHUNKS split of epilogue sums stay as
they are: sums add in the same order, element indexes (Lowering.cell_index)
stay row-major over the same cells.

The kernel is then rendered over the collapsed domain through ``Collapsed``
(the group's values with collapsed types), and ``wrap`` reshapes its
arguments: inside the njit kernel where every reshaped array is C-contiguous
(parameters, kernel outputs: numba's reshape is then a free view), else in a
plain Python ``kernel(...)`` that reshapes them with numpy (views, never
copies) and calls the njit ``body``; that costs a few µs per call, so only
kernels of COLLAPSE_CELLS cells or more take it.
"""
from __future__ import annotations

from dataclasses import dataclass

from bendc.codegen.fused import epilogues
from bendc.codegen.plan import Step
from bendc.codegen.views import view_access
from bendc.ir.graph import Graph, Node
from bendc.kernels.access import Access, contiguous_strides, dense
from bendc.kernels import cpu_policy as policy
from bendc.ops import OPS
from bendc.ops.base import reduced_axes

__all__ = ["COLLAPSE_CELLS", "Collapse", "Collapsed", "collapse_domain", "wrap"]

# A kernel with a strided view among its reshaped arguments is collapsed through a Python wrapper
# only from this many cells: its numpy reshapes (~0.7 µs per array) would eat what a longer inner
# loop gives back (x * sigmoid(x) * y + y at 1 thread, one loop per axis vs wrapped: [4,8,8] 2.3 vs
# 3.2 µs, [16,8,8] 3.7 vs 3.6, [4,16,8,8] 9.0 vs 5.5, [64,16,8,8] 282 vs 99). Reshaped in the njit
# kernel (C-contiguous arguments) it costs nothing: [4,8,8] 2.4 vs 2.2, [8,4,4] 2.7 vs 2.1, [16,8,8]
# 3.7 vs 2.6, [4,16,8,8] 9.0 vs 4.4, [64,16,8,8] 160 vs 75; those kernels collapse at every size.
COLLAPSE_CELLS = 4096


@dataclass
class Collapse:
    """Which domain axes form each collapsed axis, the collapsed domain, the group seen with
    collapsed shapes, and each reshaped array's dims grouped (argument -> groups of its dims)."""

    groups: list[list[int]]
    domain: tuple[int, ...]
    graph: "Collapsed"
    reshapes: dict[int, list[list[int]]]  # value -> groups of its dims (values of rank > 0 only)
    contiguous: bool  # every reshaped array is C-contiguous: numba reshapes them inside the kernel


class Collapsed:
    """The graph as a collapsed kernel renders it: the group's values with collapsed types (and
    epilogue sums with collapsed attributes); other nodes as they are."""

    def __init__(self, graph: Graph, nodes: dict[int, Node]) -> None:
        self._graph, self._nodes = graph, nodes

    def node(self, id: int) -> Node:
        return self._nodes.get(id) or self._graph.node(id)


def value_strides(graph: Graph, value: int) -> tuple[int, ...] | None:
    """The strides (elements) of the array a CPU kernel gets for ``value``: parameters (the
    runtime makes them C-contiguous), kernel outputs and constants are dense; a layout op's
    result is numpy's view of its operand. None where that is not known (a reshape that no
    strides describe: numpy copies it, or returns a view our model does not follow)."""
    chain = []
    node = graph.node(value)
    while node.inputs and OPS[node.op].lowering.kind == "layout":
        chain.append(node.id)
        node = graph.node(node.inputs[0])
    access: Access = dense(node.id, node.type.shape)
    for id in reversed(chain):
        if graph.node(id).op not in ("permute", "expand", "index", "reshape"):
            return None  # a layout op views.py does not model
        view = view_access(graph, id, access)
        if view is None:
            return None
        access = view
    return access.strides


def collapse_domain(step: Step, graph: Graph, domain: tuple[int, ...]) -> Collapse | None:
    """The collapse of a fused elementwise step's domain, or None where it keeps its loops."""
    n = len(domain)
    if n < 2:
        return None
    members = [graph.node(i) for i in step.nodes]
    if any(m.op == "reshape" and graph.node(m.inputs[0]).type.numel != 1 for m in members):
        return None  # a size-1 reshape reads its operand by the domain's non-1 axes: left as is
    sums = set(epilogues(graph, step.nodes))
    local = set(step.nodes)
    # Every indexed array: (value, {domain axis: its dim}), the dims right-aligned (broadcast),
    # or at the kept axes of an epilogue sum.
    arrays: dict[int, dict[int, int]] = {}
    status: list[set[int]] = []  # per sum: its reduced axes
    for m in members:
        if m.id in sums:
            axes = set(reduced_axes(graph, m))
            status.append(axes)
            kept = [a for a in range(n) if a not in axes]
            if m.type.ndim == len(kept):
                arrays[m.id] = {a: d for d, a in enumerate(kept)}
            else:
                lead = n - m.type.ndim
                arrays[m.id] = {lead + d: d for d in range(m.type.ndim)}
            continue
        for value in [m.id] + [v for v in m.inputs if v not in local]:
            source = graph.node(value)
            if source.op == "const" or source.type.numel == 1:
                continue
            lead = n - source.type.ndim
            arrays[value] = {lead + d: d for d in range(source.type.ndim)}
    strides = {v: value_strides(graph, v) for v in step.inputs if v in arrays}  # outputs are dense
    parallel = next((a for a, d in enumerate(domain) if d > 1), None) if policy.parallel("elementwise", step.cells) else None

    # A strided array's dims of more than one element in a collapsed axis must chain densely
    # (size-1 dims between them aside: numpy's free reshape), so each array remembers the last
    # such dim of the axis being built.
    last: dict[int, int | None] = {}
    # Per array, whether the collapsed axis being built reads it along its axes of more than one
    # cell ("indexed") or broadcasts it there: one array may not do both within one collapsed axis
    # (an operand (1,1,4) expanded over a (2,1,4) domain: axes 0 and 2 joined through the size-1
    # axis 1 would read it at 8 cells; found by the long fuzz run).
    mode: dict[int, str | None] = {}

    def kind(value: int, a: int) -> str | None:
        if domain[a] == 1:
            return None
        d = arrays[value].get(a)
        return "indexed" if d is not None and graph.node(value).type.shape[d] == domain[a] else "broadcast"

    def start(a: int) -> None:
        for value, dims in arrays.items():
            d = dims.get(a)
            last[value] = d if d is not None and graph.node(value).type.shape[d] != 1 else None
            mode[value] = kind(value, a)

    def mergeable(a: int) -> bool:
        """Whether axis a + 1 joins the collapsed axis that ends with axis a."""
        if a == parallel or any((a in s) != (a + 1 in s) for s in status):
            return False
        for value in arrays:
            joined = kind(value, a + 1)
            if joined is not None and mode[value] is not None and joined != mode[value]:
                return False
        for value, dims in arrays.items():
            shape = graph.node(value).type.shape
            da, db = dims.get(a), dims.get(a + 1)
            sa = 1 if da is None else shape[da]
            sb = 1 if db is None else shape[db]
            if da is not None and db is not None:
                if (sa, sb) != (domain[a], domain[a + 1]) and 1 not in (domain[a], domain[a + 1]) \
                        and (sa, sb) != (1, 1):
                    return False
                if sb != 1 and last[value] is not None and value in strides:
                    st = strides[value]
                    if st is None or st[last[value]] != st[db] * sb:
                        return False
            elif db is not None:  # the pair straddles a broadcast array's leading axes
                if sb != 1 and domain[a] != 1:
                    return False
            elif da is not None:
                return False
        return True

    groups = [[0]]
    start(0)
    for a in range(n - 1):
        if mergeable(a):
            groups[-1].append(a + 1)
            for value, dims in arrays.items():
                mode[value] = mode[value] or kind(value, a + 1)
                d = dims.get(a + 1)
                if d is not None and graph.node(value).type.shape[d] != 1:
                    last[value] = d
        else:
            groups.append([a + 1])
            start(a + 1)
    if len(groups) == n:
        return None
    new_domain = tuple(_product(domain[a] for a in g) for g in groups)
    reshapes: dict[int, list[list[int]]] = {}
    nodes: dict[int, Node] = {}
    for value, dims in arrays.items():
        node = graph.node(value)
        grouped = [[dims[a] for a in g if a in dims] for g in groups]
        grouped = [g for g in grouped if g]
        shape = tuple(_product(node.type.shape[d] for d in g) for g in grouped)
        if value in step.inputs or value in step.outputs:
            reshapes[value] = grouped
        nodes[value] = node.replace(type=node.type.with_shape(shape))
    for m in members:  # an epilogue sum's attributes over the collapsed axes
        if m.id not in sums:
            continue
        axes = set(reduced_axes(graph, m))
        reduced = tuple(k for k, g in enumerate(groups) if g[0] in axes)
        if m.op == "sum":
            attr = {**m.attr, "dims": reduced}
        elif m.op == "sum_to_size":
            attr = {**m.attr, "shape": nodes[m.id].type.shape}
        else:
            return None
        nodes[m.id] = nodes[m.id].replace(attrs=attr)
    collapsed = Collapsed(graph, nodes)
    for m in members:  # the collapsed sums reduce exactly the collapsed axes of the reduced ones
        if m.id in sums:
            expected = {k for k, g in enumerate(groups) if g[0] in set(reduced_axes(graph, m))}
            if set(reduced_axes(collapsed, collapsed.node(m.id))) != expected:
                return None
    reshaped = [v for v, grouped in reshapes.items() if any(len(g) > 1 for g in grouped)]
    contiguous = all(v not in strides or _c_contiguous(graph.node(v).type.shape, strides[v]) for v in reshaped)
    if not contiguous and step.cells < COLLAPSE_CELLS:
        return None
    return Collapse(groups, new_domain, collapsed, reshapes, contiguous)


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """numpy's C_CONTIGUOUS flag (size-1 dims may have any stride), so numba types it layout 'C'."""
    return strides is not None and all(s == e for s, e, d in zip(strides, contiguous_strides(shape), shape) if d != 1)


def _product(sizes) -> int:
    total = 1
    for size in sizes:
        total *= size
    return total


def wrap(source: str, step: Step, collapse: Collapse) -> str:
    """The kernel source over the collapsed domain called on the kernel's own arguments."""
    if collapse.contiguous:
        return _reshaped_in_kernel(source, step, collapse)
    return _python_wrapper(source, step, collapse)


def _merged_shapes(step: Step, collapse: Collapse, suffix: str) -> list[tuple[str, str | None]]:
    """(argument, its collapsed shape as an expression over ``argument + suffix``'s shape, or None
    where the argument keeps its shape) for every argument of the kernel."""
    names = [f"in{k}" for k in range(len(step.inputs))] + [f"out{k}" for k in range(len(step.outputs))]
    shapes = []
    for name, value in zip(names, list(step.inputs) + list(step.outputs)):
        grouped = collapse.reshapes.get(value)
        if grouped is None or all(len(g) == 1 for g in grouped):
            shapes.append((name, None))
            continue
        dims = [" * ".join(f"{name}{suffix}.shape[{d}]" for d in g) for g in grouped]
        shapes.append((name, f"({', '.join(dims)},)"))
    return shapes


def _reshaped_in_kernel(source: str, step: Step, collapse: Collapse) -> str:
    """Every reshaped argument is C-contiguous (parameters, kernel outputs): the njit kernel
    reshapes it first (numba's reshape of a 'C' array is a view; it refuses other layouts)."""
    shapes = _merged_shapes(step, collapse, "_full")
    header = f"def kernel({', '.join(name for name, _ in shapes)}):"
    renamed = f"def kernel({', '.join(name + '_full' * (shape is not None) for name, shape in shapes)}):"
    reshapes = ["    # the collapsed domain: adjacent axes merged (a free reshape of C-contiguous arrays)"]
    reshapes += [f"    {name} = {name}_full.reshape({shape})" for name, shape in shapes if shape is not None]
    assert header in source, "the collapsed kernel's njit function was not found"
    return source.replace(header, "\n".join([renamed] + reshapes), 1)


def _python_wrapper(source: str, step: Step, collapse: Collapse) -> str:
    """A strided view among the arguments: the njit function is renamed ``body`` and a Python
    ``kernel`` calls it on the arguments reshaped by numpy (views: setting ``shape`` raises where
    the reshape would copy), at a few µs per call."""
    shapes = _merged_shapes(step, collapse, "")
    header = f"def kernel({', '.join(name for name, _ in shapes)}):"
    lines = [header, "    # the collapsed domain: adjacent axes merged where a reshape is free (no copies)"]
    for name, shape in shapes:
        if shape is not None:
            lines += [f"    {name}_c = {name}.view()", f"    {name}_c.shape = {shape}"]
    lines.append(f"    body({', '.join(name + '_c' * (shape is not None) for name, shape in shapes)})")
    assert header in source, "the collapsed kernel's njit function was not found"
    return source.replace(header, header.replace("def kernel(", "def body(", 1), 1) + "\n\n" + "\n".join(lines) + "\n"
