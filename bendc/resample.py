"""Issue 22's norm and resampling functions, torch's semantics, mostly composed of existing ops.

- ``batch_norm``: batch statistics (mean, biased variance) in training (the fused ops of
  bendc/ops/batch_norm.py: ``batch_norm`` and ``batch_norm_stats``, float64 inside), the running statistics
  in evaluation (elementwise ops); a training call updates the running statistics it was given *in place* as torch does: the
  traced ``running_mean`` / ``running_var`` tensors name the updated values afterwards (the momentum
  update with the unbiased variance), as ``x[i] = v`` rebinds x (bendc/trace.py).
- ``conv_transpose1d`` / ``conv_transpose2d``: the input gradient of a conv2d (``conv2d_grad_input``,
  bendc/ops/conv.py) of x by the transposed conv's weight, which is exactly torch's definition of a
  transposed convolution; output_padding is the conv's extra bottom/right padding. Gradients are
  conv2d_grad_input's (a conv2d for x, a conv2d_grad_weight for the weight).
- ``interpolate``: nearest (torch's ``floor(dst * scale)`` source index, 3-5-D), linear / bilinear /
  trilinear (3-D / 4-D / 5-D) and bicubic (4-D; A = -0.75, the border replicated), align_corners both
  ways: per resized dim, the last first, an ``index_select`` by constant source indices (for linear two,
  for bicubic four, weighted by constant weights: linear's computed in float32 as torch's CPU kernels
  compute them, bicubic's polynomials of torch's float32 position evaluated in float64); area: adaptive
  average pooling. Gradients are index_select's (sums into the sources).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from bendc.errors import ShapeError, UnsupportedError
# bendc.functional's helpers, which bendc/functional.py binds here when it imports this module
# (``bind``): functional imports resample and not the other way round, so there is no import cycle.
_HELPERS = ("_affine_operand", "_ints", "_static_float", "_tensor", "_tracer", "adaptive_avg_pool2d", "conv_operands",
            "index_select")
_affine_operand = _ints = _static_float = _tensor = _tracer = adaptive_avg_pool2d = conv_operands = index_select = None


def bind(functional: dict[str, Any]) -> None:
    """Take bendc.functional's helpers (its globals) for this module's functions."""
    globals().update({name: functional[name] for name in _HELPERS})
from bendc.trace import Tensor


# ------------------------------------------------------------------ batch norm
def _rebind(target: Any, value: Tensor, name: str, op: str, tracer) -> None:
    """torch updates the running statistics in place: the traced tensor names the new value."""
    if isinstance(target, Tensor):
        target.id = value.id
        return
    raise UnsupportedError(
        f"{op} in training mode updates {name} in place, but {name} is a torch tensor bendc does not trace "
        f"(a module buffer not given to functional_call): pass the buffers in the dict, e.g. "
        f"{{**bendc.params(model), **bendc.buffers(model)}}, and return the updated ones from the step",
        loc=tracer.builder.loc, op=op)


def _captured(value: Any, op: str, tracer) -> Any:
    """A torch tensor operand as a constant of the graph (bendc.trace.torch_constant); others as they are."""
    if value is None or isinstance(value, Tensor):
        return value
    return tracer.value(value, op)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: Any = 0.1, eps: float = 1e-5) -> Tensor:
    """torch's batch_norm: x (N, C, *) normalized per channel. Training: by the batch's mean and biased
    variance, and the running statistics given are updated in place (``(1 - momentum) * old + momentum *
    batch``, the unbiased variance; ``momentum`` a number or a traced 0-d tensor); evaluation: by the
    running statistics. Then ``* weight + bias`` (each optional, (C,))."""
    op = "batch_norm"
    tracer = _tracer(op, input, running_mean, running_var, weight, bias)
    with tracer.at_user_line(op) as builder:
        x = tracer.value(_tensor(input, op), op)
        eps = _static_float(eps, "eps", op, tracer)
        if x.ndim < 2:
            raise ShapeError(f"input {x.type} must be (N, C, *) with at least 2 dimensions", loc=builder.loc, op=op)
        channels = x.shape[1]
        stat_shape = (1, channels) + (1,) * (x.ndim - 2)
        weight = _affine_operand(_captured(weight, op, tracer), "weight", (channels,), op, tracer)
        bias = _affine_operand(_captured(bias, op, tracer), "bias", (channels,), op, tracer)
        if training:
            count = x.numel() // max(channels, 1)
            if count <= 1:
                raise ShapeError(f"training batch_norm needs more than 1 value per channel, got input {x.type}",
                                 loc=builder.loc, op=op)
            if (running_mean is None) != (running_var is None):
                raise UnsupportedError("batch_norm needs both running_mean and running_var or neither",
                                       loc=builder.loc, op=op)
            if running_mean is not None:
                if isinstance(momentum, Tensor):
                    factor = momentum
                else:
                    factor = _static_float(0.0 if momentum is None else momentum, "momentum", op, tracer)
                # torch updates them under no_grad: no gradient reaches x through the running statistics
                stats = tracer.emit("batch_norm_stats", (x.detach().id,))  # (2, C): mean, biased variance
                for name, stat, batch in (("running_mean", running_mean, stats[0]),
                                          ("running_var", running_var, stats[1] * (count / (count - 1)))):
                    if not isinstance(stat, Tensor):
                        _rebind(stat, x, name, op, tracer)
                    old = _affine_operand(stat, name, (channels,), op, tracer)
                    _rebind(stat, (1 - factor) * old + factor * batch, name, op, tracer)
            # one fused op, float64 inside (bendc/ops/batch_norm.py): composed of float32 ops, the
            # normalization multiplied the mean's rounding by rstd
            affine = tuple(v.id for v in (weight, bias) if v is not None)
            return tracer.emit("batch_norm", (x.id,) + affine, eps=eps, weight=weight is not None,
                               bias=bias is not None)
        else:
            if running_mean is None or running_var is None:
                raise UnsupportedError("batch_norm in evaluation mode needs running_mean and running_var",
                                       loc=builder.loc, op=op)
            # the module's own buffers (not given to functional_call) are constants: guarded by their version
            mean = _affine_operand(_captured(running_mean, op, tracer), "running_mean", (channels,), op,
                                   tracer).reshape(stat_shape)
            var = _affine_operand(_captured(running_var, op, tracer), "running_var", (channels,), op,
                                  tracer).reshape(stat_shape)
        out = (x - mean) * (var + eps).rsqrt()
        if weight is not None:
            out = out * weight.reshape(stat_shape)
        if bias is not None:
            out = out + bias.reshape(stat_shape)
        return out


def batch_norm_module_forward(module: Any, input: Any) -> Any:
    """nn.BatchNorm1d/2d/3d's forward (torch's _BatchNorm.forward) over traced buffers: the
    ``num_batches_tracked`` count is a traced tensor, so momentum=None's cumulative average
    ``1 / num_batches_tracked`` is computed in the graph rather than read with float()."""
    module._check_input_dim(input)
    training = module.training
    factor: Any = 0.0 if module.momentum is None else module.momentum
    if training and module.track_running_stats and module.num_batches_tracked is not None:
        count = module.num_batches_tracked
        tracer = _tracer("batch_norm", input)
        with tracer.at_user_line("batch_norm"):
            _rebind(count, count + 1, "num_batches_tracked", "batch_norm", tracer)
            if module.momentum is None:
                factor = 1.0 / count.float()
    use_batch = training or (module.running_mean is None and module.running_var is None)
    keep = not training or module.track_running_stats
    return batch_norm(input, module.running_mean if keep else None, module.running_var if keep else None,
                      module.weight, module.bias, use_batch, factor, module.eps)


# ------------------------------------------------------------------ transposed convolution
def _conv_transpose(x, weight, bias, stride, padding, output_padding, groups, dilation, dims: int, op: str):
    tracer = _tracer(op, x, weight, bias)
    with tracer.at_user_line(op) as builder:
        x, weight, unbatched = conv_operands(tracer, builder, x, weight, dims, op, "C_in, C_out/groups, kernel")
        stride = _ints(stride, dims, "stride", op, tracer)
        padding = _ints(padding, dims, "padding", op, tracer)
        output_padding = _ints(output_padding, dims, "output_padding", op, tracer)
        dilation = _ints(dilation, dims, "dilation", op, tracer)
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
            raise UnsupportedError(f"groups must be a positive Python int, got {groups!r}", loc=builder.loc, op=op)
        groups = int(groups)
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(output_padding) < 0:
            raise ShapeError(f"needs positive stride and dilation, non-negative padding and output_padding, got "
                             f"stride {stride}, dilation {dilation}, padding {padding}, output_padding "
                             f"{output_padding}", loc=builder.loc, op=op)
        if x.shape[1] != weight.shape[0] or weight.shape[0] % groups:
            raise ShapeError(f"input {x.type} needs {weight.shape[0]} channels for weight {weight.type} (C_in, "
                             f"C_out/groups, kernel), divisible by groups={groups}", loc=builder.loc, op=op)
        kernel = weight.shape[2:]
        sizes, bottoms = [], []
        for size, k, s, p, o, d in zip(x.shape[2:], kernel, stride, padding, output_padding, dilation):
            if o >= max(s, d):
                raise ShapeError(f"output_padding {output_padding} must be smaller than stride {stride} or "
                                 f"dilation {dilation}", loc=builder.loc, op=op)
            out = (size - 1) * s - 2 * p + d * (k - 1) + o + 1
            if out < 1:
                raise ShapeError(f"output size {out} of input {x.type}, kernel {tuple(kernel)} is too small",
                                 loc=builder.loc, op=op)
            # the conv whose input gradient this is: input size `out`, padding p before, `bottom` after, so
            # that its output is `size` again (any bottom in [p - o, p - o + s) does; it must be >= 0)
            bottom = max(p - o, 0)
            if bottom >= p - o + s:
                raise UnsupportedError(f"output_padding {output_padding} larger than padding {padding} plus stride "
                                       f"{stride} is not supported", loc=builder.loc, op=op)
            sizes.append(out)
            bottoms.append(bottom)
        if dims == 1:  # over (N, C, 1, L), as conv1d
            x, weight = x.unsqueeze(2), weight.unsqueeze(2)
            sizes, stride, dilation = [1] + sizes, (1,) + stride, (1,) + dilation
            pads = (0, 0, padding[0], bottoms[0])
        else:
            pads = (padding[0], bottoms[0], padding[1], bottoms[1])
        out = tracer.emit("conv2d_grad_input", (x.id, weight.id), input_size=tuple(sizes), stride=stride,
                          dilation=dilation, groups=groups, padding=pads)
        if bias is not None:
            bias = _affine_operand(bias, "bias", (out.shape[1],), op, tracer)
            out = out + bias.reshape((1, out.shape[1], 1, 1))
        if dims == 1:
            out = out.reshape(out.shape[0], out.shape[1], out.shape[3])
        return out.reshape(*out.shape[1:]) if unbatched else out


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """torch's conv_transpose2d: input (N, C_in, H, W) or unbatched, weight (C_in, C_out/groups, KH, KW),
    bias (C_out,): conv2d's input gradient (``conv2d_grad_input``)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 2,
                           "conv_transpose2d")


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """torch's conv_transpose1d: input (N, C_in, L) or unbatched, weight (C_in, C_out/groups, K)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 1,
                           "conv_transpose1d")


# ------------------------------------------------------------------ interpolate
_LINEAR_MODES = {"linear": 3, "bilinear": 4, "trilinear": 5}
_CUBIC_A = np.float32(-0.75)  # torch's bicubic convolution constant


def _scale(size: int, out: int, align_corners: bool, scale: float | None) -> np.float32:
    """torch's area_pixel_compute_scale (float32)."""
    if align_corners:
        return np.float32(size - 1) / np.float32(out - 1) if out > 1 else np.float32(0.0)
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(size) / np.float32(out)


