"""Matrix products: torch.matmul on operands of two or more dimensions with
broadcast batch dimensions (the tracer handles 1-D promotion)."""
from __future__ import annotations

import numpy as np

from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit
from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op, require_float

MATMUL_TILE = 16


def _infer_matmul(types, attrs):
    a, b = types
    require_float(types, "matmul")
    if a.ndim < 2 or b.ndim < 2:
        raise InferError("matmul operands need two or more dimensions (1-D is promoted by the tracer)")
    if a.shape[-1] != b.shape[-2]:
        raise InferError(f"inner dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.with_shape(batch + (a.shape[-2], b.shape[-1]))


def _swap_last(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def vjp_matmul(b, node, grad, needs):
    """d (A @ B) = (g @ B^T, A^T @ g), each summed over broadcast batch dims.

    A frozen (constant) operand gets no product at all.
    """
    x, y = node.inputs
    grad_x = grad_y = None
    if needs[0]:
        y_t = b.permute(y, _swap_last(len(b.shape(y))))
        grad_x = b.sum_to_size(b.matmul(grad, y_t), b.shape(x))
    if needs[1]:
        x_t = b.permute(x, _swap_last(len(b.shape(x))))
        grad_y = b.sum_to_size(b.matmul(x_t, grad), b.shape(y))
    return (grad_x, grad_y)


# ------------------------------------------------------------------ cuda kernels
def matmul_tile(rows: int, columns: int) -> int:
    """MATMUL_TILE, or the smallest power of two covering a smaller product (fewer idle threads)."""
    return min(MATMUL_TILE, max(2, kit.power_of_two_at_least(max(rows, columns))))


def _cuda_matmul(op: kit.CudaNode) -> kit.Kernels:
    """Tiled product: each block computes a TILE x TILE tile of one batch entry's output.

    Operands are read through their strides (a transposed operand is a permute
    view, never copied). Each tile is loaded with consecutive threads on the
    operand's contiguous axis, so global reads coalesce for either layout; the
    shared tiles have one padding column against bank conflicts.
    """
    a_shape, b_shape, out_shape = op.shapes[0], op.shapes[1], op.shape
    m, k_size, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = out_shape[:-2]
    batches = numel(batch)
    tile = matmul_tile(m, n)
    split, batch_index = kit.unflatten("z", batch, "z")

    def operand_base(shape) -> list[str]:
        lead = len(batch) - (len(shape) - 2)
        return ["0" if size == 1 else batch_index[lead + axis] for axis, size in enumerate(shape[:-2])] + ["0", "0"]

    a_access, b_access = op.accesses
    a_row, a_k = a_access.strides[-2], a_access.strides[-1]
    b_k, b_col = b_access.strides[-2], b_access.strides[-1]
    a_swap = a_row == 1 and a_k != 1  # a is stored column-major (e.g. a transposed view)
    b_swap = b_k == 1 and b_col != 1
    # Each extent is read from an array's length where one holds exactly that axis times its stride
    # (a whole operand whose leading axis it is, as a batch usually is): one source, and one cubin,
    # for every batch size (kit.length_of); the other extents stay literals.
    lengths, total = (*op.lengths, 0, 0)[:2], numel(out_shape)
    extents = {"rows": _runtime_extent(m, [(op.names[0], lengths[0], a_row), ("out0", total, n)]),
               "depth": _runtime_extent(k_size, [(op.names[0], lengths[0], a_k), (op.names[1], lengths[1], b_k)]),
               "columns": _runtime_extent(n, [(op.names[1], lengths[1], b_col), ("out0", total, 1)])}
    rows, depth, columns = (name if isinstance(value, str) else str(value) for name, value in extents.items())
    read_extents = [f"{name} = {value}" for name, value in extents.items() if isinstance(value, str)]
    load_a = _tile_load("tile_a", op.names[0], "a_base", ("row0", a_row, rows), ("k0", a_k, depth), a_swap)
    load_b = _tile_load("tile_b", op.names[1], "b_base", ("k0", b_k, depth), ("col0", b_col, columns), b_swap)
    tiles = "(depth + TILE - 1) // TILE" if depth == "depth" else kit.ceil_div(k_size, tile)
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
                f"if row < {rows} and col < {columns}:",
                f"    out0[out_base + row * {columns} + col] = acc"])
    inner = kit.used(split, inner) + inner
    # column tiles on grid.x (up to 2^31 blocks); row tiles on y and batch entries on z, which take
    # at most 65535 blocks each: past that each block loops (kit.block_loop)
    row_tiles = kit.ceil_div(m, tile) or 1
    per_tile = ["row0 = row_tile * TILE", "row = row0 + ty"] + inner
    row_loop = kit.block_loop("row_tile", "y", row_tiles, per_tile,
                              "(rows + TILE - 1) // TILE" if rows == "rows" else None)
    body = (["tile_a = cuda.shared.array((TILE, PADDED), numba.float32)",
             "tile_b = cuda.shared.array((TILE, PADDED), numba.float32)",
             "tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y"] + read_extents
            + ["col0 = cuda.blockIdx.x * TILE", "col = col0 + tx"]
            + kit.block_loop("z", "z", batches, row_loop))
    constants = f"\nTILE = {tile}\nPADDED = {tile + 1}  # a padding column against shared-memory bank conflicts\n"
    source = constants + kit.kernel_source("kernel", op.arguments, body,
                                             "One output element per thread, TILE x TILE tiles in shared memory.")
    grid = (kit.ceil_div(n, tile) or 1, kit.grid_blocks(row_tiles), kit.grid_blocks(batches))
    launch = kit.Launch("kernel", grid, (tile, tile, 1), 2 * tile * (tile + 1) * 4)
    layout = ", ".join(f"{name} strides {tuple(a.strides[-2:])}{' (column-major loads)' if swap else ''}"
                       for name, a, swap in (("a", a_access, a_swap), ("b", b_access, b_swap)))
    batch_text = f"{batches} x " if batch else ""
    return kit.Kernels(f"matmul {batch_text}[{m},{k_size}] @ [{k_size},{n}], {tile}x{tile} tiles; {layout}",
                   source, [launch])


