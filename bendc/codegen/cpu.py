"""The CPU renderer: kernel plan steps -> numba / numpy source.

A fused elementwise group becomes one ``@njit`` function over its cells (a
loop nest over the group's iteration space, ``prange`` on the outer loop when
the group is large); every value is a named float32 temporary, constants are
typed (``np.float32(...)``), there is no fastmath, so + - * / round as
PyTorch's do; epilogue sums accumulate in float64 (in lanes over the
innermost loop: cpu_kit.sum_layout). Other steps use the op's own CPU lowering
(numpy's BLAS for matrix products, numba row and reduction kernels).
"""
from __future__ import annotations

from bendc.codegen.collapse import collapse_domain, wrap
from bendc.codegen.fused import epilogues, member_expression, operand_reference, reduction_index
from bendc.codegen.plan import KernelPlan, Step, collective_step, elementwise_domain
from bendc.ir.graph import Graph
from bendc.ir.printer import format_node
from bendc.ir.types import TensorType
from bendc.kernels import cpu_policy as policy
from bendc.kernels.epilogue import Epilogue
from bendc.kernels.templates import helper_functions
from bendc.kernels.cpu_kit import (UNROLLED_EXTENT, SumLines, element, heavy_body, loop_nest, njit_decorator,
                                   sum_layout, sum_lines, through_row, vectorizable_math)
from bendc.ops import OPS
from bendc.ops.attention.layout import whole_heads
from bendc.ops.base import reduced_axes

# Vectors an iteration for a loop calling the kit's math, asked of the native translator
# (runtime/native/translate.py INTERLEAVE_CONSTANT). 2-vCPU AMD EPYC (Zen 3, AVX2), 1 thread: gelu's
# forward over 1024 x 512 floats 1.00 ms at 1, 0.85 at 2, 0.65 at 4. Only in kernels whose largest
# tensor is large enough to repay the compile time (bendc/kernels/cpu_policy.py interleaves).
MATH_INTERLEAVE = 4
# ... in the attention's templates: their exponentials run over rows of 16-64 lanes, multiples of
# 16 (a causal row from the start of its 16-lane chunk), so 2 vectors of 8 and no remainder. Fused
# heads fwd+bwd, B=8 H=4 T=64 D=16: 0.60-0.62 -> 0.54-0.58 ms (4: 16-lane remainders in scalar
# code, slower than 1). The other attention kernels ask for 2 as well.
ATTENTION_INTERLEAVE = 2
# ... in the tiled schedule's (past SMALL_HEAD positions), whose rows are tiles of 64 lanes: 4 vectors
# of 8, no remainder. (4, 8, 2, 512, 64) causal fwd+bwd, 1 thread, alternating processes (stop 51):
# 73.0 / 73.7 / 81.4 / 84.5 ms at 2, 68.0 / 68.7 / 69.8 / 70.7 at 4.
TILED_ATTENTION_INTERLEAVE = 4

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
        in_place = {out: param for out, param in (plan.donations.items() if plan else ()) if out in step.outputs}
        body = _render_elementwise(step, graph, domain, in_place)
    else:
        node = nodes[0]
        summary = f"{node.op} ({step.kind})"
        lowering = OPS[node.op].lowering
        types = [graph.node(i).type for i in node.inputs]
        if len(nodes) > 1:  # an op computing a fused group as its epilogue (bendc/passes/fusion.py)
            summary += f" with {len(nodes) - 1} fused elementwise ops as its epilogue"
            body = lowering.cpu(node.attr, types, node.type, epilogue=render_epilogue(step, graph, node.id))
        else:
            body = lowering.cpu(node.attr, types, node.type)
    body, kit = vectorizable_math(body)
    helpers = helper_functions(body, "cpu")
    if not kit:  # a helper may call the kit's functions itself (products.py: bendc_fma)
        kit = vectorizable_math(helpers)[1]
    header = HEADER.format(name=step.name, summary=summary, nodes=listing)
    if kit:
        header += "\n# float32 exp, log, tanh, erf without libm calls (bendc/kernels/templates/cpu_math.py)\n" + kit
        count = _interleave_count(step, graph)
        if count > 1 and policy.interleaves(_largest_tensor(step, graph)):
            header += (f"\n# the loops calling them: {count} vectors an iteration "
                       f"(runtime/native/translate.py)\nNATIVE_INTERLEAVE = {count}\n")
    header += helpers
    return header + "\n" + body


