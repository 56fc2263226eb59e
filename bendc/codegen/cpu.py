"""The CPU renderer: kernel plan steps -> numba / numpy source.

A fused elementwise group becomes one ``@njit`` function over its cells (a
loop nest over the group's iteration space, ``prange`` on the outer loop when
the group is large); every value is a named float32 temporary, constants are
typed (``np.float32(...)``), there is no fastmath, so + - * / round as
PyTorch's do. Other steps use the op's own CPU lowering (numpy's BLAS for
matrix products, numpy reductions, numba row kernels).
"""
from __future__ import annotations

from bendc.codegen.collapse import collapse_domain, wrap
from bendc.codegen.fused import epilogues, member_expression, operand_reference, reduction_index
from bendc.codegen.plan import KernelPlan, Step, collective_step, elementwise_domain
from bendc.ir.graph import Graph
from bendc.ir.printer import format_node
from bendc.kernels.templates import helper_functions
from bendc.kernels.cpu_kit import (PARALLEL_CELLS, REDUCTION_CHUNKS, UNROLLED_EXTENT, chunked_loop_nest, element,
                                   loop_nest, njit_decorator, vectorizable_math)
from bendc.ops import OPS
from bendc.ops.base import reduced_axes

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
        step.source = render_step(step, graph, plan)


def render_step(step: Step, graph: Graph, plan: KernelPlan | None = None) -> str:
    nodes = [graph.node(i) for i in step.nodes]
    listing = "\n".join("    " + format_node(graph, n) for n in nodes)
    if step.kind == "collective":  # host code over the runtime's bucket (bendc/ops/collective.py)
        summary = f"all_reduce {step.phase} of {len(nodes)} tensors (collective)"
        body = OPS[nodes[0].op].lowering.cpu(collective_step(plan, step, graph))
        return HEADER.format(name=step.name, summary=summary, nodes=listing) + "\n" + body
    if step.kind == "elementwise":
        domain = elementwise_domain(graph, step.nodes)
        summary = f"{len(nodes)} fused elementwise ops over [{','.join(map(str, domain))}]"
        body = _render_elementwise(step, graph, domain)
    else:
        node = nodes[0]
        summary = f"{node.op} ({step.kind})"
        lowering = OPS[node.op].lowering
        body = lowering.cpu(node.attr, [graph.node(i).type for i in node.inputs], node.type)
    body, helpers = vectorizable_math(body)
    header = HEADER.format(name=step.name, summary=summary, nodes=listing)
    if helpers:
        header += "\n# float32 exp, log, tanh, erf without libm calls (bendc/kernels/templates/cpu_math.py)\n" + helpers
    header += helper_functions(body, "cpu")
    return header + "\n" + body


# ------------------------------------------------------------------ elementwise
def _render_elementwise(step: Step, graph: Graph, domain: tuple[int, ...]) -> str:
    # Adjacent axes that every array indexes densely (or none does) are one loop: the kernel is
    # rendered over the collapsed domain, called through a wrapper that reshapes its arguments.
    collapse = collapse_domain(step, graph, domain)
    if collapse is not None:
        return wrap(_render_elementwise_loops(step, collapse.graph, collapse.domain), step, collapse)
    return _render_elementwise_loops(step, graph, domain)


