"""Training batch norm as fused ops: ``batch_norm`` (x normalized by the batch's statistics, then the
affine), ``batch_norm_grad`` (its VJP, PyTorch's formula) and ``batch_norm_stats`` (the batch mean and
biased variance that update the running statistics).

How F.batch_norm uses them in training mode (x (N, C, *), each channel's N*S values one row; S the
spatial size)::

    %2 = batch_norm_stats %x                                               : f32[2,3]   (running stats)
    %3 = batch_norm[bias=True, eps=1e-05, weight=True] %x, %w, %b          : f32[8,3,5,6]
    %9 = batch_norm_grad[eps=1e-05, grad_affine=True, grad_input=True, weight=True] %x, %g, %w
                                                                           : f32[726]
    %10 = index[spec=((0,720,1),)] %9 ; %11 = reshape[shape=(8,3,5,6)] %10   dx
    %12 = index[spec=((720,723,1),)] %9                                      dweight
    %13 = index[spec=((723,726,1),)] %9                                      dbias

Evaluation mode (the running statistics) stays elementwise ops (bendc/resample.py): nothing there
cancels.

Why fused ops and no longer the composed ``(x - mean) * rsqrt(var + eps)`` of float32 values: the
mean rounded to float32 leaves a residual e that the normalization multiplies by rstd. Over a batch
of two nearly equal values (a norm after a norm, rstd ~50) the two outputs were 3e-6 away from
antisymmetric where torch's were 2e-7 (fuzz program 16168 of tests/fuzz/test_fuzz_modules.py: the
next batch norm's running mean), and the backward's composed terms likewise (program 62380). Here a
channel's mean, rstd and every output are float64 until one rounding per element, as group_norm
(bendc/ops/group_norm.py) computes its rows: at least as close to the exact (float64) result as
torch's float32 kernels, whose x * alpha + beta rounds twice.

Numbers. Everything of a channel is float64, each output rounded once to float32:
- the statistics, in one pass: with d = x - x0 (x0 the channel's first element, x[0, c, 0]),
  S1 = sum(d), S2 = sum(d*d); mean = x0 + S1/L, var = (S2 - S1*(S1/L))/L (at least 0),
  rstd = 1/sqrt(var + eps), L = N*S. Each sum is per sample first (the sample's S values in
  group_norm's lane order, lane_sum: LANES independent partial sums, then the tail past the last
  full block), then the samples' sums in sample order: the result does not depend on the thread
  count, and the reference interpreter sums in the same order, so the cpu kernels match it bit
  for bit;
- the forward: y = (x - mean) * (rstd * w[c]) + b[c] (without weight the scale is rstd, without
  bias nothing is added);
- the backward, PyTorch's formula (aten's batch_norm_backward): per channel db = sum(dy) and
  xc = sum(dy * (x - mean)) = sum(dy * d) - db * (S1/L) (the shifted sum, in the same pass as the
  statistics); dx = (dy - db/L - (x - mean) * (xc * rstd * rstd / L)) * (rstd * w[c]),
  dweight[c] = xc * rstd, dbias[c] = db;
- batch_norm_stats: mean and var as above, rounded to float32 ((2, C): the mean, then the biased
  variance; bendc/resample.py makes the unbiased one and the momentum update from them).

CPU kernels. A channel's values are N runs of S adjacent floats. Where S >= LANES one prange cell
is a channel (its sums through the lanes, then its outputs, while the channel is in cache); below
that (a BatchNorm1d over (N, C) has S = 1) the samples are the outer loop over rows of x and the
channels the inner one (adjacent in memory: it vectorizes), per-channel float64 accumulators, the
outputs a second pass over the rows; these narrow loops stay serial (inside a prange body they did
not vectorize: 3.6x slower at one thread). The same sums in the same order either way.

Cost against the composed float32 ops this replaced (fwd + bwd + a relu, ``step.profile``-style
medians, 1 thread): (256, 128) 0.070 -> 0.088 ms, (1024, 512) 1.43 -> 2.00, (128, 64, 8, 8) 1.78 ->
2.34, (64, 64, 16, 16) 3.23 -> 4.07 (torch eager 0.16-0.23, -, 4.3, 8.6): the statistics are read
once more (batch_norm_stats for the running statistics, and the forward's own pass) and the
backward makes four float64 sums. examples/cnn_bn.py's step: 1.16-1.23 -> 1.25-1.26 ms.

On cuda each op is one block per channel: float64 partial sums combined in a shared-memory tree,
the variance centered (a second tree over (x - mean)^2, as group_norm's), so results agree with
the reference to float64 rounding (tests use the usual tolerances); the backward's dweight and
dbias come from the same block (thread 0 writes them).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import njit_decorator
from bendc.ops.base import InferError, Lowering, define_op, require_float
from bendc.ops.group_norm import (LANE_COUNT, LANES, _affine_names, _cuda_stats_lines, _strided, infer_affine_norm,
                                  infer_packed_grad, lane_add, lane_finish, lane_start, packed_affine_vjp)

# Channels a prange cell takes where a channel's runs are short (S < LANES): the cell walks the
# samples, each a run of CHANNEL_BLOCK adjacent channels.
CHANNEL_BLOCK = 64


# ------------------------------------------------------------------ shapes
def _geometry(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(samples N, channels C, spatial S)."""
    return shape[0], shape[1], numel(shape[2:])


