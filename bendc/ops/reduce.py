"""Reductions: sum over dims, sum_to_size (autodiff's broadcast reduction),
and the row ops softmax and log_softmax."""
from __future__ import annotations

import numpy as np

from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import lane_max, njit_decorator, row_lanes, sum_kernel
from bendc.kernels.access import dense
from bendc.ops.base import OPS, InferError, Lowering, define_op, normalize_dims, require_float

TREE_MIN_EXTENT = 64  # on cuda, a sum over at least this many elements gets a block per output element


def _keepdim_shape(shape, dims):
    return tuple(1 if axis in dims else d for axis, d in enumerate(shape))


def _infer_sum(types, attrs):
    (x,) = types
    require_float(types, "sum")
    return x.with_shape(summed_shape(x, attrs, "sum"))


def summed_shape(x, attrs, op: str) -> tuple[int, ...]:
    """The shape of x summed over ``attrs["dims"]`` (sorted, distinct, non-negative), kept as size 1
    with ``attrs["keepdim"]`` (sum and int_sum)."""
    dims = tuple(attrs["dims"])
    if normalize_dims(dims, x.ndim) != dims:
        raise InferError(f"{op} dims {dims} must be sorted, distinct and non-negative")
    if attrs["keepdim"]:
        return _keepdim_shape(x.shape, dims)
    return tuple(d for axis, d in enumerate(x.shape) if axis not in dims)


def _reference_sum(values, attrs):
    """float64 accumulation rounded once to float32, as the cpu kernels' sums (in another order:
    numpy's pairwise float64 sum; the two round to the same float32 but at a near-tie): numpy's
    float32 sum is sequential along a strided axis and drifts past torch's cascade sum."""
    (x,) = values
    total = np.sum(x, axis=tuple(attrs["dims"]), keepdims=attrs["keepdim"], dtype=np.float64)
    return np.asarray(total, dtype=np.float32)


def vjp_sum(b, node, grad, needs):
    """d sum(a, dims) = expand(unsqueeze(g, dims), a.shape): PyTorch's sum_backward."""
    x = node.inputs[0]
    shape = b.shape(x)
    if not node.attr["keepdim"]:
        grad = b.reshape(grad, _keepdim_shape(shape, node.attr["dims"]))
    return (b.expand(grad, shape),)


def _cpu_sum(attrs, ins, out):
    """An unfused sum is a fused kernel's epilogue sum over a loop nest reading x (cpu_kit.sum_kernel:
    float64, in lanes over the innermost loop, chunked when parallel; rounded once to float32)."""
    dims = tuple(attrs["dims"])
    if not dims:
        return "def kernel(in0, out0):\n    out0[...] = in0\n"
    keep = attrs["keepdim"]
    kept = [("0" if axis in dims else f"i{axis}") for axis in range(ins[0].ndim) if keep or axis not in dims]
    return sum_kernel(ins[0].shape, dims, kept, "sum")


def _sum_reduced_axes(in_shape, attrs):
    return tuple(attrs["dims"])


def _cuda_sum(op):
    """sum / sum_to_size over the axes the op reduces (cuda_line_sum), in float32."""
    return cuda_line_sum(op, set(OPS[op.node.op].reduced_axes(op.shapes[0], op.attrs)), "float32")


