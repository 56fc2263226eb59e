"""The CUDA renderer: kernel plan steps -> numba.cuda modules.

Each step becomes one module (named by its structural hash, like the CPU
kernels) holding one or two ``@cuda.jit`` kernels that take the same
arguments: ``in0..`` (the flat array of each input's root), ``out0..`` (the
flat outputs) and ``err`` (two int64 words) for steps that check indices.
Every read goes through the value's :class:`~bendc.codegen.strides.Access`,
so permuted, broadcast and sliced operands are read in place.

How each kind is lowered, and why:

- ``elementwise``: one cell per thread in a grid-stride loop; the flat cell
  id is split into the loop indices, the ops' ``scalar`` renderers give the
  body (``math.*`` and ``np.float32(...)`` constants: float32 throughout).
  Epilogue sums of a fused group are ``cuda.atomic.add`` into outputs that a
  ``zero`` kernel clears first: the summed operand stays in registers (a
  separate reduction kernel would need it written out, which is what fusion
  saved), at the price of a summation order that varies from run to run.
- ``row`` (softmax, log_softmax): one block per row, a shared-memory tree for
  the row's max and sum, ``syncthreads`` between levels (no warp shuffles).
- ops with their own kernels (``Lowering.cuda``, rendered in the op's file
  from a :class:`CudaNode`): the norm statistics (a block per row, a float64
  tree), rope (a thread per output element, reading its partner) and the
  attention ops (a block per work item: a pair of rows or columns, or one).
- ``reduce`` (sum, sum_to_size): one block per output element with the same
  tree when the reduced extent is large, else one thread per output element
  summing its elements in order.
- ``matmul``: square shared-memory tiles, one output element per thread,
  ``blockIdx.z`` over the (broadcast) batch; operands read through strides.
- ``gather`` (index_select, gather): one output element per thread; an index
  outside its dimension sets ``err`` (the runtime raises the user's error).
- ``scatter`` (index_add, scatter_add, index_scatter): a ``zero`` kernel, then
  one source element per thread; accumulations are ``cuda.atomic.add``, so
  repeated indices sum in an unspecified order (PyTorch's CPU kernels add in
  index order: equal within tolerance, not bit for bit).
- ``layout``: no kernel (consumers read through strides) unless the view is
  materialized (see strides.py): then a copy kernel.
- ``source`` (constants read by other steps): no kernel; the runtime uploads
  ``VALUE`` once.

There is no fastmath and the runtime turns NVVM's FMA contraction off, so
+ - * / round as PyTorch's do; ``CudaOptions(fastmath=True)`` opts in.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Sequence

# The CPU renderer's index helpers: the same broadcast and reduction index rules, one definition.
from bendc.codegen.cpu import _reduction_index, member_expression, operand_reference
from bendc.codegen.plan import KernelPlan, Step, elementwise_domain
from bendc.codegen.strides import Access, dense, indexed, reshaped, resolve_accesses, view_access
from bendc.ir.graph import Graph, Node
from bendc.ir.printer import format_node
from bendc.ops import OPS
from bendc.ops.reduce import sum_to_size_axes
from bendc.passes.fusion import reduced_axes

WARP = 32
MAX_BLOCK = 256   # threads per block for grid-stride and tree kernels
MAX_GRID = 4096   # blocks of a grid-stride kernel (each thread then loops)
MAX_ROWS = 65535  # blocks of a block-per-row kernel (each block then loops)
MAX_SHARED_BYTES = 48 * 1024  # static shared memory a block may declare
ROW_TEMPLATE_OPS = ("softmax", "log_softmax")  # the row ops _render_row knows; others bring Lowering.cuda
TREE_MIN_EXTENT = 64  # a sum over at least this many elements gets a block per output element
MATMUL_TILE = 16

TYPE_NAMES = {"f32": "float32", "i64": "int64", "i32": "int32", "bool": "boolean"}

HEADER = '''"""bendc cuda kernel {name}: {summary}

Generated from:
{nodes}