def _check_x(x, attrs, op: str) -> None:
    if x.ndim < 2:
        raise InferError(f"{op} needs x of shape (N, C, *), got {x}")
    if "eps" in attrs and not isinstance(attrs["eps"], float):
        raise InferError(f"{op} eps must be a float, got {attrs['eps']!r}")


def _infer_batch_norm(types, attrs):
    return infer_affine_norm(types, attrs, "batch_norm", _check_x)


def _infer_batch_norm_grad(types, attrs):
    return infer_packed_grad(types, attrs, "batch_norm_grad", _check_x)


def _infer_batch_norm_stats(types, attrs):
    require_float(types, "batch_norm_stats")
    if len(types) != 1:
        raise InferError(f"batch_norm_stats takes x, got {len(types)} operands")
    _check_x(types[0], attrs, "batch_norm_stats")
    return types[0].with_shape((2, types[0].shape[1]))


# ------------------------------------------------------------------ reference semantics
def _channel_sum(values: np.ndarray) -> np.ndarray:
    """(N, C, S) float64 -> (C,) in the kernels' order: LANES partial sums, lane k taking element k
    of every full block of LANES of every sample's run (samples in order, blocks in order); one
    sequential sum of the elements past each run's last full block; the lanes added in lane order,
    then the tail."""
    samples, channels, spatial = values.shape
    full = spatial - spatial % LANES
    lanes = np.zeros((channels, LANES))
    tail = np.zeros(channels)
    for n in range(samples):
        for start in range(0, full, LANES):
            lanes = lanes + values[n, :, start:start + LANES]
        for i in range(full, spatial):
            tail = tail + values[n, :, i]
    total = np.zeros(channels)
    for k in range(LANES):
        total = total + lanes[:, k]
    return total + tail


def _moments(x: np.ndarray, eps: float):
    """x (N, C, *) -> (x3 (N, C, S) float64, d = x3 - x0, S1, mean, var, rstd (C,) each)."""
    samples, channels, spatial = _geometry(x.shape)
    x3 = np.asarray(x, np.float64).reshape(samples, channels, spatial)
    size = samples * spatial
    shift = x3[0, :, 0] if size else np.zeros(channels)
    d = x3 - shift[None, :, None]
    total, squares = _channel_sum(d), _channel_sum(d * d)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = shift + total / size
        variance = (squares - total * (total / size)) / size
        variance = np.where(variance < 0.0, 0.0, variance)
        rstd = 1.0 / np.sqrt(variance + eps)
    return x3, d, total, mean, variance, rstd


