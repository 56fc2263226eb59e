"""The CPU kernels' float32 transcendentals (bendc/kernels/templates/cpu_math.py) against torch's
CPU results and float64, on 1e6 random inputs (uniform and random bit patterns) plus edge cases:
±0, ±inf, NaN, denormals, the overflow and underflow boundaries. Measured max ulp (this machine):
exp 1, log 1, tanh 1, erf 2 against torch; sigmoid 2 against float64 and 4 against torch.sigmoid,
which is itself 4 ulp from 1/(1 + torch.exp(-x)) (its vectorized exp is a less accurate one).
And: generated kernels call no libm transcendental, and the loops that call them vectorize."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from numba import njit

from bendc.kernels.templates import cpu_math
from conftest import ulp_distance

EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -1e-40, 1.17549435e-38,
                  3.4028235e38, -3.4028235e38, 88.72283, 88.7229, 89.0, 100.0, -87.33654, -87.34, -103.9,
                  -103.98, -104.0, -200.0, 0.625, -0.625, 0.9, -0.9, 3.99, 4.0, 4.01, 9.0, -9.0, 1.0, -1.0,
                  1e-8, -1e-8, 0.5, 2.0], dtype=np.float32)


def _inputs(positive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(0)
    uniform = rng.uniform(-20.0, 20.0, 500_000).astype(np.float32)
    patterns = rng.integers(0, 2**32, 500_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([uniform, patterns[np.isfinite(patterns)], EDGES])
    return np.abs(x) if positive else x


def _apply(function, x: np.ndarray) -> np.ndarray:
    @njit(error_model="numpy")
    def loop(x, out):
        for i in range(x.shape[0]):
            out[i] = function(x[i])

    out = np.empty_like(x)
    loop(x, out)
    return out


def _ulp(actual, expected) -> np.ndarray:
    distance = ulp_distance(actual, expected)
    distance[np.isnan(actual) & np.isnan(expected)] = 0
    return distance


def _float64(function, x):
    with np.errstate(all="ignore"):
        return function(x.astype(np.float64)).astype(np.float32)


CASES = {  # name: (helper, torch's function, float64 reference, positive inputs, max ulp vs torch, vs float64)
    "exp": (cpu_math.bendc_exp, torch.exp, np.exp, False, 2, 1),
    "log": (cpu_math.bendc_log, torch.log, np.log, True, 2, 1),
    "tanh": (cpu_math.bendc_tanh, torch.tanh, np.tanh, False, 2, 2),
    "sigmoid": (cpu_math.bendc_sigmoid, torch.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x)), False, 4, 2),
    "erf": (cpu_math.bendc_erf, torch.erf, np.vectorize(math.erf, otypes=[np.float64]), False, 2, 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_within_stated_ulp_of_torch_and_float64(name):
    helper, torch_fn, exact, positive, torch_ulp, exact_ulp = CASES[name]
    x = _inputs(positive)
    if name == "erf":
        x = np.concatenate([x[:500_000] / np.float32(4.0), x[500_000:]])  # most of erf's range is ±1
    actual = _apply(helper, x)
    against_torch = _ulp(actual, torch_fn(torch.from_numpy(x)).numpy())
    exact_values = _float64(exact, x)
    # Against float64 where the result is a normal float: 1 / (1 + e^-x) flushes to 0 below
    # x = -88.7 in float32 (torch's does too) where float64 still has a denormal.
    normal = ~(np.abs(exact_values) < np.float32(1.17549435e-38))
    against_exact = _ulp(actual[normal], exact_values[normal])
    worst = int(np.argmax(against_torch))
    assert against_torch.max() <= torch_ulp, f"{name}({x[worst]!r}) = {actual[worst]!r}: {against_torch.max()} ulp"
    assert against_exact.max() <= exact_ulp, f"{name}: {against_exact.max()} ulp from float64"


def test_exp_through_underflow_every_float():
    """Every float32 from -87 to -180 (denormal results, then 0): within 1 ulp of float64's e^x
    rounded to float32, and +0 wherever x < -104 (the helper clamps at -176, where its two factors
    of 2^n are +0, so that -inf, a masked attention score, makes no underflowing product)."""
    bits = np.arange(np.float32(-87.0).view(np.int32), np.float32(-180.0).view(np.int32) + 1, dtype=np.int32)
    x = np.concatenate([bits.view(np.float32), np.float32([-np.inf, -3.4028235e38, -1e30])])
    actual = _apply(cpu_math.bendc_exp, x)
    assert _ulp(actual, _float64(np.exp, x)).max() <= 1
    below = x < np.float32(-104.0)
    assert below.sum() > 1000 and np.array_equal(actual[below].view(np.int32), np.zeros(below.sum(), np.int32))


@pytest.mark.parametrize("name", list(CASES))
def test_edge_cases_are_torchs(name):
    """±0 keep their sign, infinities and NaN come out as torch's, overflow and underflow at
    torch's boundaries: the same bits (NaN: a NaN)."""
    helper, torch_fn, _, positive, _, _ = CASES[name]
    x = np.abs(EDGES) if positive else EDGES
    x = np.concatenate([x, -x]) if not positive else np.concatenate([x, np.float32([-1.0, -np.inf, -0.0])])
    actual, expected = _apply(helper, x), torch_fn(torch.from_numpy(x)).numpy()
    special = ~np.isfinite(expected) | (expected == 0) | ~np.isfinite(x) | (x == 0)
    assert np.array_equal(np.isnan(actual), np.isnan(expected))
    both = special & ~np.isnan(expected)
    assert np.array_equal(actual[both].view(np.int32), expected[both].view(np.int32)), (x[both], actual[both],
                                                                                         expected[both])


