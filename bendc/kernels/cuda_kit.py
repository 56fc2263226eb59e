"""Writing numba.cuda kernels: launches, loops, tree reductions, kernel sources and limits.

An op's own cuda lowering (``Lowering.cuda`` in its op file) is given a
:class:`CudaNode` (the node, how to read each operand in place, the kernel's
argument list) and returns :class:`Kernels`: the source of one or more
``@cuda.jit`` functions and how to launch them. Generated kernels keep
PyTorch's numbers: float32 constants (``np.float32(...)``), ``math.*``
functions, no fastmath.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from bendc.ir.graph import Node
from bendc.kernels.access import Access, reshaped
from runtime.dtypes import numel

# Every generated kernel is compiled without link-time optimization: with LTO (numba-cuda's
# default where nvJitLink is present) machine code is made inside nvJitLink, which never sees
# NVVM's fma=False and contracts a*b+c into FFMA (tests/cuda/test_sass.py shows both). Kernels
# are decorated with ``@jit``, which a generated module defines as JIT_DEFINITION says: the
# options go through functools.partial because numba-cuda 0.30.4's ``@cuda.jit(lto=False)``
# form drops ``lto`` (its autojitwrapper does not pass it on); numba's simulator has no linker
# and takes no ``lto``.
JIT_DEFINITION = "jit = cuda.jit if numba.config.ENABLE_CUDASIM else functools.partial(cuda.jit, lto=False)"
KERNEL_DECORATOR = "@jit"
FASTMATH_DECORATOR = "@functools.partial(jit, fastmath=True)"

WARP = 32
MAX_BLOCK = 256   # threads per block for grid-stride and tree kernels
MAX_GRID = 4096   # blocks of a grid-stride kernel (each thread then loops)
MAX_ROWS = 65535  # blocks of a block-per-row kernel (each block then loops); grid.y and grid.z blocks
MAX_SHARED_BYTES = 48 * 1024  # static shared memory a block may declare
# The launch limits of every CUDA GPU since compute capability 3.0 (the CUDA programming guide's
# "Technical Specifications"): grid.x < 2^31, grid.y and grid.z <= 65535, 1024 threads a block
# (z at most 64). A launch past them fails with CUDA_ERROR_INVALID_VALUE.
LIMIT_GRID = (2**31 - 1, 65535, 65535)
LIMIT_BLOCK = (1024, 1024, 64)
LIMIT_BLOCK_THREADS = 1024


@dataclass
class Launch:
    """One kernel launch of a step: ``kernel[grid, block]`` with static shared memory."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0

    def __post_init__(self) -> None:
        assert launch_limits_broken(self.grid, self.block) == [], \
            f"{self.kernel}[grid={self.grid}, block={self.block}]: {launch_limits_broken(self.grid, self.block)}"

    @property
    def threads(self) -> int:
        return numel(self.grid + self.block)

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
    scratch: int = 0  # float32 cells of a scratch array the kernels take after the outputs (CudaNode.scratch)


