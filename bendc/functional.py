"""torch.nn.functional names with PyTorch semantics, for traced tensors.

Each function either records one op or composes ops through the tracer, so
its backward comes from the ops' VJP rules.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable

import numpy as np

from bendc.errors import ShapeError, UnsupportedError, user_location
from bendc.ops.base import f32_value
from bendc.ops.base import METHODS
from bendc.reductions import FUNCTIONS as REDUCTIONS
from bendc.tensor_math import FUNCTIONS as MATH_FUNCTIONS
from bendc.sort_scatter import FUNCTIONS as SORT_SCATTER_FUNCTIONS
from bendc.trace import Tensor, Tracer, _normalize_dim, active_tracer, matmul


def __getattr__(name: str) -> Any:
    """``F.<method>(x, *others)`` for the ops that declare their method in their op file."""
    if name in METHODS:
        def function(x: Tensor, *others: Any) -> Tensor:
            return getattr(_tensor(x, METHODS[name]), name)(*others)

        function.__name__ = name
        return function
    if name in MATH_FUNCTIONS:  # nan_to_num, round(decimals=) (bendc/tensor_math.py)
        return MATH_FUNCTIONS[name]
    if name in SORT_SCATTER_FUNCTIONS:  # prod, cumprod, flip, sort, ..., scatter_reduce (bendc/sort_scatter.py)
        return SORT_SCATTER_FUNCTIONS[name]
    if name in REDUCTIONS:  # max, min, amax, ... cumsum (bendc/reductions.py): not globals, so that
        return REDUCTIONS[name]  # max and min do not shadow the builtins in this module
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


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """torch's layer_norm: normalize over the trailing ``normalized_shape`` dims (biased variance),
    then ``* weight + bias`` (each optional, of shape ``normalized_shape``).

    Records one ``layer_norm`` op (bendc/ops/layer_norm.py) over x viewed as (rows, L), L the
    elements of ``normalized_shape``; its VJP is one ``layer_norm_grad``.
    """
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
        length = int(np.prod(shape))
        rows = x.reshape(int(np.prod(x.shape[:x.ndim - len(shape)])), length)
        affine = tuple(v.reshape(length).id for v in (weight, bias) if v is not None)
        out = tracer.emit("layer_norm", (rows.id,) + affine, eps=eps, weight=weight is not None,
                          bias=bias is not None)
        return out.reshape(x.shape)


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """torch's group_norm: x (N, C, *) normalized per (sample, group of C / num_groups channels),
    then ``* weight + bias`` per channel (each optional, of shape (C,)).

    Records one ``group_norm`` op (bendc/ops/group_norm.py); its VJP is one ``group_norm_grad``.
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
        channels = x.shape[1]
        if groups <= 0 or channels % groups:
            raise ShapeError(f"num_groups {groups} must divide the {channels} channels of {x.type}",
                             loc=builder.loc, op="group_norm")
        weight = _affine_operand(weight, "weight", (channels,), "group_norm", tracer)
        bias = _affine_operand(bias, "bias", (channels,), "group_norm", tracer)
        affine = tuple(v.id for v in (weight, bias) if v is not None)
        return tracer.emit("group_norm", (x.id,) + affine, groups=groups, eps=eps, weight=weight is not None,
                           bias=bias is not None)


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
                                 enable_gqa: bool = False, seed: Tensor | None = None) -> Tensor:
    """softmax(scale * q k^T [causal mask]) v, torch's signature and semantics.

    query (B, H, T, D), key (B, Hkv, T, D), value (B, Hkv, T, Dv). With
    ``enable_gqa`` H is a multiple of Hkv and query head h reads key/value
    head h // (H // Hkv); without it Hkv is H (or 1, which broadcasts, as in
    torch). ``scale`` defaults to 1/sqrt(D). ``attn_mask`` is accepted for
    torch's positional order and must keep its default. Records one
    ``attention`` node; the ``attention_schedule`` pass picks its schedule.
    With ``dropout_p`` > 0 the probabilities go through ``dropout`` (``seed``,
    or the trace's ``dropout_seed``): composed from matmul, softmax and
    dropout, as torch's math path (the fused kernels keep dropout_p=0).
    """
    op = "scaled_dot_product_attention"
    tracer = _tracer(op, query, key, value)
    with tracer.at_user_line(op) as builder:
        if attn_mask is not None:
            raise UnsupportedError("attn_mask is not supported (use is_causal=True for a causal mask)",
                                   loc=builder.loc, op=op)
        dropout_p = _static_float(dropout_p, "dropout_p", op, tracer)
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
        if dropout_p != 0.0:
            return _attention_with_dropout(q, k, v, is_causal, f32_value(scale), dropout_p, seed)
        return tracer.emit("attention", (q.id, k.id, v.id), causal=is_causal, scale=f32_value(scale),
                           schedule="auto")


