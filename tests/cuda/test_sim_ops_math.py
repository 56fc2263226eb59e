"""Issue 22's elementwise math, the integer <= and a cumsum over a zero-size dim on the cuda target
under numba's CUDA simulator, against the reference interpreter (tiny shapes: a simulated thread
costs ~170 us). Runs in its own process (tests/cuda/run_simulator.sh); skipped elsewhere.

Selections, classifications and roundings are compared bit for bit (a NaN matches any NaN); the
transcendentals and the gradients within the conftest tolerances (the simulator evaluates math.* in
float64 and rounds differently from libdevice)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc.functional as F  # noqa: E402
from cuda_programs import Program  # noqa: E402
from test_simulator import check_program  # noqa: E402


def selections_and_roundings(x, y):
    picked = F.stack([F.maximum(x, y), x.minimum(y), x.fmax(y), x.fmin(y)])
    rounded = F.stack([x.floor(), x.ceil(), x.round(), x.trunc(), x.frac(), x.nan_to_num(posinf=9.0)])
    masks = x.isnan().float() + x.isinf().float() * 2.0 + x.isfinite().float() * 4.0
    return picked, rounded, masks


def _specials(rng):
    x = np.array([[0.5, -0.5, 2.5, -0.0, np.nan, np.inf], [-1.5, 8388609.0, 0.49999997, -0.7, 1.0, -np.inf]],
                 np.float32)
    y = np.array([[0.5, 1.0, np.nan, 0.0, 1.0, -2.0], [-2.0, 3.0, 0.5, -0.7, np.nan, 0.0]], np.float32)
    return x, y


def transcendentals(x, u, p, w):
    a = x * w
    values = F.stack([a.sin(), a.cos(), a.tan(), (u * w).asin(), (u * w).acos(), a.atan(), a.sinh(), a.cosh(),
                      a.erf(), a.erfc(), a.exp2(), a.expm1(), (p * w * w).log2(), (p * w * w).log10(),
                      (p * w).log1p(), a.atan2(u), a.lerp(u, 0.7), a.lerp(u, w)])
    loss = (values * x).sum() + (F.maximum(a, u) + F.fmax(a, u) + a.frac()).sum()
    loss.backward()
    return loss, w.grad, values


def integer_compare_and_empty_cumsum(i, j, e):
    return (i <= j).float() + (i >= j).float() * 2.0, e.cumsum(1)


def _uniform(rng, low, high, shape=(2, 3)):
    return rng.uniform(low, high, shape).astype(np.float32)


PROGRAMS = [
    Program("selections_and_roundings", selections_and_roundings, (), _specials, frozenset({"elementwise"}),
            bitwise=(0, 1, 2)),
    Program("transcendentals", transcendentals, ("w",), lambda rng: (
        _uniform(rng, -1.0, 1.0), _uniform(rng, -0.9, 0.9), _uniform(rng, 0.5, 2.0), _uniform(rng, 0.5, 1.0)),
        frozenset({"elementwise"})),
    Program("integer_compare_and_empty_cumsum", integer_compare_and_empty_cumsum, (), lambda rng: (
        np.array([0, 3, 2, 1], np.int32), np.array([1, 3, 1, 2], np.int32), np.zeros((3, 0), np.float32)),
        frozenset(), bitwise=(0, 1)),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-math-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program, cache_dir: str) -> None:
    check_program(program, cache_dir)
