"""Normalization statistics (norm_mean, norm_rstd) and the rotary embedding (rope).

How F.layer_norm uses them: the statistics are IR values
computed by row kernels, and the normalization and the affine are ordinary
elementwise ops::

    %1 = norm_mean[dims=(1,)] %x                   : f32[64,1]     row kernel
    %2 = norm_rstd[dims=(1,), eps=1e-05] %x        : f32[64,1]     row kernel
    %3 = sub %x, %1                                : f32[64,128]   \\
    %4 = mul %3, %2                                : f32[64,128]    | one fused kernel
    %5 = mul %4, %w                                : f32[64,128]    |
    %6 = add %5, %b                                : f32[64,128]   /

Why this shape of IR rather than one ``layer_norm`` row op with a ``layer_norm_vjp``:

- The fusion pass fuses the normalization with the affine and with whatever
  elementwise work surrounds the layer (a residual add, an activation, the
  loss), forward and backward alike; a monolithic row op would be a fusion
  barrier on both sides.
- The backward is autodiff of these ops, nothing layer-specific: dweight and
  dbias come out as ``sum_to_size`` of ``g * xhat`` and of ``g``, and the two
  row sums that dx needs (``sum(g' * (x - mean))`` for rstd's VJP,
  ``sum(-g' * rstd)`` for the mean's) as ``sum_to_size`` too, so the fusion pass
  takes all four as epilogue sums of one backward kernel; dx is one more
  elementwise kernel. Layer norm forward and backward on (64, 128) is 4
  launches: the two statistics, one fused kernel, dx.
- Each statistic is its own op because a kernel step has one output: packing
  mean and rstd into one ``[2, ...]`` value would need two ``index`` views in
  the forward and, in the backward, two ``index_scatter`` kernels and an add
  to rebuild the packed gradient. ``norm_rstd`` recomputes the row mean in its
  own kernel (in the same order as ``norm_mean``, so the two agree bit for bit).

Group norm used these ops too (x reshaped to (N, G, C/G, S), the same statistics
over the last two dims) and no longer does: it is two fused ops of its own,
bendc/ops/group_norm.py. Its groups are rows of 256-1024 elements that fit in
L1, so one kernel per direction reads each row once or twice there, while the
composed path spent one kernel per statistic plus four backward kernels whose
sum_to_size epilogues add one dependent float64 per array cell: in
examples/cnn.py's step (1 thread) the group-norm kernels took 1.67 ms
composed and 0.45 ms fused (the step 4.1 ms -> 2.7 ms, minima of
``step.profile``). Its backward is PyTorch's formula (ds, db per channel),
computed in float64. The fusion the composed IR allows around a layer norm
(the residual add, the activation) matters less there: group norm sits between
a conv and an activation whose gradient needs its output anyway.

The statistics accumulate in float64 along each row (the mean, then the
biased variance around it), in the CPU kernels' eight lanes
(``cpu_kit.SUM_LANES``: eight independent partial sums added in a fixed tree,
which pipeline where one running sum would wait on every add), and round once
to float32: within an ulp of PyTorch's float Welford moments. The reference
interpreter sums in the same order (``cpu_kit.lane_row_sums``), so the cpu
kernels match it bit for bit.

On cuda (``Lowering.cuda``) each statistic is one block per row: float64
partial sums combined in a shared-memory tree, rounded once (float64 on
purpose: tests/cuda/test_ptx.py allows ``.f64`` for these two ops only); the
tree's order differs from the CPU's lanes by float64 rounding only, far
below float32's.

rope is a row op, not an elementwise one: the elementwise renderer reads each
operand at the cell's own (broadcast) index, and a rotary output reads its
partner half a row away. Its CPU kernel is one cell per row of the last dim;
on cuda it is one thread per output element, which reads its partner
(no row loop: every element is independent once the partner is known). Its
VJP is the inverse rotation, ``rope[inverse=True]``, and gradients for cos
and sin (when they are leaves) are elementwise products of ``index`` views of
the halves, summed over the leading dims by autodiff's ``sum_to_size``.
"""
from __future__ import annotations

import numpy as np

from bendc.kernels import cuda_kit as kit
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import lane_row_sums, njit_decorator, row_lanes
from bendc.ops.base import InferError, Lowering, define_op, require_float


