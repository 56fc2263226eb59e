"""The CUDA renderer: kernel plan steps -> numba.cuda modules.

Each step becomes one module (named by its structural hash, like the CPU
kernels) holding one or two ``@cuda.jit`` kernels that take the same
arguments: ``in0..`` (the flat array of each input's root), ``out0..`` (the
flat outputs) and ``err`` (two int64 words) for steps that check indices.
Every read goes through the value's :class:`~bendc.codegen.strides.Access`,
so permuted, broadcast and sliced operands are read in place.

How each kind is lowered, and why:

This module renders the generic kinds, for every op of the kind: fused
elementwise groups, views and their copies, constants. Every other kind is
the op's own ``Lowering.cuda``, written beside the op (bendc/ops/) with the
kernel kit (bendc/kernels/cuda_kit.py), given a :class:`CudaNode`.

- ``elementwise``: one cell per thread in a grid-stride loop; the flat cell
  id is split into the loop indices, the ops' ``scalar`` renderers give the
  body (``math.*`` and ``np.float32(...)`` constants: float32 throughout).
  Each epilogue sum of a fused group gets a kernel of its own: a block per
  output element whose threads recompute the summed operand from the group's
  inputs over the reduced cells in order, then a shared-memory tree of fixed
  shape (the operand is never written out, which is what fusion saved, and
  no atomics: the same bits every run, as the cpu target promises). Few
  output elements make few blocks (as the standalone sum kernels).
- ``layout``: no kernel (consumers read through strides) unless the view is
  materialized (see views.py): then a copy kernel.
- the op's own kernels (``Lowering.cuda``): softmax rows and sums
  (ops/reduce.py: shared-memory trees), matmul tiles (ops/matmul.py), gathers
  and scatters (ops/gather.py, ops/layout.py: index checks set ``err``), the
  norm statistics and rope (ops/norm.py), the attention ops (ops/attention.py).
- ``source`` (constants read by other steps): no kernel; the runtime uploads
  ``VALUE`` once.

Kernels read their cell, row and matrix counts from their arrays' lengths where an argument
holds exactly that many (kit.length_of: ``while cell < out0.shape[0]``), as the cpu kernels read
their loop extents from shapes: a new batch size renders the same module, whose cubin the cache
then holds; only the launches, sized from the shapes here, change.

There is no fastmath and the runtime turns NVVM's FMA contraction off, so
+ - * / round as PyTorch's do; ``CudaOptions(fastmath=True)`` opts in.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from bendc.codegen.fused import epilogues, member_expression, operand_reference, reduction_index
from bendc.codegen.plan import KernelPlan, Step, collective_step, elementwise_domain
from bendc.codegen.views import StepReads, Views, materialize, resolve_accesses, view_access
from bendc.ir.graph import Graph, Node
from bendc.ir.printer import format_node
from bendc.ir.types import numel
from bendc.ops.base import reduced_axes
from bendc.kernels.access import Access, dense
from bendc.kernels.cuda_kit import (FASTMATH_DECORATOR, JIT_DEFINITION, KERNEL_DECORATOR, CudaNode, Kernels, Launch, argument_list,
                                    block_per_row_launch, grid_stride_launch, grid_stride_loop, kernel_source,
                                    length_of, sum_block, sum_threads, tree_lines, unflatten,
                                    used)
from bendc.kernels.templates import helper_functions
from bendc.ops import OPS
from runtime.dtypes import NUMBA_NAMES

HEADER = '''"""bendc cuda kernel {name}: {summary}

Generated from:
{nodes}