# ------------------------------------------------------------------ losses
def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """torch's mse_loss: (input - target)^2, averaged, summed or per element (``reduction``)."""
    return _pointwise_loss("mse_loss", input, target, size_average, reduce, reduction, lambda d: d * d)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """torch's l1_loss: |input - target|, reduced."""
    return _pointwise_loss("l1_loss", input, target, size_average, reduce, reduction, lambda d: d.abs())


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> Tensor:
    """torch's smooth_l1_loss: with z = |input - target|, 0.5 * z * z / beta where z < beta, else
    z - 0.5 * beta (torch's kernel, in its order); beta 0 is l1_loss."""
    beta = _loss_parameter("smooth_l1_loss", "beta", beta, input)
    if beta == 0.0:
        return l1_loss(input, target, size_average, reduce, reduction)
    return _pointwise_loss("smooth_l1_loss", input, target, size_average, reduce, reduction,
                           lambda d: _by_size(d.abs(), beta, lambda z: 0.5 * z * z / beta, lambda z: z - 0.5 * beta))


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Any = None) -> Tensor:
    """torch's huber_loss: with z = |input - target|, 0.5 * z * z where z < delta, else
    delta * (z - 0.5 * delta)."""
    delta = _loss_parameter("huber_loss", "delta", delta, input)
    if weight is not None:
        raise UnsupportedError("huber_loss(weight=...) is not supported", loc=user_location(), op="huber_loss")
    return _pointwise_loss("huber_loss", input, target, None, None, reduction, lambda d: _by_size(
        d.abs(), delta, lambda z: 0.5 * z * z, lambda z: delta * (z - 0.5 * delta)))


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                         reduce=None, reduction: str = "mean") -> Tensor:
    """torch's binary_cross_entropy of probabilities: (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100)
    (its kernel's formula and clamp), times weight, reduced. torch raises for probabilities outside
    [0, 1]; bendc cannot check the data while tracing (they give NaN)."""
    def terms(x, t):
        loss = (t - 1.0) * x.neg().log1p().clamp(min=-100.0) - t * x.log().clamp(min=-100.0)
        return loss if weight is None else loss * weight

    return _pointwise_loss("binary_cross_entropy", input, target, size_average, reduce, reduction, terms,
                           difference=False)


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """torch's kl_div of log-probabilities ``input``: target * (log(target) - input) (0 where target is 0,
    torch's xlogy), or with log_target exp(target) * (target - input); reduction "batchmean" divides the
    sum by the batch (input.shape[0]), "mean" by every element, as torch."""
    if log_target:
        return _pointwise_loss("kl_div", input, target, size_average, reduce, reduction,
                               lambda x, t: t.exp() * (t - x), difference=False, batchmean=True)

    def terms(x, t):  # xlogy(t, t): 0 where t is 0
        return _where_nonzero(t, lambda safe: t * safe.log()) - t * x

    return _pointwise_loss("kl_div", input, target, size_average, reduce, reduction, terms, difference=False,
                           batchmean=True)