# ------------------------------------------------------------------ statistics
def _stat_geometry(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns): the reduced trailing dims are one row each."""
    columns = 1
    for axis in dims:
        columns *= shape[axis]
    leading = 1
    for axis in range(len(shape) - len(dims)):
        leading *= shape[axis]
    return leading, columns


def _infer_stat(name: str):
    def infer(types, attrs):
        (x,) = types
        require_float(types, name)
        dims = tuple(attrs["dims"])
        if not dims or dims != tuple(range(x.ndim - len(dims), x.ndim)):
            raise InferError(f"{name} dims {dims} must be the trailing dims of {x}")
        if name == "norm_rstd" and not isinstance(attrs["eps"], float):
            raise InferError(f"norm_rstd eps must be a float, got {attrs['eps']!r}")
        return x.with_shape(tuple(1 if axis in dims else d for axis, d in enumerate(x.shape)))

    return infer


def _row_moments(x: np.ndarray, dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per row (float64, in the cpu kernels' lane order): the mean and the sum of squared deviations."""
    rows, columns = _stat_geometry(x.shape, dims)
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(rows, columns)
    if columns == 0:
        nan = np.full(rows, np.nan)
        return nan, nan, columns
    mean = lane_row_sums(flat) / columns
    deviation = flat - mean[:, None]
    squares = lane_row_sums(deviation * deviation)
    return mean, squares, columns


def _stat_shape(x: np.ndarray, dims) -> tuple[int, ...]:
    return tuple(1 if axis in dims else d for axis, d in enumerate(x.shape))


def _reference_norm_mean(values, attrs):
    (x,) = values
    dims = tuple(attrs["dims"])
    mean, _, _ = _row_moments(x, dims)
    return mean.astype(np.float32).reshape(_stat_shape(x, dims))


def _reference_norm_rstd(values, attrs):
    (x,) = values
    dims = tuple(attrs["dims"])
    _, squares, columns = _row_moments(x, dims)
    with np.errstate(divide="ignore", invalid="ignore"):
        rstd = 1.0 / np.sqrt(squares / columns + attrs["eps"])
    return rstd.astype(np.float32).reshape(_stat_shape(x, dims))


def vjp_norm_mean(b, node, grad, needs):
    """d mean(x) = expand(g) / n, broadcast first so the division fuses with x's other terms."""
    x = node.inputs[0]
    _, columns = _stat_geometry(b.shape(x), tuple(node.attr["dims"]))
    return (b.div(b.expand(grad, b.shape(x)), b.const(float(columns))),)


def vjp_norm_rstd(b, node, grad, needs):
    """d rstd(x) = -(g * ((x - mean) * rstd * rstd * rstd)) / n (PyTorch's formula, by rows).

    The mean's own dependence on x contributes nothing: the deviations sum to
    zero. ``(x - mean) * rstd`` is the forward's xhat, which CSE shares.
    """
    x = node.inputs[0]
    dims = tuple(node.attr["dims"])
    _, columns = _stat_geometry(b.shape(x), dims)
    mean = b.emit("norm_mean", (x,), dims=dims)
    rstd = node.id
    cubed = b.mul(b.mul(b.mul(b.sub(x, mean), rstd), rstd), rstd)
    return (b.div(b.neg(b.mul(grad, cubed)), b.const(float(columns))),)


STAT_BLOCKS = 16  # a parallel statistics kernel's blocks of rows (each allocates its row of squares once)


