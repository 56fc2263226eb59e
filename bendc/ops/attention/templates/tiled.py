"""numba template: the tiled (flash-attention) schedule's forward and backward, over blocks of
BLOCK queries by BLOCK keys, each tile product bendc_rows_fma (bendc/kernels/templates/products.py:
register blocks in cache, accumulating in place); math.exp and math.log become the kit's
branch-free float32 versions when rendered (cpu_kit).

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


from bendc.kernels.templates.products import bendc_rows_fma
from bendc.ops.attention.templates.placeholders import CAUSAL, FUSED, PARALLEL, SCALE

# ---------------------------------------------------------------- TEMPLATE

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
    the diagonal when causal, the diagonal one masked), O = sum P V / sum P and the logsumexp.
    The diagonal tile's products skip the chunks of LANES cells its mask hides."""
    t = q.shape[0]
    width = v.shape[1]
    first = block * BLOCK
    end = min(first + BLOCK, t)
    rows = end - first
    # Q^T once a block (the tile products' sources are rows of lanes) and one buffer for the
    # tiles' scores
    queries_t = np.empty((q.shape[1], rows), np.float32)
    _transposed_into(q[first:end], queries_t)
    scores_full = np.empty(BLOCK * rows, np.float32)
    top = np.full(rows, -np.inf, np.float32)  # running max of each query's scores
    total = np.zeros(rows, np.float32)  # running sum of exp(score - top)
    acc = np.zeros((rows, width), np.float32)
    new = np.empty(rows, np.float32)
    alpha = np.empty(rows, np.float32)
    last = block + 1 if causal else (t + BLOCK - 1) // BLOCK
    for key_block in range(last):
        k0 = key_block * BLOCK
        k1 = min(k0 + BLOCK, t)
        cols = k1 - k0
        diagonal = causal and key_block == block
        scores = scores_full[:cols * rows].reshape((cols, rows))
        # S^T = K Q^T (keys, queries); on the diagonal a key's row from the start of its chunk
        bendc_rows_fma(scores, k[k0:k1], ACROSS, queries_t, queries_t.shape[0], 0, rows,
                       ROW_FROM_CHUNK if diagonal else 0, True)
        for r in range(rows):
            new[r] = top[r]
        for c in range(cols):
            tile_row = scores[c]
            for r in range(rows):
                x = tile_row[r] * scale
                x = np.float32(-np.inf) if diagonal and c > r else x  # (the cells not computed among them)
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
        for r in range(rows):
            a = alpha[r]
            line = acc[r]
            for c in range(width):
                line[c] = line[c] * a
        # acc += P V, each cell's FMAs in key order; on the diagonal a query reads the keys up to
        # the end of its chunk (the rest of its P is 0)
        bendc_rows_fma(acc, scores, DOWN, v[k0:k1], cols, 0, width, SOURCES_TO_CHUNK if diagonal else 0, False)
    for r in range(rows):
        for c in range(width):
            out[first + r, c] = acc[r, c] / total[r]
    for r in range(rows):  # a loop of its own, so the logs run in vectors
        lse[first + r] = top[r] + math.log(total[r])


SMALL = 64  # sequences up to this length take the fused per-head kernels below (no tiles); the
#             choice is rendered per call site, so a module holds (and compiles) one of the two paths
LANES = 16  # a causal row's cells are computed from the start of its 16-lane chunk (bendc_rows_fma's chunks)