def _reference_batch_norm(values, attrs):
    x = values[0]
    affine = dict(zip(_affine_names(attrs), values[1:]))
    x3, _, _, mean, _, rstd = _moments(x, attrs["eps"])
    scale = rstd if "weight" not in affine else rstd * np.asarray(affine["weight"], np.float64)
    y = (x3 - mean[None, :, None]) * scale[None, :, None]
    if "bias" in affine:
        y = y + np.asarray(affine["bias"], np.float64)[None, :, None]
    return y.astype(np.float32).reshape(x.shape)


def _reference_batch_norm_grad(values, attrs):
    x, g = values[0], values[1]
    x3, d, total, mean, _, rstd = _moments(x, attrs["eps"])
    dy = np.asarray(g, np.float64).reshape(x3.shape)
    size = x3.shape[0] * x3.shape[2]
    w = np.asarray(values[2], np.float64) if attrs["weight"] else np.ones(x3.shape[1])
    db = _channel_sum(dy)
    xc = _channel_sum(dy * d) - db * (total / size)
    parts = []
    with np.errstate(divide="ignore", invalid="ignore"):
        if attrs["grad_input"]:
            k = xc * rstd * rstd / size
            dx = (dy - (db / size)[None, :, None] - (x3 - mean[None, :, None]) * k[None, :, None]) \
                * (rstd * w)[None, :, None]
            parts.append(dx.astype(np.float32).reshape(-1))
        if attrs["grad_affine"]:
            parts += [(xc * rstd).astype(np.float32), db.astype(np.float32)]
    return np.concatenate(parts)


def _reference_batch_norm_stats(values, attrs):
    _, _, _, mean, variance, _ = _moments(values[0], 0.0)
    return np.stack([mean, variance]).astype(np.float32)


# ------------------------------------------------------------------ VJP
def vjp_batch_norm(b, node, grad, needs):
    """One batch_norm_grad (dx, and dweight|dbias where either is needed), taken apart by views."""
    return packed_affine_vjp(b, node, grad, needs, "batch_norm_grad")


# ------------------------------------------------------------------ CPU kernels
# A kernel's sums: name -> the term of element i of the sample's run (``row`` x's run, ``grow`` g's).
_D = "(np.float64(row[i]) - shift)"
_STATS = {"total": _D, "squares": f"{_D} * {_D}"}
_GRAD = {**_STATS, "dot": f"np.float64(grow[i]) * {_D}", "db": "np.float64(grow[i])"}

# A channel's statistics from its sums (``size`` = N*S), as _moments.
_FINISH = ["mean = shift + total / size", "variance = (squares - total * (total / size)) / size",
           "if variance < 0.0:", "    variance = 0.0", "rstd = 1.0 / math.sqrt(variance + eps)"]


def _wide_sums(sums: dict[str, str], grad: bool) -> list[str]:
    """Channel c's sums (one prange cell): LANES partial sums running over every sample's full blocks
    and one over the runs' tails (a local array each: LLVM knows it aliases nothing, so the lane loop
    vectorizes), added once at the end (_channel_sum's order); then its statistics. The lane count is
    the argument (``lanes``: LANE_COUNT), not a literal (group_norm.py's _lane_lines: a literal 32-trip loop is
    unrolled before the loop vectorizer runs); the lane lines are group norm's (lane_start, lane_add,
    lane_finish)."""
    names = list(sums)
    lines = [f"lanes_{k} = np.empty(lanes)" for k in range(len(names))] + lane_start(names)
    lines += ["shift = np.float64(x3[0, c, 0])"]
    lines += ["for n in range(samples):", "    row = x3[n, c]"] + (["    grow = g3[n, c]"] if grad else [])
    lines += ["    " + line for line in lane_add(names, list(sums.values()), "spatial")]
    return lines + lane_finish(names) + _FINISH


