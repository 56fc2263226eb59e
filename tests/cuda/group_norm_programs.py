"""Tiny programs covering group_norm and group_norm_grad on cuda (bendc/ops/group_norm.py): both
affine operands, none, a weight alone over a transposed (strided) input, and affine gradients
alone. Shared by the simulator tests (tests/cuda/test_sim_group_norm.py) and the PTX builds
(tests/cuda/test_ptx.py)."""
from __future__ import annotations

import bendc.functional as F
from cuda_programs import Program, normal


def affine_nchw(x, w, b, g):
    y = F.group_norm(x, 2, w, b)
    y.backward(g)
    return y, x.grad, w.grad, b.grad


def plain_groups_of_one_channel(x, g):
    y = F.group_norm(x, 3, eps=1e-3)
    y.backward(g)
    return y, x.grad


def weight_only_transposed(x, w, g):
    """A transposed (strided) input: the kernels split row and column indexes to read it."""
    y = F.group_norm(x.transpose(0, 1), 1, w)
    y.backward(g)
    return y, x.grad, w.grad


def affine_grads_only(x, w, b, g):
    """x is no leaf: only the per-channel kernel runs (grad_input=False)."""
    y = F.group_norm(x, 2, w, b)
    y.backward(g)
    return y, w.grad, b.grad


PROGRAMS = [
    Program("group_norm_affine", affine_nchw, ("x", "w", "b"),
            lambda rng: (normal(rng, 2, 4, 2, 3), normal(rng, 4), normal(rng, 4), normal(rng, 2, 4, 2, 3)),
            frozenset({"row"})),
    Program("group_norm_plain", plain_groups_of_one_channel, ("x",),
            lambda rng: (normal(rng, 2, 3, 5), normal(rng, 2, 3, 5)), frozenset({"row"})),
    Program("group_norm_transposed", weight_only_transposed, ("x", "w"),
            lambda rng: (normal(rng, 2, 2, 1, 3), normal(rng, 2), normal(rng, 2, 2, 1, 3)), frozenset({"row"})),
    Program("group_norm_affine_only", affine_grads_only, ("w", "b"),
            lambda rng: (normal(rng, 3, 4, 2), normal(rng, 4), normal(rng, 4), normal(rng, 3, 4, 2)),
            frozenset({"row"})),
]
