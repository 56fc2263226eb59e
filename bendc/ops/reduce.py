"""Reductions: sum over dims, sum_to_size (autodiff's broadcast reduction),
and the row ops softmax and log_softmax."""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, define_op, normalize_dims, require_float


def _keepdim_shape(shape, dims):
    return tuple(1 if axis in dims else d for axis, d in enumerate(shape))


def _infer_sum(types, attrs):
    (x,) = types
    require_float(types, "sum")
    dims = tuple(attrs["dims"])
    if normalize_dims(dims, x.ndim) != dims:
        raise InferError(f"sum dims {dims} must be sorted, distinct and non-negative")
    if attrs["keepdim"]:
        return x.with_shape(_keepdim_shape(x.shape, dims))
    return x.with_shape(tuple(d for axis, d in enumerate(x.shape) if axis not in dims))


def _reference_sum(values, attrs):
    (x,) = values
    return np.asarray(np.sum(x, axis=tuple(attrs["dims"]), keepdims=attrs["keepdim"], dtype=np.float32))


def vjp_sum(b, node, grad, needs):
    """d sum(a, dims) = expand(unsqueeze(g, dims), a.shape): PyTorch's sum_backward."""
    x = node.inputs[0]
    shape = b.shape(x)
    if not node.attr["keepdim"]:
        grad = b.reshape(grad, _keepdim_shape(shape, node.attr["dims"]))
    return (b.expand(grad, shape),)


define_op(
    name="sum",
    arity=1,
    infer=_infer_sum,
    reference=_reference_sum,
    lowering=Lowering("reduce"),
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
    total = np.sum(x, axis=axes, keepdims=True, dtype=np.float32) if axes else x
    return np.asarray(total, dtype=np.float32).reshape(shape)


def vjp_sum_to_size(b, node, grad, needs):
    """d sum_to_size(a) = expand(g, a.shape)."""
    return (b.expand(grad, b.shape(node.inputs[0])),)


define_op(
    name="sum_to_size",
    arity=1,
    infer=_infer_sum_to_size,
    reference=_reference_sum_to_size,
    lowering=Lowering("reduce"),
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
    return np.asarray(e / np.sum(e, axis=dim, keepdims=True, dtype=np.float32), dtype=np.float32)


def _reference_log_softmax(values, attrs):
    (x,) = values
    dim = attrs["dim"]
    shifted = x - np.max(x, axis=dim, keepdims=True)
    log_total = np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True, dtype=np.float32))
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


define_op(
    name="softmax",
    arity=1,
    infer=_infer_row("softmax"),
    reference=_reference_softmax,
    lowering=Lowering("row"),
    vjp=vjp_softmax,
    attr_names=("dim",),
    doc="`%1 = softmax[dim=1] %0`: exp(x - max) / sum(exp(x - max)) along dim.",
)

define_op(
    name="log_softmax",
    arity=1,
    infer=_infer_row("log_softmax"),
    reference=_reference_log_softmax,
    lowering=Lowering("row"),
    vjp=vjp_log_softmax,
    attr_names=("dim",),
    doc="`%1 = log_softmax[dim=1] %0`: (x - max) - log(sum(exp(x - max))) along dim.",
)