def _narrow_sums(sums: dict[str, str], grad: bool, parallel: bool) -> list[str]:
    """Every channel's sums into float64 arrays (named as the sums): runs shorter than LANES are all
    tail, one sequential sum a channel (_channel_sum's order). x (and g) as rows of samples (``x2``,
    ``g2``: a row's C * S values adjacent; indexing a contiguous row, not the 3-D array, lets LLVM
    vectorize the channel loop: a BatchNorm1d over (256, 128) ran 3.3x faster), samples outer and a
    block of channels inner, prange cells over the blocks (``spatial`` is a literal); then the
    statistics arrays means, variances, rstds."""
    names = list(sums)
    loop = "prange" if parallel else "range"
    lines = ["x2 = x3.reshape((samples, channels * spatial))"] + (
        ["g2 = g3.reshape((samples, channels * spatial))"] if grad else [])
    # np.empty and a loop, not np.zeros: under parallel=True numba makes np.zeros a parallel loop of its own
    lines += [f"{name} = np.empty(channels)" for name in names] + ["shifts = np.empty(channels)"]
    lines += ["for c in range(channels):", "    shifts[c] = np.float64(x2[0, c * spatial])"]
    lines += [f"    {name}[c] = 0.0" for name in names]
    lines += [f"for block in {loop}((channels + {CHANNEL_BLOCK - 1}) // {CHANNEL_BLOCK}):",
              f"    last = min(channels, (block + 1) * {CHANNEL_BLOCK})",
              "    for n in range(samples):", "        row = x2[n]"] + (["        grow = g2[n]"] if grad else [])
    # j, not c: a name the prange body assigns and later code reads is a reduction to the translator
    lines += [f"        for j in range(block * {CHANNEL_BLOCK}, last):", "            shift = shifts[j]",
              "            for s in range(spatial):", "                x = np.float64(row[j * spatial + s])"]
    lines += ["                dy = np.float64(grow[j * spatial + s])"] if grad else []
    terms = {"total": "d", "squares": "d * d", "dot": "dy * d", "db": "dy"}
    lines += ["                d = x - shift"] + [f"                {name}[j] += {terms[name]}" for name in names]
    # per channel, the statistics as _FINISH computes them
    lines += ["means = np.empty(channels)", "variances = np.empty(channels)", "rstds = np.empty(channels)",
              "for c in range(channels):", "    shift = shifts[c]", "    total_c = total[c]",
              "    squares_c = squares[c]"]
    lines += ["    " + line.replace("total", "total_c").replace("squares", "squares_c") for line in _FINISH]
    return lines + ["    means[c] = mean", "    variances[c] = variance", "    rstds[c] = rstd"]


def _narrow_outputs(parallel: bool, out: str, value: str, grad: bool) -> list[str]:
    """The narrow kernels' outputs: ``out`` (N, C, S) as rows of samples, element (j, s) of row n
    ``value`` of ``x`` (and ``dy``) there, per-channel constants read from arrays at channel ``j``."""
    lines = [f"{out}2 = {out}3.reshape((samples, channels * spatial))",
             f"for n in {'prange' if parallel else 'range'}(samples):", "    row = x2[n]", f"    target = {out}2[n]"]
    lines += ["    grow = g2[n]"] if grad else []
    lines += ["    for j in range(channels):", "        for s in range(spatial):", "            i = j * spatial + s",
              "            x = np.float64(row[i])"] + (["            dy = np.float64(grow[i])"] if grad else [])
    return lines + [f"            target[i] = np.float32({value})"]


