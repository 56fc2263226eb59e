"""Tiny programs of the op-coverage issue's selection, power and shape ops for the cuda target:
run under the simulator against the reference interpreter (test_sim_ops_shape.py) and compiled
to PTX and cubin (test_ptx_ops_shape.py). Each new elementwise op, the triangle kernel, and
concat with a broadcast constant (pad) appear in at least one."""
from __future__ import annotations

import numpy as np

import bendc.functional as F
from cuda_programs import Program, normal


def masks(x, y, g):
    """Comparisons as masks (to_float) and their &, |, ^, ~, where, masked_fill, clamp (numbers and tensors),
    abs, sign, detach."""
    m = x > y
    a = m * x + (x <= 0.25) + (x == y).float() + (x != 0.5) * 0.5 + (x < y).float() + (x >= y) * y
    b = F.where(m, x, 2.0).masked_fill(y < -0.5, -1.0) + x.clamp(-0.5, 0.5) + F.clamp(x, y, x * 0.5 + 1.0)
    c = abs(x) * x.sign() + x.detach() * x + (m & (y < 0.5)) * x + (~m | (x > 1.0)) * y + (m ^ (y > 0)) * 1.5
    out = (a + b + c) * g
    out.sum().backward()
    return out, m, x.grad, y.grad


def powers(x, e, g):
    """pow_scalar (pow() and the special exponents), pow with a tensor exponent and a number base, rsqrt."""
    base = x * x + 0.5
    y = base ** 1.5 + base ** -0.5 + x ** 3 + base ** -2 + base ** e + 2.0 ** x + base.rsqrt() + base.reciprocal()
    (y * g).sum().backward()
    return y, x.grad, e.grad


def shapes(x, w, g):
    """tril/triu (their own kernel), cat/stack, pad (a broadcast constant joined in), split, repeat, expand."""
    t = x.tril() * 2.0 + x.triu(1)
    p = F.pad(x, (1, -1, 0, 2), value=0.5)
    parts = x.split([1, 3], 1)
    joined = F.cat([parts[1], parts[0] * w], 1) + F.stack([x, t]).sum(0) + x[:, :1].expand(3, 4)
    r = x.repeat(1, 2)[:, 2:6]
    loss = (joined * g).sum() + (p * p).sum() + (r * t).sum()
    loss.backward()
    return t, p, joined, x.grad, w.grad


PROGRAMS: list[Program] = [
    Program("masks", masks, ("x", "y"),
            lambda rng: (np.float32([[0.5, -0.5, 0.25, 1.0], [0.0, -2.0, 0.7, 0.5], [1.5, -0.1, 0.25, 0.3]]),
                         np.float32([[0.5, 0.1, -1.0, 1.0], [-0.3, -2.0, 0.6, 0.4], [1.0, 0.0, -0.7, 0.3]]),
                         normal(rng, 3, 4)),
            frozenset({"elementwise"}), bitwise=(1,)),
    Program("powers", powers, ("x", "e"),
            lambda rng: (normal(rng, 2, 3), normal(rng, 3) * 0.5, normal(rng, 2, 3)), frozenset({"elementwise"})),
    Program("shapes", shapes, ("x", "w"),
            lambda rng: (normal(rng, 3, 4), normal(rng, 3, 1), normal(rng, 3, 4)),
            frozenset({"gather", "scatter", "elementwise"}), bitwise=(0, 1, 2)),
]