def _interleave_count(step: Step, graph: Graph) -> int:
    """Vectors an iteration for the loops of ``step`` that call the kit's math."""
    if step.kind != "attention":
        return MATH_INTERLEAVE
    node = graph.node(step.nodes[0])
    if node.op in ("attention_tiled", "attention_tiled_grad"):
        if not whole_heads(graph.node(node.inputs[0]).type.shape[2]):  # q's (B, H, T, D)
            return TILED_ATTENTION_INTERLEAVE
    return ATTENTION_INTERLEAVE


def _largest_tensor(step: Step, graph: Graph) -> int:
    """The cells of the largest tensor a step reads or computes (a sum's input, an attention's q)."""
    types = [graph.node(i).type for i in (*step.nodes, *step.inputs)]
    return max((t.numel for t in types if isinstance(t, TensorType)), default=0)


# ------------------------------------------------------------------ elementwise
class _Cells:
    """The statements computing a fused group's members at one cell of its domain: input reads
    (``r0``, ..., a one-element input read once before the loops), members (``v0``, ...). Shared
    by the elementwise kernel and the epilogue an op's kernel applies to its result, which reads
    that result (``block``) from the op's block of rows: its leading loop relative (``row`` for
    ``i0``)."""

    def __init__(self, graph: Graph, domain: tuple[int, ...], arg_of: dict[int, str], block: int | None = None):
        self.graph, self.domain, self.arg_of, self.block = graph, domain, arg_of, block
        self.loops = [f"i{axis}" for axis in range(len(domain))]
        self.local: dict[int, str] = {}
        self.reads: dict[tuple[int, str], str] = {}
        self.body: list[str] = []
        self.hoisted: list[str] = []
        # Each loop's extent is read from the shape of an argument that the loop indexes (outputs
        # first): the source then serves every size of the domain, so a new batch size reuses the
        # compiled kernel (numba's types carry no sizes). A loop that indexes nothing keeps its literal.
        self.written: dict[int, str] = {}
        self.read_at: dict[int, str] = {}

    def note(self, extents: dict[int, str], array: str, index: list[str]) -> None:
        for position, name in enumerate(index):
            if name in self.loops:
                extents.setdefault(self.loops.index(name), f"{array}.shape[{position}]")

    def read(self, value: int, index: list[str]) -> str:
        if value == self.block:
            index = ["row" if name == "i0" else name for name in index]
        key = (value, ",".join(index))
        if key not in self.reads:
            self.reads[key] = f"r{len(self.reads)}"
            self.note(self.read_at, self.arg_of[value], index)
            # A one-element input is read once, before the loops (numba's parfor lowering
            # cannot type a 0-d array's [()] inside a prange body).
            where = self.hoisted if self.graph.node(value).type.numel == 1 else self.body
            where.append(f"{self.reads[key]} = {element(self.arg_of[value], index)}  # %{value}")
        return self.reads[key]

    def member(self, number: int, id: int) -> None:
        """The statement computing member ``id`` (the ``number``-th of the step) at the cell."""
        node = self.graph.node(id)
        operands = [operand_reference(self.graph, o, node, self.local, self.domain, self.loops, self.read)
                    for o in node.inputs]
        self.local[id] = f"v{number}"
        self.body.append(f"v{number} = {member_expression(node, operands, self.domain, self.loops, cpu=True)}  "
                         f"# %{id} = {node.op}")

    def accumulate(self, id: int, total: str, lead: list[str]) -> None:
        """Add epilogue sum ``id``'s operand at the cell into the float64 accumulator ``total``
        (``total[lead..., kept...]``, ``kept`` the output cell the reduction keeps; loop extents
        read from ``total``), in cell order: rounded once at the end, as a float32 running sum over
        many cells drifts far from the pairwise sums of numpy and PyTorch (~100x their error over
        65536 cells). The epilogue an op's kernel applies uses it; the elementwise kernel's sums go
        in lanes (cpu_kit.sum_lines)."""
        node = self.graph.node(id)
        kept = reduction_index(self.graph, node, self.loops)
        self.note(self.written, total, [*lead, *kept])
        self.body.append(f"{element(total, [*lead, *kept])} += np.float64({self.local[node.inputs[0]]})  "
                         f"# %{id} = {node.op}")

    def write(self, id: int, array: str, prologue: list[str]) -> None:
        """Store member ``id`` into its output ``array`` at the cell."""
        shape = self.graph.node(id).type.shape
        if not shape:  # a 0-d output through a 1-element view: numba's parfor lowering cannot type out[()] = v
            prologue.append(f"{array}_cell = {array}.reshape(1)")
            self.body.append(f"{array}_cell[0] = {self.local[id]}")
            return
        index = ["0"] * len(shape) if self.graph.node(id).type.numel == 1 else self.loops
        self.note(self.written, array, index)
        self.body.append(f"{element(array, index)} = {self.local[id]}")

    def extents(self) -> list[str]:
        extents = [self.written.get(axis, self.read_at.get(axis, str(size))) for axis, size in enumerate(self.domain)]
        if len(self.domain) > 1 and self.domain[-1] <= UNROLLED_EXTENT:  # a tiny inner loop: unrolled whole
            extents[-1] = str(self.domain[-1])
        return extents


