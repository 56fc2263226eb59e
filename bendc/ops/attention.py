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

Kernels: on the CPU, numba loops over work items (``prange``) with numpy's
layouts; on cuda (``Lowering.cuda``, see "CUDA kernels" below) a block per
work item, threads over the item's cells and output elements, operands read
in place through their strides. dK and dV sum over a group's query heads in
a loop inside the thread that owns the output element (no atomics).
"""
from __future__ import annotations

import numpy as np

from bendc.errors import UnsupportedError
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


# ------------------------------------------------------------------ CUDA kernels
# A block per work item: a pair of rows (i, t-1-i) of one (batch, head), the
# middle row of an odd t alone (triangular), or one row (dense); dk and dv deal
# pairs of columns (j, t-1-j) of one (batch, key/value head) the same way (a
# column j of the triangle holds rows i >= j: t - j cells, so a pair holds
# t + 1). Within a block, threads take the item's cells (scores) or its output
# elements in turn. Sums over d, j and i run in the CPU kernels' order, one
# thread per output element (no FMA contraction: the same products and sums);
# the softmax's max and sums over a row are shared-memory trees (as the
# softmax row kernel), so P and the outputs agree with the CPU within the
# tolerances. dK and dV loop over the group's query heads in head order inside
# the thread that owns the output element: no atomics, deterministic, no zero kernel.

class _CudaDeal:
    """The generated lines that deal one head's work items to a block, for a resolved schedule."""

    def __init__(self, schedule: str, t: int):
        self.pair = schedule == "triangular"
        self.t = t
        self.items = len(work_items(t, schedule))
        self.slots = 2 if self.pair else 1  # rows (or columns) a work item holds at most
        self.cells = t + 1 if self.pair else t  # cells a work item holds at most

    def per_slot(self, first: list[str], second: list[str]) -> list[str]:
        """``first`` for the item's first row (slot 0), ``second`` for its second (slot 1)."""
        if not self.pair:
            return first
        return ["if slot == 0:"] + _indent(first) + ["else:"] + _indent(second)

    def rows(self) -> list[str]:
        """row0, length0, start0 (and row1, length1, start1) of ``item`` and its ``cells``."""
        t = self.t
        if not self.pair:
            return ["row0 = item", f"length0 = {t}", f"start0 = row0 * {t}", f"cells = {t}"]
        return ["row0 = item",
                f"row1 = {t - 1} - item",
                "length0 = item + 1  # row i holds the positions j <= i",
                f"length1 = {t} - item",
                "if row1 == row0:",
                "    length1 = 0  # the middle row of an odd t is an item of its own",
                "start0 = row0 * (row0 + 1) // 2  # row i starts at cell i(i+1)/2",
                "start1 = row1 * (row1 + 1) // 2",
                "cells = length0 + length1"]

    def cell(self) -> list[str]:
        """slot, row i, position j and layout cell ``position`` of the item's cell ``c``."""
        if not self.pair:
            return ["slot = 0", "i = row0", "j = c", "position = start0 + c"]
        return ["if c < length0:", "    slot = 0", "    i = row0", "    j = c",
                "else:", "    slot = 1", "    i = row1", "    j = c - length0",
                "position = (start0 if slot == 0 else start1) + j"]

    def output_row(self, width: int) -> list[str]:
        """slot, ``col``, row i, its first item cell ``first``, ``length`` and layout ``start`` of
        output element ``e`` of the item's rows (``length`` 0: the item has no such row)."""
        if not self.pair:
            return ["col = e", "i = row0", "first = 0", "length = length0", "start = start0"]
        return [f"slot = e // {width}", f"col = e - slot * {width}",
                "if slot == 0:", "    i = row0", "    first = 0", "    length = length0", "    start = start0",
                "else:", "    i = row1", "    first = length0", "    length = length1", "    start = start1"]

    def columns(self, width: int) -> list[str]:
        """Column ``j`` (slot 0 or 1 of ``item``) and ``col`` of output element ``e``; ``present``
        is False for the missing partner of the middle column."""
        t = self.t
        if not self.pair:
            return ["col = e", "j = item", "present = True"]
        return [f"slot = e // {width}", f"col = e - slot * {width}",
                f"j = item if slot == 0 else {t - 1} - item",
                f"present = slot == 0 or {t - 1} - item != item"]

    def column_rows(self) -> str:
        """The first row that holds column j: j in the triangle, 0 dense."""
        return "j" if self.pair else "0"

    def row_start(self, row: str) -> str:
        return f"{row} * ({row} + 1) // 2" if self.pair else f"{row} * {self.t}"