def _parallel(cells: int, wide: bool, channels: int, samples: int) -> tuple[bool, bool]:
    """(the sums' prange, the narrow outputs' prange). A wide channel is a row of real work. The
    narrow loops stay serial: inside a prange body (numba's parfor, natively too) their channel
    loops did not vectorize, and one thread ran them 3.6x slower than the serial function (a
    BatchNorm1d over (1024, 512): forward 0.98 ms against 0.27)."""
    return (policy.parallel("rows", cells) and channels > 1, False) if wide else (False, False)


def _spatial(wide: bool, spatial: int) -> str:
    """The run length in a kernel's source: a literal for the narrow loops (LLVM drops the loop over a
    run of one and vectorizes the channels), the array's for the wide ones."""
    return "x3.shape[2]" if wide else str(spatial)


def _kernel_head(grad: bool) -> str:
    """The kernel entry's shapes: x (and g) as (N, C, S), N from the array's size (one source for every
    batch size)."""
    lines = ["    x = np.ascontiguousarray(in0)", "    channels, spatial = x.shape[1], x.size // (x.shape[0] * x.shape[1])",
             "    x3 = x.reshape((x.shape[0], channels, spatial))"]
    if grad:
        lines.append("    g3 = np.ascontiguousarray(in1).reshape(x3.shape)")
    return "\n".join(lines)


def _cpu_batch_norm(attrs, ins, out):
    """The statistics, then the normalized, scaled channel (one cell a channel, or the narrow loops)."""
    samples, channels, spatial = _geometry(ins[0].shape)
    weight, bias = attrs["weight"], attrs["bias"]
    wide = spatial >= LANES
    parallel, out_parallel = _parallel(ins[0].numel, wide, channels, samples)
    lines = [njit_decorator(parallel if wide else parallel or out_parallel),
             "def _channels(x3, w, b, y3, eps, lane_count):", LANE_COUNT,
             "    samples, channels = x3.shape[0], x3.shape[1]",
             f"    spatial = {_spatial(wide, spatial)}", "    size = samples * spatial"]
    if wide:
        scale = "rstd * np.float64(w[c])" if weight else "rstd"
        plus = " + np.float64(b[c])" if bias else ""
        body = _wide_sums(_STATS, False) + [f"scale = {scale}", "for n in range(samples):",
                                            "    for s in range(spatial):",
                                            f"        y3[n, c, s] = np.float32((np.float64(x3[n, c, s]) - mean) * "
                                            f"scale{plus})"]
        lines += [f"    for c in {'prange' if parallel else 'range'}(channels):"] + ["        " + l for l in body]
    else:
        lines += ["    " + l for l in _narrow_sums(_STATS, False, parallel)]
        scale = "rstds[c] * np.float64(w[c])" if weight else "rstds[c]"
        lines += ["    scales = np.empty(channels)", "    for c in range(channels):", f"        scales[c] = {scale}"]
        plus = " + np.float64(b[j])" if bias else ""
        lines += ["    " + l for l in _narrow_outputs(out_parallel, "y", f"(x - means[j]) * scales[j]{plus}", False)]
    arguments = ["in0"] + [f"in{1 + k}" for k in range(weight + bias)] + ["out0"]
    w_arg = "np.ascontiguousarray(in1)" if weight else "None"
    b_arg = f"np.ascontiguousarray(in{1 + weight})" if bias else "None"
    return "\n".join(lines) + f'''


def kernel({", ".join(arguments)}):
{_kernel_head(False)}
    _channels(x3, {w_arg}, {b_arg}, out0.reshape(x3.shape), {float(attrs["eps"])!r}, {LANES})
'''