def nearest_sources(size: int, out: int, scale: float | None) -> np.ndarray:
    """torch's nearest_idx: the source index of each output index (int64)."""
    if out == size:
        return np.arange(out, dtype=np.int64)
    if out == 2 * size:
        return np.arange(out, dtype=np.int64) >> 1
    factor = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(size) / np.float32(out)
    index = np.floor(np.arange(out, dtype=np.float32) * factor).astype(np.int64)
    return np.minimum(index, size - 1)


def linear_sources(size: int, out: int, align_corners: bool, scale: float | None):
    """torch's compute_indices_weights_linear: (index0, index1, lambda0, lambda1) per output index."""
    factor = _scale(size, out, align_corners, scale)
    dst = np.arange(out, dtype=np.float32)
    if align_corners:
        real = factor * dst
    else:
        real = np.maximum(factor * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0.0))
    index0 = np.minimum(np.floor(real).astype(np.int64), size - 1)
    lambda1 = np.clip(real - index0.astype(np.float32), np.float32(0.0), np.float32(1.0)).astype(np.float32)
    index1 = index0 + (index0 < size - 1)
    return index0, index1, (np.float32(1.0) - lambda1).astype(np.float32), lambda1


def _cubic_near(x: np.ndarray) -> np.ndarray:
    """torch's cubic_convolution1 (|x| <= 1): ((A + 2) * x - (A + 3)) * x * x + 1, in float64."""
    a = np.float64(_CUBIC_A)
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic_far(x: np.ndarray) -> np.ndarray:
    """torch's cubic_convolution2 (1 < |x| < 2): ((A * x - 5A) * x + 8A) * x - 4A, in float64."""
    a = np.float64(_CUBIC_A)
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def cubic_sources(size: int, out: int, align_corners: bool, scale: float | None):
    """torch's bicubic taps (HelperInterpCubic): per output index the source indices input_index - 1
    .. input_index + 2, clamped to [0, size) (the border replicated), and their weights for t = real -
    input_index (get_cubic_upsample_coefficients, A = -0.75). The source position real, input_index
    and t are float32 as torch computes them (the position is not clamped at 0 as linear's is;
    input_index at most size - 1, t in [0, 1]), so the taps sample where torch's do. The weights are
    the polynomials of that t (of t + 1, 1 - t and 2 - t) evaluated in float64 and rounded once.
    torch's float32 evaluation depends on its build's contraction into FMAs, and near |x| = 2 the far
    polynomial cancels: its weights can be ~25 ulps off their exact value (seen: (5 -> 10,
    align_corners) row 4's first weight, t + 1 = 1.7777778: exact -0.0288065814, this torch
    -0.02880621, the same float32 formula without FMAs -0.02880692; in the program fuzzer's (6, 5) ->
    (12, 10) an element 1.4e-6 off float64 where torch's float32 landed 5e-9 off)."""
    factor = _scale(size, out, align_corners, scale)
    dst = np.arange(out, dtype=np.float32)
    real = factor * dst if align_corners else factor * (dst + np.float32(0.5)) - np.float32(0.5)
    index = np.minimum(np.floor(real).astype(np.int64), size - 1)
    t = np.clip(real - index.astype(np.float32), np.float32(0.0), np.float32(1.0)).astype(np.float64)
    rest = 1.0 - t  # exact in float64, as are t + 1 and rest + 1
    weights = [_cubic_far(t + 1.0), _cubic_near(t), _cubic_near(rest), _cubic_far(rest + 1.0)]
    taps = [np.clip(index - 1 + j, 0, size - 1) for j in range(4)]
    return taps, [w.astype(np.float32) for w in weights]