def _cpu_stat(rstd: bool):
    """A row kernel: the float64 mean (and squared deviations) in lanes, rounded once to float32.

    The lanes are bendc_lanes8's (bendc/kernels/templates/lanes.py: one vector add a block of 8
    natively), the squared deviations first written to a float64 row in a loop LLVM vectorizes:
    the same adds in the same order as cpu_kit.lane_sum's scalar lanes, 3-4x faster."""
    def render(attrs, ins, out):
        x = ins[0]
        dims = tuple(attrs["dims"])
        rows, columns = _stat_geometry(x.shape, dims)
        parallel = policy.parallel("elementwise", x.numel) and rows > 1
        add, total = row_lanes("x[r]", "x.shape[1]")
        lines = [add, f"mean = {total} / x.shape[1]"]
        if rstd:
            eps = float(attrs["eps"])
            add, total = row_lanes("squares", "x.shape[1]")
            lines += ["for c in range(x.shape[1]):", "    deviation = np.float64(x[r, c]) - mean",
                      "    squares[c] = deviation * deviation", add,
                      f"out[r] = np.float32(1.0 / math.sqrt({total} / x.shape[1] + {eps!r}))"]
        else:
            lines.append("out[r] = np.float32(mean)")
        squares = ["squares = np.empty(x.shape[1], np.float64)"] if rstd else []
        if parallel:  # blocks of rows over the threads, a row of squares allocated once a block
            body = [f"blocks = min(x.shape[0], {STAT_BLOCKS})", "for block in prange(blocks):",
                    *("    " + line for line in squares),
                    "    for r in range(block * x.shape[0] // blocks, (block + 1) * x.shape[0] // blocks):",
                    *("        " + line for line in lines)]
        else:
            body = [*squares, "for r in range(x.shape[0]):", *("    " + line for line in lines)]
        return (
            njit_decorator(parallel) + "\n"
            "def _rows(x, out):\n" + "".join(f"    {line}\n" for line in body) + "\n\n"
            "def kernel(in0, out0):\n"
            f"    rows = in0.size // {max(columns, 1)}  # from the shape: one source for every batch size\n"
            f"    _rows(np.ascontiguousarray(in0).reshape((rows, {columns})), out0.reshape(rows))\n"
        )

    return render


def _cuda_stat(rstd: bool):
    """A row kernel on cuda: one block per row, float64 partial sums combined in a shared-memory tree.

    The statistics accumulate in float64 as the CPU kernel and the reference do
    (so the PTX of these kernels holds ``.f64`` arithmetic, on purpose: the PTX
    test allows it for norm_mean and norm_rstd only) and round once to float32.
    The tree adds in another order than the CPU's lanes; in float64 the
    difference is ~1e-16 relative, below float32 rounding, so the results agree
    with the reference to the last bit except at a rounding tie (tested with the
    usual tolerances). norm_rstd recomputes the mean in the same order as
    norm_mean, so the two kernels agree with each other bit for bit.
    """
    def render(op):
        dims = tuple(op.attrs["dims"])
        shape = op.shapes[0]
        rows, columns = _stat_geometry(shape, dims)
        block = kit.tree_block(columns)
        split, x = op.read_rows(0, len(shape) - len(dims), "row", "c", "x")

        def columns_loop(body: list[str]) -> list[str]:
            return (["c = t", f"while c < {columns}:"] + ["    " + line for line in split + body]
                    + ["    c += BLOCK"])

        row_body = (["# the row's mean, in float64", "total = np.float64(0.0)"]
                    + columns_loop([f"total += np.float64({x})"])
                    + ["partial[t] = total"] + kit.tree_lines("sum") + [f"mean = partial[0] / {columns}",
                                                                        "cuda.syncthreads()"])
        if rstd:
            eps = float(op.attrs["eps"])
            row_body += (["# the squared deviations from it, in float64", "squares = np.float64(0.0)"]
                         + columns_loop([f"deviation = np.float64({x}) - mean",
                                         "squares += deviation * deviation"])
                         + ["partial[t] = squares"] + kit.tree_lines("sum")
                         + ["if t == 0:",
                            f"    out0[row] = np.float32(1.0 / math.sqrt(partial[0] / {columns} + {eps!r}))"])
        else:
            row_body += ["if t == 0:", "    out0[row] = np.float32(mean)"]
        row_body.append("cuda.syncthreads()  # partial is reused by the block's next row")
        body = ([f"partial = cuda.shared.array({block}, numba.float64)", "t = cuda.threadIdx.x",
                 "row = cuda.blockIdx.x", f"while row < {op.count(rows)}:"]  # kit.length_of
                + ["    " + line for line in row_body] + ["    row += cuda.gridDim.x"])
        what = "1 / sqrt(variance + eps)" if rstd else "mean"
        source = f"\nBLOCK = {block}\n" + kit.kernel_source(
            "kernel", op.arguments, body, f"One block per row: the row's {what}, accumulated in float64.")
        launch = kit.Launch("kernel", (max(1, min(rows, kit.MAX_ROWS)), 1, 1), (block, 1, 1), 8 * block)
        return kit.Kernels(f"{op.node.op} over dims {dims}: {rows} rows of {columns} (float64 tree)",
                          source, [launch])

    return render