def cuda_line_sum(op, axes: set[int], accumulator: str):
    """A sum over ``axes`` of operand 0 in ``accumulator`` (numba's float32, or int64 for int_sum): the
    output element's kept indices, then a loop over the reduced ones.

    A large reduced extent (TREE_MIN_EXTENT or more), or any sum over the leading axis (the batch:
    the kernel's source then serves every batch size), gets a block per output element and a
    shared-memory tree; a small one a thread per output element summing its elements in order.
    Over the batch the block is sized at render from this batch, the source holding MAX_BLOCK for
    its shared array and striding by cuda.blockDim.x (kit.sum_threads).
    """
    shape = op.shapes[0]
    zero = "np.float32(0.0)" if accumulator == "float32" else f"np.{accumulator}(0)"
    kept_shape = tuple(1 if axis in axes else size for axis, size in enumerate(shape))
    reduced_shape = tuple(size if axis in axes else 1 for axis, size in enumerate(shape))
    outputs, reduced = numel(kept_shape), numel(reduced_shape)
    kept_split, kept = kit.unflatten("o", kept_shape, "k")
    reduced_split, summed = kit.unflatten("q", reduced_shape, "s")
    index = [s if axis in axes else k for axis, (k, s) in enumerate(zip(kept, summed))]
    x = op.read(0, index)
    if accumulator != "float32":  # an integer or bool operand, each cast as it is added
        x = f"np.{accumulator}({x})"
    what = f"{op.node.op} of [{','.join(map(str, shape))}] over axes {tuple(sorted(axes))}"
    # the output elements and the cells each sums, read from the arrays' lengths where they tell
    # (kit.length_of): one source for every batch size, reduced or kept
    count = op.count(outputs)
    cells = op.count(numel(shape))
    per_output = f"{cells} // {count}" if isinstance(cells, str) and isinstance(count, str) else reduced
    over_leading = 0 in axes and shape[0] > 1  # a sum over the batch: a tree of kit.sum_block threads
    if reduced < TREE_MIN_EXTENT and not over_leading:
        body = kept_split + [f"total = {zero}", f"for q in range({per_output}):"] + \
            ["    " + line for line in reduced_split] + [f"    total += {x}", "out0[o] = total"]
        source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(count, body, "o"),
                                   "One thread per output element, summing in order.")
        return kit.Kernels(f"{what}: a thread per output element", source,
                           [kit.grid_stride_launch("kernel", outputs)])
    block = kit.sum_block(reduced, over_leading)
    width, threads = kit.sum_threads(block, reduced, over_leading)
    inner = (kept_split + [f"total = {zero}", "q = t", "while q < reduced:"]
             + ["    " + line for line in reduced_split] + [f"    total += {x}", f"    q += {width}"]
             + ["partial[t] = total"] + kit.tree_lines("sum", width=width)
             + ["if t == 0:", "    out0[o] = partial[0]", "cuda.syncthreads()  # partial is reused"])
    body = ([f"partial = cuda.shared.array({block}, numba.{accumulator})", "t = cuda.threadIdx.x",
             f"reduced = {per_output}", "o = cuda.blockIdx.x", f"while o < {count}:"]
            + ["    " + line for line in inner]
            + ["    o += cuda.gridDim.x"])
    source = f"\nBLOCK = {block}\n" + kit.kernel_source("kernel", op.arguments, body,
                                                       "One block per output element: a shared-memory tree.")
    launch = kit.block_per_row_launch("kernel", outputs, threads, np.dtype(accumulator).itemsize * block)
    return kit.Kernels(f"{what}: a block per output element", source, [launch])


define_op(
    name="sum",
    arity=1,
    infer=_infer_sum,
    reference=_reference_sum,
    lowering=Lowering("reduce", cpu=_cpu_sum, cuda=_cuda_sum),
    reduced_axes=_sum_reduced_axes,
    vjp=vjp_sum,
    attr_names=("dims", "keepdim"),
    doc="`%1 = sum[dims=(1,), keepdim=False] %0 : f32[32]`.",
)


def sum_to_size_axes(in_shape, out_shape):
    """(leading axes to drop, axes to reduce with keepdims) for sum_to_size."""
    lead = len(in_shape) - len(out_shape)
    axes = tuple(range(lead)) + tuple(
        lead + axis for axis, d in enumerate(out_shape) if d == 1 and in_shape[lead + axis] != 1)
    return lead, axes


def _infer_sum_to_size(types, attrs):
    (x,) = types
    require_float(types, "sum_to_size")
    shape = tuple(attrs["shape"])
    lead = x.ndim - len(shape)
    if lead < 0 or any(d not in (1, x.shape[lead + axis]) for axis, d in enumerate(shape)):
        raise InferError(f"cannot sum {x} to size [{','.join(map(str, shape))}]")
    return x.with_shape(shape)


def _reference_sum_to_size(values, attrs):
    (x,) = values
    shape = tuple(attrs["shape"])
    _, axes = sum_to_size_axes(x.shape, shape)
    total = np.sum(x, axis=axes, keepdims=True, dtype=np.float64) if axes else x  # as _reference_sum
    return np.asarray(total, dtype=np.float32).reshape(shape)


def vjp_sum_to_size(b, node, grad, needs):
    """d sum_to_size(a) = expand(g, a.shape)."""
    return (b.expand(grad, b.shape(node.inputs[0])),)