def _output_sizes(x: Tensor, size: Any, scale_factor: Any, recompute: Any, op: str, loc):
    spatial = x.shape[2:]
    dims = len(spatial)
    if (size is None) == (scale_factor is None):
        raise UnsupportedError("interpolate needs exactly one of size and scale_factor", loc=loc, op=op)
    if size is not None:
        sizes = (size,) * dims if isinstance(size, (int, np.integer)) else tuple(size)
        if len(sizes) != dims or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1
                                     for s in sizes):
            raise ShapeError(f"size {size!r} must be {dims} positive ints for input {x.type}", loc=loc, op=op)
        return tuple(int(s) for s in sizes), (None,) * dims
    scales = (scale_factor,) * dims if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
    if len(scales) != dims or any(isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0 for s in scales):
        raise ShapeError(f"scale_factor {scale_factor!r} must be {dims} positive numbers for input {x.type}",
                         loc=loc, op=op)
    sizes = tuple(int(math.floor(float(n) * float(s))) for n, s in zip(spatial, scales))
    if min(sizes) < 1:
        raise ShapeError(f"scale_factor {scale_factor!r} makes an empty output of input {x.type}", loc=loc, op=op)
    return sizes, ((None,) * dims if recompute else tuple(float(s) for s in scales))


def _indices(tracer, values: np.ndarray) -> Tensor:
    return tracer.array_constant(np.asarray(values, np.int64), "i64")