define_op(
    name="norm_mean",
    arity=1,
    infer=_infer_stat("norm_mean"),
    reference=_reference_norm_mean,
    lowering=Lowering("row", cpu=_cpu_stat(rstd=False), cuda=_cuda_stat(rstd=False)),
    vjp=vjp_norm_mean,
    attr_names=("dims",),
    doc="`%1 = norm_mean[dims=(1,)] %0 : f32[64,1]`: the mean over the trailing dims (kept as size 1), "
        "accumulated in float64: layer_norm's saved mean.",
)

define_op(
    name="norm_rstd",
    arity=1,
    infer=_infer_stat("norm_rstd"),
    reference=_reference_norm_rstd,
    lowering=Lowering("row", cpu=_cpu_stat(rstd=True), cuda=_cuda_stat(rstd=True)),
    vjp=vjp_norm_rstd,
    attr_names=("dims", "eps"),
    doc="`%2 = norm_rstd[dims=(1,), eps=1e-05] %0 : f32[64,1]`: 1 / sqrt(biased variance + eps) over the "
        "trailing dims (kept as size 1): layer_norm's saved rstd.",
)


# ------------------------------------------------------------------ rope
def _infer_rope(types, attrs):
    x, cos, sin = types
    require_float(types, "rope")
    if not isinstance(attrs["inverse"], bool):
        raise InferError(f"rope inverse must be True or False, got {attrs['inverse']!r}")
    if x.ndim < 2 or x.shape[-1] % 2:
        raise InferError(f"rope needs x of shape (..., t, 2*half), got {x}")
    table = (x.shape[-2], x.shape[-1] // 2)
    if cos.shape != table or sin.shape != table:
        raise InferError(f"rope needs cos and sin of shape [{table[0]},{table[1]}] (t, half) for x {x}, "
                         f"got {cos} and {sin}")
    return x


def _reference_rope(values, attrs):
    x, cos, sin = values
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if attrs["inverse"]:
        zero = np.float32(0.0)
        first, second = (x1 * cos + x2 * sin) + zero, (x2 * cos - x1 * sin) + zero
    else:
        first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return np.concatenate([first, second], axis=-1).astype(np.float32)


def _halves(b, value: int) -> tuple[int, int]:
    """Views of the first and second half of the last dim."""
    shape = b.shape(value)
    half = shape[-1] // 2
    lead = tuple((0, d, 1) for d in shape[:-1])
    return (b.emit("index", (value,), spec=lead + ((0, half, 1),)),
            b.emit("index", (value,), spec=lead + ((half, 2 * half, 1),)))


def vjp_rope(b, node, grad, needs):
    """d rope(x) = the inverse rotation of g; d cos = g1*x1 + g2*x2; d sin = g2*x1 - g1*x2 (negated
    for the inverse), summed over the leading dims by autodiff's sum_to_size."""
    x, cos, sin = node.inputs
    inverse = node.attr["inverse"]
    grad_x = b.emit("rope", (grad, cos, sin), inverse=not inverse) if needs[0] else None
    grad_cos = grad_sin = None
    if needs[1] or needs[2]:
        g1, g2 = _halves(b, grad)
        x1, x2 = _halves(b, x)
        if needs[1]:
            grad_cos = b.add(b.mul(g1, x1), b.mul(g2, x2))
        if needs[2]:
            grad_sin = b.sub(b.mul(g1, x2), b.mul(g2, x1)) if inverse else b.sub(b.mul(g2, x1), b.mul(g1, x2))
    return (grad_x, grad_cos, grad_sin)


def _cpu_rope(attrs, ins, out):
    """One cell per row of the last dim: each output pair reads its partner element. The loops run
    over x's own axes (its strides: the attention layout's transposed q and k are not copied), the
    pair loop over a literal half that LLVM unrolls, so the row loop vectorizes; inputs with rows
    longer than ROPE_STRIDED_HALF pairs are copied contiguous first. Measured (1 thread, x a
    transposed (4, 4, 64, D) view): D=16 23 -> 11 us, D=32 52 -> 44 us (the copy and a flat row
    loop before)."""
    x = ins[0]
    half = x.shape[-1] // 2
    parallel = policy.parallel("rows", x.numel) and x.numel // max(x.shape[-1], 1) > 1
    lead = [f"i{axis}" for axis in range(x.ndim - 2)] + ["t"]
    # the parallel loop: the first axis of more than one row
    parallel_axis = next((axis for axis, size in enumerate(x.shape[:-1]) if size > 1), 0) if parallel else None
    if attrs["inverse"]:
        # PyTorch's slice backward accumulates each half into +0.0 words: -0.0 becomes +0.0.
        first = "(a * c + p * s) + np.float32(0.0)"
        second = "(p * c - a * s) + np.float32(0.0)"
    else:
        first, second = "a * c - p * s", "p * c + a * s"
    cell, partner = ", ".join(lead + ["j"]), ", ".join(lead + [f"j + {half}"])
    lines = []
    for axis, name in enumerate(lead):
        loop = "prange" if axis == parallel_axis else "range"
        lines.append("    " * (axis + 1) + f"for {name} in {loop}(x.shape[{axis}]):")
    inner = "    " * (len(lead) + 1)
    lines += [inner + f"for j in range({half}):"] + [inner + "    " + line for line in (
        f"a = x[{cell}]", f"p = x[{partner}]", "c = cos[t, j]", "s = sin[t, j]",
        f"out[{cell}] = {first}", f"out[{partner}] = {second}")]
    copy = "in0" if half <= ROPE_STRIDED_HALF else "np.ascontiguousarray(in0)"  # (no copy when it already is)
    return (
        njit_decorator(parallel) + "\n"
        "def _rows(x, cos, sin, out):\n" + "\n".join(lines) + "\n\n\n"
        "def kernel(in0, in1, in2, out0):\n"
        f"    _rows({copy}, np.ascontiguousarray(in1), np.ascontiguousarray(in2), out0)\n"
    )


# rope rows of up to this many pairs are read in place through x's strides; longer ones are copied
# contiguous first (D=64 from a transposed view: 44 us in place, 37 us copied, 4 x 4 x 64 rows)
ROPE_STRIDED_HALF = 16


def _cuda_rope(op):
    """rope on cuda: one thread per output element (grid-stride), which reads its own element and
    its partner half a row away; x, cos and sin are read through their strides. The products and
    the sum are the CPU kernel's, in the same order, so the results agree bit for bit."""
    shape = op.shape
    half = shape[-1] // 2
    split, names = kit.unflatten("cell", shape, "o")
    column, position = names[-1], names[-2]
    partner = list(names[:-1]) + ["partner"]
    if op.attrs["inverse"]:
        # PyTorch's slice backward accumulates each half into +0.0 words: -0.0 becomes +0.0.
        first, second = "(own * cs + other * sn) + np.float32(0.0)", "(own * cs - other * sn) + np.float32(0.0)"
    else:
        first, second = "own * cs - other * sn", "own * cs + other * sn"
    body = [f"j = {column}",
            f"partner = {column} + {half}",
            f"if {column} >= {half}:",
            f"    j = {column} - {half}",
            "    partner = j",
            f"own = {op.read(0, names)}",
            f"other = {op.read(0, partner)}",
            f"cs = {op.read(1, [position, 'j'])}",
            f"sn = {op.read(2, [position, 'j'])}",
            f"if {column} < {half}:",
            f"    out0[cell] = {first}",
            "else:",
            f"    out0[cell] = {second}"]
    body = kit.used(split, body) + body
    cells = op.node.type.numel
    direction = "inverse rotation" if op.attrs["inverse"] else "rotation"
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(cells), body),  # length_of
                              f"rope ({direction}): one output element per thread, reading its partner.")
    return kit.Kernels(f"rope {direction} of [{','.join(map(str, shape))}] by ({shape[-2]}, {half}) tables",
                      source, [kit.grid_stride_launch("kernel", cells)])


define_op(
    name="rope",
    arity=3,
    infer=_infer_rope,
    reference=_reference_rope,
    lowering=Lowering("row", cpu=_cpu_rope, cuda=_cuda_rope),
    vjp=vjp_rope,
    attr_names=("inverse",),
    doc="`%3 = rope[inverse=False] %x, %cos, %sin : f32[2,8,16]`: x (..., t, 2*half) rotated by the (t, half) "
        "tables: cat(x1*cos - x2*sin, x2*cos + x1*sin); inverse=True rotates back "
        "(cat(x1*cos + x2*sin, x2*cos - x1*sin)), as rope's VJP.",
)