def _by_size(z: Tensor, limit: float, small: Callable, large: Callable) -> Tensor:
    """small(z) where z < limit, else large(z) (smooth_l1 / huber); each branch's gradient only where it
    is taken."""
    return where(z < limit, small(z), large(z))


def _loss_parameter(op: str, name: str, value: Any, input: Any) -> float:
    tracer = _tracer(op, input)
    value = _static_float(value, name, op, tracer)
    if value < 0:
        raise UnsupportedError(f"{op}: {name} must be non-negative, got {value}", loc=user_location(), op=op)
    return value


def _pointwise_loss(op: str, input: Any, target: Any, size_average: Any, reduce: Any, reduction: Any,
                    terms: Callable, difference: bool = True, batchmean: bool = False) -> Tensor:
    """A loss of elementwise terms (of input - target, or of (input, target)), reduced as torch's:
    "mean", "sum", "none" (and kl_div's "batchmean"). A target of another shape broadcasts, as in torch
    (which warns)."""
    tracer = _tracer(op, input, target)
    with tracer.at_user_line(op) as builder:
        _no_legacy(op, tracer, size_average, reduce)
        if not (batchmean and reduction == "batchmean"):
            _reduction(op, reduction, tracer)
        input = tracer.value(_tensor(input, op), op)
        target = tracer.value(target, op)
        loss = terms(input - target) if difference else terms(input, target)
        if reduction == "none":
            return loss
        if reduction == "batchmean":
            return loss.sum() / float(input.shape[0]) if input.ndim else loss.sum()
        return loss.sum() if reduction == "sum" else loss.mean()


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


# ------------------------------------------------------------------ data parallel (bendc.distributed)
def all_reduce(x: Tensor, op: str = "mean") -> Tensor:
    """The sum (op="sum") or mean (op="mean") of ``x`` over every rank (an ``all_reduce`` op; MPI at
    run time, the identity in a process of one rank). Differentiable: its gradient is the
    all-reduce of the gradient (torch.distributed's autograd)."""
    tracer = _tracer("all_reduce", x)
    with tracer.at_user_line("all_reduce"):
        return tracer.emit("all_reduce", (_tensor(x, "all_reduce").id,), op=op, group="world")
# ------------------------------------------------------------------ dropout, activations, losses
# (op-coverage issue: bendc/ops/random.py, activation.py, loss.py)
_RANDOM_STATE: "weakref.WeakKeyDictionary[Tracer, dict]" = weakref.WeakKeyDictionary()


def _random_state(tracer: Tracer) -> dict:
    """Per trace: the seed of dropout calls given none (``dropout_seed``) and the next offset."""
    return _RANDOM_STATE.setdefault(tracer, {"seed": None, "offset": 0})


def _check_seed(seed: Any, op: str, tracer: Tracer) -> Tensor:
    if not isinstance(seed, Tensor):
        raise UnsupportedError(f"seed must be a 0-d int64 array parameter of the step (a new value each step), "
                               f"got {type(seed).__name__}", loc=tracer.builder.loc, op=op)
    seed = tracer.value(seed, op)
    if not seed.type.is_index or seed.shape != ():
        raise UnsupportedError(f"seed must be a 0-d int64 (or int32) array, got {seed.type}",
                               loc=tracer.builder.loc, op=op)
    return seed


