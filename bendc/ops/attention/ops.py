"""Scaled dot-product attention: the four ops (causal, grouped-query), forward and backward.

Four ops, each defined once here:

```
%o  = attention[causal=True, scale=0.125, schedule="triangular"] %q, %k, %v       : f32[B,H,T,Dv]
%p  = attention_probs[causal=True, scale=0.125, schedule="triangular"] %q, %k     : f32[B,H,C]
%s  = attention_score_grad[causal=True, scale=0.125, schedule="triangular"] %p, %v, %g : f32[B,H,C]
%dq = attention_vjp[causal=True, heads=8, schedule="triangular", wrt="q"] %s, %k  : f32[B,H,T,D]
%dk = attention_vjp[causal=True, heads=2, schedule="triangular", wrt="k"] %s, %q  : f32[B,Hkv,T,D]
%dv = attention_vjp[causal=True, heads=2, schedule="triangular", wrt="v"] %p, %g  : f32[B,Hkv,T,Dv]
```

q is (B, H, T, D), k is (B, Hkv, T, D), v is (B, Hkv, T, Dv); query head h
reads key/value head h // (H // Hkv). The forward never stores the score
matrix outside a work item. The backward recomputes P once
(``attention_probs``) and G = P * (dP - rowsum(dP * P)) * scale with
dP = dO V^T once (``attention_score_grad``); both are IR values in the
schedule's layout, so the three gradients share them: dQ = G K,
dK = G^T Q and dV = P^T dO, the last two summed over the query heads of
each key/value head's group. A frozen (constant) k or v gets no node at
all, and without dQ and dK there is no G.

The layout of P and G (C cells per head) is the ``schedule``:

- ``triangular`` (causal only): a packed lower triangle, C = T(T+1)/2, row i
  starting at cell i(i+1)/2. Work is dealt in pairs of rows i and T-1-i, so
  every work item holds T+1 cells; the middle row of an odd T is one item of
  its own. dK and dV read columns, in blocks of 16 (each row of a block is one
  contiguous segment of the layout), dealt the same way in pairs of blocks.
- ``dense``: C = T*T, a work item per row over all T positions (a causal
  row masks j > i to -inf, so its probabilities there are 0).
- ``auto``: not chosen yet (before the ``attention_schedule`` pass):
  triangular when causal, dense otherwise.

Kernels: on the CPU (cpu.py), numba loops over work items (``prange``) with numpy's
layouts; on cuda (cuda.py) a block per
work item, threads over the item's cells and output elements, operands read
in place through their strides. dK and dV sum over a group's query heads in
a loop inside the thread that owns the output element (no atomics).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.attention import cpu, cuda
from bendc.ops.attention.layout import mask, pack, resolve_schedule, score_cells, unpack
from bendc.ops.base import InferError, Lowering, define_op, require_float


def _expand_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, Hkv, T, D) -> (B, H, T, D): query head h reads head h // (H // Hkv)."""
    return np.repeat(x, heads // x.shape[1], axis=1)


def _sum_groups(x: np.ndarray, kv_heads: int) -> np.ndarray:
    """(B, H, T, D) -> (B, Hkv, T, D): the sum over each key/value head's query heads, in head order."""
    batch, heads, t, width = x.shape
    return np.sum(x.reshape(batch, kv_heads, heads // kv_heads, t, width), axis=2, dtype=np.float32)


def _swap(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


# ------------------------------------------------------------------ reference semantics
def _probabilities(q: np.ndarray, k: np.ndarray, attrs) -> np.ndarray:
    """softmax(scale * q k^T, masked above the diagonal when causal): (B, H, T, T)."""
    keys = _expand_heads(k, q.shape[1])
    scores = np.matmul(q, _swap(keys)) * np.float32(attrs["scale"])
    if attrs["causal"]:
        scores = np.where(mask(q.shape[2]), scores, np.float32(-np.inf))
    shifted = scores - np.max(scores, axis=-1, keepdims=True)
    e = np.exp(shifted)
    return np.asarray(e / np.sum(e, axis=-1, keepdims=True, dtype=np.float32), dtype=np.float32)


def _reference_attention(values, attrs):
    q, k, v = values
    probabilities = _probabilities(q, k, attrs)
    return np.ascontiguousarray(np.matmul(probabilities, _expand_heads(v, q.shape[1])), dtype=np.float32)


def _reference_probs(values, attrs):
    q, k = values
    return pack(_probabilities(q, k, attrs), resolve_schedule(attrs["schedule"], attrs["causal"]))


def _reference_score_grad(values, attrs):
    cells, v, g = values
    schedule = resolve_schedule(attrs["schedule"], attrs["causal"])
    t = v.shape[2]
    probabilities = unpack(cells, t, schedule)
    grad_probabilities = np.matmul(g, _swap(_expand_heads(v, g.shape[1])))
    row = np.sum(grad_probabilities * probabilities, axis=-1, keepdims=True, dtype=np.float32)
    scores = probabilities * (grad_probabilities - row) * np.float32(attrs["scale"])
    return pack(scores, schedule)


def _reference_vjp(values, attrs):
    cells, x = values
    schedule = resolve_schedule(attrs["schedule"], attrs["causal"])
    t = x.shape[2]
    scores = unpack(cells, t, schedule)
    if attrs["wrt"] == "q":
        return np.ascontiguousarray(np.matmul(scores, _expand_heads(x, cells.shape[1])), dtype=np.float32)
    return _sum_groups(np.matmul(_swap(scores), x), attrs["heads"])


# ------------------------------------------------------------------ inference
def _check_heads(heads: int, kv_heads: int) -> None:
    if kv_heads < 1 or heads % kv_heads:
        raise InferError(f"{heads} query heads do not split into groups over {kv_heads} key/value heads")


def _infer_attention(types, attrs):
    q, k, v = types
    require_float(types, "attention")
    resolve_schedule(attrs["schedule"], attrs["causal"])
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise InferError("attention takes q (B, H, T, D), k (B, Hkv, T, D) and v (B, Hkv, T, Dv)")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise InferError("q, k and v need one batch and one sequence length; k and v one head count")
    if q.shape[3] != k.shape[3]:
        raise InferError(f"q and k need one head dimension: {q.shape[3]} vs {k.shape[3]}")
    if q.shape[2] < 1:
        raise InferError("attention needs a sequence of at least one position")
    _check_heads(q.shape[1], k.shape[1])
    return q.with_shape(q.shape[:3] + (v.shape[3],))


def _infer_probs(types, attrs):
    q, k = types
    require_float(types, "attention_probs")
    schedule = resolve_schedule(attrs["schedule"], attrs["causal"])
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise InferError("attention_probs takes q (B, H, T, D) and k (B, Hkv, T, D)")
    _check_heads(q.shape[1], k.shape[1])
    return q.with_shape(q.shape[:2] + (score_cells(q.shape[2], schedule),))


def _check_cells(cells: TensorType, batch: int, t: int, schedule: str, op: str) -> None:
    if cells.ndim != 3 or cells.shape[0] != batch or cells.shape[2] != score_cells(t, schedule):
        raise InferError(f"{op}: scores {cells} are not the {schedule} layout of a sequence of {t} "
                         f"({score_cells(t, schedule)} cells per head)")


def _infer_score_grad(types, attrs):
    cells, v, g = types
    require_float(types, "attention_score_grad")
    schedule = resolve_schedule(attrs["schedule"], attrs["causal"])
    if v.ndim != 4 or g.ndim != 4 or g.shape[0] != v.shape[0] or g.shape[2:] != v.shape[2:]:
        raise InferError("attention_score_grad takes v (B, Hkv, T, Dv) and the output gradient (B, H, T, Dv)")
    _check_cells(cells, g.shape[0], g.shape[2], schedule, "attention_score_grad")
    if cells.shape[1] != g.shape[1]:
        raise InferError(f"scores of {cells.shape[1]} heads and a gradient of {g.shape[1]}")
    _check_heads(g.shape[1], v.shape[1])
    return cells


def _infer_vjp(types, attrs):
    cells, x = types
    require_float(types, "attention_vjp")
    schedule = resolve_schedule(attrs["schedule"], attrs["causal"])
    wrt, heads = attrs["wrt"], attrs["heads"]
    if wrt not in ("q", "k", "v"):
        raise InferError(f"attention_vjp wrt must be 'q', 'k' or 'v', got {wrt!r}")
    if x.ndim != 4:
        raise InferError(f"attention_vjp needs a 4-D operand, got {x}")
    _check_cells(cells, x.shape[0], x.shape[2], schedule, "attention_vjp")
    if wrt == "q":  # x is k: (B, Hkv, T, D)
        if heads != cells.shape[1]:
            raise InferError(f"dq has the scores' {cells.shape[1]} heads, not {heads}")
        _check_heads(heads, x.shape[1])
    else:  # x is q (for dk) or the output gradient (for dv): (B, H, T, W)
        if x.shape[1] != cells.shape[1]:
            raise InferError(f"scores of {cells.shape[1]} heads and an operand of {x.shape[1]}")
        _check_heads(cells.shape[1], heads)
    return x.with_shape((x.shape[0], heads) + x.shape[2:])


# ------------------------------------------------------------------ VJP
def vjp_attention(b, node, grad, needs):
    """d attention = (G K, sum_group G^T Q, sum_group P^T dO) with P recomputed and
    G = P * (dP - rowsum(dP * P)) * scale, dP = dO V^T: torch's math backward.

    P and G are built once and shared; a frozen operand gets no node, and G is
    only built when dq or dk is needed.
    """
    q, k, v = node.inputs
    attrs = node.attr
    common = {"causal": attrs["causal"], "schedule": attrs["schedule"]}
    heads, kv_heads = b.shape(q)[1], b.shape(k)[1]
    probs = b.emit("attention_probs", (q, k), scale=attrs["scale"], **common)
    grad_q = grad_k = grad_v = None
    if needs[0] or needs[1]:
        scores = b.emit("attention_score_grad", (probs, v, grad), scale=attrs["scale"], **common)
        if needs[0]:
            grad_q = b.emit("attention_vjp", (scores, k), wrt="q", heads=heads, **common)
        if needs[1]:
            grad_k = b.emit("attention_vjp", (scores, q), wrt="k", heads=kv_heads, **common)
    if needs[2]:
        grad_v = b.emit("attention_vjp", (probs, grad), wrt="v", heads=kv_heads, **common)
    return (grad_q, grad_k, grad_v)


# ------------------------------------------------------------------ the ops
define_op(
    name="attention",
    arity=3,
    infer=_infer_attention,
    reference=_reference_attention,
    lowering=Lowering("attention", cpu=cpu.cpu_attention, cuda=cuda.cuda_attention),
    vjp=vjp_attention,
    attr_names=("causal", "scale", "schedule"),
    doc="`%o = attention[causal=True, scale=0.125, schedule=\"triangular\"] %q, %k, %v : f32[B,H,T,Dv]`: "
        "softmax(scale * q k^T, causal mask) v with query head h reading key/value head h // (H // Hkv).",
)

define_op(
    name="attention_probs",
    arity=2,
    infer=_infer_probs,
    reference=_reference_probs,
    lowering=Lowering("attention", cpu=cpu.cpu_probs, cuda=cuda.cuda_probs),
    no_vjp="built only by attention's VJP (bendc has no create_graph)",
    attr_names=("causal", "scale", "schedule"),
    doc="`%p = attention_probs[causal=True, scale=0.125, schedule=\"triangular\"] %q, %k : f32[B,H,C]`: "
        "attention's probabilities recomputed for the backward, C cells per head in the schedule's layout.",
)

define_op(
    name="attention_score_grad",
    arity=3,
    infer=_infer_score_grad,
    reference=_reference_score_grad,
    lowering=Lowering("attention", cpu=cpu.cpu_score_grad, cuda=cuda.cuda_score_grad),
    no_vjp="built only by attention's VJP (bendc has no create_graph)",
    attr_names=("causal", "scale", "schedule"),
    doc="`%s = attention_score_grad[causal=True, scale=0.125, schedule=\"triangular\"] %p, %v, %g : f32[B,H,C]`: "
        "G = P * (dP - rowsum(dP * P)) * scale with dP = g v^T, in the layout of P.",
)

define_op(
    name="attention_vjp",
    arity=2,
    infer=_infer_vjp,
    reference=_reference_vjp,
    lowering=Lowering("attention", cpu=cpu.cpu_vjp, cuda=cuda.cuda_vjp),
    no_vjp="built only by attention's VJP (bendc has no create_graph)",
    attr_names=("causal", "heads", "schedule", "wrt"),
    doc="`%dq = attention_vjp[causal=True, heads=8, schedule=\"triangular\", wrt=\"q\"] %s, %k`: G K for wrt=q; "
        "G^T q (wrt=k) or P^T g (wrt=v) summed over each key/value head's group of query heads.",
)
