"""Issue 22's products, flips, sorts, scatters and float // and % against PyTorch eager (CPU,
float32): values and gradients on the reference and cpu targets (the autouse ``target`` fixture of
tests/parity_harness.py). Few compiles: each test traces one program holding several ops.

Tolerances, stated per test:
- bit for bit: cumprod (float64 running products in both), flip, sort/argsort/topk values and
  indices (ties keep their order of position, NaN largest: torch's stable=True; of integer tensors
  too, whose topk and stable=False sort give torch's values and the stable indices), scatter / scatter_add /
  scatter_reduce values (index order from self, as torch's CPU loops), floor_divide and remainder
  values (specials included; floor_divide also where |a / b| >= 2**24);
- within 4 ulp: prod's value (bendc rounds the float64 product once, torch rounds as it goes);
- gradients within rtol 1e-5 (divisions and sums in other orders than torch's): prod and cumprod with
  no, one and several zeros in a line; scatter_reduce's mean, prod (a single zero and two zeros at
  one position), amax/amin (ties shared evenly); sort and flip gradients are bit for bit.
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
    names = list(arrays)

    def step(*args):
        bound = dict(zip(names, args))
        outs = program(**bound)
        if leaves:
            (outs[0] * bound["seed"]).sum().backward()
        return tuple(outs) + tuple(bound[n].grad for n in leaves)

    fn = parity_harness._named_function(names, lambda args: step(*args))
    got = bendc.jit(fn, leaves=tuple(leaves), target=parity_harness.TARGET)(*arrays.values())
    return [np.asarray(g) for g in got]


def _torch(program, arrays, leaves):
    tensors = {n: torch.tensor(v, requires_grad=n in leaves) for n, v in arrays.items()}
    outs = program(**tensors)
    if leaves:
        (outs[0] * tensors["seed"]).sum().backward()
    return [o.detach().numpy() for o in outs] + [tensors[n].grad.numpy() for n in leaves]


def check(program, arrays, leaves=("x",), value_ulp=0, grad_rtol=None):
    """The program returns (float result, *other results); the loss is (result * seed).sum()."""
    got = _run(program, arrays, leaves)
    want = _torch(program, arrays, leaves)
    outputs = len(want) - len(leaves)
    for position, (mine, theirs) in enumerate(zip(got, want)):
        what = f"output {position}" if position < outputs else f"gradient of {leaves[position - outputs]}"
        assert mine.shape == theirs.shape, f"{what}: shape {mine.shape} != {theirs.shape}"
        if theirs.dtype != np.float32:
            np.testing.assert_array_equal(mine, theirs, err_msg=what)
            continue
        both_nan = np.isnan(mine) & np.isnan(theirs)
        mine, theirs = np.where(both_nan, np.float32(0.0), mine), np.where(both_nan, np.float32(0.0), theirs)
        if position >= outputs and grad_rtol is not None:
            np.testing.assert_allclose(mine, theirs, rtol=grad_rtol, atol=1e-6, err_msg=what)
        elif position < outputs and value_ulp:
            distance = ulp_distance(mine, theirs)
            assert distance.max() <= value_ulp, f"{what}: {distance.max()} ulp apart"
        else:
            assert_bitwise(mine, theirs, what)


def _space(x):
    return torch if isinstance(x, torch.Tensor) else BF


# ------------------------------------------------------------------ prod, cumprod
def _with_zeros():
    """Rows of no zero, one zero, two zeros, a zero first; a column of one zero and one of two."""
    x = normal((5, 6), 1)
    x[1, 3] = 0.0
    x[2, 1] = x[2, 4] = 0.0
    x[3, 0] = 0.0
    return x


def test_prod_and_cumprod_with_zeros():
    """torch's prod_backward and cumprod_backward: g * result / x without zeros, the product of the
    others at a single zero, 0 with several zeros (per line, and over the whole tensor)."""
    x = _with_zeros()

    def program(x, seed):
        space = _space(x)
        lines = space.cat([x.cumprod(1), space.cumprod(x, 0), x.prod(1, keepdim=True), space.prod(x, 0).reshape(1, 6)
                           .expand(5, 6)], 1)
        whole = space.stack([x[0].prod(), x[1].prod(), x[2].prod(), x[:2].prod(), x.prod()])
        return (space.cat([lines.reshape(-1), whole]),)

    check(program, {"x": x, "seed": normal((5 * 19 + 5,), 2)}, grad_rtol=1e-5, value_ulp=4)


# ------------------------------------------------------------------ flip, sort, argsort, topk
def test_flip_sort_argsort_topk_with_ties_and_nans():
    """Stable order in both directions: ties keep their order of position, -0.0 ties +0.0, NaN is the
    largest; topk takes the first k of that order; gradients scatter to the indices."""
    x = np.round(normal((4, 7), 4) * 1.5).astype(np.float32)
    x[0, :4] = [1.0, 1.0, -0.0, 0.0]
    x[1, 2] = x[1, 5] = np.nan
    y = normal((3, 6), 5)  # no ties: torch's topk order among ties is its own

    def program(x, y, seed):
        space = _space(x)
        v, i = x.sort(dim=1, stable=True)
        vd, idd = space.sort(x, dim=1, descending=True, stable=True)
        v0, i0 = x.sort(dim=0, descending=True, stable=True)
        t, ti = y.topk(3)
        s, si = space.topk(y, 2, dim=0, largest=False)
        values = space.cat([v, vd, v0, x.flip(1), space.flip(x, (0, 1))], 1)
        return (values, i, idd, i0, x.argsort(dim=1, stable=True), t, ti, s, si,
                space.argsort(y, dim=0, descending=True, stable=True), y.flip(0).flip(-1) * 2.0)

    check(program, {"x": x, "y": y, "seed": normal((4, 35), 6)}, ("x",))


def _integer_lines():
    """int64 lines full of ties, with the extremes; int32 ones with int32's."""
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 3, (3, 37)).astype(np.int64)
    x[0, :4] = [2 ** 62, -2 ** 62, np.iinfo(np.int64).max, np.iinfo(np.int64).min]
    y = rng.integers(-2, 2, (4, 5, 6)).astype(np.int32)
    y[0, 0, :2] = [np.iinfo(np.int32).max, np.iinfo(np.int32).min]
    return x, y


