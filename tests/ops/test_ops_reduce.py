"""Reductions beyond sum/mean against PyTorch eager (CPU, float32): max/min (full and along a dim,
values and indices), amax/amin, argmax/argmin, var/std, logsumexp, cumsum; values and gradients,
on the reference and cpu targets (the autouse ``target`` fixture of tests/parity_harness.py).

Bit for bit: the extrema (a selected element; their gradients are g / count, a scatter or a
gather), cumsum and its gradient (float64 running sums rounded per prefix, as torch's CPU kernel).
Within the conftest tolerances: var/std (torch's Welford moments vs the two-pass formula) and
logsumexp (exp and log, another summation order). Where NaNs are involved values are compared
with assert_close (NaN equals NaN there; bit patterns of NaN may differ).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from bendc.kernels.cpu_policy import parallel_from
from conftest import assert_bitwise, assert_close
from parity_harness import normal, parity, target  # noqa: F401  (target: the autouse fixture)
import parity_harness

PARALLEL_CELLS = parallel_from("rows")


def _jit(fn, leaves=()):
    return bendc.jit(fn, leaves=leaves, target=parity_harness.TARGET)


def ties(shape, seed=0) -> np.ndarray:
    """Small integers: many ties in every line (and an all-equal first line)."""
    values = np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)
    values.reshape(-1, shape[-1])[0] = 1.0
    return values


def with_nan(shape, seed=0) -> np.ndarray:
    values = normal(shape, seed)
    flat = values.reshape(-1)
    flat[1] = np.nan
    flat[-2] = np.nan
    return values


# ------------------------------------------------------------------ max / min without dim
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("data", ["normal", "ties", "single"])
def test_full_extremum(op, data):
    """torch.max(x): 0-d; the gradient is split evenly among the ties (evenly_distribute_backward)."""
    x = {"normal": normal((3, 5), 1), "ties": ties((3, 5), 2), "single": normal((), 3)}[data]
    parity(lambda F, x: getattr(x, op)() * 3.0, {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("op", ["max", "min"])
def test_full_extremum_nan_takes_the_gradient_evenly(op):
    """A NaN is the extremum; torch's max() gives its gradient to the NaNs, split evenly."""
    parity(lambda F, x: getattr(x, op)() * 2.0, {"x": with_nan((3, 4), 4)}, ("x",))