def _render_elementwise(step: Step, graph: Graph, domain: tuple[int, ...], in_place: dict[int, int]) -> str:
    # Adjacent axes that every array indexes densely (or none does) are one loop: the kernel is
    # rendered over the collapsed domain, called through a wrapper that reshapes its arguments.
    collapse = collapse_domain(step, graph, domain)
    if collapse is not None:
        return wrap(_render_elementwise_loops(step, collapse.graph, collapse.domain, in_place), step, collapse)
    return _render_elementwise_loops(step, graph, domain, in_place)


def _render_elementwise_loops(step: Step, graph: Graph, domain: tuple[int, ...], in_place: dict[int, int]) -> str:
    """``in_place``: output -> the donated parameter (an input of the step) the runtime writes it
    over (plan.donations: its array is the parameter's). Such an output is stored through the
    parameter's own argument: the loop then loads and stores one array at one index, which LLVM
    vectorizes, where an output argument that is the input's memory under another name failed
    the vectorizer's run-time overlap check and ran the scalar loop (gpt_small's AdamW update,
    (256, 64): 0.049 ms in place against 0.014 ms into separate arrays)."""
    cells = _Cells(graph, domain, {value: f"in{k}" for k, value in enumerate(step.inputs)})
    loops, body, local = cells.loops, cells.body, cells.local
    sums = epilogues(graph, step.nodes)
    # The loops' parallel split and each epilogue sum's accumulation: cpu_kit.sum_layout.
    layout = sum_layout(domain, [set(reduced_axes(graph, graph.node(id))) for id in sums],
                        "elementwise")
    before: dict[int, list[str]] = {}
    after: dict[int, list[str]] = {}
    out_of = {id: f"out{k}" for k, id in enumerate(step.outputs)}
    prologue: list[str] = []
    epilogue: list[str] = []
    row_sums: list[int] = []
    in_cell_order: list[tuple[int, SumLines, int, str]] = []  # (its body line, its lines, number, label)
    for number, id in enumerate(step.nodes):
        if id not in sums:
            cells.member(number, id)
            continue
        node = graph.node(id)
        kept = reduction_index(graph, node, loops)
        cells.note(cells.written, out_of[id], kept)
        what = f"%{id} = {node.op}"
        source = sum_lines(number, local[node.inputs[0]], out_of[id], kept, set(reduced_axes(graph, node)),
                           loops, layout, layout.runs[sums.index(id)], what)
        prologue += source.prologue
        epilogue += source.epilogue
        if source.cell is not None:
            in_cell_order.append((len(body), source, number, what))
        body.append(source.body)
        if source.row is not None:
            row_sums.append(source.row)
        for axis, text in source.before.items():
            before.setdefault(axis, []).extend(text)
        for axis, text in source.after.items():
            after.setdefault(axis, []).extend(text)
    for id in step.outputs:
        if id not in sums:
            target = cells.arg_of[in_place[id]] if id in in_place else out_of[id]
            cells.write(id, target, prologue)

    extents = cells.extents()
    # A heavy body's sums in cell order add after its innermost loop, through a float32 row
    # (cpu_kit.through_row): the loop itself then runs 16 lanes, not 8.
    scratch: list[str] = []
    inner = len(domain) - 1
    if in_cell_order and not layout.lanes and domain and layout.parallel_axis != inner and heavy_body(body):
        for line, source, number, what in in_cell_order:
            if through_row(source, number, loops, extents[inner], what):
                body[line] = source.body
                after.setdefault(inner, []).extend(source.after[inner])
                scratch += source.scratch
    args = ", ".join([cells.arg_of[v] for v in step.inputs] + [out_of[o] for o in step.outputs])
    lines = [njit_decorator(layout.parallel_axis is not None), f"def kernel({args}):"]
    lines.extend("    " + line for line in cells.hoisted + prologue)
    lines.extend(loop_nest(extents, loops, layout.parallel_axis, body, chunks=layout.chunks, lanes=layout.lanes,
                           before=before, after=after, row_sums=row_sums, scratch=scratch))
    lines.extend("    " + line for line in epilogue)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ epilogues of an op's kernel
