"""The CPU renderer: kernel plan steps -> numba / numpy source.

A fused elementwise group becomes one ``@njit`` function over its cells (a
loop nest over the group's iteration space, ``prange`` on the outer loop when
the group is large); every value is a named float32 temporary, constants are
typed (``np.float32(...)``), there is no fastmath, so + - * / round as
PyTorch's do. Other steps use the op's own CPU lowering (numpy's BLAS for
matrix products, numpy reductions, numba row kernels).
"""
from __future__ import annotations

from typing import Callable

from bendc.codegen.plan import KernelPlan, Step, elementwise_domain
from bendc.ir.graph import Graph, Node
from bendc.ir.printer import format_node
from bendc.ir.types import TensorType
from bendc.ops import OPS
from bendc.ops.base import PARALLEL_CELLS
from bendc.passes.fusion import reduced_axes

HEADER = '''"""bendc kernel {name}: {summary}

Generated from:
{nodes}
"""
import math

import numpy as np
from numba import njit, prange

'''


def render_plan(plan: KernelPlan, graph: Graph) -> None:
    """Fill ``step.source`` for every step of the plan."""
    for step in plan.steps:
        step.source = render_step(step, graph)


def render_step(step: Step, graph: Graph) -> str:
    nodes = [graph.node(i) for i in step.nodes]
    listing = "\n".join("    " + format_node(graph, n) for n in nodes)
    if step.kind == "elementwise":
        domain = elementwise_domain(graph, step.nodes)
        summary = f"{len(nodes)} fused elementwise ops over [{','.join(map(str, domain))}]"
        body = _render_elementwise(step, graph, domain)
    else:
        node = nodes[0]
        summary = f"{node.op} ({step.kind})"
        lowering = OPS[node.op].lowering
        body = lowering.cpu(node.attr, [graph.node(i).type for i in node.inputs], node.type)
    return HEADER.format(name=step.name, summary=summary, nodes=listing) + "\n" + body


def strip_comments(source: str) -> str:
    """The structural part of a kernel source: docstring header and comments removed."""
    lines = source.split('"""', 2)[-1].splitlines() if source.startswith('"""') else source.splitlines()
    return "\n".join(line.split("  #", 1)[0].rstrip() for line in lines)


# ------------------------------------------------------------------ elementwise
def _index(names: list[str]) -> str:
    return "[" + (", ".join(names) if names else "()") + "]"


def _broadcast_index(shape: tuple[int, ...], domain: tuple[int, ...], loops: list[str]) -> list[str]:
    """Index of a value of ``shape`` read at the domain cell: right-aligned, size-1 dims at 0."""
    lead = len(domain) - len(shape)
    return ["0" if d == 1 else loops[lead + axis] for axis, d in enumerate(shape)]


def _unit_reshape_index(shape: tuple[int, ...], domain: tuple[int, ...], loops: list[str]) -> list[str]:
    """Index of the operand of a size-1 reshape: its non-1 dims are the domain's, in order."""
    wide = [loops[axis] for axis, d in enumerate(domain) if d != 1]
    return ["0" if d == 1 else wide.pop(0) for d in shape]


