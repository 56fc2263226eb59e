"""torch.nn.functional names with PyTorch semantics, for traced tensors.

Each function either records one op or composes ops through the tracer, so
its backward comes from the ops' VJP rules.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from bendc.errors import ShapeError, UnsupportedError
from bendc.ops.base import f32_value
from bendc.ops.base import METHODS
from bendc.trace import Tensor, Tracer, _normalize_dim, active_tracer, matmul


def __getattr__(name: str) -> Any:
    """``F.<method>(x, *others)`` for the ops that declare their method in their op file."""
    if name in METHODS:
        def function(x: Tensor, *others: Any) -> Tensor:
            return getattr(_tensor(x, METHODS[name]), name)(*others)

        function.__name__ = name
        return function
    raise AttributeError(f"module 'bendc.functional' has no attribute {name!r}")


def _tracer(op: str, *values: Any) -> Tracer:
    for value in values:
        if isinstance(value, Tensor):
            return value.tracer
    return active_tracer(op)


def _tensor(x: Any, op: str) -> Tensor:
    tracer = _tracer(op, x)
    if not isinstance(x, Tensor):
        raise UnsupportedError(f"expected a traced tensor, got {type(x).__name__}", loc=tracer.builder.loc, op=op)
    return x


# ------------------------------------------------------------------ elementwise
def relu(x: Tensor) -> Tensor:
    """max(x, 0), keeping -0.0 and NaN as PyTorch does."""
    return _tensor(x, "relu").relu()


def sigmoid(x: Tensor) -> Tensor:
    return _tensor(x, "sigmoid").sigmoid()


def tanh(x: Tensor) -> Tensor:
    return _tensor(x, "tanh").tanh()


def exp(x: Tensor) -> Tensor:
    return _tensor(x, "exp").exp()


def log(x: Tensor) -> Tensor:
    return _tensor(x, "log").log()


def sqrt(x: Tensor) -> Tensor:
    return _tensor(x, "sqrt").sqrt()


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x); ``approximate="tanh"`` for the tanh approximation."""
    x = _tensor(x, "gelu")
    with x.tracer.at_user_line("gelu"):
        return x.tracer.emit("gelu", (x.id,), approximate=approximate)


def softmax(x: Tensor, dim: int) -> Tensor:
    return _tensor(x, "softmax").softmax(dim)


def log_softmax(x: Tensor, dim: int) -> Tensor:
    return _tensor(x, "log_softmax").log_softmax(dim)


