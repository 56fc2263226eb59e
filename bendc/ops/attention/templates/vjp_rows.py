"""numba template: attention_vjp wrt q: dQ = G K, row by row.

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np
from numba import njit, prange

from bendc.ops.attention.templates.layout_triangular import _deal, _items, _row_length, _row_start
from bendc.ops.attention.templates.rows import _weighted_rows
from bendc.ops.attention.templates.placeholders import PARALLEL

# ---------------------------------------------------------------- TEMPLATE

@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
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
