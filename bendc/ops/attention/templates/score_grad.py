"""numba template: attention_score_grad: G = P * (dP - rowsum(dP * P)) * scale.

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np
from numba import njit, prange

from bendc.ops.attention.templates.layout_triangular import _deal, _items, _row_length, _row_start
from bendc.ops.attention.templates.rows import _dots
from bendc.ops.attention.templates.placeholders import PARALLEL, SCALE

# ---------------------------------------------------------------- TEMPLATE

@njit(parallel=PARALLEL, cache=True, error_model='numpy', no_cfunc_wrapper=True)
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
                np.float32(SCALE))