@dataclass(frozen=True)
class CudaNode:
    """What an op's own cuda renderer (``Lowering.cuda``) is given: one node of a step, how to read
    each of its operands (argument name and strided access, so views are read in place) and the
    kernel argument lists. The renderer returns :class:`Kernels`; its kernels take ``arguments``
    (``in0..``, ``out0``), or ``checked_arguments`` (``..., err``) when they check indices, and
    write ``out0`` densely in row-major order.
    """

    node: Node
    shapes: tuple[tuple[int, ...], ...]  # of node.inputs, in operand order
    names: tuple[str, ...]               # the kernel argument holding each operand (one per value)
    accesses: tuple[Access, ...]         # where each operand's elements are in that argument
    arguments: str
    checked_arguments: str
    lengths: tuple[int, ...] = ()        # the elements of each operand's argument (the window of its root it reads)
    # The argument list with a float32 scratch array after the outputs, and its name, for kernels that
    # return ``Kernels(scratch=cells)``: the memory plan gives the step that many cells of a temporary
    # buffer, live during the step only (bendc/codegen/cuda.py render_step). No index check with it.
    scratch_arguments: str = ""
    scratch: str = ""

    @property
    def attrs(self) -> dict:
        return self.node.attr

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.type.shape

    def count(self, count: int, per: int = 1) -> int | str:
        """``count`` read from the length of an argument holding exactly that many elements, or that
        many runs of ``per`` (out0 first, then the operands: length_of), so the kernel serves every
        such size."""
        arrays = [("out0", numel(self.shape))] + list(zip(self.names, self.lengths))
        return length_of(count, arrays, per)

    def read(self, operand: int, index: Sequence[str]) -> str:
        """The element of operand ``operand`` at one index expression per axis ("0" for a fixed axis)."""
        return f"{self.names[operand]}[{self.accesses[operand].flat(index)}]"

    def read_rows(self, operand: int, lead: int, row: str, column: str, prefix: str) -> tuple[list[str], str]:
        """Operand ``operand`` as a matrix: its first ``lead`` axes flattened into rows, the rest into
        columns. Returns the statements that split ``row`` and ``column`` into axis indexes (none
        where strides describe the matrix, as for any contiguous operand) and the element read."""
        shape = self.shapes[operand]
        rows, columns = numel(shape[:lead]), numel(shape[lead:])
        matrix = reshaped(self.accesses[operand], shape, (rows, columns))
        if matrix is not None:
            return [], f"{self.names[operand]}[{matrix.flat([row, column])}]"
        row_split, row_names = unflatten(row, shape[:lead], f"{prefix}r")
        column_split, column_names = unflatten(column, shape[lead:], f"{prefix}c")
        return row_split + column_split, self.read(operand, row_names + column_names)