def _render_elementwise_loops(step: Step, graph: Graph, domain: tuple[int, ...]) -> str:
    loops = [f"i{axis}" for axis in range(len(domain))]
    arg_of = {value: f"in{k}" for k, value in enumerate(step.inputs)}
    local: dict[int, str] = {}
    reads: dict[tuple[int, str], str] = {}
    body: list[str] = []
    hoisted: list[str] = []

    # Each loop's extent is read from the shape of an argument that the loop indexes (outputs
    # first): the source then serves every size of the domain, so a new batch size reuses the
    # compiled kernel (numba's types carry no sizes). A loop that indexes nothing keeps its literal.
    written: dict[int, str] = {}
    read_at: dict[int, str] = {}

    def note(extents: dict[int, str], array: str, index: list[str]) -> None:
        for position, name in enumerate(index):
            if name in loops:
                extents.setdefault(loops.index(name), f"{array}.shape[{position}]")

    def read(value: int, index: list[str]) -> str:
        key = (value, ",".join(index))
        if key not in reads:
            reads[key] = f"r{len(reads)}"
            note(read_at, arg_of[value], index)
            # A one-element input is read once, before the loops (numba's parfor lowering
            # cannot type a 0-d array's [()] inside a prange body).
            where = hoisted if graph.node(value).type.numel == 1 else body
            where.append(f"{reads[key]} = {element(arg_of[value], index)}  # %{value}")
        return reads[key]

    sums = epilogues(graph, step.nodes)
    summed_axes = set()
    for id in sums:
        summed_axes.update(reduced_axes(graph, graph.node(id)))
    # The first loop of more than one cell runs in parallel. When an epilogue sums over it (its
    # cells would race on the output), its range is split in a fixed number of chunks (set by the
    # shape, not the thread count: the same sums on every machine), each summing into its own
    # partial output; the partials are added in chunk order after the loop.
    parallel_axis = next((axis for axis, d in enumerate(domain) if d > 1), None)
    if step.cells < PARALLEL_CELLS:
        parallel_axis = None
    chunks = min(REDUCTION_CHUNKS, domain[parallel_axis]) if parallel_axis in summed_axes else 0
    out_of = {id: f"out{k}" for k, id in enumerate(step.outputs)}
    prologue: list[str] = []
    epilogue: list[str] = []
    for number, id in enumerate(step.nodes):
        node = graph.node(id)
        if id in sums:
            # Accumulate the operand into the reduction's output cell in float64, in cell order, and
            # round once at the end: a float32 running sum over many cells drifts far from the
            # pairwise sums of numpy and PyTorch (~100x their error over 65536 cells).
            kept = reduction_index(graph, node, loops)
            note(written, out_of[id], kept)
            flat, wide = f"z{number}", f"w{number}"
            value = f"np.float64({local[node.inputs[0]]})"
            if chunks:  # one float64 partial sum per chunk, added in chunk order after the loop
                total = f"p{number}"
                prologue.append(f"{total} = np.zeros(({chunks},) + {out_of[id]}.shape, np.float64)")
                body.append(f"{element(total, ['chunk', *kept])} += {value}  # %{id} = {node.op}")
                epilogue += [f"{flat} = {out_of[id]}.reshape({out_of[id]}.size)",
                             f"{wide} = {total}.reshape(({chunks}, {flat}.size))",
                             f"for q in range({flat}.size):", f"    s{number} = np.float64(0.0)",
                             f"    for chunk in range({chunks}):", f"        s{number} += {wide}[chunk, q]",
                             f"    {flat}[q] = np.float32(s{number})"]
            else:
                total = f"a{number}"
                prologue.append(f"{total} = np.zeros({out_of[id]}.shape, np.float64)")
                body.append(f"{element(total, kept)} += {value}  # %{id} = {node.op}")
                epilogue += [f"{flat} = {out_of[id]}.reshape({out_of[id]}.size)",
                             f"{wide} = {total}.reshape({total}.size)",
                             f"for q in range({flat}.size):", f"    {flat}[q] = np.float32({wide}[q])"]
            continue
        operands = [operand_reference(graph, o, node, local, domain, loops, read) for o in node.inputs]
        local[id] = f"v{number}"
        body.append(f"v{number} = {member_expression(node, operands, domain, loops)}  # %{id} = {node.op}")
    for id in step.outputs:
        if id in sums:
            continue
        shape = graph.node(id).type.shape
        if not shape:  # a 0-d output through a 1-element view: numba's parfor lowering cannot type out[()] = v
            prologue.append(f"{out_of[id]}_cell = {out_of[id]}.reshape(1)")
            body.append(f"{out_of[id]}_cell[0] = {local[id]}")
            continue
        index = ["0"] * len(shape) if graph.node(id).type.numel == 1 else loops
        note(written, out_of[id], index)
        body.append(f"{element(out_of[id], index)} = {local[id]}")

    extents = [written.get(axis, read_at.get(axis, str(size))) for axis, size in enumerate(domain)]
    if len(domain) > 1 and domain[-1] <= UNROLLED_EXTENT:  # a tiny inner loop: unrolled whole
        extents[-1] = str(domain[-1])
    args = ", ".join([arg_of[v] for v in step.inputs] + [out_of[o] for o in step.outputs])
    lines = [njit_decorator(parallel_axis is not None), f"def kernel({args}):"]
    lines.extend("    " + line for line in hoisted + prologue)
    if chunks:
        lines.extend(chunked_loop_nest(extents, loops, parallel_axis, chunks, body))
    else:
        lines.extend(loop_nest(extents, loops, parallel_axis, body))
    lines.extend("    " + line for line in epilogue)
    return "\n".join(lines) + "\n"