def _cpu_batch_norm_grad(attrs, ins, out):
    """The statistics and the sums db, xc of a channel in one pass, then dweight, dbias and dx."""
    samples, channels, spatial = _geometry(ins[0].shape)
    weight, grad_input, grad_affine = attrs["weight"], attrs["grad_input"], attrs["grad_affine"]
    wide = spatial >= LANES
    parallel, out_parallel = _parallel(ins[0].numel, wide, channels, samples)
    out_parallel = out_parallel and grad_input
    lines = [njit_decorator(parallel if wide else parallel or out_parallel),
             "def _channels(x3, g3, w, dx3, dweight, dbias, eps, lane_count):", LANE_COUNT,
             "    samples, channels = x3.shape[0], x3.shape[1]",
             f"    spatial = {_spatial(wide, spatial)}", "    size = samples * spatial"]
    wc = "np.float64(w[c])" if weight else "1.0"
    if wide:
        body = _wide_sums(_GRAD, True) + ["xc = dot - db * (total / size)"]
        if grad_affine:
            body += ["dweight[c] = np.float32(xc * rstd)", "dbias[c] = np.float32(db)"]
        if grad_input:
            body += ["kx = xc * rstd * rstd / size", "gm = db / size", f"scale = rstd * {wc}",
                     "for n in range(samples):", "    for s in range(spatial):",
                     "        dx3[n, c, s] = np.float32((np.float64(g3[n, c, s]) - gm - (np.float64(x3[n, c, s]) - mean)"
                     " * kx) * scale)"]
        lines += [f"    for c in {'prange' if parallel else 'range'}(channels):"] + ["        " + l for l in body]
    else:
        lines += ["    " + l for l in _narrow_sums(_GRAD, True, parallel)]
        lines += ["    kxs = np.empty(channels)", "    gms = np.empty(channels)", "    scales = np.empty(channels)",
                  "    for c in range(channels):", "        total_c = total[c]", "        rstd = rstds[c]",
                  "        xc = dot[c] - db[c] * (total_c / size)"]
        if grad_affine:
            lines += ["        dweight[c] = np.float32(xc * rstd)", "        dbias[c] = np.float32(db[c])"]
        lines += ["        kxs[c] = xc * rstd * rstd / size", "        gms[c] = db[c] / size",
                  f"        scales[c] = rstd * {wc}"]
        if grad_input:
            lines += ["    " + l for l in _narrow_outputs(out_parallel, "dx",
                                                          "(dy - gms[j] - (x - means[j]) * kxs[j]) * scales[j]", True)]
    arguments = "in0, in1, in2, out0" if weight else "in0, in1, out0"
    w_arg = "np.ascontiguousarray(in2)" if weight else "None"
    dx = "out0[:x.size].reshape(x3.shape)" if grad_input else "np.empty((0, 0, 0), np.float32)"
    cells = "x.size" if grad_input else "0"
    if grad_affine:
        affine = f"out0[{cells}:{cells} + channels], out0[{cells} + channels:]"
    else:
        affine = "np.empty(0, np.float32), np.empty(0, np.float32)"
    return "\n".join(lines) + f'''


def kernel({arguments}):
{_kernel_head(True)}
    _channels(x3, g3, {w_arg}, {dx}, {affine}, {float(attrs["eps"])!r}, {LANES})
'''


def _cpu_batch_norm_stats(attrs, ins, out):
    """Each channel's mean and biased variance, rounded once: (2, C)."""
    samples, channels, spatial = _geometry(ins[0].shape)
    wide = spatial >= LANES
    parallel, _ = _parallel(ins[0].numel, wide, channels, samples)
    lines = [njit_decorator(parallel), "def _channels(x3, out, eps, lane_count):", LANE_COUNT,
             "    samples, channels = x3.shape[0], x3.shape[1]",
             f"    spatial = {_spatial(wide, spatial)}", "    size = samples * spatial"]
    if wide:
        body = _wide_sums(_STATS, False) + ["out[0, c] = np.float32(mean)", "out[1, c] = np.float32(variance)"]
        lines += [f"    for c in {'prange' if parallel else 'range'}(channels):"] + ["        " + l for l in body]
    else:
        lines += ["    " + l for l in _narrow_sums(_STATS, False, parallel)]
        lines += ["    for c in range(channels):", "        out[0, c] = np.float32(means[c])",
                  "        out[1, c] = np.float32(variances[c])"]
    return "\n".join(lines) + f'''


def kernel(in0, out0):
{_kernel_head(False)}
    _channels(x3, out0, 0.0, {LANES})
'''