def _cuda_block(cg, work: int) -> int:
    """Threads of a block: a power of two (the trees halve it) covering an item's cells or output
    elements, up to MAX_BLOCK. Unlike the row kernels' tree_block it may be less than a warp: only
    tiny items (t below 31 and head sizes below 16) get one, where a real GPU loses nothing that
    matters and the simulator (which pays per thread and per syncthreads) much less time."""
    block = 1
    while block < work and block < cg.MAX_BLOCK:
        block *= 2
    return block


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _work_loop(count: int, items: int, decode: list[str], body: list[str]) -> list[str]:
    """Blocks take work items in turn: ``bh`` (or ``bkv``) and ``item`` from ``work``."""
    return (["work = cuda.blockIdx.x", f"while work < {count * items}:"]
            + _indent(decode + body) + ["    work += cuda.gridDim.x"])


def _head_decode(heads: int, group: int, items: int) -> list[str]:
    return [f"bh = work // {items}", f"item = work - bh * {items}", f"b = bh // {heads}", f"h = bh - b * {heads}",
            f"hk = h // {group}  # the key/value head of query head h"]


def _cuda_launch(cg, op, block: int, work: int, shared_bytes: int):
    node = op.node
    if shared_bytes > cg.MAX_SHARED_BYTES:
        raise UnsupportedError(f"{node.op} {node.type} on cuda keeps a work item's scores in shared memory: "
                               f"{shared_bytes} bytes, more than {cg.MAX_SHARED_BYTES}", loc=node.loc, op=node.op)
    return cg.Launch("kernel", (max(1, min(work, cg.MAX_ROWS)), 1, 1), (block, 1, 1), shared_bytes)


def _cuda_softmax(op, store: str):
    """attention (``store`` "shared": P stays in shared memory and is multiplied by V) or
    attention_probs (``store`` "out": P is written in the layout)."""
    from bendc.codegen import cuda as cg

    layout = resolve_schedule(op.attrs["schedule"], op.attrs["causal"])
    batch, heads, t, depth = op.shapes[0]
    group = heads // op.shapes[1][1]
    deal = _CudaDeal(layout, t)
    width = op.shapes[2][3] if store == "shared" else 0
    block = _cuda_block(cg, max(deal.cells, deal.slots * max(width, depth)))
    partials = tuple(f"partial{slot}" for slot in range(deal.slots))
    cells_per_head = score_cells(t, layout)
    score = "scores[c]" if store == "shared" else f"out0[bh * {cells_per_head} + position]"
    mask = op.attrs["causal"] and layout == "dense"
    dot = ["acc = np.float32(0.0)", f"for d in range({depth}):",
           f"    acc += query[slot, d] * {op.read(1, ['b', 'hk', 'j', 'd'])}",
           f"s = acc * np.float32({op.attrs['scale']!r})"]
    if mask:  # positions after i are masked (their probability is 0)
        dot = ["s = np.float32(-math.inf)", "if j <= i:"] + _indent(dot)

    def cells_loop(body: list[str]) -> list[str]:
        return ["c = t", "while c < cells:"] + _indent(deal.cell() + body) + ["    c += BLOCK"]

    def each(template: str) -> list[str]:
        return [template.format(slot=slot) for slot in range(deal.slots)]

    item = (deal.rows()
            + ["# the item's query rows, in shared memory",
               "e = t", f"while e < {deal.slots * depth}:"]
            + _indent([f"slot = e // {depth}", f"d = e - slot * {depth}",
                       "i = row0 if slot == 0 else row1" if deal.pair else "i = row0",
                       f"query[slot, d] = {op.read(0, ['b', 'h', 'i', 'd'])}", "e += BLOCK"])
            + ["cuda.syncthreads()",
               "# scale * q . k for each of the item's cells, and each row's maximum"]
            + each("top{slot} = np.float32(-math.inf)")
            + cells_loop(dot + [f"{score} = s"]
                         + deal.per_slot(["if s > top0:", "    top0 = s"], ["if s > top1:", "    top1 = s"]))
            + each("partial{slot}[t] = top{slot}") + cg.tree_lines("max", partials)
            + each("top{slot} = partial{slot}[0]") + ["cuda.syncthreads()",
                                                       "# exp(s - max) and each row's sum"]
            + each("total{slot} = np.float32(0.0)")
            + cells_loop(deal.per_slot([f"x = math.exp({score} - top0)", "total0 += x"],
                                       [f"x = math.exp({score} - top1)", "total1 += x"]) + [f"{score} = x"])
            + each("partial{slot}[t] = total{slot}") + cg.tree_lines("sum", partials)
            + each("total{slot} = partial{slot}[0]")
            + ["# the probabilities"]
            + cells_loop(deal.per_slot([f"{score} = {score} / total0"], [f"{score} = {score} / total1"])))
    if store == "shared":
        item += (["cuda.syncthreads()", "# the item's output rows: P . V, in order of j",
                  "e = t", f"while e < {deal.slots * width}:"]
                 + _indent(deal.output_row(width)
                           + ["if length > 0:",
                              "    acc = np.float32(0.0)",
                              "    for j in range(length):",
                              f"        acc += scores[first + j] * {op.read(2, ['b', 'hk', 'j', 'col'])}",
                              f"    out0[(bh * {t} + i) * {width} + col] = acc",
                              "e += BLOCK"]))
    item.append("cuda.syncthreads()  # shared memory is reused by the block's next item")
    shared = [f"query = cuda.shared.array(({deal.slots}, {max(depth, 1)}), numba.float32)"]
    if store == "shared":
        shared.append(f"scores = cuda.shared.array({max(deal.cells, 1)}, numba.float32)")
    shared += [f"{name} = cuda.shared.array(BLOCK, numba.float32)" for name in partials]
    body = shared + ["t = cuda.threadIdx.x"] + _work_loop(batch * heads, deal.items,
                                                          _head_decode(heads, group, deal.items), item)
    shared_bytes = 4 * (deal.slots * max(depth, 1) + len(partials) * block
                        + (max(deal.cells, 1) if store == "shared" else 0))
    what = "softmax(scale * q k^T) . v" if store == "shared" else f"P in the {layout} layout"
    source = f"\nBLOCK = {block}\n" + cg.kernel_source(
        "kernel", op.arguments, body, f"A block per work item ({layout}): {what}.")
    launch = _cuda_launch(cg, op, block, batch * heads * deal.items, shared_bytes)
    return cg.Kernels(f"{op.node.op} ({layout}): {batch * heads} heads x {deal.items} work items of up to "
                      f"{deal.cells} cells, a block each", source, [launch])