def test_integer_sorts_in_torchs_stable_order():
    """int64 and int32 sort / argsort with stable=True: torch's values and indices exactly, ties in
    their order of position in both directions; the values keep their dtype."""
    x, y = _integer_lines()

    def program(x, y):
        space = _space(x)
        v, i = x.sort(dim=-1, descending=True, stable=True)
        vy, iy = space.sort(y, dim=0, stable=True)
        return (v, i, vy, iy, space.argsort(y, dim=1, descending=True, stable=True), x.argsort(dim=0, stable=True))

    check(program, {"x": x, "y": y}, ())
    got = _run(program, {"x": x, "y": y}, ())
    assert [g.dtype for g in got[:4]] == [np.int64, np.int64, np.int32, np.int64]


def test_integer_topk_and_unstable_sort_give_torchs_values():
    """topk and sort with stable=False leave the order of ties open in torch (its indices are its own):
    bendc's values are torch's, its indices the stable ones (torch's stable=True order)."""
    x, y = _integer_lines()

    def program(x, y):
        space = _space(x)
        t, ti = x.topk(5, dim=1)
        u, ui = space.topk(y, 3, dim=-1, largest=False)
        s, si = y.sort(dim=2, descending=True)
        return t, ti, u, ui, s, si

    got = _run(program, {"x": x, "y": y}, ())
    want = [w.numpy() for w in program(torch.tensor(x), torch.tensor(y))]
    for position in (0, 2, 4):
        np.testing.assert_array_equal(got[position], want[position])
    stable = [torch.tensor(x).sort(dim=1, descending=True, stable=True).indices[:, :5],
              torch.tensor(y).sort(dim=-1, stable=True).indices[..., :3],
              torch.tensor(y).sort(dim=2, descending=True, stable=True).indices]
    for position, order in zip((1, 3, 5), stable):
        np.testing.assert_array_equal(got[position], order.numpy())


# ------------------------------------------------------------------ scatter, scatter_add, scatter_reduce
def test_scatter_family_values_and_gradients():
    """Repeated indices combine in index order from self (bit for bit); amax/amin share the gradient
    among ties (self included); prod's gradient with a single zero and with two zeros at one position;
    include_self both ways."""
    x = np.round(normal((4, 5), 7) * 2.0).astype(np.float32)
    src = np.round(normal((3, 5), 8) * 2.0).astype(np.float32)
    index = np.array([[0, 1, 2, 3, 0], [0, 1, 1, 3, 2], [2, 1, 1, 0, 2]], np.int64)
    unique = np.array([[3, 0, 1, 2, 0], [1, 2, 0, 3, 2], [0, 1, 3, 1, 3]], np.int64)  # no repeats per column
    src[0, 0] = src[1, 0] = x[0, 0] = 4.0        # a three-way tie at (0, 0) for amax
    src[0, 1] = src[1, 1] = -9.0                 # a tie for amin at (1, 1) among src
    src[1, 2] = 0.0                              # a single zero at (1, 2)
    src[1, 4] = src[2, 4] = 0.0                  # two zeros at (2, 4)

    def program(x, src, index, unique, seed):
        space = _space(x)
        blocks = [x.scatter(0, unique, src), space.scatter(x, 0, unique, 2.5), x.scatter_add(0, index, src),
                  space.scatter_add(x, 0, index, src)]
        for reduce in ("sum", "prod", "mean", "amax", "amin"):
            for include_self in (True, False):
                blocks.append(x.scatter_reduce(0, index, src, reduce, include_self=include_self))
        return (space.cat(blocks, 1),)

    arrays = {"x": x, "src": src, "index": index, "unique": unique, "seed": normal((4, 70), 9)}
    check(program, arrays, ("x", "src"), grad_rtol=1e-5)