# ------------------------------------------------------------------ cuda kernels
def _element(op: kit.CudaNode, operand: int, index: str, prefix: str) -> tuple[list[str], str]:
    """Operand ``operand`` (N, C, *) at element ``index`` (0 <= index < N*S) of the block's channel:
    the statements splitting it into (n, s) and the read."""
    shape = op.shapes[operand]
    spatial = numel(shape[2:])
    split = [f"{prefix}n = ({index}) // {spatial}", f"{prefix}s = ({index}) % {spatial}"]
    spatial_split, names = kit.unflatten(f"{prefix}s", shape[2:], f"{prefix}a")
    return split + spatial_split, op.read(operand, [f"{prefix}n", "channel"] + names)


def _channels_loop(op: kit.CudaNode, body: list[str], shared: tuple[str, ...]) -> list[str]:
    """One block per channel (looping where there are more channels than blocks)."""
    samples, channels, spatial = _geometry(op.shapes[0])
    return ([f"{name} = cuda.shared.array(BLOCK, numba.float64)" for name in shared]
            + ["t = cuda.threadIdx.x", f"size = {op.count(samples, channels * spatial)} * {spatial}",
               "channel = cuda.blockIdx.x", f"while channel < {channels}:"]
            + ["    " + line for line in body] + ["    channel += cuda.gridDim.x"])


def _channel_kernels(op: kit.CudaNode, body: list[str], shared: tuple[str, ...], doc: str) -> kit.Kernels:
    """One kernel of one block per channel around ``body`` (float64 shared arrays ``shared``), 256
    threads a block whatever the batch (the channel's N*S values grow with it: kit.sum_block)."""
    samples, channels, spatial = _geometry(op.shapes[0])
    block = kit.sum_block(samples * spatial, True)
    source = f"\nBLOCK = {block}\n" + kit.kernel_source("kernel", op.arguments, _channels_loop(op, body, shared), doc)
    return kit.Kernels(f"{op.node.op} of {channels} channels of {samples * spatial} (float64 trees)", source,
                       [kit.block_per_row_launch("kernel", channels, block, 8 * len(shared) * block)])


def _out_index(op: kit.CudaNode, prefix: str) -> str:
    """The flat index of (n, channel, s) in a contiguous (N, C, S) array."""
    _, channels, spatial = _geometry(op.shapes[0])
    return f"({prefix}n * {channels} + channel) * {spatial} + {prefix}s"


def _cuda_batch_norm(op: kit.CudaNode) -> kit.Kernels:
    attrs = op.attrs
    split, x = _element(op, 0, "i", "x")
    scale = f"rstd * np.float64({op.read(1, ['channel'])})" if attrs["weight"] else "rstd"
    plus = f" + np.float64({op.read(1 + attrs['weight'], ['channel'])})" if attrs["bias"] else ""
    body = (_cuda_stats_lines(split, x, "size", attrs["eps"], "i") + [f"scale = {scale}"]
            + _strided("i", "size", split + [f"out0[{_out_index(op, 'x')}] = np.float32((np.float64({x}) - mean) * "
                                             f"scale{plus})"]))
    return _channel_kernels(op, body, ("partial",),
                            "One block per channel: mean and rstd in float64, then the normalized, scaled channel.")