def _cpu_sum_to_size(attrs, ins, out):
    """As _cpu_sum: the leading dims dropped, the others kept (size 1 where summed)."""
    shape = tuple(attrs["shape"])
    lead, axes = sum_to_size_axes(ins[0].shape, shape)
    if not axes:
        return f"def kernel(in0, out0):\n    out0[...] = in0.reshape({shape!r})\n"
    kept = [("0" if axis in axes else f"i{axis}") for axis in range(lead, ins[0].ndim)]
    return sum_kernel(ins[0].shape, axes, kept, "sum_to_size")


def _sum_to_size_reduced_axes(in_shape, attrs):
    return sum_to_size_axes(in_shape, tuple(attrs["shape"]))[1]


define_op(
    name="sum_to_size",
    arity=1,
    infer=_infer_sum_to_size,
    reference=_reference_sum_to_size,
    lowering=Lowering("reduce", cpu=_cpu_sum_to_size, cuda=_cuda_sum),
    reduced_axes=_sum_to_size_reduced_axes,
    vjp=vjp_sum_to_size,
    attr_names=("shape",),
    doc="`%1 = sum_to_size[shape=(1,16)] %0`: sums the broadcast dims away (PyTorch's sum_to_size).",
)


# ------------------------------------------------------------------ row ops
def _infer_row(name):
    def infer(types, attrs):
        (x,) = types
        require_float(types, name)
        dim = attrs["dim"]
        if x.ndim == 0 or not 0 <= dim < x.ndim:
            raise InferError(f"{name} dim {dim} is out of range for {x}")
        return x

    return infer


def _reference_softmax(values, attrs):
    (x,) = values
    dim = attrs["dim"]
    shifted = x - np.max(x, axis=dim, keepdims=True)
    e = np.exp(shifted)
    total = np.sum(e, axis=dim, keepdims=True, dtype=np.float64).astype(np.float32)  # as the cpu kernel
    return np.asarray(e / total, dtype=np.float32)


def _reference_log_softmax(values, attrs):
    (x,) = values
    dim = attrs["dim"]
    shifted = x - np.max(x, axis=dim, keepdims=True)
    log_total = np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True, dtype=np.float64).astype(np.float32))
    return np.asarray(shifted - log_total, dtype=np.float32)


def vjp_softmax(b, node, grad, needs):
    """d softmax = y * (g - sum(g * y, dim)): PyTorch's _softmax_backward_data."""
    y = node.id
    dim = node.attr["dim"]
    row = b.sum(b.mul(grad, y), (dim,), keepdim=True)
    return (b.mul(y, b.sub(grad, row)),)


def vjp_log_softmax(b, node, grad, needs):
    """d log_softmax = g - exp(y) * sum(g, dim): PyTorch's _log_softmax_backward_data."""
    y = node.id
    dim = node.attr["dim"]
    row = b.sum(grad, (dim,), keepdim=True)
    return (b.sub(grad, b.mul(b.exp(y), row)),)


def _cpu_row(log: bool):
    """Rows of the reduced dim: max (in lanes), exp(x - max) into the output row (a loop LLVM vectorizes), their
    sum (float64 lanes, rounded once), then the result. The output row holds the exponentials
    between the passes, so ``out`` must not overlap ``x`` (the memory plan never gives a row op's
    output its input's buffer; the wrapper copies an overlapping input)."""
    def render(attrs, ins, out):
        shape = ins[0].shape
        dim = attrs["dim"]
        columns = shape[dim]
        rows = ins[0].numel // max(columns, 1)
        parallel = policy.parallel("rows", ins[0].numel) and rows > 1
        loop = "prange" if parallel else "range"
        finish = ("            out[r, c] = (x[r, c] - m) - log_total\n" if log else
                  "            out[r, c] = e[c] / total\n")
        moved = dim != len(shape) - 1
        add, total = row_lanes("e", str(columns))
        source = (
            njit_decorator(parallel) + "\n"
            f"def _rows(x, out):\n"
            f"    for r in {loop}(x.shape[0]):\n"
            # the max in lanes (a NaN anywhere makes the row NaN through the sum, whatever the max)
            + "".join(f"        {line}\n" for line in lane_max("m", "x[r, c]", "c", "x.shape[1]"))
            + f"        e = out[r]\n"
            f"        for c in range({columns}):\n"
            f"            e[c] = math.exp(x[r, c] - m)\n"
            # the sum of exp(x - max) in float64 lanes (cpu_kit.lane_sum's, through bendc_lanes8), rounded
            # once to float32
            + f"        {add}\n"
            + f"        total = np.float32({total})\n"
            + ("        log_total = math.log(total)\n" if log else "")
            + f"        for c in range({columns}):\n" + finish + "\n\n"
        )
        if not moved:
            return source + (
                "def kernel(in0, out0):\n"
                f"    rows = in0.size // {max(columns, 1)}  # from the shape: one source for every batch size\n"
                "    x = np.ascontiguousarray(in0)\n"
                "    if np.may_share_memory(x, out0):  # (the output row holds the exponentials)\n"
                "        x = x.copy()\n"
                f"    _rows(x.reshape((rows, {columns})), out0.reshape((rows, {columns})))\n")
        return source + (
            "def kernel(in0, out0):\n"
            f"    moved = np.ascontiguousarray(np.moveaxis(in0, {dim}, -1))\n"
            "    result = np.empty_like(moved)\n"
            f"    rows = moved.size // {max(columns, 1)}\n"
            f"    _rows(moved.reshape((rows, {columns})), result.reshape((rows, {columns})))\n"
            f"    out0[...] = np.moveaxis(result, -1, {dim})\n")

    return render