@pytest.mark.parametrize("name", list(CASES))
def test_a_loop_over_a_helper_vectorizes(name):
    """The helper inlines into the loop and the loop runs on SIMD registers (xmm is scalar SSE,
    ymm/zmm are vectors); no call remains to libm's expf/logf/tanhf/erff."""
    helper = CASES[name][0]

    @njit(error_model="numpy")
    def loop(x, out):
        for i in range(x.shape[0]):
            out[i] = helper(x[i])

    x = np.ones(64, np.float32)
    loop(x, np.empty_like(x))
    assembly = loop.inspect_asm(loop.signatures[0])
    assert re.search(r"%[yz]mm\d", assembly), f"{name}: no vector registers in the loop"
    assert not re.search(r"\b(expf|logf|tanhf|erff)\b", assembly), f"{name}: a libm call remains"


def _gelu_float64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gelu and its derivative in float64 (scipy's erfc keeps the negative tail's relative accuracy)."""
    from scipy.special import erfc

    wide = x.astype(np.float64)
    with np.errstate(all="ignore"):
        cdf = np.where(wide > 0, 1.0 - 0.5 * erfc(wide / math.sqrt(2.0)), 0.5 * erfc(-wide / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * wide * wide) / math.sqrt(2.0 * math.pi)
        return wide * cdf, cdf + wide * pdf


def test_gelu_and_its_gradient_through_one_exp():
    """bendc_gelu / bendc_gelu_vjp (gelu's CPU kernels): within 10 ulp of float64 wherever gelu is
    a normal float (the negative tail included, where 1 + erf cancels: the erf-based form was
    ~1e6 ulp off there, torch's is too), the gradient within 2.5e-7 of float64 absolutely (it
    crosses 0 near x = -0.75), both within 1.5e-6 * max(1, |x|) of torch; the special values are
    the erf-based form's: gelu(inf) = inf, gelu(-inf) = NaN (-inf * 0, as torch's formula),
    gelu(-1e30) = -0.0, the gradient 1 and 0 at +-1e30 and NaN at +-inf (inf * 0)."""
    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-16.0, 16.0, 400_001, dtype=np.float32),
                        rng.standard_normal(300_000).astype(np.float32) * np.float32(3.0),
                        np.float32([0.0, -0.0, 1e-30, -1e-30, 1e-45, -0.7518, 5.5, -5.5, 12.9, -12.9])])

    @njit(error_model="numpy")
    def both(x, value, grad):
        for i in range(x.shape[0]):
            value[i] = cpu_math.bendc_gelu(x[i])
            grad[i] = cpu_math.bendc_gelu_vjp(np.float32(1.0), x[i])

    value, grad = np.empty_like(x), np.empty_like(x)
    both(x, value, grad)
    exact_value, exact_grad = _gelu_float64(x)
    normal = np.abs(exact_value) >= np.float32(1.17549435e-38)
    assert _ulp(value[normal], exact_value[normal].astype(np.float32)).max() <= 10
    assert np.abs(grad - exact_grad).max() <= 2.5e-7
    tx = torch.from_numpy(x)
    scale = np.maximum(1.0, np.abs(x))
    assert (np.abs(value - torch.nn.functional.gelu(tx).numpy()) / scale).max() <= 1.5e-6
    assert (np.abs(grad - torch.ops.aten.gelu_backward(torch.ones_like(tx), tx).numpy()) / scale).max() <= 1.5e-6
    special = np.float32([np.inf, -np.inf, np.nan, 1e30, -1e30, 3e38, -3e38])
    value, grad = np.empty_like(special), np.empty_like(special)
    both(special, value, grad)
    assert np.array_equal(value, np.float32([np.inf, np.nan, np.nan, 1e30, -0.0, 3e38, -0.0]), equal_nan=True)
    assert np.signbit(value[4]) and np.signbit(value[6])
    assert np.array_equal(grad, np.float32([np.nan, np.nan, np.nan, 1.0, 0.0, 1.0, 0.0]), equal_nan=True)


def test_gelu_kernels_call_the_kits_gelu_on_the_cpu_only_for_the_erf_form():
    """Lowering.cpu_scalar: the cpu's fused kernels call bendc_gelu / bendc_gelu_vjp for
    approximate="none" (tanh keeps the shared expression); the cuda renderer keeps math.erf."""
    import bendc
    import bendc.functional as F
    from bendc.ops import OPS

    def step(x):
        (F.gelu(x) * F.gelu(x * 2.0, approximate="tanh")).sum().backward()
        return x.grad

    jitted = bendc.jit(step, leaves=("x",), target="cpu")
    jitted(np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6))
    cells = "\n".join(line for source in jitted.kernels().values() for line in source.splitlines()
                      if re.match(r"\s+v\d+ = ", line))  # the kernels' cell statements
    assert "bendc_gelu(" in cells and "bendc_gelu_vjp(" in cells, cells
    assert "bendc_tanh(" in cells and "math.erf" not in cells and "bendc_erf(" not in cells, cells
    assert "math.erf(" in OPS["gelu"].lowering.scalar("a", approximate="none")
    assert OPS["gelu"].lowering.cpu_scalar("a", approximate="tanh") is None