def _weights(tracer, values: np.ndarray, axis: int, ndim: int) -> Tensor:
    weights = tracer.array_constant(np.asarray(values, np.float32), "f32")
    return weights.reshape((1,) * axis + (len(values),) + (1,) * (ndim - axis - 1))


def _weighted_taps(tracer, x: Tensor, axis: int, taps, weights) -> Tensor:
    """sum_j weights[j] * x[taps[j]] along ``axis``, added left to right as torch's kernels add them."""
    out = None
    for index, weight in zip(taps, weights):
        term = _weights(tracer, weight, axis, x.ndim) * index_select(x, axis, _indices(tracer, index))
        out = term if out is None else out + term
    return out


def _area(x: Tensor, sizes: tuple[int, ...]) -> Tensor:
    """mode="area": torch's adaptive_avg_pool1d/2d/3d to ``sizes`` (adaptive_avg_pool2d of the input with a
    unit height for 1-D, as torch computes it; for 3-D, over (H, W) and then over D, the box means
    nested)."""
    n, c = x.shape[:2]
    if x.ndim == 3:
        return adaptive_avg_pool2d(x.unsqueeze(2), (1, sizes[0])).reshape(n, c, sizes[0])
    if x.ndim == 4:
        return adaptive_avg_pool2d(x, sizes)
    depth, height, width = x.shape[2:]
    planes = adaptive_avg_pool2d(x.reshape(n, c * depth, height, width), sizes[1:])
    lines = planes.reshape(n, c, depth, sizes[1] * sizes[2])
    return adaptive_avg_pool2d(lines, (sizes[0], sizes[1] * sizes[2])).reshape(n, c, *sizes)


