"""An optimizer step on given gradients for the resident-parameter checks of the cubin runtime
(tests/cuda/test_cubin_simulator.py offline, tests/gpu/test_cubin_runtime.py on a GPU):
momentum SGD with weight decay, + - * only, so the cuda build's updates are the cpu build's bit
for bit. w, m, b, mb are donated and updated in place; c is donated too but read again after its
update (the norm), so the memory plan keeps its update in a buffer of its own and says why.

    bendc compile tests/cuda/momentum_program.py:momentum --target cuda --donate w,m,b,mb,c -o OUT
"""
from __future__ import annotations

import bendc

EXAMPLE_SHAPES = "w=f32[4,5] m=f32[4,5] g=f32[4,5] b=f32[5] mb=f32[5] gb=f32[5] c=f32[3] gc=f32[3]"
DONATED = ("w", "m", "b", "mb", "c")
IN_PLACE = ("w", "m", "b", "mb")  # the donations the memory plan makes
FEEDS = {"w": 0, "m": 1, "b": 2, "mb": 3, "c": 4}  # input -> the output slot that updates it
GRADIENTS = ("g", "gb", "gc")
NORM = 5  # the output slot of the norm: a sum, whose order differs on a GPU


@bendc.jit(donate=DONATED)
def momentum(w, m, g, b, mb, gb, c, gc, lr=0.1, mu=0.9, wd=0.01):
    m2 = m * mu + (g + w * wd)
    mb2 = mb * mu + gb
    c2 = c - gc * lr
    return w - m2 * lr, m2, b - mb2 * lr, mb2, c2, (c * c).sum()