# ------------------------------------------------------------------ layers
def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x @ w.T + b."""
    tracer = _tracer("linear", x, w)
    with tracer.at_user_line("linear") as builder:
        x, w = tracer.value(x, "linear"), tracer.value(w, "linear")
        if w.ndim not in (1, 2):
            raise ShapeError(f"weight must be 1-D or 2-D, got {w.type}", loc=builder.loc, op="linear")
        if x.ndim == 0 or x.shape[-1] != w.shape[-1]:
            raise ShapeError(f"input {x.type} and weight {w.type} need the same last dimension",
                             loc=builder.loc, op="linear")
        out = matmul(x, w.T)
        if b is not None:
            out = out + b
        return out


# ------------------------------------------------------------------ normalization
def _affine_operand(value: Any, name: str, shape: tuple[int, ...], op: str, tracer: Tracer) -> Tensor | None:
    """weight or bias: None, or a tensor of exactly ``shape``."""
    if value is None:
        return None
    value = tracer.value(_tensor(value, op), op)
    if value.shape != shape:
        raise ShapeError(f"{name} {value.type} must have shape [{','.join(map(str, shape))}]",
                         loc=tracer.builder.loc, op=op)
    return value


def _normalize(x: Tensor, dims: tuple[int, ...], eps: float) -> Tensor:
    """(x - mean) * rstd over the trailing ``dims``; the statistics are row kernels (bendc.ops.norm)."""
    tracer = x.tracer
    mean = tracer.emit("norm_mean", (x.id,), dims=dims)
    rstd = tracer.emit("norm_rstd", (x.id,), dims=dims, eps=eps)
    return (x - mean) * rstd


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """torch's layer_norm: normalize over the trailing ``normalized_shape`` dims (biased variance),
    then ``* weight + bias`` (each optional, of shape ``normalized_shape``)."""
    tracer = _tracer("layer_norm", x, weight, bias)
    with tracer.at_user_line("layer_norm") as builder:
        x = tracer.value(_tensor(x, "layer_norm"), "layer_norm")
        eps = _static_float(eps, "eps", "layer_norm", tracer)
        if not isinstance(normalized_shape, (tuple, list)) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in normalized_shape):
            # torch.nn.functional.layer_norm takes no bare int either (nn.LayerNorm does).
            raise UnsupportedError(f"normalized_shape must be a tuple of ints, got {normalized_shape!r}",
                                   loc=builder.loc, op="layer_norm")
        shape = tuple(int(d) for d in normalized_shape)
        if not shape:
            raise ShapeError(f"normalized_shape must be non-empty (input {x.type})", loc=builder.loc,
                             op="layer_norm")
        if len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
            raise ShapeError(f"input {x.type} does not end in normalized_shape [{','.join(map(str, shape))}]",
                             loc=builder.loc, op="layer_norm")
        weight = _affine_operand(weight, "weight", shape, "layer_norm", tracer)
        bias = _affine_operand(bias, "bias", shape, "layer_norm", tracer)
        out = _normalize(x, tuple(range(x.ndim - len(shape), x.ndim)), eps)
        if weight is not None:
            out = out * weight
        if bias is not None:
            out = out + bias
        return out


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """torch's group_norm: x (N, C, *) normalized per (sample, group of C / num_groups channels),
    then ``* weight + bias`` per channel (each optional, of shape (C,)).

    Traced as x.reshape(N, G, C/G, S) (a view), the statistics over the last two
    dims, and the affine read as (G, C/G, 1): one kernel over (N, G, C/G, S).
    """
    tracer = _tracer("group_norm", x, weight, bias)
    with tracer.at_user_line("group_norm") as builder:
        x = tracer.value(_tensor(x, "group_norm"), "group_norm")
        eps = _static_float(eps, "eps", "group_norm", tracer)
        if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
            raise UnsupportedError(f"num_groups must be a Python int, got {num_groups!r}",
                                   loc=builder.loc, op="group_norm")
        groups = int(num_groups)
        if x.ndim < 2:
            raise ShapeError(f"input {x.type} must be (N, C, *) with at least 2 dimensions",
                             loc=builder.loc, op="group_norm")
        batch, channels = x.shape[:2]
        if groups <= 0 or channels % groups:
            raise ShapeError(f"num_groups {groups} must divide the {channels} channels of {x.type}",
                             loc=builder.loc, op="group_norm")
        weight = _affine_operand(weight, "weight", (channels,), "group_norm", tracer)
        bias = _affine_operand(bias, "bias", (channels,), "group_norm", tracer)
        spatial = math.prod(x.shape[2:])
        grouped = x.reshape(batch, groups, channels // groups, spatial)
        out = _normalize(grouped, (2, 3), eps)
        per_channel = (groups, channels // groups, 1)
        if weight is not None:
            out = out * weight.reshape(per_channel)
        if bias is not None:
            out = out + bias.reshape(per_channel)
        return out.reshape(x.shape)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding: x (..., t, 2*half), cos and sin (t, half); with x1, x2 the halves of
    the last dim, cat(x1*cos - x2*sin, x2*cos + x1*sin). Gradients reach x, and cos and sin
    where they are leaves."""
    tracer = _tracer("rope", x, cos, sin)
    with tracer.at_user_line("rope"):
        x, cos, sin = (tracer.value(_tensor(v, "rope"), "rope") for v in (x, cos, sin))
        return tracer.emit("rope", (x.id, cos.id, sin.id), inverse=False)