_MODES = "nearest, linear, bilinear, trilinear, bicubic, area"


def interpolate(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """torch's interpolate: modes nearest (3-5-D), linear / bilinear / trilinear (3-D / 4-D / 5-D) and
    bicubic (4-D), align_corners both ways, and area (3-5-D: adaptive average pooling), by size= or
    scale_factor= (the scale given is the one used, unless recompute_scale_factor). The interpolating
    modes go one spatial dim at a time, the last first, each output the taps' weighted sum as torch's
    CPU kernels nest them (inner sums along the last dim)."""
    op = "interpolate"
    tracer = _tracer(op, input)
    with tracer.at_user_line(op) as builder:
        x = tracer.value(_tensor(input, op), op)
        if antialias:
            raise UnsupportedError("interpolate(antialias=True) is not supported", loc=builder.loc, op=op)
        ranks = {"nearest": (3, 4, 5), "area": (3, 4, 5), "bicubic": (4,),
                 **{name: (rank,) for name, rank in _LINEAR_MODES.items()}}
        if mode not in ranks:
            raise UnsupportedError(f"interpolate mode {mode!r} is not supported ({_MODES})", loc=builder.loc, op=op)
        if mode in ("nearest", "area") and align_corners is not None:
            raise ShapeError(f"align_corners only applies to the interpolating modes (torch refuses it for {mode})",
                             loc=builder.loc, op=op)
        if x.ndim not in ranks[mode]:
            wanted = " or ".join(f"{rank}-D" for rank in ranks[mode])
            raise ShapeError(f"{mode} interpolate needs a {wanted} input (N, C, *), got {x.type}",
                             loc=builder.loc, op=op)
        sizes, scales = _output_sizes(x, size, scale_factor, recompute_scale_factor, op, builder.loc)
        if mode == "area":
            return _area(x, sizes)
        out = x
        for offset in reversed(range(x.ndim - 2)):  # the last dim first: torch's inner sums
            axis, n, m, scale = 2 + offset, x.shape[2 + offset], sizes[offset], scales[offset]
            if mode == "nearest":
                if m != n:
                    out = index_select(out, axis, _indices(tracer, nearest_sources(n, m, scale)))
            elif mode == "bicubic":
                out = _weighted_taps(tracer, out, axis, *cubic_sources(n, m, bool(align_corners), scale))
            else:
                index0, index1, lambda0, lambda1 = linear_sources(n, m, bool(align_corners), scale)
                out = _weighted_taps(tracer, out, axis, (index0, index1), (lambda0, lambda1))
        return out


def upsample(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    """torch's upsample (interpolate's older name)."""
    return interpolate(input, size, scale_factor, mode, align_corners)