def dropout_seed(seed: Tensor) -> None:
    """The seed (a 0-d int64 array parameter of the step) of the later dropout calls of this trace
    that are given none: torch's ``F.dropout``, ``nn.Dropout`` and ``dropout_p`` of attention."""
    tracer = _tracer("dropout_seed", seed)
    with tracer.at_user_line("dropout_seed"):
        _random_state(tracer)["seed"] = _check_seed(seed, "dropout_seed", tracer)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, seed: Tensor | None = None) -> Tensor:
    """torch's dropout: each element zeroed with probability p, kept ones scaled by 1/(1-p);
    identity for p=0 or training=False. The mask comes from Philox-4x32-10 keyed by ``seed`` (a 0-d
    int64 array parameter of the step: same seed, same mask) at the element's index and this call's
    offset in the trace; the backward recomputes it (bendc/ops/random.py)."""
    tracer = _tracer("dropout", x, seed)
    with tracer.at_user_line("dropout") as builder:
        x = tracer.value(_tensor(x, "dropout"), "dropout")
        p = _static_float(p, "p", "dropout", tracer)
        if not 0.0 <= p <= 1.0:
            raise UnsupportedError(f"dropout probability has to be between 0 and 1, but got {p}", loc=builder.loc,
                                   op="dropout")
        if not isinstance(training, (bool, np.bool_)):
            raise UnsupportedError(f"training must be a Python bool, got {training!r}", loc=builder.loc,
                                   op="dropout")
        if not training or p == 0.0:
            return x
        state = _random_state(tracer)
        if seed is None:
            seed = state["seed"]
            if seed is None:
                raise UnsupportedError(f"dropout(p={p}) in training mode needs a seed: pass seed= (a 0-d int64 "
                                       "array parameter of the step, a new value each step) or call "
                                       "bendc.functional.dropout_seed(seed) first", loc=builder.loc, op="dropout")
        seed = _check_seed(seed, "dropout", tracer)
        offset = state["offset"]
        state["offset"] += 1
        return tracer.emit("dropout", (x.id, seed.id), p=p, offset=offset)