def _render_elementwise(step: Step, graph: Graph, domain: tuple[int, ...]) -> str:
    loops = [f"i{axis}" for axis in range(len(domain))]
    arg_of = {value: f"in{k}" for k, value in enumerate(step.inputs)}
    local: dict[int, str] = {}
    reads: dict[tuple[int, str], str] = {}
    body: list[str] = []

    def read(value: int, index: list[str]) -> str:
        key = (value, ",".join(index))
        if key not in reads:
            reads[key] = f"r{len(reads)}"
            body.append(f"{reads[key]} = {arg_of[value]}{_index(index)}  # %{value}")
        return reads[key]

    def operand(value: int, node: Node) -> str:
        return operand_reference(graph, value, node, local, domain, loops, read)

    epilogues = [id for id in step.nodes if reduced_axes(graph, graph.node(id)) is not None]
    out_of = {id: f"out{k}" for k, id in enumerate(step.outputs)}
    prologue: list[str] = []
    for number, id in enumerate(step.nodes):
        node = graph.node(id)
        if id in epilogues:
            # Accumulate the operand into the reduction's output cell, in cell order.
            axes = reduced_axes(graph, node)
            kept = _reduction_index(graph, node, axes, loops)
            flat = f"z{number}"
            prologue += [f"{flat} = {out_of[id]}.reshape({out_of[id]}.size)",
                         f"for q in range({flat}.size):", f"    {flat}[q] = np.float32(0.0)"]
            body.append(f"{out_of[id]}{_index(kept)} += {local[node.inputs[0]]}  # %{id} = {node.op}")
            continue
        expression = member_expression(node, [operand(o, node) for o in node.inputs])
        local[id] = f"v{number}"
        body.append(f"v{number} = {expression}  # %{id} = {node.op}")
    for id in step.outputs:
        if id in epilogues:
            continue
        shape = graph.node(id).type.shape
        index = ["0"] * len(shape) if graph.node(id).type.numel == 1 else loops
        body.append(f"{out_of[id]}{_index(index)} = {local[id]}")

    # The first loop of more than one cell runs in parallel, unless an epilogue sums over it
    # (its cells would race on the output).
    parallel_axis = next((axis for axis, d in enumerate(domain) if d > 1), None)
    if step.cells < PARALLEL_CELLS or any(parallel_axis in reduced_axes(graph, graph.node(e)) for e in epilogues):
        parallel_axis = None
    parallel = parallel_axis is not None
    args = ", ".join([arg_of[v] for v in step.inputs] + [out_of[o] for o in step.outputs])
    lines = [f"@njit(parallel={parallel}, cache=True, error_model='numpy')", f"def kernel({args}):"]
    lines.extend("    " + line for line in prologue)
    indent = "    "
    for axis, size in enumerate(domain):
        loop = "prange" if axis == parallel_axis else "range"
        lines.append(f"{indent}for {loops[axis]} in {loop}({size}):")
        indent += "    "
    lines.extend(indent + line for line in body)
    return "\n".join(lines) + "\n"


def operand_reference(graph: Graph, value: int, node: Node, local: dict[int, str], domain: tuple[int, ...],
                      loops: list[str], read: Callable[[int, list[str]], str]) -> str:
    """How a fused kernel's member ``node`` reads operand ``value`` at the current cell: a
    local of the kernel, an inlined float32 constant, or ``read(value, index)`` of an input
    (broadcast, size-1 reshape or one-element index). Shared by the CPU and CUDA renderers."""
    source = graph.node(value)
    if value in local:
        return local[value]
    if source.op == "const":
        return OPS["const"].lowering.scalar(value=source.attr["value"])
    shape = source.type.shape
    if source.type.numel == 1:
        return read(value, ["0"] * len(shape))
    if node.op == "reshape":
        return read(value, _unit_reshape_index(shape, domain, loops))
    return read(value, _broadcast_index(shape, domain, loops))


def member_expression(node: Node, operands: list[str]) -> str:
    """One fused member's value over its operands' names: expand and size-1 reshape just read
    their operand (at the index ``operand_reference`` chose); other ops render their scalar."""
    if node.op in ("expand", "reshape"):
        return operands[0]
    return OPS[node.op].lowering.scalar(*operands, **node.attr)


def _reduction_index(graph: Graph, node: Node, axes: tuple[int, ...], loops: list[str]) -> list[str]:
    """The output cell a domain cell adds into: reduced axes dropped (or 0 where kept as size 1)."""
    if node.op == "sum":
        if node.attr["keepdim"]:
            return ["0" if axis in axes else loop for axis, loop in enumerate(loops)]
        return [loop for axis, loop in enumerate(loops) if axis not in axes]
    lead = len(loops) - node.type.ndim
    return ["0" if lead + axis in axes else loops[lead + axis] for axis in range(node.type.ndim)]


def step_types(graph: Graph, step: Step) -> list[TensorType]:
    return [graph.node(i).type for i in step.inputs]
