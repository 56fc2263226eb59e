"""numba template: attention's forward: each work item's rows' scores, softmax and P . V.

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np
from numba import njit, prange

from bendc.ops.attention.templates.layout_triangular import _deal, _items, _row_length
from bendc.ops.attention.templates.rows import _softmax_scores, _weighted_rows
from bendc.ops.attention.templates.placeholders import CAUSAL, PARALLEL, SCALE

# ---------------------------------------------------------------- TEMPLATE

@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
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
               np.float32(SCALE), CAUSAL)