def _unary_op(op: str, x: Tensor, **attrs: Any) -> Tensor:
    tracer = _tracer(op, x)
    with tracer.at_user_line(op):
        x = tracer.value(_tensor(x, op), op)
        floats = {name: f32_value(_static_float(value, name, op, tracer)) for name, value in attrs.items()}
        return tracer.emit(op, (x.id,), **floats)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x), as torch computes it: x / (1 + exp(-x))."""
    return _unary_op("silu", x)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log1p(exp(beta * x)) / beta, and x where beta * x > threshold (torch's)."""
    return _unary_op("softplus", x, beta=beta, threshold=threshold)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x (torch's; the gradient at 0 is negative_slope)."""
    return _unary_op("leaky_relu", x, negative_slope=negative_slope)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha * (exp(x) - 1) (torch's, with expm1)."""
    return _unary_op("elu", x, alpha=alpha)


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """x clamped to [min_val, max_val]; the gradient passes where min_val < x < max_val strictly."""
    tracer = _tracer("hardtanh", x)
    if _static_float(min_val, "min_val", "hardtanh", tracer) > _static_float(max_val, "max_val", "hardtanh", tracer):
        raise UnsupportedError(f"min_val {min_val} cannot be greater than max_val {max_val}",
                               loc=user_location(), op="hardtanh")
    return _unary_op("hardtanh", x, min_val=min_val, max_val=max_val)


# ---- activations of public model code, composed of the ops above in torch's order: hardswish,
# hardsigmoid, relu6 and softsign round as torch's kernels do (bit for bit), the others within tolerance
def hardswish(x: Tensor) -> Tensor:
    """x * clamp(x + 3, 0, 6) / 6 (torch's kernel, in its order), with torch's piecewise gradient: 0 up
    to -3, g * (x / 3 + 0.5) strictly between -3 and 3 (here the product rule's, within rounding), g
    from 3. Each branch below has the formula's bits where it is taken."""
    x = _activation_operand("hardswish", x)
    value = (x * (x + 3.0).clamp(0.0, 6.0) / 6.0).detach()
    return where((x > -3.0) & (x < 3.0), x * (x + 3.0) / 6.0, where(x >= 3.0, x * 6.0 / 6.0, value))


def hardsigmoid(x: Tensor) -> Tensor:
    """clamp(x + 3, 0, 6) / 6 (torch's); the gradient g / 6 where -3 < x < 3 strictly, as torch's
    (clamp's would pass at the ends too)."""
    x = _activation_operand("hardsigmoid", x)
    return where((x > -3.0) & (x < 3.0), (x + 3.0) / 6.0, ((x + 3.0).clamp(0.0, 6.0) / 6.0).detach())


def relu6(x: Tensor) -> Tensor:
    """hardtanh(x, 0, 6), as torch's relu6."""
    return hardtanh(x, 0.0, 6.0)


def softsign(x: Tensor) -> Tensor:
    """x / (|x| + 1), torch's composite."""
    x = _activation_operand("softsign", x)
    return x / (x.abs() + 1.0)


def mish(x: Tensor) -> Tensor:
    """x * tanh(softplus(x)) (torch's; within tolerance of its vectorized tanh and log1p)."""
    x = _activation_operand("mish", x)
    return x * softplus(x).tanh()


def logsigmoid(x: Tensor) -> Tensor:
    """log(sigmoid(x)) = -softplus(-x): torch's values within tolerance, its gradient sigmoid(-x)
    (0.5 at 0, where min(x, 0) - log1p(exp(-|x|)) composed would give 1)."""
    x = _activation_operand("logsigmoid", x)
    return -softplus(-x)


def selu(x: Tensor) -> Tensor:
    """scale * elu(x, alpha) with torch's constants."""
    return 1.0507009873554804934193349852946 * elu(_activation_operand("selu", x), 1.6732632423543772848170429916717)


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = _activation_operand("celu", x)
    alpha = _static_float(alpha, "alpha", "celu", x.tracer)
    if alpha == 0.0:
        raise UnsupportedError("celu: alpha 0 is not supported (torch refuses it too)", loc=user_location(), op="celu")
    return where(x > 0.0, x, alpha * (x / alpha).expm1())


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b), a and b the halves of x along dim."""
    x = _activation_operand("glu", x)
    if x.ndim == 0 or x.shape[_normalize_dim(dim, x.ndim, "glu", user_location())] % 2:
        raise ShapeError(f"glu: dim {dim} of {x.type} must have an even size", loc=user_location(), op="glu")
    a, b = x.chunk(2, dim)
    return a * b.sigmoid()


def tanhshrink(x: Tensor) -> Tensor:
    x = _activation_operand("tanhshrink", x)
    return x - x.tanh()


def softshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """x - lambd above lambd, x + lambd below -lambd, else 0 (torch's vector loop's +0.0; its scalar
    tail gives x * 0, -0.0 for a negative x, so the sign of a zero depends on the position and the CPU)."""
    x = _activation_operand("softshrink", x)
    lambd = _static_float(lambd, "lambd", "softshrink", x.tracer)
    return where(x > lambd, x - lambd, where(x < -lambd, x + lambd, 0.0))


def hardshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """x where |x| > lambd, else 0."""
    x = _activation_operand("hardshrink", x)
    lambd = _static_float(lambd, "lambd", "hardshrink", x.tracer)
    return where((x > lambd) | (x < -lambd), x, 0.0)


def threshold(x: Tensor, threshold: float, value: float) -> Tensor:
    """x where x > threshold, else value."""
    x = _activation_operand("threshold", x)
    return where(x > _static_float(threshold, "threshold", "threshold", x.tracer), x,
                 _static_float(value, "value", "threshold", x.tracer))


def _activation_operand(op: str, x: Any) -> Tensor:
    tracer = _tracer(op, x)
    return tracer.value(_tensor(x, op), op)


def _no_legacy(op: str, tracer: Tracer, size_average: Any, reduce: Any) -> None:
    if size_average is not None or reduce is not None:
        raise UnsupportedError("size_average and reduce are deprecated in torch: use reduction=",
                               loc=tracer.builder.loc, op=op)


def _reduction(op: str, reduction: Any, tracer: Tracer) -> str:
    if reduction not in ("mean", "sum", "none"):
        raise UnsupportedError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}",
                               loc=tracer.builder.loc, op=op)
    return reduction


def _static_int(value: Any, name: str, op: str, tracer: Tracer) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UnsupportedError(f"{name} must be a Python int, got {value!r}", loc=tracer.builder.loc, op=op)
    return int(value)


def _class_operands(op: str, input: Tensor, target: Tensor, weight: Any, tracer: Tracer):
    """input (N, C), an integer target (N,), weight None or (C,): validated."""
    loc = tracer.builder.loc
    input, target = tracer.value(input, op), tracer.value(target, op)
    if not target.type.is_index:
        raise UnsupportedError(f"target must hold int64/int32 class indices, got {target.type}", loc=loc, op=op)
    if input.ndim != 2 or target.shape != input.shape[:1]:
        raise ShapeError(f"input must be (N, C) and target (N,), got {input.type} and {target.type}", loc=loc, op=op)
    if weight is not None:
        weight = tracer.value(_tensor(weight, op), op)
        if weight.shape != input.shape[1:]:
            raise ShapeError(f"weight {weight.type} must have one value per class (C={input.shape[1]})",
                             loc=loc, op=op)
        if weight.requires_grad:  # torch: nll_loss is not differentiable with respect to weight
            raise UnsupportedError("a class weight that requires grad is not supported (as in torch)", loc=loc,
                                   op=op)
    return input, target, weight


def _nll(log_probs: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str):
    """torch's nll_loss over rows of (N, C) log-probabilities; also returns the rows' mask and weights."""
    tracer = log_probs.tracer
    valid = tracer.emit("class_valid", (target.id,), ignore_index=ignore_index)
    safe = tracer.emit("class_safe", (target.id,), classes=log_probs.shape[1], ignore_index=ignore_index)
    picked = gather(log_probs, 1, safe.unsqueeze(1)).reshape(target.shape[0])
    zero = tracer.const(0.0)
    if weight is None:
        row_weights = tracer.emit("where", (valid.id, tracer.const(1.0).id, zero.id))
        terms = tracer.emit("where", (valid.id, (-picked).id, zero.id))
    else:
        class_weights = index_select(weight, 0, safe)
        row_weights = tracer.emit("where", (valid.id, class_weights.id, zero.id))
        terms = tracer.emit("where", (valid.id, (-(picked * class_weights)).id, zero.id))
    if reduction == "none":
        loss = terms
    elif reduction == "sum":
        loss = terms.sum()
    else:
        loss = terms.sum() / row_weights.sum()  # all rows ignored: 0 / 0 = nan, as torch
    return loss, valid, row_weights


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """torch's nll_loss: -input[i, target[i]] * weight[target[i]] per row (0 where target is
    ignore_index), summed, or averaged over the weights of the rows not ignored (nan if all are)."""
    tracer = _tracer("nll_loss", input, target, weight)
    with tracer.at_user_line("nll_loss"):
        _no_legacy("nll_loss", tracer, size_average, reduce)
        input, target, weight = _class_operands("nll_loss", input, target, weight, tracer)
        ignore_index = _static_int(ignore_index, "ignore_index", "nll_loss", tracer)
        return _nll(input, target, weight, ignore_index, _reduction("nll_loss", reduction, tracer))[0]


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """torch's cross_entropy with class-index targets: input (N, C), integer target (N,);
    log_softmax then nll_loss, and with label_smoothing eps torch's (1 - eps) * nll + eps / C *
    smooth, smooth = -sum_c (log_softmax * weight) per row (0 for ignored rows), reduced alike."""
    tracer = _tracer("cross_entropy", input, target, weight)
    with tracer.at_user_line("cross_entropy") as builder:
        _no_legacy("cross_entropy", tracer, size_average, reduce)
        input, target, weight = _class_operands("cross_entropy", input, target, weight, tracer)
        ignore_index = _static_int(ignore_index, "ignore_index", "cross_entropy", tracer)
        reduction = _reduction("cross_entropy", reduction, tracer)
        smoothing = _static_float(label_smoothing, "label_smoothing", "cross_entropy", tracer)
        if not 0.0 <= smoothing <= 1.0:
            raise UnsupportedError(f"label_smoothing must be between 0.0 and 1.0, got {smoothing}",
                                   loc=builder.loc, op="cross_entropy")
        log_probs = input.log_softmax(1)
        loss, valid, row_weights = _nll(log_probs, target, weight, ignore_index, reduction)
        if smoothing == 0.0:
            return loss
        summed = (log_probs if weight is None else log_probs * weight).sum(1)
        smooth = tracer.emit("where", (valid.id, (-summed).id, tracer.const(0.0).id))
        if reduction == "mean":
            smooth = smooth.sum() / row_weights.sum()
        elif reduction == "sum":
            smooth = smooth.sum()
        return (1.0 - smoothing) * loss + smooth * (smoothing / input.shape[1])


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """torch's stable formula: (1 - t) * x - log_sigmoid(x) * ((pos_weight - 1) * t + 1), times
    weight, reduced; log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|))."""
    op = "binary_cross_entropy_with_logits"
    tracer = _tracer(op, input, target, weight, pos_weight)
    with tracer.at_user_line(op) as builder:
        _no_legacy(op, tracer, size_average, reduce)
        reduction = _reduction(op, reduction, tracer)
        input = tracer.value(_tensor(input, op), op)
        target = tracer.value(target, op)
        if target.shape != input.shape:
            raise ShapeError(f"target size ({target.type}) must be the same as input size ({input.type})",
                             loc=builder.loc, op=op)
        operands = [input.id, target.id]
        if pos_weight is not None:
            pos_weight = tracer.value(_tensor(pos_weight, op), op)
            if pos_weight.requires_grad:
                raise UnsupportedError("a pos_weight that requires grad is not supported (pass it as a constant)",
                                       loc=builder.loc, op=op)
            operands.append(pos_weight.id)
        loss = tracer.emit("bce_logits", tuple(operands))
        if loss.shape != input.shape:
            raise ShapeError(f"pos_weight {pos_weight.type} must broadcast to the input {input.type}",
                             loc=builder.loc, op=op)
        if weight is not None:
            loss = loss * weight
            if loss.shape != input.shape:
                raise ShapeError(f"weight must broadcast to the input {input.type}", loc=builder.loc, op=op)
        if reduction == "mean":
            return loss.mean()
        return loss.sum() if reduction == "sum" else loss


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """torch's normalize for p=2: x / max(||x||_2 over dim, eps)."""
    tracer = _tracer("normalize", input)
    with tracer.at_user_line("normalize") as builder:
        input = tracer.value(_tensor(input, "normalize"), "normalize")
        if _static_float(p, "p", "normalize", tracer) != 2.0:
            raise UnsupportedError(f"normalize supports p=2 only, got p={p}", loc=builder.loc, op="normalize")
        eps = f32_value(_static_float(eps, "eps", "normalize", tracer))
        dim = _normalize_dim(dim, input.ndim, "normalize", builder.loc)
        sum_of_squares = input.square().sum(dim, keepdim=True)
        return input / tracer.emit("norm_clamp", (sum_of_squares.id,), eps=eps)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """torch's embedding: rows of ``weight`` (V, D) picked by an integer index of any shape; rows
    picked by ``padding_idx`` take no gradient."""
    tracer = _tracer("embedding", input, weight)
    with tracer.at_user_line("embedding") as builder:
        if not isinstance(input, Tensor):
            raise UnsupportedError("the index must be an integer array parameter of the jitted function",
                                   loc=builder.loc, op="embedding")
        input, weight = tracer.value(input, "embedding"), tracer.value(_tensor(weight, "embedding"), "embedding")
        if weight.ndim != 2:
            raise ShapeError(f"weight must be (num_embeddings, embedding_dim), got {weight.type}", loc=builder.loc,
                             op="embedding")
        flat = input.reshape(-1) if input.ndim != 1 else input
        rows = index_select(weight, 0, flat)
        if padding_idx is not None:
            padding_idx = _static_int(padding_idx, "padding_idx", "embedding", tracer)
            if not -weight.shape[0] <= padding_idx < weight.shape[0]:
                raise ShapeError(f"padding_idx {padding_idx} must be within num_embeddings {weight.shape[0]}",
                                 loc=builder.loc, op="embedding")
            padding_idx %= weight.shape[0]
            rows = tracer.emit("padding_rows", (rows.id, flat.unsqueeze(1).id), padding_idx=padding_idx)
        return rows.reshape(*input.shape, weight.shape[1]) if input.ndim != 1 else rows


