"""numba template: the tiled (flash-attention) schedule's forward and backward, over blocks of
BLOCK queries by BLOCK keys, each tile product a BLAS call (numba's np.dot, through scipy);
math.exp and math.log become the kit's branch-free float32 versions when rendered (cpu_kit).

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE, CAUSAL and FUSED replaced by the call site's values (``parallel``, the
softmax scale, ``causal``, and whether its sequence is at most SMALL long: then each head runs
fused, ``_small_forward_head``/``_small_backward_head``). The lines above it make the file
importable and lintable.

Scores are computed transposed, a tile S^T = K_j Q_i^T of (keys, queries): every elementwise
pass over a tile (scale, mask, max, exp, sums) then runs along a tile row of queries, so the
per-query max and sums are elementwise updates LLVM vectorizes (no reduction across lanes).
"""
import math

import numpy as np
from numba import njit, prange


from bendc.ops.attention.templates.placeholders import CAUSAL, FUSED, PARALLEL, SCALE

# ---------------------------------------------------------------- TEMPLATE

def _one_blas_thread():
    """numba's np.dot calls scipy's OpenBLAS (through scipy.linalg.cython_blas). Called from prange
    threads, a product past OpenBLAS's own threading threshold (64 x 64 x 128 is) starts OpenBLAS's
    threads on the same cores: measured 35x slower at D=128. That library gets one thread (numpy's
    OpenBLAS, which the runtime's matmuls call, is another library and keeps its threads)."""
    import ctypes
    import glob
    import os

    import scipy
    for path in glob.glob(os.path.join(os.path.dirname(scipy.__file__) + ".libs", "libscipy_openblas*.so")):
        setter = getattr(ctypes.CDLL(path), "scipy_openblas_set_num_threads", None)
        if setter is not None:
            setter(1)


_one_blas_thread()

BLOCK = 64  # queries and keys per tile (layout.TILE; measured: 64 beat 32 and 128 at T=512, D=64)


@njit(cache=True, no_cfunc_wrapper=True)
def _tiled_items(blocks, causal):
    """Work items per head: pairs of block rows (b, blocks-1-b) when causal (blocks + 1 tiles
    each), one block row otherwise."""
    return (blocks + 1) // 2 if causal else blocks


@njit(cache=True, no_cfunc_wrapper=True)
def _tiled_deal(item, blocks, causal):
    """The block rows of a work item: item and blocks-1-item when causal (-1: none)."""
    if not causal:
        return item, -1
    other = blocks - 1 - item
    if other == item:
        return item, -1
    return item, other


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _forward_block(q, k, v, out, lse, block, scale, causal):
    """One block row of queries: online softmax over the key blocks it sees (those at or below
    the diagonal when causal, the diagonal one masked), O = sum P V / sum P and the logsumexp."""
    t = q.shape[0]
    width = v.shape[1]
    first = block * BLOCK
    end = min(first + BLOCK, t)
    rows = end - first
    queries = q[first:end]
    top = np.full(rows, -np.inf, np.float32)  # running max of each query's scores
    total = np.zeros(rows, np.float32)  # running sum of exp(score - top)
    acc = np.zeros((rows, width), np.float32)
    product = np.empty((rows, width), np.float32)
    new = np.empty(rows, np.float32)
    alpha = np.empty(rows, np.float32)
    last = block + 1 if causal else (t + BLOCK - 1) // BLOCK
    for key_block in range(last):
        k0 = key_block * BLOCK
        k1 = min(k0 + BLOCK, t)
        cols = k1 - k0
        scores = np.dot(k[k0:k1], queries.T)  # (keys, queries)
        diagonal = causal and key_block == block
        for r in range(rows):
            new[r] = top[r]
        for c in range(cols):
            tile_row = scores[c]
            for r in range(rows):
                x = tile_row[r] * scale
                x = np.float32(-np.inf) if diagonal and c > r else x
                tile_row[r] = x
                new[r] = x if x > new[r] else new[r]
        for r in range(rows):
            alpha[r] = math.exp(top[r] - new[r])
            total[r] = total[r] * alpha[r]
            top[r] = new[r]
        for c in range(cols):
            tile_row = scores[c]
            for r in range(rows):
                e = math.exp(tile_row[r] - new[r])
                tile_row[r] = e
                total[r] += e
        np.dot(scores.T, v[k0:k1], product)
        for r in range(rows):
            a = alpha[r]
            for c in range(width):
                acc[r, c] = acc[r, c] * a + product[r, c]
    for r in range(rows):
        for c in range(width):
            out[first + r, c] = acc[r, c] / total[r]
        lse[first + r] = top[r] + math.log(total[r])