def render_epilogue(step: Step, graph: Graph, producer: int) -> Epilogue:
    """The fused group of an epilogue step as ``_epilogue(first, count, value, ...)`` over rows
    ``first .. first + count - 1`` of its domain (bendc/kernels/epilogue.py), serial: the op's
    kernel calls it from its own (parallel) loop over blocks of its result, each block's sums
    into a partial of its own."""
    members = [i for i in step.nodes if i != producer]
    domain = elementwise_domain(graph, members)
    own = len(graph.node(producer).inputs)
    arg_of = {value: f"in{own + k}" for k, value in enumerate(step.inputs[own:])}
    arg_of[producer] = "value"
    out_of = {id: f"out{k}" for k, id in enumerate(step.outputs)}
    sums = epilogues(graph, members)
    partial_of = {id: f"p{k}" for k, id in enumerate(sums)}
    cells = _Cells(graph, domain, arg_of, block=producer)
    for number, id in enumerate(members):
        if id in sums:
            cells.accumulate(id, partial_of[id], ["0"])
        else:
            cells.member(number, id)
    prologue: list[str] = []
    for id in step.outputs:
        if id != producer and id not in sums:
            cells.write(id, out_of[id], prologue)
    extents = cells.extents()
    inputs = tuple(arg_of[v] for v in step.inputs[own:])
    outputs = tuple(out_of[o] for o in step.outputs if o != producer)
    written = tuple(out_of[o] for o in step.outputs if o != producer and o not in sums)
    parameters = ", ".join(("first", "count", "value") + inputs + written + tuple(partial_of[i] for i in sums))
    lines = [njit_decorator(False), f"def _epilogue({parameters}):",
             f'    """The fused elementwise group of {_listing(members)}, rows first .. first + count - 1."""']
    lines.extend("    " + line for line in cells.hoisted + prologue)
    lines.append("    for row in range(count):")
    lines.append("        i0 = first + row")
    lines.extend(loop_nest(extents[1:], cells.loops[1:], None, cells.body, indent="        "))
    return Epilogue("\n".join(lines) + "\n", inputs, outputs, out_of.get(producer),
                    tuple((out_of[i], partial_of[i]) for i in sums))


def _listing(ids: list[int]) -> str:
    return " ".join(f"%{i}" for i in ids)
