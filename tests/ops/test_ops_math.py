"""Issue 22's elementwise math against PyTorch eager (CPU, float32): values and gradients on the
reference and cpu targets (the autouse ``target`` fixture of tests/parity_harness.py).

Tolerances, stated per group:
- bit for bit (values and gradients; a NaN matches any NaN): maximum/minimum/fmax/fmin (selections; ties split g / 2),
  isnan/isinf/isfinite, nan_to_num, floor/ceil/round/trunc/frac (-0.0, halves, 2**23 and beyond,
  infinities and NaN included);
- within 2 ulp of torch for values and 4 ulp for gradients: sin, cos, tan, asin, acos, atan, sinh,
  cosh, erf, erfc, exp2, log2, log10, log1p, expm1, atan2 (torch's SLEEF kernels are 1-ulp, the
  reference is float64 rounded once, the cpu kernels call libm's float32 functions);
- lerp within 1 ulp plus 1e-7 absolute (torch's vectorized lerp is an FMA, bendc's two roundings).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from conftest import assert_bitwise, ulp_distance
from parity_harness import normal, target  # noqa: F401  (target: the autouse fixture)
import parity_harness


def _run(program, arrays, leaves):
    """bendc on the current target: the program's value and each leaf's gradient of (value * seed).sum()."""
    names = list(arrays)

    def step(*args):
        bound = dict(zip(names, args))
        out = program(**bound)
        seed = bound["seed"] if "seed" in bound else None
        if leaves:
            (out * seed if seed is not None else out).sum().backward()
        return (out,) + tuple(bound[n].grad for n in leaves)

    fn = parity_harness._named_function(names, lambda args: step(*args))
    got = bendc.jit(fn, leaves=tuple(leaves), target=parity_harness.TARGET)(*arrays.values())
    return [np.asarray(g) for g in got]


def _torch(program, arrays, leaves):
    tensors = {n: torch.tensor(v, requires_grad=n in leaves) for n, v in arrays.items()}
    out = program(**tensors)
    seed = tensors.get("seed")
    if leaves:
        (out * seed if seed is not None else out).sum().backward()
    return [out.detach().numpy()] + [tensors[n].grad.numpy() for n in leaves]


def check(program, arrays, leaves=("x",), value_ulp=0, grad_ulp=0, torch_program=None, grad_atol=None):
    got = _run(program, arrays, leaves)
    want = _torch(torch_program or program, arrays, leaves)
    for position, (mine, theirs) in enumerate(zip(got, want)):
        what = "value" if position == 0 else f"gradient of {leaves[position - 1]}"
        if theirs.dtype == np.bool_:
            np.testing.assert_array_equal(mine, theirs, err_msg=what)
            continue
        if position > 0 and grad_atol is not None:
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=grad_atol, err_msg=what)
            continue
        limit = value_ulp if position == 0 else grad_ulp
        both_nan = np.isnan(mine) & np.isnan(theirs)  # NaN bit patterns (the sign of a NaN) may differ
        if limit == 0:
            assert_bitwise(np.where(both_nan, np.float32(0.0), mine), np.where(both_nan, np.float32(0.0), theirs),
                           what)
            continue
        distance = np.where(both_nan, 0, ulp_distance(mine, theirs))
        assert distance.max() <= limit, f"{what}: {distance.max()} ulp apart (at most {limit}), e.g. " \
            f"{mine.flat[distance.argmax()]!r} vs {theirs.flat[distance.argmax()]!r}"


def _seed(shape):
    return normal(shape, 99)


SPECIALS = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 1.0, -1.0,
                     8388607.5, -8388607.5, 8388608.0, 16777217.0, 3e38, -3e38, np.inf, -np.inf, np.nan,
                     1e-45, -1e-45, 0.7], np.float32)


# ------------------------------------------------------------------ selections and classifications
def test_maximum_minimum_fmax_fmin_with_ties_and_nans():
    """Ties give each side g / 2 (maximum/minimum), a NaN propagates (maximum/minimum) or is skipped
    (fmax/fmin); broadcasting sums the gradient of the smaller operand."""
    a = np.round(normal((4, 6), 1) * 2.0).astype(np.float32)
    b = np.round(normal((6,), 2) * 2.0).astype(np.float32)
    a[0, :3] = b[:3]            # ties
    a[1, 0] = np.nan
    b[4] = np.nan
    a[2, 1] = np.inf
    full = np.broadcast_to(b, a.shape).copy()
    names = ("maximum", "minimum", "fmax", "fmin")

    def functions(x, y, seed):
        space = torch if isinstance(x, torch.Tensor) else BF
        return space.stack([getattr(space, name)(x, y) for name in names])

    def methods(x, y, seed):
        stack = torch.stack if isinstance(x, torch.Tensor) else BF.stack
        return stack([getattr(x, name)(y) for name in names])

    check(functions, {"x": a, "y": full, "seed": _seed((4, 4, 6))}, ("x", "y"))
    # broadcast: the smaller operand's gradient is a sum over rows, in another order than torch's
    check(methods, {"x": a, "y": b, "seed": _seed((4, 4, 6))}, ("x", "y"), grad_atol=1e-6)


def test_classifications_and_masks_of_them():
    x = SPECIALS.reshape(4, 6)
    check(lambda x: (x.isnan().float() + x.isinf().float() * 2.0) + x.isfinite().float() * 4.0, {"x": x}, ())
    check(lambda x, seed: torch.where(torch.isfinite(x), x, 0.0) if isinstance(x, torch.Tensor)
          else BF.where(x.isfinite(), x, 0.0), {"x": x, "seed": _seed((4, 6))}, ("x",))


@pytest.mark.parametrize("kwargs", [{}, {"nan": 1.5}, {"nan": -2.0, "posinf": 7.0, "neginf": -9.0}])
def test_nan_to_num_values_and_gradient(kwargs):
    """The gradient is g where x is finite, 0 where x was replaced (torch's g * isfinite(x))."""
    x = SPECIALS.reshape(4, 6)
    check(lambda x, seed: torch.nan_to_num(x, **kwargs) + x.nan_to_num(**kwargs) * 0.5, {"x": x, "seed": _seed((4, 6))})


# ------------------------------------------------------------------ roundings
def test_roundings_bitwise_at_halves_signed_zeros_and_large_values():
    """Halves round to even, -0.0 and negative fractions keep their sign, |x| >= 2**23, inf and NaN
    pass; floor/ceil/round/trunc have zero gradients, frac's is g."""
    x = np.concatenate([SPECIALS, normal((24,), 3) * np.float32(5.0)]).reshape(6, 8)
    names = ("floor", "ceil", "round", "trunc", "frac")

    def program(x, seed):
        stack = torch.stack if isinstance(x, torch.Tensor) else BF.stack
        return stack([getattr(x, name)() for name in names])

    check(program, {"x": x, "seed": _seed((5, 6, 8))})


@pytest.mark.parametrize("decimals", [2, -1])
def test_round_with_decimals(decimals):
    x = normal((3, 5), 4) * np.float32(300.0)
    check(lambda x, seed: x.round(decimals=decimals), {"x": x, "seed": _seed((3, 5))})
    check(lambda x, seed: torch.round(x, decimals=decimals), {"x": x, "seed": _seed((3, 5))})


def test_torch_fix_is_trunc():
    x = normal((2, 5), 5) * np.float32(3.0)
    check(lambda x, seed: torch.fix(x), {"x": x, "seed": _seed((2, 5))})


# ------------------------------------------------------------------ transcendentals
def _domain(name):
    if name in ("asin", "acos"):
        return np.random.default_rng(6).uniform(-0.99, 0.99, (4, 6)).astype(np.float32)
    if name in ("log2", "log10"):
        return np.random.default_rng(6).uniform(0.01, 50.0, (4, 6)).astype(np.float32)
    if name == "log1p":
        return np.random.default_rng(6).uniform(-0.9, 5.0, (4, 6)).astype(np.float32)
    if name in ("sinh", "cosh", "exp2", "expm1"):
        return normal((4, 6), 6) * np.float32(4.0)
    return normal((4, 6), 6) * np.float32(3.0)


TRANSCENDENTALS = ["sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "erf", "erfc", "exp2", "log2",
                   "log10", "log1p", "expm1"]


def test_transcendentals_within_two_ulp():
    """All of them in one program (one compile per target), each on its own domain, values and gradients."""
    arrays = {}
    for name in TRANSCENDENTALS:
        x = _domain(name)
        x[0, :3] = [0.0, -0.0, 1e-6] if name not in ("log2", "log10") else [1.0, 2.0, 1e-6]
        arrays[name] = x
    arrays["seed"] = _seed((4, 6))

    def program(seed, **xs):
        space = torch if isinstance(seed, torch.Tensor) else BF
        return space.stack([getattr(space, name)(xs[name]) for name in TRANSCENDENTALS])

    fn = parity_harness._named_function(list(arrays), lambda args: program(**dict(zip(arrays, args))))
    check(fn, arrays, tuple(TRANSCENDENTALS), value_ulp=2, grad_ulp=4)


def test_transcendentals_outside_their_domain_are_nan_as_torch():
    x = np.array([-2.0, 1.5, -1.0, np.inf, -np.inf, np.nan], np.float32)
    names = ("asin", "acos", "log2", "log10", "log1p", "atan", "erf", "erfc", "exp2", "expm1")
    check(lambda x: BF.stack([getattr(x, name)() for name in names]) if not isinstance(x, torch.Tensor)
          else torch.stack([getattr(x, name)() for name in names]), {"x": x}, (), value_ulp=2)


def test_atan2_broadcast_in_every_quadrant():
    y = np.array([[1.0, -1.0, 0.0, -0.0, 2.0, -3.0]], np.float32).repeat(3, 0) * normal((3, 1), 7)
    x = np.array([1.0, 1.0, -1.0, -1.0, 0.0, -2.0], np.float32)
    x[2] = 0.5
    program = lambda y, x, seed: torch.atan2(y, x) if isinstance(y, torch.Tensor) else y.atan2(x)
    check(program, {"y": y, "x": x, "seed": _seed((3, 6))}, ("y", "x"), value_ulp=2, grad_ulp=4)
    check(lambda y, x, seed: torch.arctan2(y, x), {"y": y, "x": x, "seed": _seed((3, 6))}, ("y", "x"),
          value_ulp=2, grad_ulp=4)


# ------------------------------------------------------------------ lerp
@pytest.mark.parametrize("weight", [0.25, 0.9, "tensor"])
def test_lerp_number_and_tensor_weights(weight):
    """Both of torch's branches (|w| < 0.5 and not), each operand's gradient."""
    arrays = {"start": normal((3, 4), 8), "end": normal((3, 4), 9), "seed": _seed((3, 4))}
    leaves = ("start", "end")
    if weight == "tensor":
        arrays["w"] = np.random.default_rng(10).uniform(-0.5, 1.5, (4,)).astype(np.float32)
        arrays["w"][:2] = [0.5, 0.49999997]
        leaves += ("w",)
        program = lambda start, end, seed, w: torch.lerp(start, end, w) if isinstance(start, torch.Tensor) \
            else start.lerp(end, w)
    else:
        program = lambda start, end, seed: start.lerp(end, weight)
    got = _run(program, arrays, leaves)
    want = _torch(program, arrays, leaves)
    for position, (mine, theirs) in enumerate(zip(got, want)):
        np.testing.assert_allclose(mine, theirs, rtol=1.2e-7, atol=1e-7, err_msg=f"output {position}")


# ------------------------------------------------------------------ errors
def test_integer_operands_and_bad_arguments_are_bendc_errors():
    index = np.arange(4, dtype=np.int64)
    with pytest.raises(bendc.BendcError, match=r"sin needs float32 operands.*i64\[4\]"):
        bendc.jit(lambda i: i.sin(), target=parity_harness.TARGET)(index)
    with pytest.raises(bendc.BendcError, match=r"decimals must be an int"):
        bendc.jit(lambda x: x.round(decimals=0.5), target=parity_harness.TARGET)(normal((3,), 1))
    with pytest.raises(bendc.BendcError, match=r"nan must be a Python number"):
        bendc.jit(lambda x: x.nan_to_num(nan="zero"), target=parity_harness.TARGET)(normal((3,), 1))
    with pytest.raises(bendc.BendcError, match=r"do not broadcast"):
        bendc.jit(lambda x, y: x.maximum(y), target=parity_harness.TARGET)(normal((3,), 1), normal((4,), 2))
