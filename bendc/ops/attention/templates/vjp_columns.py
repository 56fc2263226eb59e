"""numba template: attention_vjp wrt k or v: dK = G^T Q and dV = P^T dO, in blocks of columns.

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np
from numba import njit, prange

from bendc.ops.attention.templates.layout_triangular import _column_first, _deal, _items, _row_length, _row_start
from bendc.ops.attention.templates.placeholders import PARALLEL

# ---------------------------------------------------------------- TEMPLATE

COLUMN_BLOCK = 16  # columns a work item accumulates together: each row of scores is read as one segment


@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
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
