"""numba template: attention_tiled_grad: dQ, dK and dV in one buffer (B, H + 2 Hkv, T, max(D, Dv)):
heads 0..H-1 hold dQ, the next Hkv dK, the last Hkv dV (the first D or Dv columns).

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import numpy as np

from bendc.ops.attention.templates.placeholders import CAUSAL, FUSED, SCALE
from bendc.ops.attention.templates.tiled import _attention_tiled_grads

# ---------------------------------------------------------------- TEMPLATE

def kernel(in0, in1, in2, in3, in4, out0):
    batch, heads, t, depth = in0.shape
    kv_heads = in1.shape[1]
    width = in2.shape[3]
    saved = np.ascontiguousarray(in3)
    lse = saved[:, :, t:, :].reshape(batch, heads, (saved.shape[2] - t) * width)[:, :, :t]
    if FUSED:  # the small heads read Q, K, V and dO through their strides (the projections' layout)
        q, k, v, g = in0, in1, in2, in4
    else:  # the tiles' products read rows of contiguous lanes: a projection's view in place, others copied
        q, k, v, g = (x if x.strides[-1] == x.itemsize else np.ascontiguousarray(x) for x in (in0, in1, in2, in4))
    _attention_tiled_grads(q, k, v, saved, g, lse,
                           out0[:, :heads, :, :depth], out0[:, heads:heads + kv_heads, :, :depth],
                           out0[:, heads + kv_heads:, :, :width], np.float32(SCALE), CAUSAL)