def argument_list(inputs: int, outputs: int, checked: bool = False) -> str:
    """``in0, .., out0, ..`` (and ``err``, two int64 words, for kernels that check indices)."""
    names = [f"in{k}" for k in range(inputs)] + [f"out{k}" for k in range(outputs)]
    return ", ".join(names + (["err"] if checked else []))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def power_of_two_at_least(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


def launch_limits_broken(grid: Sequence[int], block: Sequence[int]) -> list[str]:
    """What a launch configuration breaks of the GPU's limits (LIMIT_GRID, LIMIT_BLOCK,
    LIMIT_BLOCK_THREADS); empty when it may be launched."""
    broken = [f"grid.{axis} = {size} not in [1, {limit}]" for axis, size, limit in zip("xyz", grid, LIMIT_GRID)
              if not 1 <= size <= limit]
    broken += [f"block.{axis} = {size} not in [1, {limit}]" for axis, size, limit in zip("xyz", block, LIMIT_BLOCK)
               if not 1 <= size <= limit]
    if numel(tuple(block)) > LIMIT_BLOCK_THREADS:
        broken.append(f"{numel(tuple(block))} threads a block > {LIMIT_BLOCK_THREADS}")
    return broken


def block_loop(variable: str, axis: str, count: int, body: list[str], runtime: str | None = None) -> list[str]:
    """``body`` for each ``variable`` in range(``count``), a value per block along the grid's ``axis``
    (y or z: at most MAX_ROWS blocks, grid_blocks gives the launch's size). Past MAX_ROWS values each
    block loops, ``gridDim`` values apart; every thread of a block takes the same iterations, so
    ``syncthreads`` inside stays safe. Within the limit it is one assignment (no loop). ``runtime``:
    the count as the kernel computes it (from its arrays' lengths), for the loop's bound."""
    if count <= MAX_ROWS:
        return [f"{variable} = cuda.blockIdx.{axis}"] + body
    return ([f"{variable} = cuda.blockIdx.{axis}", f"while {variable} < {runtime or count}:"]
            + ["    " + line for line in body] + [f"    {variable} += cuda.gridDim.{axis}"])


def grid_blocks(count: int) -> int:
    """The blocks along grid.y or grid.z of a block_loop over ``count`` values."""
    return max(1, min(count, MAX_ROWS))


def grid_stride_launch(kernel: str, cells: int) -> Launch:
    """Blocks of up to MAX_BLOCK threads (a multiple of the warp), at most MAX_GRID blocks."""
    block = min(MAX_BLOCK, WARP * ceil_div(max(cells, 1), WARP))
    grid = max(1, min(ceil_div(cells, block), MAX_GRID))
    return Launch(kernel, (grid, 1, 1), (block, 1, 1))


def block_per_row_launch(kernel: str, rows: int, block: int, shared_bytes: int) -> Launch:
    """One block per row (at most MAX_ROWS blocks; each block then loops over rows)."""
    return Launch(kernel, (max(1, min(rows, MAX_ROWS)), 1, 1), (block, 1, 1), shared_bytes)


def tree_block(extent: int) -> int:
    """Threads of a block-per-row kernel: a power of two (the tree halves it), one warp to MAX_BLOCK."""
    return min(MAX_BLOCK, max(WARP, power_of_two_at_least(extent)))


def sum_block(extent: int, over_leading: bool) -> int:
    """BLOCK of a kernel summing ``extent`` cells a block (the size of its shared array): tree_block,
    but MAX_BLOCK for a sum over the leading axis (the batch, usually), whose extent grows with it:
    BLOCK is a constant of the kernel's source, which then serves every batch size (length_of).
    Such a kernel strides and halves by its launch's block, sized from this batch (sum_threads): a
    sum over a batch of 4 is one warp a block, not 256 threads."""
    return MAX_BLOCK if over_leading else tree_block(extent)


def sum_threads(block: int, extent: int, over_leading: bool) -> tuple[str, int]:
    """(the thread count a sum kernel of BLOCK ``block`` strides by and its tree halves from, the
    launch's threads): BLOCK for both, but for a sum over the leading axis ``cuda.blockDim.x`` and
    tree_block of this shape's ``extent`` (a power of two up to BLOCK, which is then MAX_BLOCK)."""
    return ("cuda.blockDim.x", tree_block(extent)) if over_leading else ("BLOCK", block)


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


def length_of(count: int, arrays: Sequence[tuple[str, int]], per: int = 1) -> int | str:
    """``count`` as a kernel should write it: the length of the first of ``arrays`` (kernel argument,
    elements of its flat array) that holds exactly ``count`` elements (``out0.shape[0]``), or
    ``count`` runs of ``per`` elements (``out0.shape[0] // per``: the rows of a row kernel), else the
    literal. A kernel that reads its cell count from an array's length has one source for every
    size of that array, so a new batch size reuses its module and cubin (as the cpu kernels read
    their loop extents from shapes); the launch's grid is sized from the shapes when it is rendered."""
    for name, length in arrays:
        if per > 0 and length == count * per:
            return f"{name}.shape[0]" if per == 1 else f"{name}.shape[0] // {per}"
    return count


def grid_stride_loop(cells: int | str, body: list[str], variable: str = "cell") -> list[str]:
    """A grid-stride loop over ``cells`` (a count, or an expression: length_of) around ``body``
    (kernel-level indentation)."""
    return ([f"{variable} = cuda.grid(1)", "stride = cuda.gridsize(1)", f"while {variable} < {cells}:"]
            + ["    " + line for line in body] + [f"    {variable} += stride"])


def bounded_decorator(threads: int, blocks: int) -> str:
    """A kernel decorator with launch bounds: at most ``threads`` a block and at least ``blocks``
    resident per SM, so NVVM and ptxas keep the kernel within 65536 / (threads x blocks)
    registers a thread (numba-cuda's ``launch_bounds``; the simulator takes none). The
    ahead-of-time build reads them back from the dispatcher (codegen/ptx.py jit_options)."""
    return (f"@(jit if numba.config.ENABLE_CUDASIM else functools.partial(jit, launch_bounds=({threads}, {blocks})))")


def kernel_source(name: str, arguments: str, body: list[str], doc: str = "",
                  decorator: str = KERNEL_DECORATOR) -> str:
    """The source of one ``@cuda.jit`` kernel ``name(arguments)`` with ``body`` (kernel-level lines)."""
    lines = ["", "", decorator, f"def {name}({arguments}):"]
    if doc:
        lines.append(f'    """{doc}"""')
    lines.extend("    " + line if line else "" for line in body)
    return "\n".join(lines) + "\n"


def zero_kernel(arguments: str, sizes: dict[str, int], what: str, word: str = "0.0") -> tuple[str, Launch]:
    """A kernel writing +0.0 (or ``word``: "-0.0", the identity of +) into outputs (by argument name and
    size) before they are accumulated into."""
    cells = max(sizes.values())
    body: list[str] = []
    for name, size in sizes.items():  # each output's length is its array's (length_of): any size
        if size < cells:
            body += [f"if cell < {name}.shape[0]:", f"    {name}[cell] = np.float32({word})"]
        else:
            body.append(f"{name}[cell] = np.float32({word})")
    largest = next(name for name, size in sizes.items() if size == cells)
    source = kernel_source("zero", arguments, grid_stride_loop(f"{largest}.shape[0]", body), f"Clear {what}.")
    return source, grid_stride_launch("zero", cells)


def tree_lines(operation: str, arrays: Sequence[str] = ("partial",), width: str = "BLOCK") -> list[str]:
    """Combine ``partial[0..width)`` into ``partial[0]``: halve the active threads each level.

    Several shared arrays (``arrays``) are combined level by level in one tree (one
    ``syncthreads`` per level for all of them). ``t`` is the thread index, ``width`` (BLOCK, or the
    launch's ``cuda.blockDim.x``: see sum_threads) a power of two.
    """
    combine = []
    for array in arrays:
        combine += ([f"    other = {array}[t + half]", f"    if other > {array}[t]:", f"        {array}[t] = other"]
                    if operation == "max" else [f"    {array}[t] += {array}[t + half]"])
    return (["cuda.syncthreads()", f"half = {width} // 2", "while half > 0:", "    if t < half:"]
            + ["    " + line for line in combine] + ["    cuda.syncthreads()", "    half //= 2"])


def checked_read(index_read: str, size: int, on_error: list[str], on_success: list[str]) -> list[str]:
    """Read an index; outside [0, size) record it in ``err`` (flag, value) instead of using it."""
    return ([f"j = {index_read}", f"if j < 0 or j >= {size}:", "    err[0] = 1", "    err[1] = j"]
            + ["    " + line for line in on_error] + ["else:"] + ["    " + line for line in on_success])


def scatter_kernels(op: CudaNode, split: list[str], body: list[str], what: str, checked: bool,
                    check: str = "", word: str = "0.0") -> Kernels:
    """A scatter into a cleared output (+0.0 words, or ``word``): a ``zero`` kernel, then ``body`` once
    per element of the source (operand 0; ``split`` gives its indexes from ``cell``)."""
    node = op.node
    body = used(split, body) + body
    cells = numel(op.shapes[0])
    arguments = op.checked_arguments if checked else op.arguments
    zero, zero_launch = zero_kernel(arguments, {"out0": numel(op.shape)}, f"the output of {node.op}", word)
    source = zero + kernel_source("kernel", arguments, grid_stride_loop(op.count(cells), body),
                                  f"{node.op}: one source element per thread ({what}).")
    return Kernels(f"{node.op} into [{','.join(map(str, op.shape))}] ({what})", source,
                   [zero_launch, grid_stride_launch("kernel", cells)], check=check)