Launches:
{launches}
"""
import math

import numba
import numpy as np
from numba import cuda

SIGNATURE = "{signature}"
'''


@dataclass(frozen=True)
class CudaOptions:
    """Code generation options. ``fastmath`` lets NVVM contract and approximate (off: PyTorch's numbers)."""

    fastmath: bool = False


@dataclass
class Launch:
    """One kernel launch of a step: ``kernel[grid, block]`` with static shared memory."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0

    @property
    def threads(self) -> int:
        count = 1
        for size in self.grid + self.block:
            count *= size
        return count

    def describe(self) -> str:
        shared = f", {self.shared_bytes} bytes of shared memory" if self.shared_bytes else ""
        return f"{self.kernel}[grid={self.grid}, block={self.block}] ({self.threads} threads{shared})"


@dataclass
class Kernels:
    """A rendered step: the kernel functions' source and how to launch them."""

    summary: str
    source: str
    launches: list[Launch]
    check: str = ""  # the error message of an index check ({index} is the bad index)
    prelude: str = ""  # module-level constants (source steps)


# ------------------------------------------------------------------ the plan
def render_cuda_plan(plan: KernelPlan, graph: Graph, options: CudaOptions = CudaOptions()) -> list[str]:
    """Resolve strided reads, then fill ``source``, ``launches`` and ``check`` of every step.

    Call before the memory plan: views that must be copied become write steps here.
    Returns the decisions made (materialized views) as report lines.
    """
    access, decisions = resolve_accesses(plan, graph)
    for step in plan.steps:
        render_step(step, graph, access, options)
    return decisions


def render_step(step: Step, graph: Graph, access: dict[int, Access], options: CudaOptions) -> None:
    nodes = [graph.node(i) for i in step.nodes]
    kernels = _render_kind(step, graph, access)
    listing = "\n".join("    " + format_node(graph, n) for n in nodes)
    launches = "\n".join("    " + launch.describe() for launch in kernels.launches) or "    none"
    header = HEADER.format(name=step.name, summary=kernels.summary, nodes=listing, launches=launches,
                           signature=_signature(step, graph, bool(kernels.check)))
    source = header + kernels.prelude + kernels.source
    if options.fastmath:
        source = source.replace("@cuda.jit\n", "@cuda.jit(fastmath=True)\n")
    step.source = source
    step.launches = [asdict(launch) for launch in kernels.launches]
    step.check = kernels.check


def _render_kind(step: Step, graph: Graph, access: dict[int, Access]) -> Kernels:
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
    lowering = OPS[node.op].lowering
    if lowering.cuda is not None:  # the op's own kernels, rendered in its op file
        return lowering.cuda(CudaNode.of(step, graph, access, node))
    renderers = {"row": _render_row, "reduce": _render_sum, "matmul": _render_matmul,
                 "gather": _render_gather, "scatter": _render_scatter}
    return renderers[step.kind](step, graph, access, node)


@dataclass(frozen=True)
class CudaNode:
    """What an op's own cuda renderer (``Lowering.cuda``) is given: one node of a step, how to read
    each of its operands (argument name and strided access, so views are read in place) and the
    kernel argument list. The renderer returns :class:`Kernels`; its kernels take ``arguments``
    (``in0..``, ``out0``) and write ``out0`` densely in row-major order.
    """

    node: Node
    shapes: tuple[tuple[int, ...], ...]  # of node.inputs, in operand order
    names: tuple[str, ...]               # the kernel argument holding each operand (one per value)
    accesses: tuple[Access, ...]         # where each operand's elements are in that argument
    arguments: str

    @staticmethod
    def of(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> "CudaNode":
        names = _argument_names(step)
        return CudaNode(node, tuple(graph.node(i).type.shape for i in node.inputs),
                        tuple(names[i] for i in node.inputs), tuple(access[i] for i in node.inputs),
                        _arguments(step))

    @property
    def attrs(self) -> dict:
        return self.node.attr

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.type.shape

    def read(self, operand: int, index: Sequence[str]) -> str:
        """The element of operand ``operand`` at one index expression per axis ("0" for a fixed axis)."""
        return f"{self.names[operand]}[{self.accesses[operand].flat(index)}]"

    def read_rows(self, operand: int, lead: int, row: str, column: str, prefix: str) -> tuple[list[str], str]:
        """Operand ``operand`` as a matrix: its first ``lead`` axes flattened into rows, the rest into
        columns. Returns the statements that split ``row`` and ``column`` into axis indexes (none
        where strides describe the matrix, as for any contiguous operand) and the element read."""
        shape = self.shapes[operand]
        rows, columns = _numel(shape[:lead]), _numel(shape[lead:])
        matrix = reshaped(self.accesses[operand], shape, (rows, columns))
        if matrix is not None:
            return [], f"{self.names[operand]}[{matrix.flat([row, column])}]"
        row_split, row_names = unflatten(row, shape[:lead], f"{prefix}r")
        column_split, column_names = unflatten(column, shape[lead:], f"{prefix}c")
        return row_split + column_split, self.read(operand, row_names + column_names)


def describe_launches(plan: KernelPlan) -> list[str]:
    """Report lines: the launch configuration of every step that launches kernels."""
    lines = []
    for step in plan.steps:
        if step.launches:
            configured = "; ".join(Launch(**_launch_tuple(l)).describe() for l in step.launches)
            when = " (hoisted)" if step.hoisted else ""
            lines.append(f"{step.name}{when}: {configured}")
    return lines


def _launch_tuple(launch: dict) -> dict:
    return {**launch, "grid": tuple(launch["grid"]), "block": tuple(launch["block"])}


# ------------------------------------------------------------------ shared pieces
def _signature(step: Step, graph: Graph, checked: bool) -> str:
    """The numba signature of the step's kernels: one flat contiguous array per argument."""
    types = [f"{TYPE_NAMES[graph.node(v).type.dtype]}[::1]" for v in step.inputs + step.outputs]
    if checked:
        types.append("int64[::1]")
    return f"void({', '.join(types)})"


def _arguments(step: Step, checked: bool = False) -> str:
    names = [f"in{k}" for k in range(len(step.inputs))] + [f"out{k}" for k in range(len(step.outputs))]
    return ", ".join(names + (["err"] if checked else []))


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _power_of_two_at_least(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


def grid_stride_launch(kernel: str, cells: int) -> Launch:
    """Blocks of up to MAX_BLOCK threads (a multiple of the warp), at most MAX_GRID blocks."""
    block = min(MAX_BLOCK, WARP * _ceil_div(max(cells, 1), WARP))
    grid = max(1, min(_ceil_div(cells, block), MAX_GRID))
    return Launch(kernel, (grid, 1, 1), (block, 1, 1))


def tree_block(extent: int) -> int:
    """Threads of a block-per-row kernel: a power of two (the tree halves it), one warp to MAX_BLOCK."""
    return min(MAX_BLOCK, max(WARP, _power_of_two_at_least(extent)))


def unflatten(flat: str, shape, prefix: str) -> tuple[list[str], list[str]]:
    """Statements splitting a row-major flat index into one index per axis, and the index names.

    Axes of size 1 get the index "0" and no statement; the outermost axis takes the quotient.
    """
    live = [axis for axis, size in enumerate(shape) if size != 1]
    names = [f"{prefix}{axis}" if size != 1 else "0" for axis, size in enumerate(shape)]
    lines = []
    rest = flat
    for position, axis in enumerate(reversed(live)):
        if position == len(live) - 1:
            lines.append(f"{names[axis]} = {rest}")
            break
        lines.append(f"{names[axis]} = {rest} % {shape[axis]}")
        lines.append(f"{prefix}rest = {rest} // {shape[axis]}")
        rest = f"{prefix}rest"
    return lines, names


def used(split: list[str], rest: list[str]) -> list[str]:
    """The statements of ``split`` (``name = expression`` lines) that ``rest`` needs, in order."""
    kept = list(split)
    changed = True
    while changed:
        changed = False
        for position, line in enumerate(kept):
            name = line.split(" = ", 1)[0]
            later = "\n".join(kept[position + 1:] + rest)
            if not re.search(rf"\b{re.escape(name)}\b", later):
                del kept[position]
                changed = True
                break
    return kept


def grid_stride_loop(cells: int, body: list[str], variable: str = "cell") -> list[str]:
    """A grid-stride loop over ``cells`` around ``body`` (kernel-level indentation)."""
    return ([f"{variable} = cuda.grid(1)", "stride = cuda.gridsize(1)", f"while {variable} < {cells}:"]
            + ["    " + line for line in body] + [f"    {variable} += stride"])


def kernel_source(name: str, arguments: str, body: list[str], doc: str = "") -> str:
    """The source of one ``@cuda.jit`` kernel ``name(arguments)`` with ``body`` (kernel-level lines)."""
    lines = ["", "", "@cuda.jit", f"def {name}({arguments}):"]
    if doc:
        lines.append(f'    """{doc}"""')
    lines.extend("    " + line if line else "" for line in body)
    return "\n".join(lines) + "\n"


def _zero_kernel(step: Step, sizes: dict[str, int], what: str, checked: bool = False) -> tuple[str, Launch]:
    """A kernel writing +0.0 into outputs (by argument name and size) before they are accumulated into."""
    cells = max(sizes.values())
    body: list[str] = []
    for name, size in sizes.items():
        if size < cells:
            body += [f"if cell < {size}:", f"    {name}[cell] = np.float32(0.0)"]
        else:
            body.append(f"{name}[cell] = np.float32(0.0)")
    source = kernel_source("zero", _arguments(step, checked), grid_stride_loop(cells, body), f"Clear {what}.")
    return source, grid_stride_launch("zero", cells)


def _argument_names(step: Step) -> dict[int, str]:
    """The kernel argument of each input value (a value read twice is one argument)."""
    return {value: f"in{k}" for k, value in enumerate(step.inputs)}


# ------------------------------------------------------------------ elementwise
def _render_elementwise(step: Step, graph: Graph, access: dict[int, Access]) -> Kernels:
    domain = elementwise_domain(graph, step.nodes)
    prelude, loops = unflatten("cell", domain, "i")
    arg_of = _argument_names(step)
    out_of = {id: f"out{k}" for k, id in enumerate(step.outputs)}
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

    def operand(value: int, node: Node) -> str:
        return operand_reference(graph, value, node, local, domain, loops, read)

    epilogues = [id for id in step.nodes if reduced_axes(graph, graph.node(id)) is not None]
    for number, id in enumerate(step.nodes):
        node = graph.node(id)
        if id in epilogues:
            kept = _reduction_index(graph, node, reduced_axes(graph, node), loops)
            flat = dense(id, node.type.shape).flat(kept)
            body.append(f"cuda.atomic.add({out_of[id]}, {flat}, {local[node.inputs[0]]})"
                        f"  # %{id} = {node.op} (epilogue)")
            continue
        expression = member_expression(node, [operand(o, node) for o in node.inputs])
        local[id] = f"v{number}"
        body.append(f"v{number} = {expression}  # %{id} = {node.op}")
    for id in step.outputs:
        if id in epilogues:
            continue
        if graph.node(id).type.numel == 1 and _numel(domain) != 1:
            body.append(f"if cell == 0:\n    {out_of[id]}[0] = {local[id]}  # one value for the whole group")
        else:
            body.append(f"{out_of[id]}[cell] = {local[id]}")
    body = [line for text in body for line in text.split("\n")]
    cells = _numel(domain)
    source = kernel_source("kernel", _arguments(step), grid_stride_loop(cells, used(prelude, body) + body))
    launches = [grid_stride_launch("kernel", cells)]
    summary = f"{len(step.nodes)} fused elementwise ops over [{','.join(map(str, domain))}]"
    if epilogues:
        sizes = {out_of[e]: graph.node(e).type.numel for e in epilogues}
        zero, launch = _zero_kernel(step, sizes, "the epilogue sums' outputs: the kernel adds into them")
        source = zero + source
        launches.insert(0, launch)
        summary += ", epilogue " + ", ".join(f"{graph.node(e).op} %{e}" for e in epilogues)
    return Kernels(summary, source, launches)


# ------------------------------------------------------------------ tree reductions
def tree_lines(operation: str, arrays: Sequence[str] = ("partial",)) -> list[str]:
    """Combine ``partial[0..BLOCK)`` into ``partial[0]``: halve the active threads each level.

    Several shared arrays (``arrays``) are combined level by level in one tree (one
    ``syncthreads`` per level for all of them). ``t`` is the thread index, BLOCK a power of two.
    """
    combine = []
    for array in arrays:
        combine += ([f"    other = {array}[t + half]", f"    if other > {array}[t]:", f"        {array}[t] = other"]
                    if operation == "max" else [f"    {array}[t] += {array}[t + half]"])
    return (["cuda.syncthreads()", "half = BLOCK // 2", "while half > 0:", "    if t < half:"]
            + ["    " + line for line in combine] + ["    cuda.syncthreads()", "    half //= 2"])


def _render_row(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> Kernels:
    """softmax / log_softmax along ``dim``: one block per row."""
    assert node.op in ROW_TEMPLATE_OPS, f"{node.op} is a row op without a cuda renderer (Lowering.cuda)"
    shape = graph.node(node.inputs[0]).type.shape
    dim = node.attr["dim"]
    columns = shape[dim]
    rows = _numel(shape) // max(columns, 1)
    block = tree_block(columns)
    row_shape = tuple(1 if axis == dim else size for axis, size in enumerate(shape))
    split, names = unflatten("row", row_shape, "r")
    index = list(names)
    index[dim] = "c"
    x = f"in0[{access[node.inputs[0]].flat(index)}]"
    out = f"out0[{dense(node.id, shape).flat(index)}]"
    log = node.op == "log_softmax"
    finish = (["log_total = math.log(total)"], f"{out} = ({x} - m) - log_total") if log else \
        ([], f"{out} = math.exp({x} - m) / total")

    def columns_loop(body: list[str]) -> list[str]:
        return ["c = t", f"while c < {columns}:"] + ["    " + line for line in body] + ["    c += BLOCK"]

    row_body = (["# the row's maximum"] + ["m = np.float32(-math.inf)"]
                + columns_loop([f"x = {x}", "if x > m:", "    m = x"])
                + ["partial[t] = m"] + tree_lines("max") + ["m = partial[0]", "cuda.syncthreads()"]
                + ["# the sum of exp(x - max)", "total = np.float32(0.0)"]
                + columns_loop([f"total += math.exp({x} - m)"])
                + ["partial[t] = total"] + tree_lines("sum") + ["total = partial[0]"] + finish[0]
                + [f"# the row of {node.op}"] + columns_loop([finish[1]])
                + ["cuda.syncthreads()  # partial is reused by the block's next row"])
    row_body = used(split, row_body) + row_body
    body = ([f"partial = cuda.shared.array({block}, numba.float32)", "t = cuda.threadIdx.x",
             "row = cuda.blockIdx.x", f"while row < {rows}:"]
            + ["    " + line for line in row_body] + ["    row += cuda.gridDim.x"])
    source = f"\nBLOCK = {block}\n" + kernel_source("kernel", _arguments(step), body, "One block per row.")
    launch = Launch("kernel", (max(1, min(rows, MAX_ROWS)), 1, 1), (block, 1, 1), 4 * block)
    return Kernels(f"{node.op} over dim {dim}: {rows} rows of {columns}", source, [launch])


def _reduced_axes_of(graph: Graph, node: Node) -> tuple[int, ...]:
    source = graph.node(node.inputs[0]).type.shape
    if node.op == "sum":
        return tuple(node.attr["dims"])
    return sum_to_size_axes(source, tuple(node.attr["shape"]))[1]


def _render_sum(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> Kernels:
    """sum / sum_to_size: the output element's kept indices, then a loop over the reduced ones."""
    shape = graph.node(node.inputs[0]).type.shape
    axes = set(_reduced_axes_of(graph, node))
    kept_shape = tuple(1 if axis in axes else size for axis, size in enumerate(shape))
    reduced_shape = tuple(size if axis in axes else 1 for axis, size in enumerate(shape))
    outputs, reduced = _numel(kept_shape), _numel(reduced_shape)
    kept_split, kept = unflatten("o", kept_shape, "k")
    reduced_split, summed = unflatten("q", reduced_shape, "s")
    index = [s if axis in axes else k for axis, (k, s) in enumerate(zip(kept, summed))]
    x = f"in0[{access[node.inputs[0]].flat(index)}]"
    what = f"{node.op} of [{','.join(map(str, shape))}] over axes {tuple(sorted(axes))}"
    if reduced < TREE_MIN_EXTENT:
        body = kept_split + ["total = np.float32(0.0)", f"for q in range({reduced}):"] + \
            ["    " + line for line in reduced_split] + [f"    total += {x}", "out0[o] = total"]
        source = kernel_source("kernel", _arguments(step), grid_stride_loop(outputs, body, "o"),
                         "One thread per output element, summing in order.")
        return Kernels(f"{what}: a thread per output element", source, [grid_stride_launch("kernel", outputs)])
    block = tree_block(reduced)
    inner = (kept_split + ["total = np.float32(0.0)", "q = t", f"while q < {reduced}:"]
             + ["    " + line for line in reduced_split] + [f"    total += {x}", "    q += BLOCK"]
             + ["partial[t] = total"] + tree_lines("sum")
             + ["if t == 0:", "    out0[o] = partial[0]", "cuda.syncthreads()  # partial is reused"])
    body = ([f"partial = cuda.shared.array({block}, numba.float32)", "t = cuda.threadIdx.x",
             "o = cuda.blockIdx.x", f"while o < {outputs}:"] + ["    " + line for line in inner]
            + ["    o += cuda.gridDim.x"])
    source = f"\nBLOCK = {block}\n" + kernel_source("kernel", _arguments(step), body,
                                               "One block per output element: a shared-memory tree.")
    launch = Launch("kernel", (max(1, min(outputs, MAX_ROWS)), 1, 1), (block, 1, 1), 4 * block)
    return Kernels(f"{what}: a block per output element", source, [launch])


# ------------------------------------------------------------------ matmul
def matmul_tile(rows: int, columns: int) -> int:
    """MATMUL_TILE, or the smallest power of two covering a smaller product (fewer idle threads)."""
    return min(MATMUL_TILE, max(2, _power_of_two_at_least(max(rows, columns))))


def _render_matmul(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> Kernels:
    """Tiled product: each block computes a TILE x TILE tile of one batch entry's output.

    Operands are read through their strides (a transposed operand is a permute
    view, never copied). Each tile is loaded with consecutive threads on the
    operand's contiguous axis, so global reads coalesce for either layout; the
    shared tiles have one padding column against bank conflicts.
    """
    a_id, b_id = node.inputs
    a_shape, b_shape, out_shape = graph.node(a_id).type.shape, graph.node(b_id).type.shape, node.type.shape
    m, k_size, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = out_shape[:-2]
    batches = _numel(batch)
    tile = matmul_tile(m, n)
    split, batch_index = unflatten("z", batch, "z")

    def operand_base(shape) -> list[str]:
        lead = len(batch) - (len(shape) - 2)
        return ["0" if size == 1 else batch_index[lead + axis] for axis, size in enumerate(shape[:-2])] + ["0", "0"]

    a_access, b_access = access[a_id], access[b_id]
    a_row, a_k = a_access.strides[-2], a_access.strides[-1]
    b_k, b_col = b_access.strides[-2], b_access.strides[-1]
    names = _argument_names(step)
    a_swap = a_row == 1 and a_k != 1  # a is stored column-major (e.g. a transposed view)
    b_swap = b_k == 1 and b_col != 1
    load_a = _tile_load("tile_a", names[a_id], "a_base", ("row0", a_row, m), ("k0", a_k, k_size), a_swap)
    load_b = _tile_load("tile_b", names[b_id], "b_base", ("k0", b_k, k_size), ("col0", b_col, n), b_swap)
    tiles = _ceil_div(k_size, tile)
    inner = ([f"a_base = {a_access.flat(operand_base(a_shape))}",
                f"b_base = {b_access.flat(operand_base(b_shape))}",
                f"out_base = z * {m * n}" if batches > 1 else "out_base = 0",
                "acc = np.float32(0.0)",
                f"for tile in range({tiles}):",
                "    k0 = tile * TILE"]
             + ["    " + line for line in load_a + load_b]
             + ["    cuda.syncthreads()",
                "    for kk in range(TILE):",
                "        acc += tile_a[ty, kk] * tile_b[kk, tx]",
                "    cuda.syncthreads()",
                f"if row < {m} and col < {n}:",
                f"    out0[out_base + row * {n} + col] = acc"])
    inner = used(split, inner) + inner
    body = (["tile_a = cuda.shared.array((TILE, PADDED), numba.float32)",
             "tile_b = cuda.shared.array((TILE, PADDED), numba.float32)",
             "tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y",
             "row0 = cuda.blockIdx.y * TILE", "col0 = cuda.blockIdx.x * TILE",
             "row = row0 + ty", "col = col0 + tx",
             "z = cuda.blockIdx.z", f"while z < {batches}:"]
            + ["    " + line for line in inner] + ["    z += cuda.gridDim.z"])
    constants = f"\nTILE = {tile}\nPADDED = {tile + 1}  # a padding column against shared-memory bank conflicts\n"
    source = constants + kernel_source("kernel", _arguments(step), body,
                                             "One output element per thread, TILE x TILE tiles in shared memory.")
    grid = (_ceil_div(n, tile) or 1, _ceil_div(m, tile) or 1, max(1, min(batches, MAX_ROWS)))
    launch = Launch("kernel", grid, (tile, tile, 1), 2 * tile * (tile + 1) * 4)
    layout = ", ".join(f"{name} strides {tuple(a.strides[-2:])}{' (column-major loads)' if swap else ''}"
                       for name, a, swap in (("a", a_access, a_swap), ("b", b_access, b_swap)))
    batch_text = f"{batches} x " if batch else ""
    return Kernels(f"matmul {batch_text}[{m},{k_size}] @ [{k_size},{n}], {tile}x{tile} tiles; {layout}",
                   source, [launch])


def _tile_load(tile: str, array: str, base: str, first: tuple[str, int, int], second: tuple[str, int, int],
               swap: bool) -> list[str]:
    """Load ``tile[i, j] = operand[first + i, second + j]`` (zero outside the operand).

    ``first`` and ``second`` are (start, stride, size) of the tile's two axes. Thread x
    walks the second axis, or the first when ``swap`` (that axis is the contiguous one).
    """
    (start0, stride0, size0), (start1, stride1, size1) = first, second
    i, j = ("tx", "ty") if swap else ("ty", "tx")
    return [f"p = {start0} + {i}",
            f"q = {start1} + {j}",
            f"if p < {size0} and q < {size1}:",
            f"    {tile}[{i}, {j}] = {array}[{_element(base, ('p', stride0), ('q', stride1))}]",
            "else:",
            f"    {tile}[{i}, {j}] = np.float32(0.0)"]


def _element(base: str, *terms: tuple[str, int]) -> str:
    """``base + i * stride + ...``, leaving out stride-0 (broadcast) terms."""
    parts = [base] + [name if stride == 1 else f"{name} * {stride}" for name, stride in terms if stride]
    return " + ".join(parts)


# ------------------------------------------------------------------ gather and scatter
def _range_check(op: str, size: int) -> str:
    return f"{op}: index {{index}} is out of range for a dimension of size {size}"


def _checked_read(index_read: str, size: int, on_error: list[str], on_success: list[str]) -> list[str]:
    """Read an index; outside [0, size) record it in ``err`` (flag, value) instead of using it."""
    return ([f"j = {index_read}", f"if j < 0 or j >= {size}:", "    err[0] = 1", "    err[1] = j"]
            + ["    " + line for line in on_error] + ["else:"] + ["    " + line for line in on_success])


def _render_gather(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> Kernels:
    """index_select / gather: one output element per thread; the index picks the element along dim."""
    x_id, index_id = node.inputs
    dim = node.attr["dim"]
    shape = node.type.shape
    size = graph.node(x_id).type.shape[dim]
    split, names = unflatten("cell", shape, "o")
    index_shape = graph.node(index_id).type.shape
    if node.op == "index_select":
        index_read = access[index_id].flat([names[dim]] if index_shape else [])
    else:
        index_read = access[index_id].flat(names)
    source_index = list(names)
    source_index[dim] = "j"
    x_in, i_in = _argument_names(step)[x_id], _argument_names(step)[index_id]
    body = _checked_read(f"{i_in}[{index_read}]", size, ["out0[cell] = np.float32(0.0)"],
                         [f"out0[cell] = {x_in}[{access[x_id].flat(source_index)}]"])
    body = used(split, body) + body
    cells = _numel(shape)
    source = kernel_source("kernel", _arguments(step, checked=True), grid_stride_loop(cells, body),
                     f"{node.op} along dim {dim}; a bad index sets err.")
    return Kernels(f"{node.op} along dim {dim}", source, [grid_stride_launch("kernel", cells)],
                   check=_range_check(node.op, size))


def _render_scatter(step: Step, graph: Graph, access: dict[int, Access], node: Node) -> Kernels:
    """index_add / scatter_add (atomic adds) and index_scatter (stores) into a cleared output."""
    shape = node.type.shape
    source_id = node.inputs[0]
    source_shape = graph.node(source_id).type.shape
    split, names = unflatten("cell", source_shape, "s")
    value = f"in0[{access[source_id].flat(names)}]"
    out_dense = dense(node.id, shape)
    checked = node.op != "index_scatter"
    check = ""
    if node.op == "index_scatter":
        body = [f"out0[{indexed(out_dense, node.attr['spec']).flat(names)}] = {value}"]
    else:
        dim = node.attr["dim"]
        index_id = node.inputs[1]
        if node.op == "index_add":
            index_shape = graph.node(index_id).type.shape
            index_read = access[index_id].flat([names[dim]] if index_shape else [])
        else:
            index_read = access[index_id].flat(names)
        target = list(names)
        target[dim] = "j"
        body = _checked_read(f"in1[{index_read}]", shape[dim], [],
                             [f"cuda.atomic.add(out0, {out_dense.flat(target)}, {value})"])
        check = _range_check(node.op, shape[dim])
    body = used(split, body) + body
    cells = _numel(source_shape)
    zero, zero_launch = _zero_kernel(step, {"out0": _numel(shape)}, f"the output of {node.op}", checked)
    what = "atomic adds" if checked else "stores"
    source = zero + kernel_source("kernel", _arguments(step, checked), grid_stride_loop(cells, body),
                            f"{node.op}: one source element per thread ({what}).")
    return Kernels(f"{node.op} into [{','.join(map(str, shape))}] ({what})", source,
                   [zero_launch, grid_stride_launch("kernel", cells)], check=check)


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
    source = kernel_source("kernel", _arguments(step), grid_stride_loop(cells, body), f"Copy of {node.op} %{node.id}.")
    return Kernels(f"{node.op} copied into its own buffer", source, [grid_stride_launch("kernel", cells)])
