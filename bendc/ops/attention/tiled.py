"""The tiled (flash-attention) schedule's two ops: the forward that saves each query's
logsumexp with O, and the backward that recomputes the scores tile by tile from it.

The ``attention_schedule`` pass rewrites a call site it gives the ``tiled`` schedule into

```
%a  = attention_tiled[causal=True, scale=0.125] %q, %k, %v                 : f32[B,H,T+R,Dv]
%o  = index[spec=((0,B,1),(0,H,1),(0,T,1))] %a                              : f32[B,H,T,Dv]
%gs = attention_tiled_grad[causal=True, scale=0.125] %q, %k, %v, %a, %g   : f32[B,H+2Hkv,T,W]
%dq = index[spec=((0,B,1),(0,H,1),(0,T,1),(0,D,1))] %gs                   : f32[B,H,T,D]
%dk = index[spec=((0,B,1),(H,H+Hkv,1),(0,T,1),(0,D,1))] %gs               : f32[B,Hkv,T,D]
%dv = index[spec=((0,B,1),(H+Hkv,H+2Hkv,1),(0,T,1),(0,Dv,1))] %gs         : f32[B,Hkv,T,Dv]
```

A kernel step has one output, so each op packs what one kernel writes into one value and
``index`` views take it apart (no copies): ``attention_tiled`` holds O in rows 0..T-1 of each
head and the T logsumexps in the R = ceil(T / Dv) rows after them (row-major, the tail of the
last row unused); ``attention_tiled_grad`` holds dQ in heads 0..H-1, dK in the next Hkv and dV
in the last Hkv, each in its first D (Dv) of W = max(D, Dv) columns. Neither stores a T x T
matrix: the kernels (templates/tiled.py) work on blocks of BLOCK queries by BLOCK keys, the
tile products in blocks of registers (bendc_rows_fma), the softmax online (a running max and
sum per query), causal blocks above the diagonal never computed and the diagonal block masked. Both ops exist only after the pass
(no VJP). Their cuda kernels (cuda_tiled.py) write the same packed layouts: a block per query
tile in the forward, and a race-free backward of two kernels (dK and dV per key tile, then dQ per
query tile).
"""
from __future__ import annotations

import numpy as np

from bendc.ops.attention import cpu, cuda_tiled
from bendc.ops.attention.layout import mask
from bendc.ops.base import InferError, Lowering, define_op, require_float