def _runtime_extent(size: int, places: list[tuple[str, int, int]]) -> int | str:
    """``size`` read at run time from the first of ``places`` (array, its length, the axis' stride
    there) whose length is exactly ``size`` times the stride, else the literal."""
    for name, length, stride in places:
        if stride > 0 and length == size * stride:
            return f"{name}.shape[0]" if stride == 1 else f"{name}.shape[0] // {stride}"
    return size


def _tile_load(tile: str, array: str, base: str, first: tuple[str, int, int | str],
               second: tuple[str, int, int | str],
               swap: bool) -> list[str]:
    """Load ``tile[i, j] = operand[first + i, second + j]`` (zero outside the operand).

    ``first`` and ``second`` are (start, stride, size: a count or a kernel variable) of the tile's
    two axes. Thread x
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


def _cpu_matmul(attrs, ins, out) -> str:
    """numpy's BLAS at one thread, bendc's pool above (runtime/native/products.py: one sgemm a block
    of the output). A batch of rows times one matrix ((..., m, k) @ (k, n)) is one (rows, k) @ (k, n)
    product: numpy's broadcast matmul makes one BLAS call per batch entry (and takes a slower path
    for some layouts), one call over all rows is 2-3x faster on the shapes of a transformer."""
    a, b = ins
    if a.ndim > 2 and b.ndim == 2:
        k, n = a.shape[-1], b.shape[-1]
        # the row count from the shape where k > 0 (one source for every batch size)
        rows = f"in0.size // {k}" if k else str(out.numel // max(n, 1))
        return (_PRODUCTS + "def kernel(in0, in1, out0):\n"
                f"    # (..., m, k) @ (k, n) as one (rows, {k}) @ ({k}, {n}) product\n"
                f"    rows = {rows}\n"
                f"    bendc_matmul(in0.reshape(rows, {k}), in1, out0.reshape(rows, {n}))\n")
    if a.ndim == 2 and b.ndim == 2:
        return _PRODUCTS + "def kernel(in0, in1, out0):\n    bendc_matmul(in0, in1, out0)\n"
    return "def kernel(in0, in1, out0):\n    np.matmul(in0, in1, out=out0)\n"


# matrices' products on bendc's thread pool at numba's thread count above 1 (runtime/native/products.py)
_PRODUCTS = "from runtime.native.products import matmul as bendc_matmul\n\n\n"


define_op(
    name="matmul",
    arity=2,
    infer=_infer_matmul,
    reference=lambda v, a: np.ascontiguousarray(np.matmul(v[0], v[1]), dtype=np.float32),
    lowering=Lowering("matmul", cpu=_cpu_matmul, cuda=_cuda_matmul),
    vjp=vjp_matmul,
    doc="`%2 = matmul %0, %1 : f32[32,16]`: batched matrix product with broadcast batch dims.",
)