def _attention_with_dropout(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float, dropout_p: float,
                            seed: Tensor | None) -> Tensor:
    """torch's math attention with dropout: softmax(scale * q k^T [causal]) -> dropout -> @ v,
    query head h reading key/value head h // (H // Hkv) (as a broadcast over head groups)."""
    batch, heads, t, width = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    keys = k.reshape(batch, kv_heads, 1, t, width).transpose(-1, -2)
    scores = matmul(q.reshape(batch, kv_heads, group, t, width), keys) * scale
    if is_causal:
        scores = q.tracer.emit("causal_fill", (scores.id,), value=-math.inf, size=t)
    probs = dropout(scores.softmax(-1), dropout_p, True, seed)
    out = matmul(probs, v.reshape(batch, kv_heads, 1, t, v.shape[3]))
    return out.reshape(batch, heads, t, v.shape[3])
# ------------------------------------------------------------------ shapes, selection, powers (issue 14)
from bendc.tensor_ops import cat, pad, stack, where  # noqa: E402,F401  (torch's names and semantics)
from bendc.tensor_ops import where_nonzero as _where_nonzero  # noqa: E402
from bendc.tensor_ops import (arange, empty, empty_like, eye, full, full_like, linspace, one_hot,  # noqa: E402,F401
                              ones, ones_like, tensor, zeros, zeros_like)  # tensor creation (issue 22)

