"""numba template: attention_probs: P recomputed in the layout.

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np
from numba import njit, prange

from bendc.ops.attention.templates.layout_triangular import _deal, _items, _row_length, _row_start
from bendc.ops.attention.templates.rows import _softmax_scores
from bendc.ops.attention.templates.placeholders import CAUSAL, PARALLEL, SCALE

# ---------------------------------------------------------------- TEMPLATE

@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
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
           np.float32(SCALE), CAUSAL)
