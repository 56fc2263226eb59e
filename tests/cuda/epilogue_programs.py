"""A fused elementwise group with epilogue sums of every shape (tests/cuda/test_epilogue_sums.py
compiles it to PTX, tests/cuda/test_sim_epilogue_sums.py runs it under the simulator): a bias
gradient (rows summed, columns kept), a full sum, and sum_to_size of a broadcast operand, over 70
rows (more than one pass of each thread, a tree of 128 threads)."""
from __future__ import annotations

import numpy as np

import bendc.functional as F

SHAPES = "x=f32[70,4]:leaf b=f32[4]:leaf g=f32[70,4] c=f32[70,1]:leaf"
LEAVES = ("x", "b", "c")


def fused_sums(x, b, g, c):
    y = F.relu(x * 2.0 + b) * c
    loss = (y * g).sum() + (x * x).sum()
    loss.backward()
    return loss, y, b.grad, c.grad, x.grad


def inputs(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for shape in ((70, 4), (4,), (70, 4), (70, 1)))


def float64_outputs(x, b, g, c) -> list[np.ndarray]:
    """The same step in float64 with numpy (the sums' reference)."""
    x, b, g, c = (np.asarray(a, np.float64) for a in (x, b, g, c))
    pre = x * 2.0 + b
    y = np.maximum(pre, 0.0) * c
    loss = (y * g).sum() + (x * x).sum()
    dy = g
    grad_pre = np.where(pre > 0, dy * c, 0.0)
    return [np.array(loss), y, grad_pre.sum(0), (np.maximum(pre, 0.0) * dy).sum(1, keepdims=True),
            grad_pre * 2.0 + 2.0 * x]