# ------------------------------------------------------------------ attention
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(scale * q k^T [causal mask]) v, torch's signature and semantics.

    query (B, H, T, D), key (B, Hkv, T, D), value (B, Hkv, T, Dv). With
    ``enable_gqa`` H is a multiple of Hkv and query head h reads key/value
    head h // (H // Hkv); without it Hkv is H (or 1, which broadcasts, as in
    torch). ``scale`` defaults to 1/sqrt(D). ``attn_mask`` and ``dropout_p``
    are accepted for torch's positional order and must keep their defaults.
    Records one ``attention`` node; the ``attention_schedule`` pass picks its
    schedule.
    """
    op = "scaled_dot_product_attention"
    tracer = _tracer(op, query, key, value)
    with tracer.at_user_line(op) as builder:
        if attn_mask is not None:
            raise UnsupportedError("attn_mask is not supported (use is_causal=True for a causal mask)",
                                   loc=builder.loc, op=op)
        if isinstance(dropout_p, Tensor) or dropout_p != 0.0:
            raise UnsupportedError(f"dropout_p={dropout_p!r} is not supported (0.0 only)", loc=builder.loc, op=op)
        if not isinstance(is_causal, bool) or not isinstance(enable_gqa, bool):
            raise UnsupportedError("is_causal and enable_gqa must be Python bools", loc=builder.loc, op=op)
        q, k, v = (tracer.value(x, op) for x in (query, key, value))
        for x in (q, k, v):
            if x.ndim != 4:
                raise ShapeError(f"query, key and value must be 4-D (B, H, T, D), got {q.type}, {k.type}, "
                                 f"{v.type}", loc=builder.loc, op=op)
        if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
            raise UnsupportedError(f"query and key/value of different lengths ({q.type}, {k.type}, {v.type}) "
                                   "are not supported: one sequence length T", loc=builder.loc, op=op)
        heads, kv_heads = q.shape[1], k.shape[1]
        if enable_gqa:
            if kv_heads == 0 or heads % kv_heads:
                raise ShapeError(f"with enable_gqa the query heads ({heads}) must be a multiple of the key/value "
                                 f"heads ({kv_heads}): {q.type}, {k.type}", loc=builder.loc, op=op)
        elif kv_heads not in (heads, 1):
            raise ShapeError(f"query {q.type} has {heads} heads and key {k.type} {kv_heads}: pass "
                             "enable_gqa=True for grouped-query attention", loc=builder.loc, op=op)
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[3]) if q.shape[3] else 1.0
        scale = _static_float(scale, "scale", op, tracer)
        return tracer.emit("attention", (q.id, k.id, v.id), causal=is_causal, scale=f32_value(scale),
                           schedule="auto")


# ------------------------------------------------------------------ losses
def mse_loss(input: Tensor, target: Tensor) -> Tensor:
    """mean((input - target)^2)."""
    tracer = _tracer("mse_loss", input, target)
    with tracer.at_user_line("mse_loss"):
        diff = tracer.value(input, "mse_loss") - target
        return (diff * diff).mean()


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean over N of -log_softmax(logits)[i, target[i]]; logits (N, C), integer target (N,)."""
    tracer = _tracer("cross_entropy", logits, target)
    with tracer.at_user_line("cross_entropy") as builder:
        logits, target = tracer.value(logits, "cross_entropy"), tracer.value(target, "cross_entropy")
        if not target.type.is_index:
            raise UnsupportedError(f"target must hold int64/int32 class indices, got {target.type}",
                                   loc=builder.loc, op="cross_entropy")
        if logits.ndim != 2 or target.shape != logits.shape[:1]:
            raise ShapeError(f"logits must be (N, C) and target (N,), got {logits.type} and {target.type}",
                             loc=builder.loc, op="cross_entropy")
        log_probs = logits.log_softmax(1)
        picked = gather(log_probs, 1, target.unsqueeze(1))
        return -picked.mean()


# ------------------------------------------------------------------ indexing
def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """torch.index_select: slices along dim picked by a 1-D integer index."""
    tracer = _tracer("index_select", x, index)
    with tracer.at_user_line("index_select") as builder:
        x, index = tracer.value(x, "index_select"), tracer.value(index, "index_select")
        return tracer.emit("index_select", (x.id, index.id), dim=_normalize_dim(dim, x.ndim, "index_select",
                                                                                 builder.loc))


def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """torch.gather: out[..., j, ...] = x[..., index[..., j, ...], ...] along dim."""
    tracer = _tracer("gather", x, index)
    with tracer.at_user_line("gather") as builder:
        x, index = tracer.value(x, "gather"), tracer.value(index, "gather")
        return tracer.emit("gather", (x.id, index.id), dim=_normalize_dim(dim, x.ndim, "gather", builder.loc))


# ------------------------------------------------------------------ optimizers
def _static_float(value: Any, name: str, op: str, tracer: Tracer) -> float:
    if isinstance(value, Tensor) or not isinstance(value, (int, float)):
        raise UnsupportedError(f"{name} must be a Python number (a static value), got {type(value).__name__}",
                               loc=tracer.builder.loc, op=op)
    return float(value)


def sgd_step(param: Tensor, grad: Tensor, lr: float, momentum: float = 0.0, buf: Tensor | None = None):
    """One torch.optim.SGD update: returns the new param, and (param, buf) with momentum.

    Without momentum: param - lr * grad. With momentum: buf = grad on the first
    step (buf None), else buf * momentum + grad; then param - lr * buf.
    """
    tracer = _tracer("sgd_step", param, grad)
    with tracer.at_user_line("sgd_step") as builder:
        lr = _static_float(lr, "lr", "sgd_step", tracer)
        momentum = _static_float(momentum, "momentum", "sgd_step", tracer)
        param, grad = tracer.value(param, "sgd_step"), tracer.value(grad, "sgd_step")
        if grad.shape != param.shape:
            raise ShapeError(f"grad {grad.type} must have the param's shape {param.type}",
                             loc=builder.loc, op="sgd_step")
        if momentum == 0.0:
            return param - lr * grad
        new_buf = grad if buf is None else buf * momentum + grad
        return param - lr * new_buf, new_buf


