"""Tiny programs covering the reductions beyond sum on cuda (amax/amin, max/min with and without dim,
argmax/argmin, logsumexp, var/std, cumsum, int64 sums of bools and integers), forward and backward,
with ties and NaNs among their inputs. Shared by the simulator tests (tests/cuda/test_sim_ops_reduce.py) and the PTX builds
(tests/cuda/test_ptx_ops_reduce.py)."""
from __future__ import annotations

import numpy as np

import bendc.functional as F
from cuda_programs import Program, normal


def extrema(x, w):
    y = x * w
    values, indices = y.max(1)
    low = F.min(y, 0, keepdim=True).values
    loss = values.sum() + low.sum() + y.amax((0, 2)).sum() + y.amin(-1, keepdim=True).sum() + y.max() - y.min()
    loss.backward()
    return loss, w.grad, indices, y.argmin(0), y.argmax(), values


def ties_and_nans(x):
    values, indices = x.max(1)
    return values, indices, x.amin(1), x.argmin(1), x.max(), x.argmax(0, keepdim=True)


def long_lines(x):
    """Lines of TREE_MIN_EXTENT or more elements: a block per output element and a (value, index) tree."""
    values, indices = x.max(1)
    return values, indices, x.amin(1), x.argmin(1), x.max(), x.argmax(), x.amax(0, keepdim=True), x.logsumexp(1)


def _long_lines_inputs(rng: np.random.Generator) -> tuple:
    x = rng.integers(-2, 3, size=(3, 70)).astype(np.float32)  # ties in every line
    x[0, 40] = x[0, 10] = np.nan  # the first NaN (10) is the extremum and the index
    x[2, 69] = 9.0
    x[1, 3] = -9.0
    x[2, 5] = -np.inf
    return (x,)


def moments(x, w):
    y = x * w
    loss = (y.var(1) + y.std(0, correction=0).sum() + y.logsumexp(1) + y.logsumexp((0, 1))).sum() \
        + (y.cumsum(1) * x).sum() + (y.cumsum(0) * w).sum()
    loss.backward()
    return loss, w.grad, y.cumsum(-1), y.logsumexp(0, keepdim=True)


def integer_sums(x, counts):
    """int64 sums of bool and integer tensors: lines of 70 (a block's int64 tree) and of 2 or 3 (a
    thread per output element), an int32 operand, keepdim."""
    return (x > 0).sum(1), (x < 0.5).sum(), counts.sum(0), counts.sum(1, keepdim=True), (counts > 0).sum()


def _integer_sums_inputs(rng: np.random.Generator) -> tuple:
    return normal(rng, 3, 70), rng.integers(-9, 9, size=(2, 3)).astype(np.int32)


def _ties_and_nans_inputs(rng: np.random.Generator) -> tuple:
    x = rng.integers(-1, 2, size=(3, 4)).astype(np.float32)
    x[0] = 1.0  # an all-equal line
    x[1, 2] = np.nan
    x[2, 0] = -np.inf
    return (x,)


PROGRAMS: list[Program] = [
    Program("extrema", extrema, ("w",), lambda rng: (normal(rng, 2, 3, 4), normal(rng, 2, 3, 4)),
            frozenset({"reduce", "gather", "scatter", "elementwise"}), bitwise=(2, 3, 4, 5)),
    Program("ties_and_nans", ties_and_nans, (), _ties_and_nans_inputs, frozenset({"reduce", "gather"}),
            bitwise=(1, 3, 5)),
    Program("long_lines", long_lines, (), _long_lines_inputs, frozenset({"reduce", "gather"}),
            bitwise=(1, 3, 5)),
    Program("moments", moments, ("w",), lambda rng: (normal(rng, 3, 5), normal(rng, 3, 5)),
            frozenset({"reduce", "row", "elementwise"})),
    Program("integer_sums", integer_sums, (), _integer_sums_inputs, frozenset({"reduce"}),
            bitwise=(0, 1, 2, 3, 4)),
]

# Kernels that accumulate in float64 on purpose, as torch's CPU cumsum does (bendc/ops/scan.py),
# and logsumexp's sum of exponentials (bendc/ops/extrema.py).
FLOAT64_OPS = frozenset({"cumsum", "logsumexp"})
