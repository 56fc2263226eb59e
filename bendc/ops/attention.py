"""Scaled dot-product attention (causal, grouped-query), forward and backward.

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
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import PARALLEL_CELLS, InferError, Lowering, define_op, require_float

SCHEDULES = ("auto", "triangular", "dense")


# ------------------------------------------------------------------ layout
def resolve_schedule(schedule: str, causal: bool) -> str:
    """The layout a schedule attribute means: 'auto' is triangular when causal, else dense."""
    if schedule not in SCHEDULES:
        raise InferError(f"unknown attention schedule {schedule!r}; one of {', '.join(SCHEDULES)}")
    if schedule == "auto":
        return "triangular" if causal else "dense"
    if schedule == "triangular" and not causal:
        raise InferError("the triangular schedule needs causal attention (every position attends to all)")
    return schedule


def score_cells(t: int, schedule: str) -> int:
    """Cells per head of a score matrix in a resolved layout."""
    return t * (t + 1) // 2 if schedule == "triangular" else t * t


def row_start(i: int, t: int, schedule: str) -> int:
    """The first cell of row i: i(i+1)/2 in the packed triangle, i*t dense."""
    return i * (i + 1) // 2 if schedule == "triangular" else i * t


def work_items(t: int, schedule: str) -> list[tuple[int, ...]]:
    """The rows of each work item of one head: pairs (i, t-1-i), the middle row alone (triangular);
    one row each (dense)."""
    if schedule == "dense":
        return [(i,) for i in range(t)]
    return [(i,) if i == t - 1 - i else (i, t - 1 - i) for i in range((t + 1) // 2)]


def _mask(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


def pack(full: np.ndarray, schedule: str) -> np.ndarray:
    """(..., T, T) -> (..., C) in the layout (the triangle's cells j <= i, row after row)."""
    t = full.shape[-1]
    if schedule == "triangular":
        rows, columns = np.tril_indices(t)
        return np.ascontiguousarray(full[..., rows, columns], dtype=np.float32)
    return np.ascontiguousarray(full.reshape(full.shape[:-2] + (t * t,)), dtype=np.float32)


def unpack(cells: np.ndarray, t: int, schedule: str) -> np.ndarray:
    """(..., C) -> (..., T, T); the triangle's cells above the diagonal are +0.0."""
    if schedule == "triangular":
        full = np.zeros(cells.shape[:-1] + (t, t), dtype=np.float32)
        rows, columns = np.tril_indices(t)
        full[..., rows, columns] = cells
        return full
    return cells.reshape(cells.shape[:-1] + (t, t))


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
        scores = np.where(_mask(q.shape[2]), scores, np.float32(-np.inf))
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


# ------------------------------------------------------------------ CPU kernels
# Generated modules hold only numba code and a numpy wrapper (the runtime needs
# nothing else). Shapes are read from the arrays, so one compiled kernel serves
# every shape; only the schedule, causal, scale and parallelism are in the text.

_LAYOUT_HELPERS = {
    "triangular": '''
@njit(cache=True)
def _items(t):
    """Work items per head: pairs of rows (i, t-1-i), t+1 cells each; the middle row of an odd t alone."""
    return (t + 1) // 2


@njit(cache=True)
def _deal(item, t):
    """The rows (or column blocks) of a work item: item and t-1-item; -1 when item is the middle one."""
    other = t - 1 - item
    if other == item:
        return item, -1
    return item, other


@njit(cache=True)
def _row_start(i, t):
    """Row i of the packed lower triangle starts at cell i(i+1)/2."""
    return i * (i + 1) // 2


@njit(cache=True)
def _row_length(i, t):
    """Row i holds the positions j <= i."""
    return i + 1


@njit(cache=True)
def _column_first(j, t):
    """Column j holds the rows i >= j."""
    return j
''',
    "dense": '''
@njit(cache=True)
def _items(t):
    """Work items per head: one row (or column block) each."""
    return t


@njit(cache=True)
def _deal(item, t):
    """The row (or column block) of a work item."""
    return item, -1


@njit(cache=True)
def _row_start(i, t):
    """Row i of the dense matrix starts at cell i*t."""
    return i * t


@njit(cache=True)
def _row_length(i, t):
    """Every row holds all t positions."""
    return t


@njit(cache=True)
def _column_first(j, t):
    """Every column holds all t rows."""
    return 0
''',
}

_ROW_HELPERS = '''

@njit(cache=True)
def _dots(x, rows_t, out):
    """out[j] = x . rows_t[:, j], summed in order of x's index (vectorized over j, four terms a pass)."""
    length = out.shape[0]
    depth = x.shape[0]
    for j in range(length):
        out[j] = np.float32(0.0)
    d = 0
    while d + 4 <= depth:
        x0 = x[d]
        x1 = x[d + 1]
        x2 = x[d + 2]
        x3 = x[d + 3]
        r0 = rows_t[d]
        r1 = rows_t[d + 1]
        r2 = rows_t[d + 2]
        r3 = rows_t[d + 3]
        for j in range(length):
            out[j] = (((out[j] + x0 * r0[j]) + x1 * r1[j]) + x2 * r2[j]) + x3 * r3[j]
        d += 4
    while d < depth:
        xd = x[d]
        rd = rows_t[d]
        for j in range(length):
            out[j] = out[j] + xd * rd[j]
        d += 1


@njit(cache=True)
def _accumulate(weights, rows, out):
    """out += sum over j of weights[j] * rows[j], in order of j (vectorized over out, four terms a pass)."""
    width = out.shape[0]
    count = weights.shape[0]
    j = 0
    while j + 4 <= count:
        w0 = weights[j]
        w1 = weights[j + 1]
        w2 = weights[j + 2]
        w3 = weights[j + 3]
        r0 = rows[j]
        r1 = rows[j + 1]
        r2 = rows[j + 2]
        r3 = rows[j + 3]
        for c in range(width):
            out[c] = (((out[c] + w0 * r0[c]) + w1 * r1[c]) + w2 * r2[c]) + w3 * r3[c]
        j += 4
    while j < count:
        w = weights[j]
        r = rows[j]
        for c in range(width):
            out[c] = out[c] + w * r[c]
        j += 1


@njit(cache=True)
def _weighted_rows(weights, rows, out):
    """out = sum over j of weights[j] * rows[j], in order of j."""
    for c in range(out.shape[0]):
        out[c] = np.float32(0.0)
    _accumulate(weights, rows, out)


@njit(cache=True)
def _softmax_scores(query, keys_t, row, i, scale, causal):
    """row = softmax(scale * (query . key j)) over the row's positions, j > i masked when causal."""
    _dots(query, keys_t, row)
    length = row.shape[0]
    for j in range(length):
        row[j] = row[j] * scale
    if causal:
        for j in range(i + 1, length):
            row[j] = np.float32(-np.inf)
    top = row[0]
    for j in range(1, length):
        if row[j] > top:
            top = row[j]
    total = np.float32(0.0)
    for j in range(length):
        e = math.exp(row[j] - top)
        row[j] = e
        total += e
    for j in range(length):
        row[j] = row[j] / total
'''

_FORWARD = '''

@njit(parallel={parallel}, cache=True, error_model='numpy')
def _attention(q, keys_t, v, out, heads, group, scale, causal):
    """Each work item: its rows' scores, softmax over each row's positions, then P . V."""
    count, t, _ = q.shape
    kv_heads = heads // group
    items = _items(t)
    for work in prange(count * items):
        bh = work // items
        item = work - bh * items
        kv = (bh // heads) * kv_heads + (bh % heads) // group
        cells = np.empty(t + 1, np.float32)  # the work item's cells: t + 1 at most
        offset = 0
        for i in _deal(item, t):
            if i < 0:
                continue
            length = _row_length(i, t)
            row = cells[offset:offset + length]
            _softmax_scores(q[bh, i], keys_t[kv], row, i, scale, causal)
            _weighted_rows(row, v[kv], out[bh, i])
            offset += length


def kernel(in0, in1, in2, out0):
    batch, heads, t, depth = in0.shape
    kv_heads = in1.shape[1]
    q = np.ascontiguousarray(in0).reshape(batch * heads, t, depth)
    keys_t = np.ascontiguousarray(np.swapaxes(in1, 2, 3)).reshape(batch * kv_heads, depth, t)
    v = np.ascontiguousarray(in2).reshape(batch * kv_heads, t, in2.shape[3])
    _attention(q, keys_t, v, out0.reshape(batch * heads, t, out0.shape[3]), heads, heads // kv_heads,
               np.float32({scale!r}), {causal!r})
'''

_PROBS = '''

@njit(parallel={parallel}, cache=True, error_model='numpy')
def _probs(q, keys_t, out, heads, group, scale, causal):
    """P recomputed in the layout: each work item writes its rows' softmax."""
    count, t, _ = q.shape
    kv_heads = heads // group
    items = _items(t)
    for work in prange(count * items):
        bh = work // items
        item = work - bh * items
        kv = (bh // heads) * kv_heads + (bh % heads) // group
        for i in _deal(item, t):
            if i < 0:
                continue
            start = _row_start(i, t)
            _softmax_scores(q[bh, i], keys_t[kv], out[bh, start:start + _row_length(i, t)], i, scale, causal)


def kernel(in0, in1, out0):
    batch, heads, t, depth = in0.shape
    kv_heads = in1.shape[1]
    q = np.ascontiguousarray(in0).reshape(batch * heads, t, depth)
    keys_t = np.ascontiguousarray(np.swapaxes(in1, 2, 3)).reshape(batch * kv_heads, depth, t)
    _probs(q, keys_t, out0.reshape(batch * heads, out0.shape[2]), heads, heads // kv_heads,
           np.float32({scale!r}), {causal!r})
'''

_SCORE_GRAD = '''

@njit(parallel={parallel}, cache=True, error_model='numpy')
def _score_grad(probs, g, values_t, out, heads, group, scale):
    """G = P * (dP - rowsum(dP * P)) * scale with dP = dO . V^T, row by row in the layout."""
    count, t, _ = g.shape
    kv_heads = heads // group
    items = _items(t)
    for work in prange(count * items):
        bh = work // items
        item = work - bh * items
        kv = (bh // heads) * kv_heads + (bh % heads) // group
        for i in _deal(item, t):
            if i < 0:
                continue
            start = _row_start(i, t)
            length = _row_length(i, t)
            p = probs[bh, start:start + length]
            row = out[bh, start:start + length]
            _dots(g[bh, i], values_t[kv], row)
            total = np.float32(0.0)
            for j in range(length):
                total += row[j] * p[j]
            for j in range(length):
                row[j] = p[j] * (row[j] - total) * scale


def kernel(in0, in1, in2, out0):
    batch, kv_heads, t, width = in1.shape
    heads = in2.shape[1]
    values_t = np.ascontiguousarray(np.swapaxes(in1, 2, 3)).reshape(batch * kv_heads, width, t)
    g = np.ascontiguousarray(in2).reshape(batch * heads, t, width)
    probs = np.ascontiguousarray(in0).reshape(batch * heads, in0.shape[2])
    _score_grad(probs, g, values_t, out0.reshape(batch * heads, out0.shape[2]), heads, heads // kv_heads,
                np.float32({scale!r}))
'''

_VJP_ROWS = '''

@njit(parallel={parallel}, cache=True, error_model='numpy')
def _rows_times(scores, k, out, heads, group):
    """dq: each of a work item's rows is its scores times the rows of k."""
    count, t, _ = out.shape
    kv_heads = heads // group
    items = _items(t)
    for work in prange(count * items):
        bh = work // items
        item = work - bh * items
        kv = (bh // heads) * kv_heads + (bh % heads) // group
        for i in _deal(item, t):
            if i < 0:
                continue
            start = _row_start(i, t)
            length = _row_length(i, t)
            _weighted_rows(scores[bh, start:start + length], k[kv], out[bh, i])


def kernel(in0, in1, out0):
    batch, heads, cells = in0.shape
    _, kv_heads, t, depth = in1.shape
    scores = np.ascontiguousarray(in0).reshape(batch * heads, cells)
    k = np.ascontiguousarray(in1).reshape(batch * kv_heads, t, depth)
    _rows_times(scores, k, out0.reshape(batch * heads, t, depth), heads, heads // kv_heads)
'''

_VJP_COLUMNS = '''

COLUMN_BLOCK = 16  # columns a work item accumulates together: each row of scores is read as one segment


@njit(parallel={parallel}, cache=True, error_model='numpy')
def _columns_times(scores, x, out, heads, group):
    """dk (dv): row j of out is the sum, over the group's heads in order and the rows i of column j
    in order, of scores[i, j] times row i of q (of dO). A work item holds blocks of
    COLUMN_BLOCK columns, dealt in pairs (b, blocks-1-b) as rows are."""
    count, t, width = out.shape
    kv_heads = heads // group
    blocks = (t + COLUMN_BLOCK - 1) // COLUMN_BLOCK
    items = _items(blocks)
    for work in prange(count * items):
        bkv = work // items
        item = work - bkv * items
        first_head = (bkv // kv_heads) * heads + (bkv % kv_heads) * group
        for block in _deal(item, blocks):
            if block < 0:
                continue
            first = block * COLUMN_BLOCK
            end = min(first + COLUMN_BLOCK, t)
            acc = out[bkv]
            for j in range(first, end):
                for c in range(width):
                    acc[j, c] = np.float32(0.0)
            for member in range(group):
                bh = first_head + member
                i = _column_first(first, t)
                while i < t:
                    if i + 4 <= t and _row_length(i, t) >= end:
                        # Four rows that hold the whole block: one pass over each accumulator row.
                        s0 = _row_start(i, t)
                        s1 = _row_start(i + 1, t)
                        s2 = _row_start(i + 2, t)
                        s3 = _row_start(i + 3, t)
                        x0 = x[bh, i]
                        x1 = x[bh, i + 1]
                        x2 = x[bh, i + 2]
                        x3 = x[bh, i + 3]
                        for j in range(first, end):
                            w0 = scores[bh, s0 + j]
                            w1 = scores[bh, s1 + j]
                            w2 = scores[bh, s2 + j]
                            w3 = scores[bh, s3 + j]
                            row = acc[j]
                            for c in range(width):
                                row[c] = (((row[c] + w0 * x0[c]) + w1 * x1[c]) + w2 * x2[c]) + w3 * x3[c]
                        i += 4
                        continue
                    start = _row_start(i, t)
                    last = min(end, _row_length(i, t))
                    xi = x[bh, i]
                    for j in range(first, last):
                        w = scores[bh, start + j]
                        row = acc[j]
                        for c in range(width):
                            row[c] = row[c] + w * xi[c]
                    i += 1


def kernel(in0, in1, out0):
    batch, heads, cells = in0.shape
    _, _, t, width = in1.shape
    kv_heads = out0.shape[1]
    scores = np.ascontiguousarray(in0).reshape(batch * heads, cells)
    x = np.ascontiguousarray(in1).reshape(batch * heads, t, width)
    _columns_times(scores, x, out0.reshape(batch * kv_heads, t, width), heads, heads // kv_heads)
'''


def _parallel(types: list[TensorType], out: TensorType) -> bool:
    """Parallel when the products do enough work: scores cells times the row width."""
    batch, heads = types[0].shape[:2]
    arrays = [type for type in types + [out] if type.ndim == 4]
    t = max(type.shape[2] for type in arrays)
    width = max(type.shape[3] for type in arrays)
    return batch * heads * t * t * width >= PARALLEL_CELLS


def _cpu_source(template: str, layout: str, parallel: bool, **values) -> str:
    return (_LAYOUT_HELPERS[layout] + _ROW_HELPERS + template.format(parallel=parallel, **values)).lstrip("\n")


def _cpu_attention(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    return _cpu_source(_FORWARD, layout, _parallel(list(ins), out), scale=attrs["scale"],
                       causal=attrs["causal"])


def _cpu_probs(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    return _cpu_source(_PROBS, layout, _parallel(list(ins), out), scale=attrs["scale"], causal=attrs["causal"])


def _cpu_score_grad(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    return _cpu_source(_SCORE_GRAD, layout, _parallel(list(ins), out), scale=attrs["scale"])


def _cpu_vjp(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    template = _VJP_ROWS if attrs["wrt"] == "q" else _VJP_COLUMNS
    return _cpu_source(template, layout, _parallel(list(ins), out))


# ------------------------------------------------------------------ the ops
define_op(
    name="attention",
    arity=3,
    infer=_infer_attention,
    reference=_reference_attention,
    lowering=Lowering("attention", cpu=_cpu_attention),
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
    lowering=Lowering("attention", cpu=_cpu_probs),
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
    lowering=Lowering("attention", cpu=_cpu_score_grad),
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
    lowering=Lowering("attention", cpu=_cpu_vjp),
    no_vjp="built only by attention's VJP (bendc has no create_graph)",
    attr_names=("causal", "heads", "schedule", "wrt"),
    doc="`%dq = attention_vjp[causal=True, heads=8, schedule=\"triangular\", wrt=\"q\"] %s, %k`: G K for wrt=q; "
        "G^T q (wrt=k) or P^T g (wrt=v) summed over each key/value head's group of query heads.",
)