def _cuda_row(op):
    """softmax / log_softmax along ``dim``: one block per row, a shared-memory tree for the row's
    max and sum, ``syncthreads`` between levels (no warp shuffles)."""
    node = op.node
    shape = op.shapes[0]
    dim = op.attrs["dim"]
    columns = shape[dim]
    rows = numel(shape) // max(columns, 1)
    block = kit.tree_block(columns)
    row_shape = tuple(1 if axis == dim else size for axis, size in enumerate(shape))
    split, names = kit.unflatten("row", row_shape, "r")
    index = list(names)
    index[dim] = "c"
    x = op.read(0, index)
    out = f"out0[{dense(node.id, shape).flat(index)}]"
    log = node.op == "log_softmax"
    finish = (["log_total = math.log(total)"], f"{out} = ({x} - m) - log_total") if log else \
        ([], f"{out} = math.exp({x} - m) / total")

    def columns_loop(body: list[str]) -> list[str]:
        return ["c = t", f"while c < {columns}:"] + ["    " + line for line in body] + ["    c += BLOCK"]

    row_body = (["# the row's maximum"] + ["m = np.float32(-math.inf)"]
                + columns_loop([f"x = {x}", "if x > m:", "    m = x"])
                + ["partial[t] = m"] + kit.tree_lines("max") + ["m = partial[0]", "cuda.syncthreads()"]
                + ["# the sum of exp(x - max)", "total = np.float32(0.0)"]
                + columns_loop([f"total += math.exp({x} - m)"])
                + ["partial[t] = total"] + kit.tree_lines("sum") + ["total = partial[0]"] + finish[0]
                + [f"# the row of {node.op}"] + columns_loop([finish[1]])
                + ["cuda.syncthreads()  # partial is reused by the block's next row"])
    row_body = kit.used(split, row_body) + row_body
    body = ([f"partial = cuda.shared.array({block}, numba.float32)", "t = cuda.threadIdx.x",
             "row = cuda.blockIdx.x", f"while row < {op.count(rows, per=columns)}:"]
            + ["    " + line for line in row_body] + ["    row += cuda.gridDim.x"])
    source = f"\nBLOCK = {block}\n" + kit.kernel_source("kernel", op.arguments, body, "One block per row.")
    launch = kit.block_per_row_launch("kernel", rows, block, 4 * block)
    return kit.Kernels(f"{node.op} over dim {dim}: {rows} rows of {columns}", source, [launch])


define_op(
    name="softmax",
    arity=1,
    infer=_infer_row("softmax"),
    reference=_reference_softmax,
    lowering=Lowering("row", cpu=_cpu_row(log=False), cuda=_cuda_row),
    vjp=vjp_softmax,
    attr_names=("dim",),
    doc="`%1 = softmax[dim=1] %0`: exp(x - max) / sum(exp(x - max)) along dim.",
)

define_op(
    name="log_softmax",
    arity=1,
    infer=_infer_row("log_softmax"),
    reference=_reference_log_softmax,
    lowering=Lowering("row", cpu=_cpu_row(log=True), cuda=_cuda_row),
    vjp=vjp_log_softmax,
    attr_names=("dim",),
    doc="`%1 = log_softmax[dim=1] %0`: (x - max) - log(sum(exp(x - max))) along dim.",
)
