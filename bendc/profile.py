"""The profiler: where a compiled step's time goes, per kernel (``step.profile`` and ``bendc profile``).

Each run calls the program's steps one at a time (runtime/cpu.py:
CpuProgram.time_steps), timing each launch with ``time.perf_counter_ns``
(cuda: CUDA events around each step's launches, runtime/cuda.py);
output arrays are allocated outside the timed spans and reused between runs
as the fast path recycles them, and a native kernel is called as the launch
list calls it (its entry, not the function object). The ``(launch overhead)``
row is the launch list's own Python: on the cpu, the launch list itself run
with every kernel a no-op (CpuProgram.time_launch_list; the stepping loop is
the profiler's and is not counted); on cuda, the stepped call's wall time
less its kernels'. The step's time is the kernels' plus that row, so the
shares sum to 1. Rows are sorted by total time, like torch.profiler's
``key_averages()`` table.

Kernel names say what a kernel is: the ops it holds (a fused kernel:
``fused_`` and its first distinct ops), ``_bwd`` when every node is part of a
VJP, and the user's first source line: ``fused_sub_mul_add@transformer.py:73``,
``matmul@mlp.py:34``, ``gelu_vjp_bwd@model.py:42``.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from bendc.errors import UnsupportedError
from bendc.ir.graph import Graph
from runtime.files import atomic_write

OVERHEAD = "(launch overhead)"
NAMED_OPS = 3


def kernel_name(graph: Graph, step: dict) -> str:
    """``fused_gelu_mul_bwd@model.py:42`` style: ops, backward or not, the first user line."""
    nodes = [graph.node(n) for n in step["nodes"] if n in graph]
    ops: list[str] = []
    for node in nodes:
        if node.op not in ops:
            ops.append(node.op)
    body = "_".join(ops[:NAMED_OPS]) + ("_etc" if len(ops) > NAMED_OPS else "") or step["op"] or step["kind"]
    if len(nodes) > 1:
        body = "fused_" + body
    if nodes and all(node.vjp_of is not None for node in nodes):
        body += "_bwd"
    line = step["lines"][0] if step.get("lines") else ""
    return body + (f"@{line}" if line else "")


def _flops(plan: dict, step: dict) -> int:
    """2*M*N*K for a matrix product (batched: times the batch), else 0 (elementwise work is bytes)."""
    if step["kind"] != "matmul" or step.get("op") not in (None, "matmul") or len(step["inputs"]) < 2 or not step["outputs"]:
        return 0
    left = plan["values"][str(step["inputs"][0])][1]
    out = plan["values"][str(step["outputs"][0])][1]
    if not left:
        return 0
    return 2 * int(np.prod(out, dtype=np.int64)) * int(left[-1])


def _bytes(plan: dict, step: dict) -> int:
    if step["convention"] != "write":
        return 0
    from runtime.dtypes import DTYPES

    total = 0
    for value in step["inputs"] + step["outputs"]:
        dtype, shape = plan["values"][str(value)]
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
    return total


@dataclass
class Profile:
    """The per-kernel table; ``rows`` are dicts (kernel, step, kind, nodes, source_lines, calls,
    total_ms, mean_ms, bytes, gb_per_s, gflop_per_s, share), sorted by total time."""

    function: str
    runs: int
    step_ms: float  # one call: its kernels' time and the launch list's own
    rows: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)  # Chrome trace events

    def __str__(self) -> str:
        header = (f"{'kernel':<44} {'step':>7} {'calls':>6} {'total ms':>9} {'mean ms':>8} {'share':>6} "
                  f"{'GB/s':>7} {'GFLOP/s':>8}  source lines")
        lines = [f"bendc profile of {self.function}: {self.runs} runs, {self.step_ms:.3f} ms per step", header,
                 "-" * len(header)]
        for row in self.rows:
            rate = lambda value: f"{value:.2f}" if value else "-"  # noqa: E731
            lines.append(f"{row['kernel'][:44]:<44} {row['step']:>7} {row['calls']:>6} {row['total_ms']:>9.3f} "
                         f"{row['mean_ms']:>8.4f} {row['share']:>6.1%} {rate(row['gb_per_s']):>7} "
                         f"{rate(row['gflop_per_s']):>8}  {', '.join(row['source_lines'])}")
        return "\n".join(lines)

    def chrome(self, path: str) -> None:
        """Write a Chrome / Perfetto trace (chrome://tracing, ui.perfetto.dev) of the runs."""
        atomic_write(path, json.dumps({"traceEvents": self.events, "displayTimeUnit": "ms"}))


def profile_executable(function: str, executable: Any, inputs: Sequence[np.ndarray], runs: int = 10) -> Profile:
    """Profile ``runs`` calls of a compiled cpu executable on ``inputs`` (after one warm-up call)."""
    program, plan = getattr(executable.run, "program", None), getattr(executable.run, "plan", None)
    from runtime.artifact import LiftedConstants
    from runtime.cuda_graph import CubinProgram

    bound = program.bound if isinstance(program, LiftedConstants) else program  # the constants' wrapper
    if isinstance(bound, CubinProgram):  # bendc.jit(target="cuda") on cubins
        raise UnsupportedError("the cubin runtime times no single steps (one CUDA graph per call): profile "
                               "with BENDC_CUDA_RUNTIME=numba (numba's launches, timed by CUDA events)", op="profile")
    if program is None or not hasattr(program, "time_steps"):
        raise UnsupportedError("the profiler times compiled programs (target 'cpu' or 'cuda'), not the "
                               "reference interpreter", op="profile")
    if runs < 1:
        raise UnsupportedError(f"runs must be at least 1 (got {runs})", op="profile")
    graph = executable.graph
    steps = {step["name"]: step for step in plan["steps"]}
    reuse: dict = {}
    inputs = [np.array(a) if not hasattr(a, "__cuda_array_interface__") else a.copy_to_host() for a in inputs]
    program.time_steps([np.array(a) for a in inputs], time.perf_counter_ns, reuse)  # warm-up
    totals: dict[str, int] = {}
    calls: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    wall = 0
    for run in range(runs):
        copies = [np.array(a) for a in inputs]  # a donated input is written over
        start = time.perf_counter_ns()
        spans = program.time_steps(copies, time.perf_counter_ns, reuse)
        end = time.perf_counter_ns()
        wall += end - start
        events.append({"name": f"{function} run {run}", "ph": "X", "ts": start / 1e3, "dur": (end - start) / 1e3,
                       "pid": 0, "tid": 0, "cat": "step"})
        for name, begin, finish in spans:
            totals[name] = totals.get(name, 0) + (finish - begin)
            calls[name] = calls.get(name, 0) + 1
            step = steps[name]
            events.append({"name": kernel_name(graph, step), "ph": "X", "ts": begin / 1e3,
                           "dur": (finish - begin) / 1e3, "pid": 0, "tid": 1, "cat": step["kind"],
                           "args": {"step": name, "lines": step.get("lines", []), "nodes": step["nodes"]}})
    if hasattr(program, "time_launch_list"):
        # cpu: the step is its kernels plus the launch list's own Python, timed with the kernels off (the
        # stepped call's loop above is the profiler's, not the step's)
        own = program.time_launch_list(inputs, time.perf_counter_ns, max(runs, 20))  # (writes nothing)
        wall = sum(totals.values()) + own * runs
    wall = max(wall, sum(totals.values()))  # cuda: device clocks against the host's; the shares still sum to 1
    rows = []
    for name, total in totals.items():
        step = steps[name]
        seconds = total / 1e9
        moved, flops = _bytes(plan, step), _flops(plan, step)
        per_call = seconds / calls[name] if calls[name] else 0.0
        rows.append({"kernel": kernel_name(graph, step), "step": name, "kind": step["kind"],
                     "nodes": list(step["nodes"]), "source_lines": list(step.get("lines", [])),
                     "calls": calls[name], "total_ms": total / 1e6, "mean_ms": total / 1e6 / calls[name],
                     "bytes": moved, "gb_per_s": moved / per_call / 1e9 if per_call and moved else 0.0,
                     "gflop_per_s": flops / per_call / 1e9 if per_call and flops else 0.0,
                     "share": total / wall if wall else 0.0})
    overhead = max(0, wall - sum(totals.values()))
    rows.append({"kernel": OVERHEAD, "step": "-", "kind": "overhead", "nodes": [], "source_lines": [],
                 "calls": runs, "total_ms": overhead / 1e6, "mean_ms": overhead / 1e6 / runs, "bytes": 0,
                 "gb_per_s": 0.0, "gflop_per_s": 0.0, "share": overhead / wall if wall else 0.0})
    rows.sort(key=lambda row: row["total_ms"], reverse=True)
    return Profile(function, runs, wall / 1e6 / runs, rows, events)
