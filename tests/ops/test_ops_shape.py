"""Parity with PyTorch eager (CPU, float32) of the op-coverage issue's shape, selection, power and cast ops.

Every program runs through ``bendc.jit`` on the reference and cpu targets and through torch
(tests/parity_harness.py), values and every leaf's gradient compared. Data movement (cat, stack,
split, pad, tril, ...), selection (comparisons as masks, where, masked_fill, clamp, abs, sign) and
the powers PyTorch computes without pow() (x ** 2, 3, 0.5, -0.5, -1, -2) are compared bit for bit;
pow() itself (torch: Sleef's pow, 1 ulp; bendc: libm's powf) within a few ulps (rtol 2e-6), as
are gradients through a broadcast operand's reduction.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from conftest import assert_bitwise
from parity_harness import TF, normal, parity, positive, target, wide  # noqa: F401  (target: autouse fixture)

POW_RTOL = 2e-6  # Sleef's pow (torch) vs libm's powf (bendc): both within 1 ulp of the exact power


def J(F):
    """torch's namespace (torch.cat, torch.where, ...) on the torch side, bendc.functional on bendc's."""
    return torch if F is TF else F


def jit(fn, leaves=()):
    from parity_harness import TARGET

    return bendc.jit(fn, leaves=leaves, target=TARGET)


def with_values(shape, seed, *specials) -> np.ndarray:
    """normal values with the given specials (ties, zeros, NaN) written at the front."""
    out = normal(shape, seed).reshape(-1)
    out[:len(specials)] = specials
    return out.reshape(shape)


# ------------------------------------------------------------------ comparisons as masks
COMPARE = {
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
}


@pytest.mark.parametrize("op", list(COMPARE))
def test_comparison_masks_in_arithmetic(op):
    """Tensor-tensor (broadcast), tensor-number and number-tensor comparisons, ties and NaN included,
    used as float32 in arithmetic (bool promoted as torch: mask * x, x + mask, .float())."""
    compare = COMPARE[op]
    a = with_values((3, 4), 1, 0.5, 0.5, math.nan, -0.0, 0.0, 2.0)
    b = with_values((4,), 2, 0.5, 0.7, 1.0, 0.0)

    def body(F, a, b):
        m = compare(a, b)
        s = compare(a, 0.5)
        r = compare(0.0, a)  # a number on the left: the reflected comparison
        return m * a + (b + s) * 2.0 + r.float() * b + m.to(torch.float32) / 4.0

    parity(body, {"a": a, "b": b}, ("a", "b"), exact=False, exact_grads=False)
    # values bit for bit (the gradient of b sums over a broadcast dim: reduction order)
    parity(lambda F, a, b: compare(a, b) * a + (a + compare(a, 0.5)), {"a": a, "b": b[None].repeat(3, 0)},
           ("a", "b"), exact=True)


def test_comparisons_return_bool_tensors():
    a = with_values((2, 5), 3, 1.0, math.nan, -0.0)
    b = with_values((5,), 4, 1.0, math.nan, 0.0)

    def step(a, b):
        return a < b, a <= b, a > 0.0, a >= b, a == b, a != b, 1.0 < a

    got = jit(step)(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    want = step(ta, tb)
    for mine, theirs in zip(got, want):
        assert mine.dtype == np.bool_
        np.testing.assert_array_equal(mine, theirs.numpy())


def test_mask_logic():
    """&, |, ^, ~ and torch.logical_* of bool masks (composed as 0/1 float compares: exact), NaN included."""
    a = with_values((3, 4), 60, math.nan, 0.0, -1.0, 1.0)
    b = with_values((3, 4), 61, 1.0, math.nan, -1.0, 0.0)

    def step(a, b):
        p, q = a > 0, b <= 0
        return (p & q, p | q, p ^ q, ~p, p & True, False | q, True ^ p, torch.logical_and(p, q),
                torch.logical_or(p, q), torch.logical_xor(p, q), torch.logical_not(q), p.logical_not())

    got = jit(step)(a, b)
    want = step(torch.from_numpy(a), torch.from_numpy(b))
    for mine, theirs in zip(got, want):
        assert mine.dtype == np.bool_
        np.testing.assert_array_equal(mine, theirs.numpy())
    parity(lambda F, a, b: ((a > 0) & (b < 0.5)) * a + (~(a < b)) * b + J(F).where((a > 0) | (b > 0), a, b),
           {"a": a, "b": b}, ("a", "b"), exact=True)


def test_logic_needs_bool_masks():
    with pytest.raises(bendc.UnsupportedError, match="bool tensors"):
        jit(lambda a: (a > 0) & a)(normal((3,), 1))


def test_integer_tensors_compare_and_cast():
    """(pred == target).float().mean(): integer comparisons and an integer to float32 cast."""
    i = np.array([0, 3, 2, 2, 1], np.int64)
    j = np.array([0, 1, 2, 3, 1], np.int64)

    def step(i, j):
        return (i == j).float().mean(), (i > 1).float(), i.float() * 0.5

    got = jit(step)(i, j)
    want = step(torch.from_numpy(i), torch.from_numpy(j))
    for mine, theirs in zip(got, want):
        assert_bitwise(mine, theirs.numpy())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_every_comparison_of_integer_tensors(dtype):
    """<=, like <, >, >=, == and !=, compares integer tensors (and an integer tensor with a number)."""
    i = np.array([0, 3, 2, 2, 1], dtype)
    j = np.array([0, 1, 2, 3, 1], dtype)

    def step(i, j):
        return i <= j, i < j, i > j, i >= j, i == j, i != j, i <= 2, torch.le(i, j)

    got = jit(step)(i, j)
    want = step(torch.from_numpy(i), torch.from_numpy(j))
    for mine, theirs in zip(got, want):
        np.testing.assert_array_equal(np.asarray(mine), theirs.numpy())


def test_bool_arithmetic_with_both_sides():
    a = normal((3, 4), 5)
    b = positive((3, 4), 6)

    def body(F, a, b):
        m = a > 0
        return (m * a + a * m + m + 1.5 - m * 2.0 + b / m.float().clamp(min=0.5) + m / b + 3.0 / (b + m)
                + 2.0 / m + m.float().detach() + (a + True) * m)

    parity(body, {"a": a, "b": b}, ("a", "b"), exact=True)


@pytest.mark.parametrize("form", ["m + m", "m * m", "m + True", "m - a", "a - m", "2.0 - m", "-m"])
def test_bool_results_and_bool_subtraction_are_refused(form):
    """Where PyTorch gives a bool result (m + m, m * True) or refuses (m - x, -m)."""
    def step(a):
        m = a > 0
        return eval(form)  # noqa: S307 (the test's own expressions)

    with pytest.raises(bendc.UnsupportedError, match="bool"):
        jit(step)(normal((3,), 1))
    if form in ("m + m", "m * m", "m + True"):
        assert step(torch.ones(3)).dtype == torch.bool
    else:
        with pytest.raises((RuntimeError, TypeError)):
            step(torch.ones(3))


def test_truth_value_of_a_comparison_is_refused():
    def step(a):
        if a.sum() > 0:
            return a
        return -a

    with pytest.raises(bendc.UnsupportedError, match=r"truth value .*f32\[\] > f32\[\]"):
        jit(step)(normal((3,), 1))


def test_equality_with_non_tensors_is_identity():
    """x == None is False and x != "a" True (Python's fallback), as a dict lookup or `in` would need."""
    def step(a):
        assert not (a == None) and (a != "a")  # noqa: E711
        return a * 1.0

    jit(step)(normal((2,), 1))


# ------------------------------------------------------------------ where, masked_fill
def test_where_tensor_and_scalar_branches_broadcast():
    c = normal((3, 1), 7)
    x = wide((1, 4), 8)
    y = wide((3, 4), 9)

    def body(F, c, x, y):
        cond = c > 0
        return (J(F).where(cond, x, y) + J(F).where(cond, x, 2.5) + J(F).where(y < 0, -1.0, y)
                + J(F).where(cond, 1.0, 0.0) + x.where(cond, y))

    parity(body, {"c": c, "x": x, "y": y}, ("x", "y"), exact=True, exact_grads=False)
    parity(lambda F, c, y: J(F).where(c > 0, y, y * 2.0), {"c": c, "y": y}, ("y",), exact=True)


def test_where_needs_a_bool_condition():
    with pytest.raises(bendc.UnsupportedError, match="bool condition"):
        jit(lambda x: BF.where(x, x, x))(normal((2,), 1))


def test_masked_fill_number_and_0d_tensor():
    x = wide((3, 5), 10)
    v = np.array(2.5, np.float32)

    def body(F, x, v):
        return x.masked_fill(x < 0, -1.0) * 2.0 + x.masked_fill(x > 0.5, v) + x.masked_fill(x > 100.0, math.inf)

    parity(body, {"x": x, "v": v}, ("x", "v"), exact=False, exact_grads=False)
    parity(lambda F, x: x.masked_fill(x < 0, 0.0), {"x": x}, ("x",), exact=True)


# ------------------------------------------------------------------ clamp, abs, sign
@pytest.mark.parametrize("low, high", [(-0.5, 0.5), (None, 0.25), (-0.25, None), (0.5, -0.5), (0.0, 0.0),
                                       (-math.inf, math.inf)])
@pytest.mark.parametrize("spelling", ["clamp", "clip", "torch"])
def test_clamp_numbers(low, high, spelling):
    """Boundaries included (x == min and x == max pass the gradient, as torch's clamp_backward), NaN kept
    (its gradient 0), min > max gives max."""
    x = with_values((4, 5), 11, -0.5, 0.5, 0.25, -0.25, 0.0, -0.0, math.nan, math.inf, -math.inf)

    def body(F, x):
        if spelling == "torch":
            return torch.clamp(x, low, high) * 3.0
        return getattr(x, spelling)(low, high) * 3.0

    parity(body, {"x": x}, ("x",), exact=True)


def test_clamp_keyword_forms():
    x = wide((3, 4), 12)
    parity(lambda F, x: x.clamp(min=0.0) + x.clamp(max=0.1) + x.clamp_min(-0.1) + x.clamp_max(0.2)
           + J(F).clamp(x, -1.0, 1.0) + J(F).clip(x, max=0.0), {"x": x}, ("x",), exact=True)


def test_clamp_needs_a_bound():
    with pytest.raises(bendc.UnsupportedError, match="min or max"):
        jit(lambda x: x.clamp())(normal((2,), 1))


@pytest.mark.parametrize("bounds", ["both", "min", "max"])
def test_clamp_tensor_bounds_and_their_gradients(bounds):
    """torch's clamp_backward_min_max: x's gradient where min <= x <= max, min's where x < min (and
    min < max), max's where x > max or max < min; ties included, crossed bounds included."""
    x = with_values((3, 4), 13, 0.0, 0.5, 1.0, -1.0)
    low = with_values((4,), 14, 0.0, 0.7, 1.0, -2.0)[None].repeat(3, 0)
    high = with_values((4,), 15, 0.2, 0.5, 0.5, -1.0)[None].repeat(3, 0)
    low[1] = high[1] + 0.5  # a crossed row: min > max

    def body(F, x, low, high):
        if bounds == "both":
            return torch.clamp(x, low, high) if F is TF else BF.clamp(x, low, high)
        if bounds == "min":
            return x.clamp(min=low)
        return x.clamp(max=high)

    parity(body, {"x": x, "low": low, "high": high}, ("x", "low", "high"), exact=True)


def test_clamp_broadcast_tensor_bound():
    x = wide((3, 4), 16)
    low = normal((4,), 17)
    parity(lambda F, x, low: x.clamp(low) + x.clamp(max=low), {"x": x, "low": low}, ("x", "low"), exact=True,
           exact_grads=False)


def test_abs_and_sign_at_zero_and_nan():
    """torch's abs gradient is g * sgn(x): 0 at +-0 and at NaN; sign(-0.0) and sign(NaN) are +0.0."""
    x = with_values((3, 5), 18, 0.0, -0.0, math.nan, 1e-30, -1e-30, math.inf, -math.inf)
    seed = normal((3, 5), 19)
    parity(lambda F, x: abs(x) * 2.0 + x.abs() + x.sign() * 3.0 + J(F).abs(x) + J(F).sign(x), {"x": x}, ("x",),
           exact=True, seed=seed)
    parity(lambda F, x: x.sign(), {"x": x}, ("x",), exact=True)  # the gradient of sign alone: zeros


# ------------------------------------------------------------------ powers
SPECIAL_EXPONENTS = [2, 3, 0.5, -0.5, -1, -2, 0, 1, 2.0, -1.0]
GENERAL_EXPONENTS = [1.5, -1.25, 0.3, 4, 2.5, -3, 1e-3, 7]


@pytest.mark.parametrize("e", SPECIAL_EXPONENTS)
def test_pow_special_exponents_bitwise(e):
    """The exponents torch computes without pow(): x*x, x*x*x, sqrt, 1/sqrt, 1/x, 1/(x*x), ones, x;
    gradients by pow_backward: g * (e * x.pow(e - 1)), zeros for e = 0."""
    x = positive((4, 5), 20, 0.3, 3.0)
    exact_grad = e - 1 in SPECIAL_EXPONENTS  # else the gradient's x.pow(e - 1) is pow(): a few ulps
    if e in (0.5, -0.5):  # torch's own sqrt is not correctly rounded on every CPU
        parity(lambda F, x: x ** e, {"x": x}, ("x",), rtol=2.5e-7, atol=0.0, grad_rtol=5e-7 if exact_grad else POW_RTOL,
               grad_atol=0.0)
    elif exact_grad:
        parity(lambda F, x: x ** e, {"x": x}, ("x",), exact=True)
    else:
        parity(lambda F, x: x ** e, {"x": x}, ("x",), exact=True, exact_grads=False, grad_rtol=POW_RTOL, grad_atol=0.0)


@pytest.mark.parametrize("e", GENERAL_EXPONENTS)
def test_pow_any_float_exponent(e):
    x = positive((4, 5), 21, 0.2, 3.0)
    parity(lambda F, x: x ** e + x.pow(e) + J(F).pow(x, e), {"x": x}, ("x",), rtol=POW_RTOL, atol=0.0)


@pytest.mark.parametrize("e", [2, 3, 4, -1, -2, 1.5, 0.5, -0.5, 0, 1, -3])
def test_pow_at_zero_and_negative_bases(e):
    """0 ** e (inf for e < 0, gradients inf or 0 by the formula), negative bases (NaN for fractional e)."""
    x = with_values((3, 4), 22, 0.0, -0.0, -2.0, -0.5, 0.0, 2.0, -3.0)
    parity(lambda F, x: x ** e, {"x": x}, ("x",), rtol=POW_RTOL, atol=0.0)


def test_pow_tensor_exponent():
    """pow_backward_self where(e == 0, 0, g * (e * x.pow(e - 1))) and pow_backward_exponent
    g * where(x == 0 and e >= 0, 0, y * log(x)), broadcasting."""
    x = positive((3, 4), 23, 0.2, 3.0)
    e = normal((4,), 24)
    parity(lambda F, x, e: x ** e, {"x": x, "e": e}, ("x", "e"), rtol=POW_RTOL, atol=0.0, grad_rtol=1e-5)
    x0 = with_values((3, 4), 25, 0.0, 0.0, 0.0, 2.0, -1.0)
    e0 = with_values((3, 4), 26, 0.0, 1.5, -1.0, 0.0, 2.0)
    parity(lambda F, x, e: J(F).pow(x, e), {"x": x0, "e": e0}, ("x", "e"), rtol=POW_RTOL, atol=0.0,
           grad_rtol=1e-5)


@pytest.mark.parametrize("base", [2.0, 0.5, 1.0, 0.0, 10, -2.0])
def test_number_base_tensor_exponent(base):
    """number ** x: torch.pow(number, tensor), the exponent's gradient g * (y * log(number)) (0 where
    the base is 0 and x >= 0)."""
    x = with_values((3, 4), 27, 0.0, 1.0, -1.0, 2.0, 0.5)
    parity(lambda F, x: base ** x + J(F).pow(base, x), {"x": x}, ("x",), rtol=POW_RTOL, atol=0.0, grad_rtol=1e-5)


def test_square_rsqrt_reciprocal():
    """rsqrt's gradient is torch's (-0.5 * g) * y**3, reciprocal's -g * (y * y)."""
    x = positive((4, 5), 28, 0.1, 4.0)
    parity(lambda F, x: x.square() + x.reciprocal() + J(F).reciprocal(x) * 0.5, {"x": x}, ("x",), exact=True)
    parity(lambda F, x: x.rsqrt() + J(F).rsqrt(x * 2.0), {"x": x}, ("x",), rtol=2.5e-7, atol=0.0, grad_rtol=1e-6,
           grad_atol=0.0)


def test_unsupported_exponent_type():
    with pytest.raises(bendc.UnsupportedError, match="exponent of type str"):
        jit(lambda x: x ** "2")(normal((2,), 1))


# ------------------------------------------------------------------ shapes and joining
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_cat_three_tensors(dim):
    shapes = [[2, 3, 5], [2, 3, 5], [2, 3, 5]]
    for k, size in enumerate((1, 4, 3)):
        shapes[k][dim] = size
    inputs = {f"x{k}": wide(tuple(s), 30 + k) for k, s in enumerate(shapes)}
    parity(lambda F, x0, x1, x2: J(F).cat([x0, x1, x2], dim) * 2.0, inputs, tuple(inputs), exact=True)
    parity(lambda F, x0, x1, x2: torch.cat((x0, x1, x2), dim=dim) + 1.0, inputs, tuple(inputs), exact=True)


def test_cat_shape_mismatch_is_a_shape_error():
    with pytest.raises(bendc.ShapeError, match="concat"):
        jit(lambda a, b: BF.cat([a, b], 0))(normal((2, 3), 1), normal((2, 4), 2))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack(dim):
    inputs = {"a": wide((2, 3), 40), "b": wide((2, 3), 41)}
    parity(lambda F, a, b: J(F).stack([a, b * 2.0, a], dim), inputs, ("a", "b"), exact=True)


@pytest.mark.parametrize("sections, dim", [(2, 0), (3, 1), ([1, 0, 4], 1), ([5], -1), (7, 1), ([0, 5], 1)])
def test_split_pieces(sections, dim):
    x = wide((3, 5), 42)

    def body(F, x):
        pieces = x.split(sections, dim)
        return sum(((p * float(k + 1)).sum() for k, p in enumerate(pieces) if p.numel()), x.sum() * 0.0)

    parity(body, {"x": x}, ("x",), exact=False, exact_grads=True)
    if sections != [0, 5]:
        parity(lambda F, x: torch.split(x, sections, dim)[-1] * 3.0, {"x": x}, ("x",), exact=True)


def test_split_returns_empty_pieces():
    x = wide((3, 5), 43)
    got = jit(lambda x: x.split([2, 0, 3], 1))(x)
    want = torch.from_numpy(x).split([2, 0, 3], 1)
    assert [g.shape for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want):
        assert_bitwise(g, w.numpy())


@pytest.mark.parametrize("chunks, dim", [(2, 0), (3, 1), (4, 1), (5, -1), (1, 0)])
def test_chunk(chunks, dim):
    x = wide((3, 5), 44)

    def body(F, x):
        pieces = x.chunk(chunks, dim)
        assert len(pieces) == len(torch.zeros(3, 5).chunk(chunks, dim))
        return J(F).cat([p * float(k + 2) for k, p in enumerate(pieces)], dim)

    parity(body, {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("dim", [None, 0, 2, -1, (0, 2), 1])
def test_squeeze(dim):
    x = wide((1, 3, 1, 4), 45)
    parity(lambda F, x: (x.squeeze() if dim is None else x.squeeze(dim)) * 2.0, {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("start, end", [(0, -1), (1, 2), (0, 1), (-2, -1), (2, 2)])
def test_flatten(start, end):
    x = wide((2, 3, 4), 46)
    parity(lambda F, x: x.flatten(start, end) * 2.0 + J(F).flatten(x, start, end), {"x": x}, ("x",), exact=True)


def test_flatten_0d_and_contiguous():
    x = np.asarray(np.float32(1.5))
    parity(lambda F, x: x.flatten() * 2.0, {"x": x}, ("x",), exact=True)
    parity(lambda F, x: x.T.contiguous() * 2.0, {"x": wide((2, 3), 47)}, ("x",), exact=True)


@pytest.mark.parametrize("sizes", [(3, 4), (2, 3, 4), (-1, 4), (2, -1, -1), (3, 1)])
def test_expand(sizes):
    x = wide((3, 1), 48)
    parity(lambda F, x: x.expand(*sizes) * 2.0, {"x": x}, ("x",), exact=True, exact_grads=False)
    parity(lambda F, x: x.expand(sizes) - 1.0, {"x": x}, ("x",), exact=True, exact_grads=False)


def test_expand_as_and_bad_expand():
    x, y = wide((1, 4), 49), wide((3, 4), 50)
    parity(lambda F, x, y: x.expand_as(y) * y, {"x": x, "y": y}, ("x", "y"), exact=True, exact_grads=False)
    with pytest.raises(bendc.ShapeError, match="expand"):
        jit(lambda x: x.expand(3, 5))(x)


@pytest.mark.parametrize("sizes", [(2, 1), (1, 3), (2, 3), (2, 1, 2), (3, 2, 2, 1), (1, 1)])
def test_repeat(sizes):
    x = wide((2, 3), 51)
    parity(lambda F, x: x.repeat(*sizes) * 2.0, {"x": x}, ("x",), exact=True, exact_grads=False)


@pytest.mark.parametrize("amounts, value", [((1, 2), None), ((0, 3, 2, 0), 1.5), ((-1, 2), 0.0),
                                            ((1, -2, -1, 1), -2.0), ((2, 2, 1, 1, 1, 0), None), ((-1, -1), None),
                                            ((0, 0), 3.0)])
def test_pad_constant(amounts, value):
    x = wide((2, 3, 4), 52)

    def body(F, x):
        kwargs = {} if value is None else {"value": value}
        return TF.pad(x, amounts, **kwargs) * 2.0 if F is TF else BF.pad(x, amounts, **kwargs) * 2.0

    parity(body, {"x": x}, ("x",), exact=True)


def test_pad_through_torch_function_and_errors():
    x = wide((2, 3), 53)
    parity(lambda F, x: torch.nn.functional.pad(x, (1, 1), "constant", 0.5) + 1.0, {"x": x}, ("x",), exact=True)
    with pytest.raises(bendc.UnsupportedError, match="pad mode 'wrap' is not supported"):
        jit(lambda x: BF.pad(x, (1, 1), mode="wrap"))(x)
    with pytest.raises(bendc.ShapeError, match="negative size"):
        jit(lambda x: BF.pad(x, (-2, -2)))(x)


@pytest.mark.parametrize("diagonal", [0, 1, -1, 2, -3, 5])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 4, 3)])
def test_tril_triu(diagonal, shape):
    x = wide(shape, 54)
    parity(lambda F, x: x.tril(diagonal) * 2.0 + x.triu(diagonal) + J(F).tril(x, diagonal) - J(F).triu(x, diagonal),
           {"x": x}, ("x",), exact=True)


def test_tril_of_a_1d_tensor_is_a_shape_error():
    with pytest.raises(bendc.ShapeError, match="at least 2"):
        jit(lambda x: x.tril())(normal((3,), 1))


def test_unbind():
    x = wide((3, 4), 55)
    parity(lambda F, x: J(F).stack([r * float(k + 1) for k, r in enumerate(x.unbind(1))], 0), {"x": x}, ("x",),
           exact=True)


# ------------------------------------------------------------------ casts
def test_float_to_and_detach():
    x = wide((3, 4), 56)
    parity(lambda F, x: x.float() * x.to(torch.float32) + x.to("cpu") * x.detach() + x.to(dtype=torch.float32)
           + x.cpu() - x.to(x), {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("spelling", ["to_bf16", "to_f16", "to_f64", "double", "half", "bfloat16"])
def test_other_dtypes_are_bendc_errors(spelling):
    def step(x):
        if spelling == "to_bf16":
            return x.to(torch.bfloat16)  # @cast
        if spelling == "to_f16":
            return x.to(torch.float16)  # @cast
        if spelling == "to_f64":
            return x.to(dtype=torch.float64)  # @cast
        return getattr(x, spelling)()  # @cast

    with pytest.raises(bendc.UnsupportedError) as info:
        jit(step)(normal((2,), 1))
    assert "test_ops_shape.py" in str(info.value) and "float32" in str(info.value)
    assert info.value.op in ("to", spelling)


def test_bf16_input_is_a_bendc_error():
    with pytest.raises(bendc.BendcError, match="bfloat16"):
        jit(lambda x: x * 2.0)(torch.ones(3, dtype=torch.bfloat16))


# ------------------------------------------------------------------ torch spellings inside bendc.jit
def test_torch_spellings_trace():
    """torch.* functions and operators on traced tensors, as a model's code writes them."""
    a, b = wide((3, 4), 57), positive((3, 4), 58)

    def body(F, a, b):
        mask = torch.gt(a, 0.0)
        y = torch.where(mask, a, torch.zeros_like(a) if F is TF else 0.0) + torch.clamp(a, min=-0.5, max=0.5)
        y = y + torch.abs(a) * torch.sign(a) + torch.pow(b, 1.5) + torch.rsqrt(b) + torch.square(a)
        y = y + torch.tril(a) + torch.cat([a[:, :1], a[:, 1:]], dim=1) + torch.stack([a, b]).sum(0)
        y = y + torch.masked_fill(a, torch.lt(a, -1.0), 3.0) + torch.reciprocal(b) + torch.flatten(a).reshape(3, 4)
        return y + torch.eq(a, b).float() + torch.chunk(a, 2, 1)[0].repeat(1, 2) + torch.squeeze(a.unsqueeze(0))

    parity(body, {"a": a, "b": b}, ("a", "b"), rtol=POW_RTOL, atol=1e-6)


@pytest.mark.parametrize("spelling", ["split", "chunk", "slices"])
def test_a_split_gradient_keeps_negative_zeros_as_torch_does(spelling, target):
    """torch's split_backward concatenates the pieces' gradients (-0.0 kept); the gradient of slices
    adds their zero-filled scatters (-0.0 + 0.0 is +0.0). bendc gives each one's bits, the split's
    without an add over the whole gradient (canonicalize's concat_tiling_scatters)."""
    x = wide((3, 6), 45)
    w = np.array([[-0.0, 0.0, -1.5, -0.0, 2.0, -0.0]] * 3, np.float32)

    def pieces(x):
        if spelling == "split":
            return x.split([2, 3, 1], 1)
        if spelling == "chunk":
            return x.chunk(3, 1)
        return x[:, :2], x[:, 2:4], x[:, 4:]

    def step(x, w):
        loss = sum((p * q).sum() for p, q in zip(pieces(x), pieces(w)))
        loss.backward()
        return x.grad

    got = bendc.jit(step, leaves=("x",), target=target)(x, w)
    tx = torch.tensor(x, requires_grad=True)
    step_torch = sum((p * q).sum() for p, q in zip(pieces(tx), pieces(torch.from_numpy(w))))
    step_torch.backward()
    assert_bitwise(got, tx.grad.numpy(), spelling)
    zeros = w == 0
    assert (np.signbit(got[zeros]) == ((spelling != "slices") & np.signbit(w[zeros]))).all()


def test_a_split_into_one_piece_is_the_tensor_itself():
    """A piece spanning the whole dim is x, as x[:, 0:n] is (no index view, so no zero-filled scatter
    in the backward); an empty piece's spec is (0, 0, 1), as an empty slice's."""
    x = wide((2, 5), 46)

    def step(x):
        (whole,), (empty, rest) = x.chunk(1, 1), x.split([0, 5], 1)
        (whole * 2.0 + rest).sum().backward()
        return x.grad, empty

    jitted = bendc.jit(step, leaves=("x",), target="reference")
    grad, empty = jitted(x)
    np.testing.assert_array_equal(grad, np.full((2, 5), 3.0, np.float32))
    assert np.asarray(empty).shape == (2, 0)
    indexes = [line for line in jitted.ir("traced").splitlines() if " = index[" in line]
    assert len(indexes) == 1 and "spec=((0,2,1),(0,0,1)), split=2]" in indexes[0], indexes
    assert "index_scatter" not in jitted.ir("final")
