"""Dropout with a counter-based generator, and the causal mask of composed attention.

```
%2 = dropout[offset=0, p=0.5] %x, %seed : f32[..]
%1 = causal_fill[value=-inf] %scores    : f32[..,T,T]
```

``dropout`` keeps element i of x where word 0 of Philox-4x32-10 at the counter (i, offset) under
the key ``seed`` (a 0-d integer input of the step) is below (1 - p) * 2^32, and scales kept
elements by 1 / (1 - p) as torch does (``x * noise`` with noise = 1.0f / float(1 - p) or 0).
i is the row-major linear index of the element; each dropout call of a trace gets its own
``offset``. The mask is never stored: the VJP is the same op on the output gradient, which draws
the same words. The scalar renderer calls ``bendc_philox`` (bendc/kernels/templates/philox.py), so
the cpu and cuda kernels draw the same words as the numpy reference below.
"""
from __future__ import annotations

import math

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, define_op, f32_value, require_float

_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
_PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_PHILOX_W = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))


def philox4x32(counter: tuple, key: tuple) -> tuple[np.ndarray, ...]:
    """Philox-4x32-10 over arrays: the four 32-bit output words (uint64 arrays) of the counter
    words ``counter`` (4 arrays or ints) under the key words ``key`` (2)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _LOW for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & _LOW for k in key)
    for _ in range(10):
        p0 = _PHILOX_M[0] * c0
        p1 = _PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> _SHIFT) ^ c1 ^ k0, p1 & _LOW, (p0 >> _SHIFT) ^ c3 ^ k1, p0 & _LOW
        k0 = (k0 + _PHILOX_W[0]) & _LOW
        k1 = (k1 + _PHILOX_W[1]) & _LOW
    return c0, c1, c2, c3


def dropout_words(seed: int, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """The word each element of a tensor of ``shape`` draws (uint64 array of 32-bit values)."""
    index = np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    key = np.asarray(seed).astype(np.int64).astype(np.uint64)
    return philox4x32((index & _LOW, index >> _SHIFT, np.uint64(offset), np.uint64(0)),
                      (key & _LOW, key >> _SHIFT))[0]


def keep_threshold(p: float) -> int:
    """Words below this are kept: (1 - p) * 2^32, so p=0 keeps every word and p=1 none."""
    return min(max(int((1.0 - p) * 4294967296.0), 0), 4294967296)


def dropout_scale(p: float) -> float:
    """torch's noise.div_(1 - p) on a float32 tensor of ones: 1.0f / float32(1 - p)."""
    if p >= 1.0:
        return 0.0
    return f32_value(np.float32(1.0) / np.float32(1.0 - p))


def _check_p(attrs) -> None:
    p = attrs.get("p")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise InferError(f"dropout probability must be in [0, 1], got {p!r}", unsupported=True)
    offset = attrs.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2 ** 32:
        raise InferError(f"dropout offset must be an int in [0, 2^32), got {offset!r}", unsupported=True)


def _infer_dropout(types, attrs):
    _check_p(attrs)
    x, seed = types
    require_float((x,), "dropout")
    if not seed.is_index or seed.shape != ():
        raise InferError(f"the dropout seed must be a 0-d int64 (or int32) array, got {seed}", unsupported=True)
    return x


def _reference_dropout(values, attrs):
    x, seed = values
    keep = dropout_words(int(seed), attrs["offset"], x.shape) < np.uint64(keep_threshold(attrs["p"]))
    noise = np.where(keep, np.float32(dropout_scale(attrs["p"])), np.float32(0.0))
    return np.asarray(np.multiply(x, noise), dtype=np.float32)


def _scalar_dropout(x, seed, *, index, p, offset):
    word = f"bendc_philox({seed}, {index}, {offset})"
    return (f"({x} * np.float32({dropout_scale(p)!r}) if {word} < np.uint64({keep_threshold(p)}) "
            f"else {x} * np.float32(0.0))")


def vjp_dropout(b, node, grad, needs):
    """d dropout(x) = dropout(g): the same words (seed, offset, index) give the same mask, so
    g * noise is recomputed, never stored (torch: grad * noise)."""
    seed = node.inputs[1]
    return (b.emit("dropout", (grad, seed), **node.attr), None)


define_op(
    name="dropout",
    arity=2,
    infer=_infer_dropout,
    reference=_reference_dropout,
    lowering=Lowering("elementwise", scalar=_scalar_dropout, cell_index=True),
    vjp=vjp_dropout,
    attr_names=("offset", "p"),
    doc="`%2 = dropout[offset=0, p=0.5] %x, %seed : f32[..]`: x * 1/(1-p) where Philox-4x32-10's word at "
        "(element index, offset) under the key seed is below (1-p) * 2^32, else x * 0.",
)


# ------------------------------------------------------------------ causal mask (composed attention)
def _infer_causal_fill(types, attrs):
    (x,) = types
    require_float(types, "causal_fill")
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise InferError(f"causal_fill needs square trailing (T, T) dimensions, got {x}")
    if not isinstance(attrs.get("value"), float):
        raise InferError(f"causal_fill needs a float value, got {attrs.get('value')!r}")
    if attrs.get("size") != x.shape[-1]:
        raise InferError(f"causal_fill size {attrs.get('size')!r} must be the trailing dimension of {x}")
    return x


def _reference_causal_fill(values, attrs):
    (x,) = values
    t = x.shape[-1]
    below = np.tril(np.ones((t, t), dtype=bool))
    return np.asarray(np.where(below, x, np.float32(attrs["value"])), dtype=np.float32)


def _scalar_causal_fill(x, *, index, value, size):
    fill = "np.float32(-np.inf)" if value == -math.inf else f"np.float32({value!r})"
    return f"({x} if ({index}) % {size} <= (({index}) // {size}) % {size} else {fill})"


def vjp_causal_fill(b, node, grad, needs):
    """d causal_fill(x) = g on and below the diagonal, 0 above it."""
    return (b.emit("causal_fill", (grad,), value=0.0, size=node.attr["size"]),)


define_op(
    name="causal_fill",
    arity=1,
    infer=_infer_causal_fill,
    reference=_reference_causal_fill,
    lowering=Lowering("elementwise", scalar=_scalar_causal_fill, cell_index=True),
    vjp=vjp_causal_fill,
    attr_names=("size", "value"),
    doc="`%1 = causal_fill[size=4, value=-inf] %x : f32[..,4,4]`: x where column <= row of the trailing "
        "(T, T) dims, else value (the causal mask of composed attention).",
)