# ------------------------------------------------------------------ max / min along a dim
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dim", [0, 1, -1, 2])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("data", ["normal", "ties"])
def test_extremum_along_dim_values_and_gradient(op, dim, keepdim, data):
    """(values, indices) along dim; the gradient goes to the returned index (torch's scatter)."""
    x = normal((3, 4, 5), 5) if data == "normal" else ties((3, 4, 5), 6)
    parity(lambda F, x: getattr(x, op)(dim=dim, keepdim=keepdim).values, {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("data", ["normal", "ties", "nan"])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_extremum_along_dim_indices(op, data, dim, keepdim):
    """indices are int64, torch's: the first occurrence on ties, the first NaN where there is one."""
    x = {"normal": normal((4, 6), 7), "ties": ties((4, 6), 8), "nan": with_nan((4, 6), 9)}[data]

    def program(x):
        values, indices = getattr(x, op)(dim, keepdim)  # tuple-unpackable, positional dim and keepdim
        result = getattr(x, op)(dim=dim, keepdim=keepdim)
        return values, indices, result.values, result.indices

    values, indices, again, again_indices = _jit(program)(x)
    want = getattr(torch.from_numpy(x), op)(dim=dim, keepdim=keepdim)
    assert indices.dtype == np.int64 and again_indices.dtype == np.int64
    np.testing.assert_array_equal(indices, want.indices.numpy())
    np.testing.assert_array_equal(again_indices, want.indices.numpy())
    assert_close(values, want.values.numpy(), "values")
    assert_close(again, want.values.numpy(), "values")


@pytest.mark.parametrize("op", ["max", "min"])
def test_extremum_along_dim_of_nan_lines_gives_the_nan_its_gradient(op):
    parity(lambda F, x: getattr(x, op)(1).values, {"x": with_nan((3, 4), 10)}, ("x",))


def test_extremum_of_0d_and_size_1_dims():
    parity(lambda F, x: x.max(0).values * 2.0 + x.min(-1, keepdim=True)[0], {"x": normal((), 11)}, ("x",),
           exact=True)
    parity(lambda F, x: x.max(1).values + x.min(0, True).values, {"x": normal((3, 1), 12)}, ("x",), exact=True)


# ------------------------------------------------------------------ amax / amin
@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim", [1, -1, (0, 2), (-1, 0), (0, 1, 2), ()])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("data", ["normal", "ties"])
def test_amax_amin(op, dim, keepdim, data):
    """The gradient is shared among ties: (g / count) * (result == x) (scale_grad_by_count)."""
    x = normal((3, 4, 5), 13) if data == "normal" else ties((3, 4, 5), 14)
    parity(lambda F, x: getattr(x, op)(dim, keepdim), {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_nan_line_gets_nan_gradients(op):
    """A line holding a NaN: the NaN is the value and, as in torch, every gradient of the line is NaN."""
    parity(lambda F, x: getattr(x, op)(1), {"x": with_nan((3, 4), 15)}, ("x",))


def test_amax_of_all_equal_rows_splits_the_gradient():
    x = np.ones((2, 4), np.float32)
    actual, expected = parity(lambda F, x: (x.amax(1) * 8.0).sum(), {"x": x}, ("x",), exact=True)
    assert_bitwise(actual.grads["x"], np.full((2, 4), 2.0, np.float32))


# ------------------------------------------------------------------ argmax / argmin
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("data", ["normal", "ties", "nan"])
def test_argmax_argmin(op, dim, keepdim, data):
    x = {"normal": normal((3, 4, 5), 16), "ties": ties((3, 4, 5), 17), "nan": with_nan((3, 4, 5), 18)}[data]
    got = _jit(lambda x: getattr(x, op)(dim=dim, keepdim=keepdim))(x)
    want = getattr(torch.from_numpy(x), op)(dim=dim, keepdim=keepdim).numpy()
    assert got.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_named_tuple_is_returned_as_torch_returns_it():
    x = ties((3, 4), 32)
    result = _jit(lambda x: x.max(1))(x)
    want = torch.from_numpy(x).max(1)
    assert type(result).__name__ == "ValuesIndices" and result._fields == ("values", "indices")
    assert_bitwise(result.values, want.values.numpy())
    np.testing.assert_array_equal(result.indices, want.indices.numpy())


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("data", ["normal", "ties", "nan"])
def test_full_reductions_of_large_operands_in_chunks(op, data):
    """Over PARALLEL_CELLS elements a full max/argmax scans chunks in parallel: the same first NaN
    and first index as a scan in order (a tie and a NaN at chunk boundaries, where a chunk starts)."""
    x = normal((256, 300), 33)
    if data == "ties":
        x[:] = np.round(x)
        x.reshape(-1)[[256 * 300 // 16 * 5, 256 * 300 // 16 * 3]] = x.max() + 1 if op.endswith("max") else x.min() - 1
    elif data == "nan":
        x.reshape(-1)[[256 * 300 // 16 * 3, 256 * 300 // 16 * 3 + 5, 256 * 300 - 1]] = np.nan
    got = _jit(lambda x: getattr(x, op)())(x)
    want = getattr(torch.from_numpy(x), op)().numpy()
    if op.startswith("arg"):
        assert int(got) == int(want)
    else:
        assert_close(got, want, op)


def test_argmax_of_0d():
    got = _jit(lambda x: (x.argmax(), x.argmin(0), x.argmax(0, keepdim=True)))(normal((), 19))
    assert [g.shape for g in got] == [(), (), ()] and all(int(g) == 0 for g in got)


# ------------------------------------------------------------------ var / std
@pytest.mark.parametrize("op", ["var", "std"])
@pytest.mark.parametrize("dim", [None, 1, -1, (0, 2)])
@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_std(op, dim, correction, keepdim):
    x = normal((3, 4, 5), 20, scale=3.0) + np.float32(2.0)
    parity(lambda F, x: getattr(x, op)(dim, keepdim=keepdim, correction=correction), {"x": x}, ("x",),
           rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std_legacy_unbiased(op):
    x = normal((4, 6), 21)
    parity(lambda F, x: getattr(x, op)(1, False, True), {"x": x}, ("x",), rtol=1e-5, atol=1e-5)  # dim, unbiased, keepdim
    parity(lambda F, x: getattr(x, op)(False) + getattr(x, op)(unbiased=True), {"x": x}, ("x",), rtol=1e-5, atol=1e-5)
    parity(lambda F, x: getattr(x, op)(), {"x": x}, ("x",), rtol=1e-5, atol=1e-5)


def test_std_of_a_constant_line_has_zero_gradients_as_torch():
    """torch's std_backward masks the gradient to 0 where the std is 0 (the long fuzz, seed 20261209:
    ``(1.0 ** x).std(0)`` gave NaN gradients); the other lines' gradients are unchanged."""
    x = normal((3, 4), 25)
    x[1] = 0.75  # a constant line: std 0

    def body(F, x):
        return x.std(1) + x.std(1, correction=0) * 2.0 + (x[1] * 0.0 + 1.0).std()

    parity(body, {"x": x}, ("x",), rtol=1e-5, atol=1e-5)


def test_var_without_degrees_of_freedom_is_nan_or_inf_as_torch():
    """n <= correction: torch's divisor is 0 (a warning, and NaN for one element, inf otherwise)."""
    x = normal((3, 2), 22)
    with pytest.warns(UserWarning):
        torch.from_numpy(x).var(1, correction=2)
    with np.errstate(all="ignore"):
        got = _jit(lambda x: (x.var(1, correction=2), x[:, :1].var(1)))(x)
    want = torch.from_numpy(x).var(1, correction=2).numpy(), torch.from_numpy(x[:, :1].copy()).var(1).numpy()
    for a, b in zip(got, want):
        assert_close(a, b, "var")


# ------------------------------------------------------------------ logsumexp
@pytest.mark.parametrize("dim", [0, 1, -1, (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(dim, keepdim):
    parity(lambda F, x: x.logsumexp(dim, keepdim), {"x": normal((3, 4, 5), 23, scale=4.0)}, ("x",))


def test_logsumexp_is_stable_for_large_values():
    x = normal((3, 5), 24) * np.float32(1e3) + np.float32(1e30)
    parity(lambda F, x: x.logsumexp(1), {"x": x}, ("x",))


def test_logsumexp_of_infinite_lines():
    """A line of -inf gives -inf (and NaN gradients, as torch); a line holding +inf gives inf."""
    x = normal((4, 3), 25)
    x[0] = -np.inf
    x[1, 1] = np.inf
    x[2, 0] = -np.inf
    with np.errstate(all="ignore"):
        parity(lambda F, x: x.logsumexp(1), {"x": x}, ("x",))


# ------------------------------------------------------------------ cumsum
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_cumsum(dim):
    """torch's CPU cumsum accumulates in float64; so does bendc's: bit for bit, gradient too."""
    parity(lambda F, x: x.cumsum(dim), {"x": normal((3, 4, 5), 26)}, ("x",), exact=True, seed="wide")


def test_cumsum_rounds_each_float64_prefix():
    x = np.array([[1e8, 1.0, 1.0, 1.0, 1.0, -1e8] * 3], np.float32)
    parity(lambda F, x: x.cumsum(1) * 1.0, {"x": x}, ("x",), exact=True)


def test_cumsum_of_0d_and_size_1_dims():
    parity(lambda F, x: x.cumsum(0), {"x": normal((), 27)}, ("x",), exact=True)
    parity(lambda F, x: x.cumsum(1), {"x": normal((4, 1), 28)}, ("x",), exact=True)


@pytest.mark.parametrize("shape, dim", [((3, 0), 1), ((3, 0, 2), 1), ((0, 3), 1), ((2, 0), 0)])
def test_cumsum_over_zero_size_dims(shape, dim):
    """Lines of no elements (the cpu kernel's line count comes from the other dims) and no lines."""
    parity(lambda F, x: x.cumsum(dim), {"x": np.zeros(shape, np.float32)}, ("x",), exact=True)


# ------------------------------------------------------------------ spellings
def test_functional_and_torch_spellings_trace():
    """bendc.functional.<name>(x, ...) and torch.<name> / torch.Tensor.<name> inside bendc.jit."""
    x = normal((3, 4), 29)

    def program(x):
        a = BF.max(x, 1).values + BF.min(x, dim=1)[0] + BF.amax(x, 0).sum() + BF.amin(x, (0, 1))
        b = BF.var(x, 1) + BF.std(x, 1, correction=0) + BF.logsumexp(x, 1) + BF.cumsum(x, 1)[:, -1]
        c = torch.max(x, 1).values + torch.min(x, 1)[0] + torch.amax(x, 1) + torch.amin(x, dim=1)
        d = torch.var(x, 1, correction=2) + torch.std(x, dim=1) + torch.logsumexp(x, 1) + torch.cumsum(x, dim=1)[:, 0]
        e = torch.max(x) + torch.min(x)
        return a + b + c + d + e, BF.argmax(x, 1), torch.argmin(x, dim=0), torch.argmax(x)

    got = _jit(program)(x)
    t = torch.from_numpy(x)
    a = t.max(1).values + t.min(dim=1)[0] + t.amax(0).sum() + t.amin((0, 1))
    b = t.var(1) + t.std(1, correction=0) + t.logsumexp(1) + t.cumsum(1)[:, -1]
    c = t.max(1).values + t.min(1)[0] + t.amax(1) + t.amin(1)
    d = t.var(1, correction=2) + t.std(1) + t.logsumexp(1) + t.cumsum(1)[:, 0]
    want = (a + b + c + d + t.max() + t.min(), t.argmax(1), t.argmin(0), t.argmax())
    assert_close(got[0], want[0].numpy(), "value", rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(g, w.numpy())


def test_errors_name_the_line_the_op_and_the_shapes():
    x = normal((3, 4), 30)
    for fn, op, words in ((lambda x: x.max(2), "max", "dim 2"), (lambda x: x.amax((0, 5)), "amax", "dim"),
                          (lambda x: x.cumsum(-3), "cumsum", "dim -3"), (lambda x: x.max(x), "max", "maximum"),
                          (lambda x: x.var(1, correction=0, unbiased=True), "var", "not both"),
                          (lambda x: x.argmax(0).max(), "max", "i64[4]")):
        with pytest.raises(bendc.BendcError) as info:
            _jit(fn)(x)
        assert info.value.op == op and words in str(info.value), str(info.value)
        assert "test_ops_reduce.py" in str(info.value), str(info.value)


# ------------------------------------------------------------------ large operands: parallel kernels
def test_large_kernels_are_parallel_and_match_torch():
    """Over PARALLEL_CELLS elements every line kernel (extrema, cumsum) runs its lines with prange."""
    if parity_harness.TARGET != "cpu":
        pytest.skip("the cpu kernels' parallel loops")
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "codegen", "test_parallel.py")
    spec = importlib.util.spec_from_file_location("bendc_test_parallel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = normal((300, 1000), 31)
    assert x.size >= PARALLEL_CELLS

    def program(x):
        values, indices = x.max(0)
        loss = values.sum() + x.amin(1).sum() + (x.cumsum(1) * x).sum() + x.logsumexp(0).sum() + x.max()
        loss.backward()
        return loss, x.grad, indices, x.argmin(1), x.argmax()

    step = bendc.jit(program, leaves=("x",), target="cpu")
    loss, grad, indices, low, top = step(x)
    assert module.serial_large_kernels(step) == []
    sources = "\n".join(s for s in step.kernels().values())
    assert sources.count("prange(x.shape[0])") >= 3  # lines in parallel
    assert sources.count("prange(lines * chunks)") >= 2  # the full max and argmax: chunks in parallel
    t = torch.from_numpy(x.copy()).requires_grad_()
    values, want_indices = t.max(0)
    want = values.sum() + t.amin(1).sum() + (t.cumsum(1) * t).sum() + t.logsumexp(0).sum() + t.max()
    want.backward()
    assert int(top) == int(t.argmax())
    assert_close(loss, want.detach().numpy(), "loss", rtol=1e-5)
    assert_close(grad, t.grad.numpy(), "grad", rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(indices, want_indices.numpy())
    np.testing.assert_array_equal(low, t.argmin(1).numpy())
