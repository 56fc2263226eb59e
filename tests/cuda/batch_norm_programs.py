"""Tiny programs covering training batch norm on cuda (bendc/ops/batch_norm.py: batch_norm,
batch_norm_grad, batch_norm_stats): both affine operands with the running statistics updated, a
BatchNorm1d over (N, C) without affine, a weight alone over a transposed (strided) input, and the
affine gradients alone. Shared by the simulator tests (tests/cuda/test_sim_batch_norm.py) and the PTX
builds (tests/cuda/test_ptx.py)."""
from __future__ import annotations

import numpy as np

import bendc.functional as F
from cuda_programs import Program, normal


def affine_running(x, w, b, g, rm, rv):
    mean, var = rm * 1.0, rv * 1.0
    y = F.batch_norm(x, mean, var, w, b, True, 0.1, 1e-5)
    y.backward(g)
    return y, x.grad, w.grad, b.grad, mean, var


def plain_rows(x, g):
    """BatchNorm1d over (N, C): a channel's values one per sample."""
    y = F.batch_norm(x, None, None, training=True, eps=1e-3)
    y.backward(g)
    return y, x.grad


def weight_only_transposed(x, w, g):
    """A transposed (strided) input: the kernels read it through its strides."""
    y = F.batch_norm(x.transpose(0, 1), None, None, w, None, True)
    y.backward(g)
    return y, x.grad, w.grad


def affine_grads_only(x, w, b, g):
    """x is no leaf: dweight and dbias only (grad_input=False)."""
    y = F.batch_norm(x, None, None, w, b, True)
    y.backward(g)
    return y, w.grad, b.grad


PROGRAMS = [
    Program("batch_norm_affine", affine_running, ("x", "w", "b"),
            lambda rng: (normal(rng, 2, 3, 2, 3), normal(rng, 3), normal(rng, 3), normal(rng, 2, 3, 2, 3),
                         normal(rng, 3), np.abs(normal(rng, 3)) + np.float32(0.5)), frozenset({"row"})),
    Program("batch_norm_rows", plain_rows, ("x",), lambda rng: (normal(rng, 5, 3), normal(rng, 5, 3)),
            frozenset({"row"})),
    Program("batch_norm_transposed", weight_only_transposed, ("x", "w"),
            lambda rng: (normal(rng, 2, 3, 4), normal(rng, 2), normal(rng, 3, 2, 4)), frozenset({"row"})),
    Program("batch_norm_affine_only", affine_grads_only, ("w", "b"),
            lambda rng: (normal(rng, 3, 2, 2), normal(rng, 2), normal(rng, 2), normal(rng, 3, 2, 2)),
            frozenset({"row"})),
]