def adam_step(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, step: int | Tensor, lr: float,
              betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
    """One torch.optim.AdamW update (weight_decay=0 is Adam); returns (param, m, v).

    ``step`` is the 1-based count of this update (PyTorch's state step after
    its increment): a static Python int (each value is a new trace), or a
    0-d array parameter (one trace for the whole training loop). Either way
    the bias corrections are computed in float64, as PyTorch computes them in
    Python, and used as float32 scalars.
    """
    tracer = _tracer("adam_step", param, grad)
    with tracer.at_user_line("adam_step") as builder:
        traced_step = isinstance(step, Tensor)
        if traced_step and (step.shape != () or step.requires_grad):
            raise UnsupportedError(f"a traced step must be a 0-d constant, got {step.type}",
                                   loc=builder.loc, op="adam_step")
        if not traced_step and (not isinstance(step, int) or isinstance(step, bool) or step < 1):
            raise UnsupportedError(f"step must be a Python int >= 1 or a 0-d array, got {step!r}",
                                   loc=builder.loc, op="adam_step")
        lr = _static_float(lr, "lr", "adam_step", tracer)
        beta1, beta2 = (_static_float(b, "betas", "adam_step", tracer) for b in betas)
        eps = _static_float(eps, "eps", "adam_step", tracer)
        weight_decay = _static_float(weight_decay, "weight_decay", "adam_step", tracer)
        param, grad = tracer.value(param, "adam_step"), tracer.value(grad, "adam_step")
        m, v = tracer.value(m, "adam_step"), tracer.value(v, "adam_step")
        for name, other in (("grad", grad), ("m", m), ("v", v)):
            if other.shape != param.shape:
                raise ShapeError(f"{name} {other.type} must have the param's shape {param.type}",
                                 loc=builder.loc, op="adam_step")
        if weight_decay != 0.0:
            param = param * (1.0 - lr * weight_decay)
        new_m = m + (1.0 - beta1) * (grad - m)          # m.lerp_(grad, 1 - beta1)
        new_v = v * beta2 + (1.0 - beta2) * grad * grad  # v.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
        if traced_step:
            step_size = tracer.emit("adam_step_size", (step.id,), lr=lr, beta1=beta1)
            bias_correction2_sqrt = tracer.emit("adam_bias_root", (step.id,), beta2=beta2)
        else:
            step_size = lr / (1.0 - beta1 ** step)
            bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** step)
        denom = new_v.sqrt() / bias_correction2_sqrt + eps
        new_param = param + (-step_size) * (new_m / denom)
        return new_param, new_m, new_v


# ------------------------------------------------------------------ convolution and pooling (op-coverage issue)
def _ints(value: Any, count: int, name: str, op: str, tracer: Tracer) -> tuple[int, ...]:
    """An int or a sequence of ``count`` ints (torch's _pair / _single), as a tuple."""
    items = (value,) * count if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if (not isinstance(items, (tuple, list)) or len(items) != count
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items)):
        raise UnsupportedError(f"{name} must be an int or {count} ints, got {value!r}", loc=tracer.builder.loc, op=op)
    return tuple(int(v) for v in items)


def _batched(x: Tensor, dims: int, op: str, builder) -> tuple[Tensor, bool]:
    """x with its batch dim: (C, *spatial) inputs are unbatched, as in torch."""
    if x.ndim == dims + 1:
        return x.unsqueeze(0), True
    if x.ndim != dims + 2:
        raise ShapeError(f"input {x.type} must be (N, C, {', '.join('HW'[-dims:] if dims == 2 else 'L')}) "
                         f"or unbatched (C, ...)", loc=builder.loc, op=op)
    return x, False