SMALL = 64  # sequences up to this length take the fused per-head kernels below (no BLAS tiles); the
#             choice is rendered per call site, so a module holds (and compiles) one of the two paths
LANES = 16  # a causal row's cells are computed from the start of its 16-lane chunk


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _transposed_into(a, at):
    """at[j, i] = a[i, j]; the columns of at past a's rows are zeros."""
    rows, cols = a.shape
    for j in range(cols):
        line = at[j]
        for i in range(rows):
            line[i] = a[i, j]
        for i in range(rows, at.shape[1]):
            line[i] = np.float32(0.0)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _add_four(dest, lo, hi, a0, a1, a2, a3, y0, y1, y2, y3):
    """dest[r] += a0 y0[r] + a1 y1[r] + a2 y2[r] + a3 y3[r] for r in [lo, hi), added in that order (one
    load and store of dest per four products)."""
    # max(..., 0): the bounds are never negative, and saying so lets the native translator leave
    # out numba's negative-index wraparound, which would keep the row loops from vectorizing
    for r in range(max(lo, 0), hi):
        x = dest[r] + a0 * y0[r]
        x = x + a1 * y1[r]
        x = x + a2 * y2[r]
        dest[r] = x + a3 * y3[r]


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _add_one(dest, lo, hi, a, y):
    for r in range(max(lo, 0), hi):
        dest[r] = dest[r] + a * y[r]


