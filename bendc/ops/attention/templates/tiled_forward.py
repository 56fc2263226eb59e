"""numba template: attention_tiled: O and each query's logsumexp, in one buffer (B, H, T + R, Dv):
rows 0..T-1 of a head hold O, the R = ceil(T / Dv) rows after them the T logsumexps, in order.

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np

from bendc.ops.attention.templates.placeholders import CAUSAL, FUSED, SCALE
from bendc.ops.attention.templates.tiled import _attention_tiled

# ---------------------------------------------------------------- TEMPLATE

def kernel(in0, in1, in2, out0):
    if FUSED:  # the small heads read Q, K and V through their strides (the projections' layout)
        q, k, v = in0, in1, in2
    else:  # the tiles' products read rows of contiguous lanes: a projection's view in place, others copied
        q, k, v = (x if x.strides[-1] == x.itemsize else np.ascontiguousarray(x) for x in (in0, in1, in2))
    _attention_tiled(q, k, v, out0, np.float32(SCALE), CAUSAL)