def test_scatter_along_the_last_dim_of_three():
    """Along the last of three dims; a src larger than the index (read as torch reads it; torch's
    backward refuses such a src, so it is no leaf)."""
    x = normal((2, 3, 4), 10)
    src = normal((2, 3, 3), 11)
    large = normal((2, 4, 5), 17)
    index = np.array([[[3, 3, 0], [1, 2, 1], [0, 0, 0]], [[2, 1, 2], [3, 3, 3], [1, 0, 1]]], np.int64)

    def program(x, src, large, index, seed):
        return (_space(x).cat([x.scatter_reduce(2, index, src, "mean"), x.scatter_add(-1, index, large),
                               x.scatter_reduce(2, index, src, "amax", include_self=False)], 2),)

    arrays = {"x": x, "src": src, "large": large, "index": index, "seed": normal((2, 3, 12), 12)}
    check(program, arrays, ("x", "src"), grad_rtol=1e-5)


# ------------------------------------------------------------------ float // and %
SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 5.5, -5.5, 3.0, 1e-3, 7.25, np.inf, -np.inf, np.nan, 1073741824.0,
                     0.1, -0.3, 2.5], np.float32)


def test_float_floor_divide_and_remainder():
    """Python-sign semantics as torch's, bit for bit over specials (zeros of both signs, infinities,
    NaN, zero divisors); remainder's gradient is g and -g * (a // b); floor_divide has none (torch's)."""
    a, b = (m.reshape(16, 16).copy() for m in np.meshgrid(SPECIALS, SPECIALS))

    def values(a, b):
        space = _space(a)
        return (space.stack([a // b, a % b, space.floor_divide(a, b), space.remainder(a, b), a % 2.5, a // -1.5,
                             7.0 % a, a.remainder(b), a.floor_divide(b)]),)

    check(values, {"a": a, "b": b}, ())
    x, y = normal((3, 4), 13) * np.float32(6.0), normal((4,), 14)

    def gradients(x, y, seed):
        return ((x % y) * 2.0 + torch.remainder(x, 1.25) if isinstance(x, torch.Tensor)
                else (x % y) * 2.0 + BF.remainder(x, 1.25),)

    check(gradients, {"x": x, "y": y, "seed": normal((3, 4), 15)}, ("x", "y"), grad_rtol=1e-6)


def _huge_quotients():
    """Pairs whose quotient is 2**20 .. 2**41 (both signs, magnitudes 2**-60 .. 2**100), where torch's float32
    a - fmod(a, b) rounds: CPython's float64 algorithm differs from torch on 157 of these 4096."""
    rng = np.random.default_rng(17)
    a = rng.uniform(1, 2, 4096) * 2.0 ** rng.integers(-60, 100, 4096) * rng.choice([-1, 1], 4096)
    b = a / (rng.uniform(1, 2, 4096) * 2.0 ** rng.integers(20, 40, 4096)) * rng.choice([-1, 1], 4096)
    return a.astype(np.float32).reshape(64, 64), b.astype(np.float32).reshape(64, 64)


def test_float_floor_divide_of_huge_quotients():
    """torch's float32 steps (div_floor_floating) bit for bit where |a / b| >= 2**24, and over a grid of
    magnitudes 1e-36 .. 1e36 (quotients that overflow and underflow float32 included)."""
    a, b = _huge_quotients()
    exponents = np.arange(-36, 37, 3, dtype=np.float64)
    magnitudes = (np.random.default_rng(18).uniform(1, 10, exponents.size) * 10.0 ** exponents).astype(np.float32)
    grid_a, grid_b = np.meshgrid(np.concatenate([magnitudes, -magnitudes]), np.concatenate([magnitudes[::2],
                                                                                             -magnitudes[1::2]]))

    def values(a, b, grid_a, grid_b):
        return (a // b, _space(a).floor_divide(grid_a, grid_b), grid_b // grid_a)

    check(values, {"a": a, "b": b, "grid_a": grid_a, "grid_b": grid_b}, ())


# ------------------------------------------------------------------ errors
def test_errors_name_the_line_the_op_and_the_shapes():
    def bad_topk(x):
        return x.topk(9)[0].sum()

    def bad_scatter(x, index):
        return x.scatter_add(0, index, x[:1]).sum()

    def floor_divide_backward(x):
        loss = (x // 0.5).sum()
        loss.backward()
        return loss, x.grad

    x = normal((2, 4), 16)
    with pytest.raises(bendc.BendcError, match=r"topk.*k=9.*4 elements") as error:
        bendc.jit(bad_topk, target="reference")(x)
    assert "test_ops_sort_scatter.py" in str(error.value)
    with pytest.raises(bendc.BendcError, match=r"index is larger than src.*f32\[1,4\]"):
        bendc.jit(bad_scatter, target="reference")(x, np.zeros((2, 4), np.int64))
    with pytest.raises(bendc.BendcError, match="floor_divide"):
        bendc.jit(floor_divide_backward, leaves=("x",), target="reference")(x)
    with pytest.raises(bendc.BendcError, match=r"sort of bool\[2,4\]: bendc sorts float32, int64 and int32") as error:
        bendc.jit(lambda x: (x > 0).sort()[1], target="reference")(x)
    assert "test_ops_sort_scatter.py" in str(error.value)