# dest[r] += w_s * sources[s, r] for s = 0 .. count-1 in order, four sources a pass. One function
# per weight layout and row range, each with its choices in the code rather than in arguments: a
# generic one stays one out-of-line function that tests them at every pass (measured: the fused
# forward at T=64, D=16 took 149 us against 127 us for these, B=4 H=4, 1 thread).
@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _rows_across(dest, weights, column, count, sources, lo, hi):
    """w_s = weights[column, s]; r in [lo, hi)."""
    whole = max(count, 0) // 4 * 4
    for s in range(0, whole, 4):
        _add_four(dest, lo, hi, weights[column, s], weights[column, s + 1], weights[column, s + 2],
                  weights[column, s + 3], sources[s], sources[s + 1], sources[s + 2], sources[s + 3])
    for s in range(whole, max(count, 0)):
        _add_one(dest, lo, hi, weights[column, s], sources[s])


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _rows_down(dest, weights, column, count, sources, lo, hi):
    """w_s = weights[s, column]; r in [lo, hi)."""
    whole = max(count, 0) // 4 * 4
    for s in range(0, whole, 4):
        _add_four(dest, lo, hi, weights[s, column], weights[s + 1, column], weights[s + 2, column],
                  weights[s + 3, column], sources[s], sources[s + 1], sources[s + 2], sources[s + 3])
    for s in range(whole, max(count, 0)):
        _add_one(dest, lo, hi, weights[s, column], sources[s])


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _rows_down_from_chunk(dest, weights, column, count, sources, hi):
    """w_s = weights[s, column]; r from the start of s's lane chunk to hi (a causal source row holds
    its cells from there on; four sources share a chunk)."""
    whole = max(count, 0) // 4 * 4
    for s in range(0, whole, 4):
        _add_four(dest, (s // LANES) * LANES, hi, weights[s, column], weights[s + 1, column],
                  weights[s + 2, column], weights[s + 3, column], sources[s], sources[s + 1], sources[s + 2],
                  sources[s + 3])
    for s in range(whole, max(count, 0)):
        _add_one(dest, (s // LANES) * LANES, hi, weights[s, column], sources[s])


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _rows_down_to_chunk(dest, weights, column, count, sources, lo):
    """w_s = weights[s, column]; r from lo to the end of s's lane chunk (a transposed causal row)."""
    whole = max(count, 0) // 4 * 4
    for s in range(0, whole, 4):
        _add_four(dest, lo, (s // LANES + 1) * LANES, weights[s, column], weights[s + 1, column],
                  weights[s + 2, column], weights[s + 3, column], sources[s], sources[s + 1], sources[s + 2],
                  sources[s + 3])
    for s in range(whole, max(count, 0)):
        _add_one(dest, lo, (s // LANES + 1) * LANES, weights[s, column], sources[s])


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _add_four_pair(da, db, lo, hi, a0, a1, a2, a3, b0, b1, b2, b3, y0, y1, y2, y3):
    """_add_four into two rows at once, each in its own order: two independent chains of adds per
    vector (one row's chain waits on each add's latency), each source row loaded once for both."""
    for r in range(max(lo, 0), hi):
        y = y0[r]
        x = da[r] + a0 * y
        z = db[r] + b0 * y
        y = y1[r]
        x = x + a1 * y
        z = z + b1 * y
        y = y2[r]
        x = x + a2 * y
        z = z + b2 * y
        y = y3[r]
        da[r] = x + a3 * y
        db[r] = z + b3 * y


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _pair_down(da, db, weights, ca, cb, count, sources, lo, hi, from_chunk):
    """Rows da and db as _rows_down (r in [lo, hi)) or _rows_down_from_chunk (``from_chunk``: r from
    the start of s's lane chunk to hi) would add them, columns ca and cb of weights."""
    whole = max(count, 0) // 4 * 4
    for s in range(0, whole, 4):
        first = (s // LANES) * LANES if from_chunk else lo
        _add_four_pair(da, db, first, hi, weights[s, ca], weights[s + 1, ca], weights[s + 2, ca],
                       weights[s + 3, ca], weights[s, cb], weights[s + 1, cb], weights[s + 2, cb],
                       weights[s + 3, cb], sources[s], sources[s + 1], sources[s + 2], sources[s + 3])
    for s in range(whole, max(count, 0)):
        first = (s // LANES) * LANES if from_chunk else lo
        _add_one(da, first, hi, weights[s, ca], sources[s])
        _add_one(db, first, hi, weights[s, cb], sources[s])


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _rows_down_all(dests, weights, count, sources, lo, hi, from_chunk):
    """dests[j] += weights[s, j] * sources[s] for s in order, every row j, r in [lo, hi) or (``from_chunk``)
    from the start of s's lane chunk to hi: two rows a pass (measured, 1 thread, B=16 H=4 T=64 D=32: the
    fused forward 708-718 us against 795-806 a row a pass). The backward's dV^T and dK^T, whose passes
    are one 16-lane vector each (_rows_down_to_chunk), were slower two rows a pass and add one."""
    rows = dests.shape[0]
    for j in range(0, rows // 2 * 2, 2):
        _pair_down(dests[j], dests[j + 1], weights, j, j + 1, count, sources, lo, hi, from_chunk)
    if rows % 2 == 1:
        if from_chunk:
            _rows_down_from_chunk(dests[rows - 1], weights, rows - 1, count, sources, hi)
        else:
            _rows_down(dests[rows - 1], weights, rows - 1, count, sources, lo, hi)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _small_scores(k, qt, st, causal):
    """S^T = K Q^T (keys by queries), row c from the start of c's lane chunk when causal (the cells
    before are left as they are), two rows a pass (rows 2i and 2i+1 share a chunk)."""
    t, tp = st.shape
    for c in range(0, t, 2):
        first = (c // LANES) * LANES if causal else 0
        for r in range(first, tp):
            st[c, r] = np.float32(0.0)
        if c + 1 < t:
            for r in range(first, tp):
                st[c + 1, r] = np.float32(0.0)
            whole = k.shape[1] // 4 * 4
            for s in range(0, whole, 4):
                _add_four_pair(st[c], st[c + 1], first, tp, k[c, s], k[c, s + 1], k[c, s + 2], k[c, s + 3],
                               k[c + 1, s], k[c + 1, s + 1], k[c + 1, s + 2], k[c + 1, s + 3], qt[s], qt[s + 1],
                               qt[s + 2], qt[s + 3])
            for s in range(whole, k.shape[1]):
                _add_one(st[c], first, tp, k[c, s], qt[s])
                _add_one(st[c + 1], first, tp, k[c + 1, s], qt[s])
        else:
            _rows_across(st[c], k, c, k.shape[1], qt, first, tp)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _small_forward_head(q, k, v, out, lse, scale, causal, qt, st, ot, top, total):
    """One head, all of it in cache: S^T row by row (a query's scores run along a row, so its max
    and sums are elementwise), the softmax, O^T = V^T P^T, O = O^T / sum and the logsumexp. A
    causal row c starts at its 16-lane chunk: the cells before c in that chunk are masked."""
    t = q.shape[0]
    width = v.shape[1]
    tp = st.shape[1]
    _transposed_into(q, qt)
    for r in range(tp):
        top[r] = np.float32(-np.inf)
        total[r] = np.float32(0.0)
    _small_scores(k, qt, st, causal)
    for c in range(t):
        first = (c // LANES) * LANES if causal else 0
        row = st[c]
        for r in range(first, tp):
            x = row[r] * scale
            x = np.float32(-np.inf) if causal and r < c else x
            row[r] = x
            top[r] = x if x > top[r] else top[r]
    for c in range(t):
        first = (c // LANES) * LANES if causal else 0
        row = st[c]
        for r in range(first, tp):
            e = math.exp(row[r] - top[r])
            e = np.float32(0.0) if causal and r < c else e
            row[r] = e
            total[r] += e
    for w in range(width):
        line = ot[w]
        for r in range(tp):
            line[r] = np.float32(0.0)
    _rows_down_all(ot, v, t, st, 0, tp, causal)
    for w in range(width):  # the divisions along O^T's rows (vectorized), then O copied out
        line = ot[w]
        for r in range(t):
            line[r] = line[r] / total[r]
    for r in range(t):
        for w in range(width):
            out[r, w] = ot[w, r]
        lse[r] = top[r] + math.log(total[r])


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _small_transpose(st, sq, causal):
    """sq = st's transpose over the cells a causal row holds (zeros past st's rows)."""
    t, tp = st.shape
    for r in range(tp):
        last = (r // LANES + 1) * LANES if causal else tp
        line = sq[r]
        for c in range(min(last, t)):
            line[c] = st[c, r]
        for c in range(t, last):
            line[c] = np.float32(0.0)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _small_backward_head(q, k, v, o, g, lse, dq, dkt, dvt, scale, causal, qt, gt, st, sq, dqt, delta, dp, logsum):
    """One query head's backward, all of it in cache: P^T recomputed from the logsumexp, dV^T += dO^T P,
    dP^T = V dO^T, dS^T = P^T (dP^T - rowsum(dO O)) scale, dQ^T = K^T dS^T, dK^T += Q^T dS (dK^T and
    dV^T accumulate over the query heads of a key/value head). The logsumexps are copied to ``logsum``
    first: ``lse`` is a strided view of the forward's output, and read in place it would keep the
    exponentials' loop from vectorizing."""
    t, depth = q.shape
    width = v.shape[1]
    tp = st.shape[1]
    _transposed_into(q, qt)
    _transposed_into(g, gt)
    for r in range(tp):
        delta[r] = np.float32(0.0)
    for r in range(t):
        s = np.float32(0.0)
        for w in range(width):
            s += g[r, w] * o[r, w]
        delta[r] = s
        logsum[r] = lse[r]
    _small_scores(k, qt, st, causal)
    for c in range(t):
        first = (c // LANES) * LANES if causal else 0
        row = st[c]
        for r in range(first, t):
            e = math.exp(row[r] * scale - logsum[r])
            row[r] = np.float32(0.0) if causal and r < c else e
        for r in range(t, tp):
            row[r] = np.float32(0.0)
    _small_transpose(st, sq, causal)
    for w in range(width):
        if causal:
            _rows_down_to_chunk(dvt[w], g, w, t, sq, 0)
        else:
            _rows_down(dvt[w], g, w, t, sq, 0, tp)
    for c in range(t):
        first = (c // LANES) * LANES if causal else 0
        for r in range(first, tp):
            dp[r] = np.float32(0.0)
        _rows_across(dp, v, c, width, gt, first, tp)
        row = st[c]
        for r in range(first, tp):
            row[r] = row[r] * (dp[r] - delta[r]) * scale
    for d in range(depth):
        line = dqt[d]
        for r in range(tp):
            line[r] = np.float32(0.0)
    _rows_down_all(dqt, k, t, st, 0, tp, causal)
    _small_transpose(st, sq, causal)
    for d in range(depth):
        if causal:
            _rows_down_to_chunk(dkt[d], q, d, t, sq, 0)
        else:
            _rows_down(dkt[d], q, d, t, sq, 0, tp)
    for r in range(t):
        for d in range(depth):
            dq[r, d] = dqt[d, r]


@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _attention_tiled(q, k, v, out, lse, scale, causal):
    """Each work item: its block rows of one (batch, head), over the key/value head it reads (up to
    SMALL positions: the whole head, fused)."""
    batch, heads, t, depth = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if FUSED:
        padded = (t + LANES - 1) // LANES * LANES
        width = v.shape[3]
        for work in prange(batch * heads):
            b = work // heads
            h = work - b * heads
            _small_forward_head(q[b, h], k[b, h // group], v[b, h // group], out[b, h], lse[b, h], scale, causal,
                                np.empty((depth, padded), np.float32), np.empty((t, padded), np.float32),
                                np.empty((width, padded), np.float32), np.empty(padded, np.float32),
                                np.empty(padded, np.float32))
        return
    blocks = (t + BLOCK - 1) // BLOCK
    items = _tiled_items(blocks, causal)
    for work in prange(batch * heads * items):
        bh = work // items
        item = work - bh * items
        b = bh // heads
        h = bh - b * heads
        for block in _tiled_deal(item, blocks, causal):
            if block < 0:
                continue
            _forward_block(q[b, h], k[b, h // group], v[b, h // group], out[b, h], lse[b, h], block, scale,
                           causal)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _add_into(target, tile, rows):
    """target[:rows] += tile[:rows]."""
    width = target.shape[1]
    for r in range(rows):
        for c in range(width):
            target[r, c] += tile[r, c]


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _backward_head(q, k, v, o, g, lse, dq, dk, dv, scale, causal):
    """flash-attention-2's backward for one query head: per tile, P^T = exp(scale S^T - lse),
    dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - rowsum(dO O)) scale, dK += dS^T Q, dQ += dS K."""
    t, depth = q.shape
    width = v.shape[1]
    blocks = (t + BLOCK - 1) // BLOCK
    delta = np.empty(BLOCK, np.float32)
    tile_v = np.empty((BLOCK, width), np.float32)
    tile_k = np.empty((BLOCK, depth), np.float32)
    tile_q = np.empty((BLOCK, depth), np.float32)
    for block in range(blocks):
        first = block * BLOCK
        end = min(first + BLOCK, t)
        rows = end - first
        queries = q[first:end]
        grads = g[first:end]
        for r in range(rows):
            s = np.float32(0.0)
            for c in range(width):
                s += g[first + r, c] * o[first + r, c]
            delta[r] = s
        last = block + 1 if causal else blocks
        for key_block in range(last):
            k0 = key_block * BLOCK
            k1 = min(k0 + BLOCK, t)
            cols = k1 - k0
            diagonal = causal and key_block == block
            probs = np.dot(k[k0:k1], queries.T)  # (keys, queries)
            for c in range(cols):
                tile_row = probs[c]
                for r in range(rows):
                    e = math.exp(tile_row[r] * scale - lse[first + r])
                    tile_row[r] = np.float32(0.0) if diagonal and c > r else e
            np.dot(probs, grads, tile_v[:cols])
            _add_into(dv[k0:k1], tile_v, cols)
            scores = np.dot(v[k0:k1], grads.T)  # dP^T, then dS^T in place
            for c in range(cols):
                tile_row = scores[c]
                p = probs[c]
                for r in range(rows):
                    tile_row[r] = p[r] * (tile_row[r] - delta[r]) * scale
            np.dot(scores, queries, tile_k[:cols])
            _add_into(dk[k0:k1], tile_k, cols)
            np.dot(scores.T, k[k0:k1], tile_q[:rows])
            _add_into(dq[first:end], tile_q, rows)


@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _attention_tiled_grads(q, k, v, o, g, lse, dq, dk, dv, scale, causal):
    """A work item per (batch, key/value head): dK and dV of that head and dQ of its group's query
    heads are written by that item only (no races), the heads in order."""
    batch, heads, t, depth = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if FUSED:
        padded = (t + LANES - 1) // LANES * LANES
        width = v.shape[3]
        for work in prange(batch * kv_heads):
            b = work // kv_heads
            kv = work - b * kv_heads
            dkt = np.zeros((depth, padded), np.float32)
            dvt = np.zeros((width, padded), np.float32)
            qt = np.empty((depth, padded), np.float32)
            gt = np.empty((width, padded), np.float32)
            st = np.empty((t, padded), np.float32)
            sq = np.empty((padded, padded), np.float32)
            dqt = np.empty((depth, padded), np.float32)
            delta = np.empty(padded, np.float32)
            logsum = np.empty(padded, np.float32)
            dp = np.empty(padded, np.float32)
            for member in range(group):
                h = kv * group + member
                _small_backward_head(q[b, h], k[b, kv], v[b, kv], o[b, h], g[b, h], lse[b, h], dq[b, h], dkt, dvt,
                                     scale, causal, qt, gt, st, sq, dqt, delta, dp, logsum)
            for c in range(t):
                for d in range(depth):
                    dk[b, kv, c, d] = dkt[d, c]
                for w in range(width):
                    dv[b, kv, c, w] = dvt[w, c]
        return
    for work in prange(batch * kv_heads):
        b = work // kv_heads
        kv = work - b * kv_heads
        dk[b, kv] = np.float32(0.0)
        dv[b, kv] = np.float32(0.0)
        for member in range(group):
            h = kv * group + member
            dq[b, h] = np.float32(0.0)
            _backward_head(q[b, h], k[b, kv], v[b, kv], o[b, h], g[b, h], lse[b, h], dq[b, h], dk[b, kv],
                           dv[b, kv], scale, causal)