def _cuda_batch_norm_grad(op: kit.CudaNode) -> kit.Kernels:
    attrs = op.attrs
    _, channels, spatial = _geometry(op.shapes[0])
    x_split, x = _element(op, 0, "i", "x")
    g_split, g = _element(op, 1, "i", "g")
    wc = f"np.float64({op.read(2, ['channel'])})" if attrs["weight"] else "1.0"
    body = (_cuda_stats_lines(x_split, x, "size", attrs["eps"], "i") + ["xc = np.float64(0.0)", "db = np.float64(0.0)"]
            + _strided("i", "size", x_split + g_split + [f"dy = np.float64({g})",
                                                         f"xc += dy * (np.float64({x}) - mean)", "db += dy"])
            + ["partial[t] = xc", "second[t] = db"] + kit.tree_lines("sum", ("partial", "second"))
            + ["xc = partial[0]", "db = second[0]", "cuda.syncthreads()"])
    if attrs["grad_affine"]:
        offset = f"size // {spatial} * {channels * spatial}" if attrs["grad_input"] else "0"  # after dx
        body += ["if t == 0:", f"    out0[{offset} + channel] = np.float32(xc * rstd)",
                 f"    out0[{offset} + {channels} + channel] = np.float32(db)"]
    if attrs["grad_input"]:
        body += ["kx = xc * rstd * rstd / size", "gm = db / size", f"scale = rstd * {wc}"]
        body += _strided("i", "size", x_split + g_split + [
            f"out0[{_out_index(op, 'x')}] = np.float32((np.float64({g}) - gm - (np.float64({x}) - mean) * kx) * scale)"])
    return _channel_kernels(op, body, ("partial", "second"),
                            "One block per channel: PyTorch's batch_norm backward in float64 (dx, dweight, dbias).")


def _cuda_batch_norm_stats(op: kit.CudaNode) -> kit.Kernels:
    split, x = _element(op, 0, "i", "x")
    body = _cuda_stats_lines(split, x, "size", None, "i") + [
        "if t == 0:", "    out0[channel] = np.float32(mean)", f"    out0[{op.shapes[0][1]} + channel] = np.float32(variance)"]
    return _channel_kernels(op, body, ("partial",),
                            "One block per channel: its mean and biased variance in float64, rounded once.")


# ------------------------------------------------------------------ the ops
define_op(
    name="batch_norm",
    arity=None,
    infer=_infer_batch_norm,
    reference=_reference_batch_norm,
    lowering=Lowering("row", cpu=_cpu_batch_norm, cuda=_cuda_batch_norm),
    vjp=vjp_batch_norm,
    attr_names=("eps", "weight", "bias"),
    doc="`%3 = batch_norm[bias=True, eps=1e-05, weight=True] %x, %w, %b : f32[8,3,5,6]`: torch's training "
        "batch_norm of x (N, C, *) by each channel's batch mean and biased variance (float64), times weight (C,) "
        "plus bias (C,) when present (their attrs say which operands follow x).",
)

define_op(
    name="batch_norm_grad",
    arity=None,
    infer=_infer_batch_norm_grad,
    reference=_reference_batch_norm_grad,
    lowering=Lowering("row", cpu=_cpu_batch_norm_grad, cuda=_cuda_batch_norm_grad),
    no_vjp="built only by batch_norm's VJP (bendc has no create_graph)",
    attr_names=("eps", "weight", "grad_input", "grad_affine"),
    doc="`%9 = batch_norm_grad[eps=1e-05, grad_affine=True, grad_input=True, weight=True] %x, %g, %w : f32[726]`: "
        "batch_norm's VJP by PyTorch's formula, the statistics recomputed from x; packed flat: dx (grad_input), "
        "then dweight and dbias (grad_affine).",
)

define_op(
    name="batch_norm_stats",
    arity=1,
    infer=_infer_batch_norm_stats,
    reference=_reference_batch_norm_stats,
    lowering=Lowering("row", cpu=_cpu_batch_norm_stats, cuda=_cuda_batch_norm_stats),
    no_vjp="the running statistics' update, which torch makes under no_grad (bendc/resample.py detaches x)",
    attr_names=(),
    doc="`%2 = batch_norm_stats %x : f32[2,3]`: each channel of x (N, C, *): its batch mean, then its biased "
        "variance (float64, rounded once).",
)