def _conv(x, weight, bias, stride, padding, dilation, groups, dims: int, op: str) -> Tensor:
    tracer = _tracer(op, x, weight, bias)
    with tracer.at_user_line(op) as builder:
        x = tracer.value(_tensor(x, op), op)
        weight = tracer.value(_tensor(weight, op), op)
        x, unbatched = _batched(x, dims, op, builder)
        if weight.ndim != dims + 2:
            raise ShapeError(f"weight {weight.type} must have {dims + 2} dimensions (O, C/groups, kernel)",
                             loc=builder.loc, op=op)
        stride = _ints(stride, dims, "stride", op, tracer)
        dilation = _ints(dilation, dims, "dilation", op, tracer)
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
            raise UnsupportedError(f"groups must be a Python int, got {groups!r}", loc=builder.loc, op=op)
        kernel = weight.shape[2:]
        if padding == "valid":
            pads = [(0, 0)] * dims
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ShapeError(f"padding='same' needs stride 1, got stride {stride}", loc=builder.loc, op=op)
            # torch pads the odd extra element at the end (bottom / right)
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, kernel)]
        elif isinstance(padding, str):
            raise UnsupportedError(f"padding={padding!r} is not supported (an int, ints, 'same' or 'valid')",
                                   loc=builder.loc, op=op)
        else:
            pads = [(p, p) for p in _ints(padding, dims, "padding", op, tracer)]
        if dims == 1:  # conv1d is conv2d over (N, C, 1, L)
            x = x.unsqueeze(2)
            weight = weight.unsqueeze(2)
            stride, dilation, pads = (1,) + stride, (1,) + dilation, [(0, 0)] + pads
        operands = [x.id, weight.id]
        if bias is not None:
            operands.append(tracer.value(_tensor(bias, op), op).id)
        out = tracer.emit("conv2d", operands, stride=stride, dilation=dilation, groups=int(groups),
                          padding=(pads[0][0], pads[0][1], pads[1][0], pads[1][1]))
        if dims == 1:
            out = out.reshape(out.shape[0], out.shape[1], out.shape[3])
        return out.reshape(*out.shape[1:]) if unbatched else out


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """torch's conv2d: input (N, C, H, W) or (C, H, W), weight (O, C/groups, KH, KW), bias (O,);
    padding an int, a pair, "same" or "valid"."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """torch's conv1d: input (N, C, L) or (C, L), weight (O, C/groups, K), bias (O,)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def _pool(op: str, x: Tensor, **attrs: Any) -> Tensor:
    tracer = _tracer(op, x)
    with tracer.at_user_line(op) as builder:
        x, unbatched = _batched(tracer.value(_tensor(x, op), op), 2, op, builder)
        out = tracer.emit(op, (x.id,), **attrs)
        return out.reshape(*out.shape[1:]) if unbatched else out


def max_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
    """torch's max_pool2d (stride defaults to kernel_size); the gradient goes to each window's first max."""
    tracer = _tracer("max_pool2d", input)
    with tracer.at_user_line("max_pool2d") as builder:
        if return_indices:
            raise UnsupportedError("max_pool2d return_indices=True is not supported", loc=builder.loc,
                                   op="max_pool2d")
        kernel, stride, padding = _window_args("max_pool2d", kernel_size, stride, padding, tracer)
        return _pool("max_pool2d", input, kernel_size=kernel, stride=stride, padding=padding,
                     dilation=_ints(dilation, 2, "dilation", "max_pool2d", tracer), ceil_mode=bool(ceil_mode))


def _window_args(op: str, kernel_size: Any, stride: Any, padding: Any, tracer: Tracer) -> tuple:
    """(kernel_size, stride, padding) as pairs; stride defaults to kernel_size, as in torch."""
    kernel = _ints(kernel_size, 2, "kernel_size", op, tracer)
    default = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    return kernel, kernel if default else _ints(stride, 2, "stride", op, tracer), _ints(padding, 2, "padding", op,
                                                                                        tracer)


def avg_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """torch's avg_pool2d (stride defaults to kernel_size)."""
    tracer = _tracer("avg_pool2d", input)
    with tracer.at_user_line("avg_pool2d") as builder:
        if divisor_override is not None:
            raise UnsupportedError(f"avg_pool2d divisor_override={divisor_override!r} is not supported",
                                   loc=builder.loc, op="avg_pool2d")
        kernel, stride, padding = _window_args("avg_pool2d", kernel_size, stride, padding, tracer)
        return _pool("avg_pool2d", input, kernel_size=kernel, stride=stride, padding=padding,
                     ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """torch's adaptive_avg_pool2d; None in output_size keeps that input size."""
    tracer = _tracer("adaptive_avg_pool2d", input)
    with tracer.at_user_line("adaptive_avg_pool2d"):
        x = _tensor(input, "adaptive_avg_pool2d")
        sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, output_size)
        if len(sizes) == 2:
            sizes = tuple(x.shape[-2 + a] if s is None else s for a, s in enumerate(sizes))
        return _pool("adaptive_avg_pool2d", x,
                     output_size=_ints(sizes, 2, "output_size", "adaptive_avg_pool2d", tracer))
