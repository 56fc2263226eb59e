"""A causal GQA attention step whose tiled cuda kernels take shrunken tiles (4 queries x 4 keys, 8
threads), set when this module is imported: for ``bendc compile`` in a subprocess
(tests/cuda/test_cubin_simulator.py), where a test cannot monkeypatch. At t=9 the attention_schedule
pass picks the tiled schedule on cuda (two key tiles or more), and key_grads splits its walk in parts
through a scratch array (fewer than MIN_BLOCKS blocks). Import it nowhere else: the tiles stay shrunk
for the rest of the process."""
from __future__ import annotations

import bendc.functional as F
import bendc.ops.attention.cuda_tiled as cuda_tiled

cuda_tiled.CANDIDATES = ((4, 4),)
cuda_tiled.THREADS = 8

EXAMPLE_SHAPES = "q=f32[1,2,9,4]:leaf k=f32[1,1,9,4]:leaf v=f32[1,1,9,3]:leaf g=f32[1,2,9,3]"


def step(q, k, v, g):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(g)
    return o, q.grad, k.grad, v.grad