def lse_rows(t: int, width: int) -> int:
    """Rows of ``width`` after O that hold a head's t logsumexps."""
    return -(-t // width)


def grad_width(depth: int, width: int) -> int:
    """Columns of attention_tiled_grad's packed dq/dk/dv."""
    return max(depth, width)


def _expand(x: np.ndarray, heads: int) -> np.ndarray:
    return np.repeat(x, heads // x.shape[1], axis=1)


def _scores(q: np.ndarray, k: np.ndarray, attrs) -> np.ndarray:
    """scale * q k^T, -inf above the diagonal when causal: (B, H, T, T)."""
    scores = np.matmul(q, np.swapaxes(_expand(k, q.shape[1]), -1, -2)) * np.float32(attrs["scale"])
    if attrs["causal"]:
        scores = np.where(mask(q.shape[2]), scores, np.float32(-np.inf))
    return scores.astype(np.float32)


def _unpack_saved(saved: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(O, logsumexp) from attention_tiled's packed value."""
    batch, heads, _, width = saved.shape
    lse = saved[:, :, t:, :].reshape(batch, heads, -1)[:, :, :t]
    return saved[:, :, :t, :], lse


# ------------------------------------------------------------------ reference semantics
def _reference_tiled(values, attrs):
    q, k, v = values
    batch, heads, t, _ = q.shape
    width = v.shape[3]
    scores = _scores(q, k, attrs)
    top = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - top)
    total = np.sum(e, axis=-1, keepdims=True, dtype=np.float32)
    out = np.zeros((batch, heads, t + lse_rows(t, width), width), dtype=np.float32)
    out[:, :, :t, :] = np.matmul(e / total, _expand(v, heads))
    lse = np.zeros((batch, heads, lse_rows(t, width) * width), dtype=np.float32)
    lse[:, :, :t] = (top + np.log(total))[..., 0]
    out[:, :, t:, :] = lse.reshape(batch, heads, -1, width)
    return out


def _reference_tiled_grad(values, attrs):
    q, k, v, saved, g = values
    batch, heads, t, depth = q.shape
    kv_heads, width = k.shape[1], v.shape[3]
    o, lse = _unpack_saved(saved, t)
    probs = np.exp(_scores(q, k, attrs) - lse[..., None]).astype(np.float32)
    grad_probs = np.matmul(g, np.swapaxes(_expand(v, heads), -1, -2))
    delta = np.sum(g * o, axis=-1, keepdims=True, dtype=np.float32)
    grad_scores = probs * (grad_probs - delta) * np.float32(attrs["scale"])

    def group_sum(x):
        return np.sum(x.reshape(batch, kv_heads, heads // kv_heads, t, x.shape[3]), axis=2, dtype=np.float32)

    out = np.zeros((batch, heads + 2 * kv_heads, t, grad_width(depth, width)), dtype=np.float32)
    out[:, :heads, :, :depth] = np.matmul(grad_scores, _expand(k, heads))
    out[:, heads:heads + kv_heads, :, :depth] = group_sum(np.matmul(np.swapaxes(grad_scores, -1, -2), q))
    out[:, heads + kv_heads:, :, :width] = group_sum(np.matmul(np.swapaxes(probs, -1, -2), g))
    return out


# ------------------------------------------------------------------ inference
def _check_qkv(q, k, v, op: str) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3] or q.shape[2] < 1:
        raise InferError(f"{op} takes q (B, H, T, D), k (B, Hkv, T, D) and v (B, Hkv, T, Dv), got {q}, {k}, {v}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise InferError(f"{q.shape[1]} query heads do not split into groups over {k.shape[1]} key/value heads")


def _infer_tiled(types, attrs):
    q, k, v = types
    require_float(types, "attention_tiled")
    _check_qkv(q, k, v, "attention_tiled")
    t, width = q.shape[2], v.shape[3]
    return q.with_shape(q.shape[:2] + (t + lse_rows(t, width), width))


def _infer_tiled_grad(types, attrs):
    q, k, v, saved, g = types
    require_float(types, "attention_tiled_grad")
    _check_qkv(q, k, v, "attention_tiled_grad")
    batch, heads, t, depth = q.shape
    width = v.shape[3]
    if saved.shape != (batch, heads, t + lse_rows(t, width), width):
        raise InferError(f"attention_tiled_grad: {saved} is not attention_tiled's output for {q} and {v}")
    if g.shape != (batch, heads, t, width):
        raise InferError(f"attention_tiled_grad: the output gradient {g} does not match q {q} and v {v}")
    return q.with_shape((batch, heads + 2 * k.shape[1], t, grad_width(depth, width)))


# ------------------------------------------------------------------ lowering
def _cpu_tiled(attrs, ins, out):
    return cpu.tiled_source("tiled_forward", list(ins), out, attrs)


def _cpu_tiled_grad(attrs, ins, out):
    return cpu.tiled_source("tiled_backward", list(ins), out, attrs)


define_op(
    name="attention_tiled",
    arity=3,
    infer=_infer_tiled,
    reference=_reference_tiled,
    lowering=Lowering("attention", cpu=_cpu_tiled, cuda=cuda_tiled.cuda_tiled),
    no_vjp="made by the attention_schedule pass after autodiff (attention's tiled schedule)",
    attr_names=("causal", "scale"),
    doc="`%a = attention_tiled[causal=True, scale=0.125] %q, %k, %v : f32[B,H,T+R,Dv]`: attention's tiled "
        "schedule: O in rows 0..T-1 of each head, each query's logsumexp in the R = ceil(T/Dv) rows after. "
        "CPU: tile products in blocks of registers; cuda: a block per query tile, K and V streamed through "
        "shared memory.",
)

define_op(
    name="attention_tiled_grad",
    arity=5,
    infer=_infer_tiled_grad,
    reference=_reference_tiled_grad,
    lowering=Lowering("attention", cpu=_cpu_tiled_grad, cuda=cuda_tiled.cuda_tiled_grad),
    no_vjp="made by the attention_schedule pass after autodiff (attention's tiled schedule)",
    attr_names=("causal", "scale"),
    doc="`%gs = attention_tiled_grad[causal=True, scale=0.125] %q, %k, %v, %a, %g : f32[B,H+2Hkv,T,W]`: "
        "dq, dk and dv (heads 0..H-1, then Hkv each; W = max(D, Dv) columns) from the saved logsumexp. "
        "cuda: dK and dV per key tile, then dQ per query tile (no atomics).",
)