def _cuda_attention(op):
    return _cuda_softmax(op, "shared")


def _cuda_probs(op):
    return _cuda_softmax(op, "out")


def _cuda_score_grad(op):
    """G = P * (dP - rowsum(dP * P)) * scale, dP = dO . V^T: a block per work item; dP is written
    into G's cells first, then rescaled in place (each thread keeps its own cells)."""
    from bendc.codegen import cuda as cg

    layout = resolve_schedule(op.attrs["schedule"], op.attrs["causal"])
    batch, kv_heads, t, width = op.shapes[1]
    heads = op.shapes[2][1]
    group = heads // kv_heads
    deal = _CudaDeal(layout, t)
    cells_per_head = score_cells(t, layout)
    block = _cuda_block(cg, max(deal.cells, deal.slots * width))
    partials = tuple(f"partial{slot}" for slot in range(deal.slots))
    out = f"out0[bh * {cells_per_head} + position]"
    probability = op.read(0, ["b", "h", "position"])

    def cells_loop(body: list[str]) -> list[str]:
        return ["c = t", "while c < cells:"] + _indent(deal.cell() + body) + ["    c += BLOCK"]

    def each(template: str) -> list[str]:
        return [template.format(slot=slot) for slot in range(deal.slots)]

    item = (deal.rows()
            + ["# the item's rows of the output gradient, in shared memory",
               "e = t", f"while e < {deal.slots * width}:"]
            + _indent([f"slot = e // {width}", f"d = e - slot * {width}",
                       "i = row0 if slot == 0 else row1" if deal.pair else "i = row0",
                       f"grads[slot, d] = {op.read(2, ['b', 'h', 'i', 'd'])}", "e += BLOCK"])
            + ["cuda.syncthreads()", "# dP = dO . v for each cell, and each row's sum of dP * P"]
            + each("total{slot} = np.float32(0.0)")
            + cells_loop(["acc = np.float32(0.0)", f"for d in range({width}):",
                          f"    acc += grads[slot, d] * {op.read(1, ['b', 'hk', 'j', 'd'])}",
                          f"{out} = acc"]
                         + deal.per_slot([f"total0 += acc * {probability}"], [f"total1 += acc * {probability}"]))
            + each("partial{slot}[t] = total{slot}") + cg.tree_lines("sum", partials)
            + each("total{slot} = partial{slot}[0]")
            + ["# G = P * (dP - the row's sum) * scale"]
            + cells_loop(deal.per_slot(["total = total0"], ["total = total1"])
                         + [f"{out} = {probability} * ({out} - total) * np.float32({op.attrs['scale']!r})"])
            + ["cuda.syncthreads()  # shared memory is reused by the block's next item"])
    body = ([f"grads = cuda.shared.array(({deal.slots}, {max(width, 1)}), numba.float32)"]
            + [f"{name} = cuda.shared.array(BLOCK, numba.float32)" for name in partials]
            + ["t = cuda.threadIdx.x"]
            + _work_loop(batch * heads, deal.items, _head_decode(heads, group, deal.items), item))
    shared_bytes = 4 * (deal.slots * max(width, 1) + len(partials) * block)
    source = f"\nBLOCK = {block}\n" + cg.kernel_source(
        "kernel", op.arguments, body, f"A block per work item ({layout}): G from P, dO and v.")
    launch = _cuda_launch(cg, op, block, batch * heads * deal.items, shared_bytes)
    return cg.Kernels(f"attention_score_grad ({layout}): {batch * heads} heads x {deal.items} work items of up "
                      f"to {deal.cells} cells, a block each", source, [launch])