# The fused heads' products are bendc_rows_fma (bendc/kernels/templates/products.py): dest[j, r] +=
# w(j, s) sources[s, r] over s in order, one FMA each, in blocks of registers; its causal modes name
# the cells a causal head holds in chunks of LANES.
ACROSS = 0  # w(j, s) = weights[j, s]
DOWN = 1  # w(j, s) = weights[s, j]
ROW_FROM_CHUNK = 1  # a row of S^T (a key) holds its queries from the start of its chunk on
SOURCES_TO_CHUNK = 2  # a query's row reads the keys up to the end of its chunk
SOURCES_FROM_CHUNK = 3  # a key's row reads the queries from the start of its chunk on


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
def _small_scores(k, qt, st, causal):
    """S^T = K Q^T (keys by queries), row c from the start of c's lane chunk when causal (the cells
    before are left as they are)."""
    bendc_rows_fma(st, k, ACROSS, qt, k.shape[1], 0, st.shape[1], ROW_FROM_CHUNK if causal else 0, True)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _small_forward_head(q, k, v, out, lse, scale, causal, qt, st, top, total):
    """One head, all of it in cache: S^T row by row (a query's scores run along a row, so its max
    and sums are elementwise), the softmax, O = P V / sum into ``out`` and the logsumexp. A causal
    row c starts at its 16-lane chunk: the cells before c in that chunk are masked."""
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
    bendc_rows_fma(out, st, DOWN, v, t, 0, width, SOURCES_TO_CHUNK if causal else 0, True)
    for r in range(t):  # a loop of its own, so the logs run in vectors (in the rows' loop: one at a time)
        lse[r] = top[r] + math.log(total[r])
    for r in range(t):
        line = out[r]
        for w in range(width):
            line[w] = line[w] / total[r]


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _small_backward_head(q, k, v, o, g, lse, dq, dk, dv, scale, causal, first_member, qt, gt, st, dpt, delta, logsum):
    """One query head's backward, all of it in cache: P^T recomputed from the logsumexp, dV += P^T dO,
    dP^T = V dO^T, dS^T = P^T (dP^T - rowsum(dO O)) scale, dQ = dS K, dK += dS^T Q (dK and dV
    accumulate over the query heads of a key/value head, from zeros at its first). The logsumexps are
    copied to ``logsum`` first: ``lse`` is a strided view of the forward's output, and read in place
    it would keep the exponentials' loop from vectorizing."""
    t, depth = q.shape
    width = v.shape[1]
    tp = st.shape[1]
    _transposed_into(q, qt)
    _transposed_into(g, gt)
    for r in range(tp):
        delta[r] = np.float32(0.0)
    for w in range(width):  # each row's sum in w order, the rows in lanes
        line = gt[w]
        for r in range(t):
            delta[r] += line[r] * o[r, w]
    for r in range(t):
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
    bendc_rows_fma(dv, st, ACROSS, g, t, 0, width, SOURCES_FROM_CHUNK if causal else 0, first_member)
    bendc_rows_fma(dpt, v, ACROSS, gt, width, 0, tp, ROW_FROM_CHUNK if causal else 0, True)
    for c in range(t):
        first = (c // LANES) * LANES if causal else 0
        row = st[c]
        dp = dpt[c]
        for r in range(first, tp):
            row[r] = row[r] * (dp[r] - delta[r]) * scale
    bendc_rows_fma(dq, st, DOWN, k, t, 0, depth, SOURCES_TO_CHUNK if causal else 0, True)
    bendc_rows_fma(dk, st, ACROSS, q, t, 0, depth, SOURCES_FROM_CHUNK if causal else 0, first_member)


@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _attention_tiled(q, k, v, out, scale, causal):
    """Each work item: its block rows of one (batch, head), over the key/value head it reads (up to
    SMALL positions: the whole head, fused). ``out`` is the forward's whole buffer (templates/
    tiled_forward.py): O in the first t rows of each head (so a head's O is C-contiguous), its
    logsumexps in the first t floats of the rows after them (``rest``; no second argument views the
    same memory)."""
    batch, heads, t, depth = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if FUSED:
        padded = (t + LANES - 1) // LANES * LANES
        for work in prange(batch * heads):
            b = work // heads
            h = work - b * heads
            rest = out[b, h, t:]
            _small_forward_head(q[b, h], k[b, h // group], v[b, h // group], out[b, h, :t], rest.reshape(rest.size)[:t],
                                scale, causal, np.empty((depth, padded), np.float32), np.empty((t, padded), np.float32),
                                np.empty(padded, np.float32), np.empty(padded, np.float32))
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
            rest = out[b, h, t:]
            _forward_block(q[b, h], k[b, h // group], v[b, h // group], out[b, h], rest.reshape(rest.size)[:t], block,
                           scale, causal)


@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _backward_head(q, k, v, o, g, lse, dq, dk, dv, scale, causal):
    """flash-attention-2's backward for one query head: per tile, P^T = exp(scale S^T - lse),
    dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - rowsum(dO O)) scale, dK += dS^T Q, dQ += dS K:
    every product bendc_rows_fma, the accumulating ones into dV, dK and dQ themselves. On the
    diagonal tile the products skip the chunks of LANES cells the mask zeroes, and the dS^T pass
    runs from each row's chunk (the cells before it are not computed and never read)."""
    t, depth = q.shape
    width = v.shape[1]
    blocks = (t + BLOCK - 1) // BLOCK
    delta = np.empty(BLOCK, np.float32)
    logsum = np.empty(BLOCK, np.float32)  # the block's logsumexps, contiguous (lse is a strided view)
    probs_full = np.empty(BLOCK * BLOCK, np.float32)
    scores_full = np.empty(BLOCK * BLOCK, np.float32)
    queries_t = np.empty((depth, BLOCK), np.float32)  # Q^T and dO^T of the block (sources in lanes)
    grads_t = np.empty((width, BLOCK), np.float32)
    for block in range(blocks):
        first = block * BLOCK
        end = min(first + BLOCK, t)
        rows = end - first
        queries = q[first:end]
        grads = g[first:end]
        _transposed_into(queries, queries_t)
        _transposed_into(grads, grads_t)
        for r in range(rows):
            delta[r] = np.float32(0.0)
            logsum[r] = lse[first + r]
        for w in range(width):  # rowsum(dO O): each row's sum in w order, the rows in lanes
            line = grads_t[w]
            for r in range(rows):
                delta[r] += line[r] * o[first + r, w]
        last = block + 1 if causal else blocks
        for key_block in range(last):
            k0 = key_block * BLOCK
            k1 = min(k0 + BLOCK, t)
            cols = k1 - k0
            diagonal = causal and key_block == block
            probs = probs_full[:cols * rows].reshape((cols, rows))
            bendc_rows_fma(probs, k[k0:k1], ACROSS, queries_t, depth, 0, rows, ROW_FROM_CHUNK if diagonal else 0,
                           True)  # S^T (keys, queries)
            for c in range(cols):
                tile_row = probs[c]
                for r in range(rows):
                    e = math.exp(tile_row[r] * scale - logsum[r])
                    tile_row[r] = np.float32(0.0) if diagonal and c > r else e
            bendc_rows_fma(dv[k0:k1], probs, ACROSS, grads, rows, 0, width, SOURCES_FROM_CHUNK if diagonal else 0,
                           False)
            scores = scores_full[:cols * rows].reshape((cols, rows))
            bendc_rows_fma(scores, v[k0:k1], ACROSS, grads_t, width, 0, rows, ROW_FROM_CHUNK if diagonal else 0,
                           True)  # dP^T, then dS^T in place
            for c in range(cols):
                tile_row = scores[c]
                p = probs[c]
                for r in range((c // LANES) * LANES if diagonal else 0, rows):
                    tile_row[r] = p[r] * (tile_row[r] - delta[r]) * scale
            bendc_rows_fma(dk[k0:k1], scores, ACROSS, queries, rows, 0, depth, SOURCES_FROM_CHUNK if diagonal else 0,
                           False)
            bendc_rows_fma(dq[first:end], scores, DOWN, k[k0:k1], cols, 0, depth, SOURCES_TO_CHUNK if diagonal else 0,
                           False)


@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
def _attention_tiled_grads(q, k, v, o, g, lse, dq, dk, dv, scale, causal):
    """A work item per (batch, key/value head): dK and dV of that head and dQ of its group's query
    heads are written by that item only (no races), the heads in order. ``o`` is the forward's whole
    buffer (O in the first t rows of each head: templates/tiled_forward.py)."""
    batch, heads, t, depth = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if FUSED:
        padded = (t + LANES - 1) // LANES * LANES
        width = v.shape[3]
        for work in prange(batch * kv_heads):
            b = work // kv_heads
            kv = work - b * kv_heads
            qt = np.empty((depth, padded), np.float32)
            gt = np.empty((width, padded), np.float32)
            st = np.empty((t, padded), np.float32)
            dpt = np.empty((t, padded), np.float32)
            delta = np.empty(padded, np.float32)
            logsum = np.empty(padded, np.float32)
            for member in range(group):
                h = kv * group + member
                _small_backward_head(q[b, h], k[b, kv], v[b, kv], o[b, h, :t], g[b, h], lse[b, h], dq[b, h], dk[b, kv],
                                     dv[b, kv], scale, causal, member == 0, qt, gt, st, dpt, delta, logsum)
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