Launches:
{launches}
"""
import functools
import math

import numba
import numpy as np
from numba import cuda

{jit}
SIGNATURE = "{signature}"
'''


@dataclass(frozen=True)
class CudaOptions:
    """Code generation options. ``fastmath`` lets NVVM contract and approximate (off: PyTorch's numbers)."""

    fastmath: bool = False


# ------------------------------------------------------------------ the plan
def render_cuda_plan(plan: KernelPlan, graph: Graph, options: CudaOptions = CudaOptions()) -> Views:
    """Resolve strided reads, turn the views that need a copy into write steps, then fill
    ``source``, ``launches`` and ``check`` of every step. Returns the views (their decisions are
    report lines); the plan's step conventions are final after this, for the memory plan."""
    views = resolve_accesses(plan, graph)
    materialize(plan, views)
    for step in plan.steps:
        render_step(step, graph, views.access, options, plan)
    return views


def render_step(step: Step, graph: Graph, access: dict[int, Access], options: CudaOptions,
                plan: KernelPlan | None = None) -> None:
    nodes = [graph.node(i) for i in step.nodes]
    if step.kind == "collective":  # a host function over device arrays (bendc/ops/collective.py)
        kernels = OPS[nodes[0].op].lowering.cuda(collective_step(plan, step, graph))
    else:  # each input passed as the window of its root that the step reads (views.StepReads)
        reads = StepReads(step, graph, access)
        kernels = _render_kind(step, graph, reads)
        step.windows = reads.windows if kernels.launches else []
    if kernels.scratch:
        assert plan is not None and not kernels.check, step.name
        _add_scratch(plan, graph, step, kernels.scratch)
    listing = "\n".join("    " + format_node(graph, n) for n in nodes)
    launches = "\n".join("    " + launch.describe() for launch in kernels.launches) or "    none"
    header = HEADER.format(name=step.name, summary=kernels.summary, nodes=listing, launches=launches,
                           jit=JIT_DEFINITION, signature=_signature(step, graph, bool(kernels.check), plan))
    source = header + kernels.prelude + kernels.source
    if options.fastmath:  # (bounded kernels: kit.bounded_decorator)
        source = source.replace(KERNEL_DECORATOR + "\n", FASTMATH_DECORATOR + "\n").replace(
            "functools.partial(jit, launch_bounds=", "functools.partial(jit, fastmath=True, launch_bounds=")
    step.source = source
    step.launches = [asdict(launch) for launch in kernels.launches]
    step.check = kernels.check
    if step.kind == "source":
        step.value = float(np.float32(nodes[0].attr["value"]))


def _render_kind(step: Step, graph: Graph, access: StepReads) -> Kernels:
    if step.kind == "elementwise":
        return _render_elementwise(step, graph, access)
    node = graph.node(step.nodes[0])
    if step.kind == "source":
        return Kernels("constant (uploaded once, no kernel)", "", [],
                       prelude=f"VALUE = {OPS['const'].lowering.scalar(value=node.attr['value'])}\n")
    if step.kind == "layout":
        if step.convention == "view":
            return Kernels(f"{node.op} (a strided view: its readers index the operand's array; no kernel)",
                           "", [])
        return _render_copy(step, graph, access, node)
    return OPS[node.op].lowering.cuda(cuda_node(step, graph, access, node))


def cuda_node(step: Step, graph: Graph, access: StepReads, node: Node) -> CudaNode:
    """What the op's own renderer needs of a step: operand shapes, argument names and accesses."""
    names = _argument_names(step)
    return CudaNode(node, tuple(graph.node(i).type.shape for i in node.inputs),
                    tuple(names[i] for i in node.inputs), tuple(access[i] for i in node.inputs),
                    _arguments(step), _arguments(step, checked=True),
                    tuple(access.lengths[i] for i in node.inputs),
                    argument_list(len(step.inputs), len(step.outputs) + 1), f"out{len(step.outputs)}")


def _add_scratch(plan: KernelPlan, graph: Graph, step: Step, cells: int) -> None:
    """A float32 value of ``cells`` that only ``step`` writes and reads (its kernels' scratch array,
    the argument after its outputs): a plan value with an id past the graph's and the plan's, which
    the memory plan places in a temporary buffer free again after the step."""
    value = max([graph.next_id - 1, *plan.values]) + 1
    plan.values[value] = ("f32", (cells,))
    step.outputs.append(value)


def describe_launches(plan: KernelPlan) -> list[str]:
    """Report lines: the launch configuration of every step that launches kernels."""
    lines = []
    for step in plan.steps:
        if step.launches:
            configured = "; ".join(Launch(**_launch_tuple(l)).describe() for l in step.launches)
            when = " (hoisted)" if step.hoisted else ""
            lines.append(f"{step.name}{when}: {configured}")
    return lines


def describe_tiles(plan: KernelPlan) -> list[str]:
    """Report lines: how each matrix-product step (matmul, conv2d and its gradients) tiles its
    product, as its kernels' summary says (the first line of the step's module)."""
    lines = []
    for step in plan.steps:
        prefix = f'"""bendc cuda kernel {step.name}: '
        if step.kind == "matmul" and step.source.startswith(prefix):
            lines.append(f"{step.name}: {step.source[len(prefix):].split(chr(10), 1)[0]}")
    return lines


def _launch_tuple(launch: dict) -> dict:
    return {**launch, "grid": tuple(launch["grid"]), "block": tuple(launch["block"])}


# ------------------------------------------------------------------ shared pieces
def _signature(step: Step, graph: Graph, checked: bool, plan: KernelPlan | None = None) -> str:
    """The numba signature of the step's kernels: one flat contiguous array per argument (a scratch
    array is a plan value, not a graph node)."""
    def dtype(value: int) -> str:
        return plan.values[value][0] if plan is not None and value in plan.values else graph.node(value).type.dtype

    types = [f"{NUMBA_NAMES[dtype(v)]}[::1]" for v in step.inputs + step.outputs]
    if checked:
        types.append("int64[::1]")
    return f"void({', '.join(types)})"


def _arguments(step: Step, checked: bool = False) -> str:
    return argument_list(len(step.inputs), len(step.outputs), checked)


def _argument_names(step: Step) -> dict[int, str]:
    """The kernel argument of each input value (a value read twice is one argument)."""
    return {value: f"in{k}" for k, value in enumerate(step.inputs)}


def _cell_count(step: Step, graph: Graph, access: StepReads, domain: tuple[int, ...],
                outputs: list[int]) -> int | str:
    """The cells of an elementwise domain as the kernel reads them: the length of an output in
    ``outputs`` or an input holding exactly one element per cell (kit.length_of), so one source
    serves every batch size; the literal where no argument does."""
    cells = numel(domain)
    arrays = [(f"out{step.outputs.index(id)}", graph.node(id).type.numel) for id in outputs]
    for k, value in enumerate(step.inputs):
        if graph.node(value).type.shape == domain and access[value].is_contiguous(domain):
            arrays.append((f"in{k}", access.lengths[value]))
    return length_of(cells, arrays)


# ------------------------------------------------------------------ elementwise
def _fused_members(step: Step, graph: Graph, access: dict[int, Access], domain: tuple[int, ...],
                   loops: list[str]) -> tuple[list[str], dict[int, str]]:
    """The statements computing every non-sum member of a fused group at the cell whose loop indexes
    are ``loops`` (``cell`` its row-major index), and the local holding each member."""
    arg_of = _argument_names(step)
    sums = set(epilogues(graph, step.nodes))
    local: dict[int, str] = {}
    reads: dict[str, str] = {}
    body: list[str] = []

    def read(value: int, index: list[str]) -> str:
        shape = graph.node(value).type.shape
        if shape == domain and index == loops and access[value].is_contiguous(shape):
            flat = "cell"
        else:
            flat = access[value].flat(index)
        element = f"{arg_of[value]}[{flat}]"
        if element not in reads:
            reads[element] = f"r{len(reads)}"
            body.append(f"{reads[element]} = {element}  # %{value}")
        return reads[element]

    for number, id in enumerate(step.nodes):
        if id in sums:
            continue
        node = graph.node(id)
        operands = [operand_reference(graph, o, node, local, domain, loops, read) for o in node.inputs]
        local[id] = f"v{number}"
        body.append(f"v{number} = {member_expression(node, operands, domain, loops)}  # %{id} = {node.op}")
    return body, local


def _render_elementwise(step: Step, graph: Graph, access: StepReads) -> Kernels:
    """The fused group's kernel over its cells, and for each epilogue sum its own kernel
    (_epilogue_sum_kernel): no atomics, so every sum has the same bits every run."""
    domain = elementwise_domain(graph, step.nodes)
    prelude, loops = unflatten("cell", domain, "i")
    out_of = {id: f"out{k}" for k, id in enumerate(step.outputs)}
    sums = epilogues(graph, step.nodes)
    body, local = _fused_members(step, graph, access, domain, loops)
    for id in step.outputs:
        if id in sums:
            continue
        if graph.node(id).type.numel == 1 and numel(domain) != 1:
            body.append(f"if cell == 0:\n    {out_of[id]}[0] = {local[id]}  # one value for the whole group")
        else:
            body.append(f"{out_of[id]}[cell] = {local[id]}")
    body = [line for text in body for line in text.split("\n")]
    cells = numel(domain)
    plain = [id for id in step.outputs if id not in sums]
    source, launches = "", []
    count = _cell_count(step, graph, access, domain, plain)
    if plain:  # (a group of sums only writes nothing per cell)
        source = kernel_source("kernel", _arguments(step), grid_stride_loop(count, used(prelude, body) + body))
        launches.append(grid_stride_launch("kernel", cells))
    summary = f"{len(step.nodes)} fused elementwise ops over [{','.join(map(str, domain))}]"
    if sums:
        over_leading = len(domain) > 0 and domain[0] > 1 and any(0 in reduced_axes(graph, graph.node(e)) for e in sums)
        block = sum_block(max(numel(domain) // max(1, graph.node(e).type.numel) for e in sums), over_leading)
        source = f"\nBLOCK = {block}\n" + source
        for number, id in enumerate(sums):
            sum_source, launch = _epilogue_sum_kernel(step, graph, access, domain, id, f"sum{number}", block, count,
                                                      over_leading)
            source += sum_source
            launches.append(launch)
        summary += ", epilogue " + ", ".join(f"{graph.node(e).op} %{e}" for e in sums) + \
            " (a block per output element, a fixed tree: the same bits every run)"
    return Kernels(summary, source, launches, prelude=helper_functions(source, "cuda"))


def _epilogue_sum_kernel(step: Step, graph: Graph, access: dict[int, Access], domain: tuple[int, ...],
                         id: int, name: str, block: int, cells: int | str, over_leading: bool
                         ) -> tuple[str, Launch]:
    """One epilogue sum of a fused group, deterministic: a block per output element (grid-stride
    over the blocks) whose threads each add the group's summed operand, recomputed from the
    inputs, over the reduced cells t, t + BLOCK, ... in order (``over_leading``, a group summing over
    the batch: BLOCK is MAX_BLOCK, and the stride the launch's block, sized from this batch: see
    kit.sum_block), then one shared-memory tree in a fixed shape (kit.tree_lines); thread 0 writes
    the element once (no atomics, no clearing).
    The output elements are the output's length and the reduced cells per element ``cells`` (the
    group's cell count, as _cell_count reads it) over that, so one source serves every batch size."""
    node = graph.node(id)
    axes = set(reduced_axes(graph, node))
    kept_shape = tuple(1 if axis in axes else size for axis, size in enumerate(domain))
    reduced_shape = tuple(size if axis in axes else 1 for axis, size in enumerate(domain))
    outputs, reduced = numel(kept_shape), numel(reduced_shape)
    kept_split, kept = unflatten("o", kept_shape, "k")
    reduced_split, summed = unflatten("q", reduced_shape, "s")
    loops = [s if axis in axes else k for axis, (k, s) in enumerate(zip(kept, summed))]
    members, local = _fused_members(step, graph, access, domain, loops)
    members = [line for text in members for line in text.split("\n")]
    strides = [numel(domain[axis + 1:]) for axis in range(len(domain))]
    flat = " + ".join(f"{loop} * {stride}" if stride != 1 else loop
                      for loop, stride in zip(loops, strides) if loop != "0") or "0"
    per_cell = used(reduced_split, [f"cell = {flat}"] + members) + [f"cell = {flat}"] + members
    out = f"out{step.outputs.index(id)}"
    assert node.type.numel == outputs, (node.type, kept_shape)
    count = f"{out}.shape[0]"
    per_element = reduced if isinstance(cells, int) else f"{cells} // {count}"
    target = dense(id, node.type.shape).flat(reduction_index(graph, node, loops))
    width, threads = sum_threads(block, reduced, over_leading)
    inner = (["total = np.float32(0.0)", "q = t", "while q < reduced:"]
             + ["    " + line for line in per_cell]
             + [f"    total += {local[node.inputs[0]]}", f"    q += {width}", "partial[t] = total"]
             + tree_lines("sum", width=width)
             + ["if t == 0:", f"    {out}[{target}] = partial[0]  # %{id} = {node.op} (epilogue)",
                "cuda.syncthreads()  # partial is reused"])
    inner = used(kept_split, inner) + inner
    body = ([f"partial = cuda.shared.array({block}, numba.float32)", "t = cuda.threadIdx.x",
             f"reduced = {per_element}", "o = cuda.blockIdx.x", f"while o < {count}:"]
            + ["    " + line for line in inner]
            + ["    o += cuda.gridDim.x"])
    source = kernel_source(name, _arguments(step), body,
                           f"%{id} = {node.op}: a block per output element, its cells in order, a fixed tree.")
    return source, block_per_row_launch(name, outputs, threads, 4 * block)


# ------------------------------------------------------------------ materialized views
def _render_copy(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> Kernels:
    """A layout op copied into its own buffer: output element ``cell`` in row-major order."""
    operand = node.inputs[0]
    view = view_access(graph, node.id, access[operand])
    if view is not None:
        split, names = unflatten("cell", node.type.shape, "o")
        read = view.flat(names)
    else:  # a reshape keeps row-major order: the cell-th element of the operand
        split, names = unflatten("cell", graph.node(operand).type.shape, "o")
        read = access[operand].flat(names)
    body = [f"out0[cell] = in0[{read}]"]
    body = used(split, body) + body
    cells = node.type.numel
    source = kernel_source("kernel", _arguments(step), grid_stride_loop("out0.shape[0]", body),
                           f"Copy of {node.op} %{node.id}.")
    return Kernels(f"{node.op} copied into its own buffer", source, [grid_stride_launch("kernel", cells)])