def _cuda_vjp(op):
    """dq = G . k (a block per work item of rows, a thread per output element summing over j in
    order); dk = G^T . q and dv = P^T . dO (a block per work item of columns, a thread per output
    element summing over the group's query heads in order, then over the column's rows i in order)."""
    from bendc.codegen import cuda as cg

    layout = resolve_schedule(op.attrs["schedule"], op.attrs["causal"])
    batch, heads, cells_per_head = op.shapes[0]
    _, _, t, width = op.shapes[1]
    deal = _CudaDeal(layout, t)
    block = _cuda_block(cg, deal.slots * width)
    if op.attrs["wrt"] == "q":
        kv_heads = op.shapes[1][1]
        group = heads // kv_heads
        item = (deal.rows() + ["e = t", f"while e < {deal.slots * width}:"]
                + _indent(deal.output_row(width)
                          + ["if length > 0:",
                             "    acc = np.float32(0.0)",
                             "    for j in range(length):",
                             f"        acc += {op.read(0, ['b', 'h', '(start + j)'])} * "
                             f"{op.read(1, ['b', 'hk', 'j', 'col'])}",
                             f"    out0[(bh * {t} + i) * {width} + col] = acc",
                             "e += BLOCK"]))
        body = ["t = cuda.threadIdx.x"] + _work_loop(batch * heads, deal.items,
                                                     _head_decode(heads, group, deal.items), item)
        work = batch * heads * deal.items
        what = f"{batch * heads} heads x {deal.items} work items of rows"
    else:
        kv_heads = op.attrs["heads"]
        group = heads // kv_heads
        column_cell = f"(({deal.row_start('i')}) + j)"  # cell (i, j) of the layout
        decode = [f"bkv = work // {deal.items}", f"item = work - bkv * {deal.items}",
                  f"b = bkv // {kv_heads}", f"hk = bkv - b * {kv_heads}"]
        item = (["e = t", f"while e < {deal.slots * width}:"]
                + _indent(deal.columns(width)
                          + ["if present:",
                             "    acc = np.float32(0.0)",
                             f"    for member in range({group}):",
                             f"        h = hk * {group} + member",
                             f"        for i in range({deal.column_rows()}, {t}):",
                             f"            acc += {op.read(0, ['b', 'h', column_cell])} * "
                             f"{op.read(1, ['b', 'h', 'i', 'col'])}",
                             f"    out0[(bkv * {t} + j) * {width} + col] = acc",
                             "e += BLOCK"]))
        body = ["t = cuda.threadIdx.x"] + _work_loop(batch * kv_heads, deal.items, decode, item)
        work = batch * kv_heads * deal.items
        what = f"{batch * kv_heads} key/value heads x {deal.items} work items of columns"
    source = f"\nBLOCK = {block}\n" + cg.kernel_source(
        "kernel", op.arguments, body, f"A block per work item ({layout}): the gradient of {op.attrs['wrt']}.")
    launch = _cuda_launch(cg, op, block, work, 0)
    return cg.Kernels(f"attention_vjp wrt {op.attrs['wrt']} ({layout}): {what}, a block each", source, [launch])


# ------------------------------------------------------------------ the ops
define_op(
    name="attention",
    arity=3,
    infer=_infer_attention,
    reference=_reference_attention,
    lowering=Lowering("attention", cpu=_cpu_attention, cuda=_cuda_attention),
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
    lowering=Lowering("attention", cpu=_cpu_probs, cuda=_cuda_probs),
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
    lowering=Lowering("attention", cpu=_cpu_score_grad, cuda=_cuda_score_grad),
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
    lowering=Lowering("attention", cpu=_cpu_vjp, cuda=_cuda_vjp),
    no_vjp="built only by attention's VJP (bendc has no create_graph)",
    attr_names=("causal", "heads", "schedule", "wrt"),
    doc="`%dq = attention_vjp[causal=True, heads=8, schedule=\"triangular\", wrt=\"q\"] %s, %k`: G K for wrt=q; "
        "G^T q (wrt=k) or P^T g (wrt=v) summed over each key/value head's group of query heads.",
)