concat = cat


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """torch.clamp: min(max(x, min), max); min and max are numbers or tensors, either None."""
    return _tensor(x, "clamp").clamp(min, max)


clip = clamp


def pow(x: Any, exponent: Any) -> Tensor:
    """torch.pow: x ** exponent (a number or a tensor either side)."""
    if isinstance(x, Tensor):
        return x ** exponent
    return _tensor(exponent, "pow").__rpow__(x)


def masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
    return _tensor(x, "masked_fill").masked_fill(mask, value)


def split(x: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple:
    return _tensor(x, "split").split(split_size_or_sections, dim)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple:
    return _tensor(x, "chunk").chunk(chunks, dim)


def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    return _tensor(x, "squeeze").squeeze(dim)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return _tensor(x, "flatten").flatten(start_dim, end_dim)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    return _tensor(x, "tril").tril(diagonal)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    return _tensor(x, "triu").triu(diagonal)
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


def conv_operands(tracer: Tracer, builder, x: Any, weight: Any, dims: int, op: str,
                  layout: str = "O, C/groups, kernel") -> tuple[Tensor, Tensor, bool]:
    """A conv's input (with its batch dim) and weight (``dims + 2`` dims), and whether x was unbatched."""
    x = tracer.value(_tensor(x, op), op)
    weight = tracer.value(_tensor(weight, op), op)
    x, unbatched = _batched(x, dims, op, builder)
    if weight.ndim != dims + 2:
        raise ShapeError(f"weight {weight.type} must have {dims + 2} dimensions ({layout})", loc=builder.loc, op=op)
    return x, weight, unbatched


def _conv(x, weight, bias, stride, padding, dilation, groups, dims: int, op: str) -> Tensor:
    tracer = _tracer(op, x, weight, bias)
    with tracer.at_user_line(op) as builder:
        x, weight, unbatched = conv_operands(tracer, builder, x, weight, dims, op)
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


# batch_norm, conv_transpose1d/2d, interpolate, upsample (bendc/resample.py), which use this module's
# helpers: bound into it here, so that resample imports nothing of this module (no import cycle).
from bendc import resample as _resample  # noqa: E402

_resample.bind(globals())
from bendc.resample import batch_norm, conv_transpose1d, conv_transpose2d, interpolate, upsample  # noqa: E402,F401
