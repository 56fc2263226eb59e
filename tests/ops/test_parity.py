"""Op parity with PyTorch eager (CPU, float32): values and gradients.

Every program here is written once against the common API (Tensor methods
plus an ``F`` namespace) and run through ``bendc.jit`` on each target
(``reference`` and ``cpu``) and through torch with ``requires_grad`` leaves. The
harness calls ``backward()`` on the result (a seed of ones for a scalar, a
fixed random seed otherwise, which is exactly ``backward(gradient=seed)`` in
both systems) and compares the value and every leaf's gradient. The harness
lives in ``tests/parity_harness.py`` (tests/ops/test_norms.py uses it too).

+ - * /, neg and pure data movement are compared bit for bit; sqrt bit for bit
against float64's sqrt rounded to float32 and within 1 ulp of torch (whose CPU
sqrt is not correctly rounded on every CPU)
(``assert_bitwise``), as are the gradients of programs whose backward is
elementwise only. Transcendentals, reductions and products are compared
with the conftest tolerances, widened only where a comment says why.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from conftest import assert_bitwise, assert_close, ulp_distance
from parity_harness import (  # noqa: F401  (target: the autouse fixture that runs each test on every target)
    _rng, int_index, normal, parity, positive, run_bendc, run_torch, target, wide)


# ------------------------------------------------------------------ + - * / (bit for bit)
BINARY: dict[str, Callable] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_tensor_tensor(op):
    fn = BINARY[op]
    inputs = {"a": wide((3, 5), seed=1), "b": positive((3, 5), seed=2) * np.float32(3.0)}
    parity(lambda F, a, b: fn(a, b), inputs, ("a", "b"), exact=True)


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("scalar", [2.0, -0.75, 0.1, 3])
def test_binary_tensor_scalar(op, scalar):
    fn = BINARY[op]
    parity(lambda F, a: fn(a, scalar), {"a": wide((4, 3), seed=3)}, ("a",), exact=True)


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("scalar", [2.0, -0.75, 0.1, 3])
def test_binary_scalar_tensor(op, scalar):
    """2.0 - x is torch's rsub; 3.0 / x is torch's x.reciprocal() * 3.0."""
    fn = BINARY[op]
    parity(lambda F, a: fn(scalar, a), {"a": positive((4, 3), seed=4) * np.float32(1.7)}, ("a",), exact=True)


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_numpy_scalar_both_sides(op):
    """np.float32 scalars act as Python scalars on either side (Tensor defers to numpy's ops)."""
    fn = BINARY[op]
    parity(lambda F, a: fn(a, np.float32(0.3)) - fn(np.float32(1.5), a), {"a": positive((3, 4), seed=17)}, ("a",),
           exact=True)


def test_neg():
    parity(lambda F, a: -a, {"a": wide((3, 4), seed=5)}, ("a",), exact=True)


@pytest.mark.filterwarnings("ignore:divide by zero")  # sqrt(0)'s gradient is inf, as in torch
@pytest.mark.parametrize("spelling", ["method", "functional"])
def test_sqrt(spelling):
    """bendc's sqrt is correctly rounded: float64's sqrt rounded to float32, bit for bit (on every CPU);
    its backward g / (2 * y) is the same IEEE formula over that y. torch's own CPU sqrt is not
    correctly rounded everywhere (1 ulp off on ~16% of inputs on AMD Zen 5), so against torch
    the value and the gradient agree within 1 ulp (the gradient: 1 from y, 1 more from rounding)."""
    a = np.concatenate([positive((200,), seed=6, low=0.1, high=50.0), wide((200,), seed=7) ** 2,
                        np.float32([0.0, 1e-38, 1e-45, 1.0, 2.0, 3.4e38])]).astype(np.float32)
    seed = normal(a.shape, seed=8)
    if spelling == "method":
        body = lambda F, a: a.sqrt()  # noqa: E731
    else:
        body = lambda F, a: F.sqrt(a)  # noqa: E731
    # Against torch within 1 ulp (the value) and 2 ulps (the gradient); the ulp check is below.
    actual, expected = parity(body, {"a": a}, ("a",), seed=seed, rtol=2.5e-7, atol=0.0,
                              grad_rtol=5e-7, grad_atol=0.0)
    rounded = np.sqrt(a.astype(np.float64)).astype(np.float32)
    assert_bitwise(actual.value, rounded, "sqrt vs float64 rounded to float32")
    assert_bitwise(actual.grads["a"], seed / (np.float32(2.0) * rounded), "grad: g / (2 * y)")
    assert ulp_distance(actual.value, expected.value).max() <= 1
    finite = np.isfinite(expected.grads["a"])
    assert ulp_distance(actual.grads["a"][finite], expected.grads["a"][finite]).max() <= 2


def test_square():
    """torch.square is x * x, its backward g * (2 * x): both bit for bit (the op declares its method,
    x.square() and F.square(x), in its op file)."""
    parity(lambda F, a: a.square(), {"a": wide((3, 4), seed=40)}, ("a",), exact=True)
    parity(lambda F, a: (F.square(a) * a).square(), {"a": wide((6,), seed=41)}, ("a",), exact=True)


def test_arithmetic_chain_gradients_bitwise():
    """loss = ((a*b - c) / d).sum(): sum's backward is a seed of ones, the rest elementwise."""
    inputs = {"a": wide((4, 5), seed=8), "b": wide((4, 5), seed=9), "c": wide((4, 5), seed=10),
              "d": positive((4, 5), seed=11)}
    parity(lambda F, a, b, c, d: ((a * b - c) / d).sum(), inputs, ("a", "b", "c", "d"),
           exact=False, exact_grads=True)  # the loss itself is a reduction


def test_arithmetic_chain_with_scalars_bitwise():
    body = lambda F, a, b: ((2.0 - a * 0.5) / b + 1.5 * a - 3.0 / b - b / 4.0)  # noqa: E731
    inputs = {"a": wide((3, 4), seed=12), "b": positive((3, 4), seed=13)}
    parity(body, inputs, ("a", "b"), exact=True)


def test_arithmetic_chain_with_constants_bitwise():
    """A constant (non-leaf) operand gets no gradient and leaves the others' bits alone."""
    body = lambda F, a, c, w: (a - c) * w / (c + 2.0) - w  # noqa: E731
    inputs = {"a": wide((2, 3), seed=14), "c": positive((2, 3), seed=15), "w": wide((2, 3), seed=16)}
    parity(body, inputs, ("a", "w"), exact=True)


# ------------------------------------------------------------------ unary transcendentals
UNARY: dict[str, tuple[Callable, Callable[[int], np.ndarray]]] = {
    "exp_method": (lambda F, a: a.exp(), lambda s: normal((3, 5), s)),
    "exp_F": (lambda F, a: F.exp(a), lambda s: normal((3, 5), s)),
    "log_method": (lambda F, a: a.log(), lambda s: positive((3, 5), s, 0.2, 20.0)),
    "log_F": (lambda F, a: F.log(a), lambda s: positive((3, 5), s, 0.2, 20.0)),
    "tanh_method": (lambda F, a: a.tanh(), lambda s: normal((3, 5), s, 2.0)),
    "tanh_F": (lambda F, a: F.tanh(a), lambda s: normal((3, 5), s, 2.0)),
    "sigmoid_method": (lambda F, a: a.sigmoid(), lambda s: normal((3, 5), s, 3.0)),
    "sigmoid_F": (lambda F, a: F.sigmoid(a), lambda s: normal((3, 5), s, 3.0)),
    "relu_method": (lambda F, a: a.relu(), lambda s: normal((3, 5), s)),
    "relu_F": (lambda F, a: F.relu(a), lambda s: normal((3, 5), s)),
    "gelu_none": (lambda F, a: F.gelu(a), lambda s: normal((3, 5), s, 2.0)),
    "gelu_none_explicit": (lambda F, a: F.gelu(a, approximate="none"), lambda s: normal((3, 5), s, 2.0)),
    "gelu_tanh": (lambda F, a: F.gelu(a, approximate="tanh"), lambda s: normal((3, 5), s, 2.0)),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
    body, make = UNARY[name]
    parity(body, {"a": make(20)}, ("a",))
    parity(lambda F, a: body(F, a).sum(), {"a": make(21)}, ("a",))  # through a scalar loss


def test_relu_is_exact():
    """relu selects; no rounding happens, so it matches bit for bit (values and gradient)."""
    parity(lambda F, a: F.relu(a), {"a": wide((4, 5), seed=22)}, ("a",), exact=True)


# ------------------------------------------------------------------ -0.0
SIGNED_ZEROS = np.array([-0.0, 0.0, -1.5, 2.0, -0.0, 0.0, 3.0, -2.5], dtype=np.float32)


def _bits(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float32).view(np.int32)


def test_relu_signed_zeros():
    """relu(-0.0) is -0.0 in torch; its backward at +0.0 and -0.0 is +0.0."""
    seed = np.array([1.0, -1.0, 2.0, 3.0, -4.0, 5.0, 6.0, -7.0], dtype=np.float32)
    actual, expected = parity(lambda F, a: F.relu(a), {"a": SIGNED_ZEROS}, ("a",), exact=True, seed=seed)
    assert _bits(expected.value)[0] == _bits(-0.0)  # the torch fact this test relies on
    zeros = SIGNED_ZEROS == 0
    assert (_bits(actual.grads["a"])[zeros] == 0).all(), "relu backward at +-0.0 must be +0.0"


def test_negative_zero_gradients():
    """Gradients that are -0.0 in torch (g * -0.0, -(+0.0)) are -0.0 here too."""
    inputs = {"a": wide((8,), seed=23), "c": SIGNED_ZEROS.copy(), "z": wide((8,), seed=24)}
    seed = np.array([0.0, 1.0, -0.0, 2.0, 0.0, -3.0, 1.0, 0.0], dtype=np.float32)
    actual, expected = parity(lambda F, a, c, z: a * c - z, inputs, ("a", "z"), exact=True, seed=seed)
    assert (_bits(expected.grads["a"]) == _bits(-0.0)).any() and (_bits(expected.grads["z"]) == _bits(-0.0)).any()


def test_index_backward_scatters_into_positive_zero():
    seed = np.array([[-0.0, 1.0], [2.0, -0.0]], dtype=np.float32)
    actual, _ = parity(lambda F, a: a[1:3, 2:4], {"a": wide((4, 5), seed=25)}, ("a",), exact=True, seed=seed)
    grad = actual.grads["a"]
    untouched = np.ones((4, 5), dtype=bool)
    untouched[1:3, 2:4] = False
    assert (_bits(grad)[untouched] == 0).all(), "positions not indexed must hold +0.0"
    assert _bits(grad[1, 2]) == _bits(-0.0)


def test_index_select_backward_zero_words():
    """Rows never selected get +0.0; a row selected with -0.0 gradients accumulates onto +0.0."""
    seed = np.full((2, 3), -0.0, dtype=np.float32)
    actual, _ = parity(lambda F, x, i: F.index_select(x, 0, i), {"x": wide((4, 3), 26), "i": int_index([1, 3])},
                       ("x",), exact=True, seed=seed)
    # +0.0 + -0.0 = +0.0: torch's index_add_ into zeros gives +0.0 for every row.
    assert (_bits(actual.grads["x"]) == 0).all()


def test_nan_results_of_sqrt_and_log():
    """sqrt and log of negatives are NaN in both, at the same positions; the rest is bit for bit.

    Only the NaN *sign* differs and is not compared: numpy returns the x86 default
    NaN 0xffc00000, torch's kernels 0x7fc00000 (IEEE 754 leaves a NaN's sign unspecified).
    """
    a = np.array([-1.0, -0.0, 0.0, 4.0, -2.5, 2.0], dtype=np.float32)
    for name in ("sqrt", "log"):
        with np.errstate(invalid="ignore", divide="ignore"):
            expected = run_torch(lambda F, a: getattr(a, name)(), {"a": a}, ("a",), seed=np.ones(6, np.float32))
            actual = run_bendc(lambda F, a: getattr(a, name)(), {"a": a}, ("a",), seed=np.ones(6, np.float32))
        for what, got, want in (("value", actual.value, expected.value),
                                ("grad", actual.grads["a"], expected.grads["a"])):
            nan = np.isnan(want)
            assert (np.isnan(got) == nan).all(), f"{name} {what}: NaN positions differ"
            if name == "sqrt":
                assert_bitwise(got[~nan], want[~nan], f"{name} {what}")
            else:
                assert_close(got[~nan], want[~nan], f"{name} {what}")


# ------------------------------------------------------------------ repeated operands
REPEATED: dict[str, Callable] = {
    "x*x": lambda F, x: x * x,
    "x+x": lambda F, x: x + x,
    "x*x*x": lambda F, x: x * x * x,
    "x-x*x": lambda F, x: x - x * x,
    "x/(x+1)": lambda F, x: x / (x + 1.0),
    "(x*x)/(x*x+x)": lambda F, x: (x * x) / (x * x + x),
}


@pytest.mark.parametrize("name", list(REPEATED))
def test_repeated_operands_bitwise(name):
    """Several contributions into one slot are added in PyTorch's engine order: bit for bit."""
    parity(REPEATED[name], {"x": positive((3, 4), seed=27)}, ("x",), exact=True)


def test_leaf_used_several_times():
    body = lambda F, x, w, y: (x * w + w * y - w) / (w * w + 1.0) + w  # noqa: E731
    inputs = {"x": wide((3, 4), seed=28), "w": wide((3, 4), seed=29), "y": wide((3, 4), seed=30)}
    parity(body, inputs, ("w",), exact=True)
    parity(body, inputs, ("x", "w", "y"), exact=True)


def test_leaf_used_several_times_through_transcendentals():
    body = lambda F, x, w: (F.tanh(x @ w.T) @ w).exp().sum() + (w * w).sum()  # noqa: E731
    parity(body, {"x": normal((3, 4), 31, 0.5), "w": normal((2, 4), 32, 0.5)}, ("x", "w"))


def test_unused_leaf_has_no_grad():
    body = lambda F, x, w, u: (x * w).sum()  # noqa: E731
    actual, _ = parity(body, {"x": wide((3,), 33), "w": wide((3,), 34), "u": wide((3,), 35)}, ("w", "u"),
                       exact_grads=True)
    assert actual.grads["u"] is None


def test_non_leaf_constants():
    """Values computed from constants only are constants (no backward through them)."""
    body = lambda F, x, y, w: (((x * 2.0 + y).exp() / y) * w + x.sqrt()).sum()  # noqa: E731
    inputs = {"x": positive((2, 5), 36), "y": positive((2, 5), 37), "w": wide((2, 5), 38)}
    parity(body, inputs, ("w",))


# ------------------------------------------------------------------ broadcasting
BROADCAST_SHAPES = [
    ((4, 1, 3), (2, 3)),
    ((2, 3), (4, 1, 3)),
    ((), (2, 3)),
    ((2, 3), ()),
    ((1,), (2, 3)),
    ((2, 3), (1,)),
    ((3, 1), (1, 4)),
    ((2, 1, 4), (3, 1)),
    ((), ()),
    ((1,), ()),
]


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_broadcast_binary(op, shapes):
    """Forward values are elementwise (bit for bit); a broadcast operand's gradient is a sum."""
    fn = BINARY[op]
    a_shape, b_shape = shapes
    inputs = {"a": normal(a_shape, 40), "b": positive(b_shape, 41)}
    parity(lambda F, a, b: fn(a, b), inputs, ("a", "b"), exact=True, exact_grads=False)


@pytest.mark.parametrize("a_shape,b_shape,full", [((4, 1, 3), (4, 2, 3), "b"), ((3,), (2, 3), "b"),
                                                  ((2, 3), (1, 3), "a"), ((2, 3), (), "a")], ids=str)
def test_broadcast_without_reduction_is_bitwise(a_shape, b_shape, full):
    """The full-shape operand's gradient needs no sum, so it is bit-exact."""
    body = lambda F, a, b: a * b - b / (a + 3.0)  # noqa: E731
    parity(body, {"a": positive(a_shape, 42), "b": normal(b_shape, 43)}, (full,), exact=True)


# ------------------------------------------------------------------ reductions
REDUCE_DIMS = [None, 0, 1, 2, -1, -3, (0, 2), (-1, 0), (1,), (0, 1, 2)]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dim", REDUCE_DIMS, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction(reduction, dim, keepdim):
    def body(F, x):
        return getattr(x, reduction)(dim=dim, keepdim=keepdim)

    parity(body, {"x": normal((2, 3, 4), 50)}, ("x",))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_reduction_default_args(reduction):
    parity(lambda F, x: getattr(x, reduction)(), {"x": normal((3, 4), 51)}, ("x",))
    parity(lambda F, x: getattr(x, reduction)(1), {"x": normal((3, 4), 52)}, ("x",))


def test_sum_gradient_is_exact():
    """sum's backward is an expand of the seed: bit for bit."""
    parity(lambda F, x: x.sum(dim=(0, 2), keepdim=True) * 3.0, {"x": normal((2, 3, 4), 53)}, ("x",),
           exact_grads=True)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dim", [(), []], ids=["tuple", "list"])
def test_reduction_empty_dim_list_reduces_all(reduction, dim):
    """torch: x.sum(dim=()) reduces every dim (not none)."""
    parity(lambda F, x: getattr(x, reduction)(dim=dim), {"x": normal((2, 3), 54)}, ("x",))


def test_mean_gradient_is_exact():
    """mean's backward divides the seed by the count, then expands: bit for bit."""
    parity(lambda F, x: x.mean(dim=(0, 2)) * 3.0, {"x": normal((2, 3, 5), 55)}, ("x",), exact_grads=True)
    parity(lambda F, x: x.mean(), {"x": normal((3, 7), 56)}, ("x",), exact_grads=True)


@pytest.mark.parametrize("shape", [(1,), (2, 1), (3, 3), (20,)], ids=str)
def test_reductions_of_negative_zeros(shape):
    """Sums of -0.0 start from +0.0 in torch, so they are +0.0 (bit for bit, also over a size-1 dim)."""
    zeros = np.full(shape, -0.0, dtype=np.float32)
    for body in (lambda F, x: x.sum(), lambda F, x: x.sum(-1), lambda F, x: x.sum(0, keepdim=True),
                 lambda F, x: x.mean(), lambda F, x: x.mean(-1)):
        parity(body, {"x": zeros}, ("x",), exact=True)


def test_reduction_of_scalar_shaped():
    parity(lambda F, x: (x * 2.0).sum(), {"x": np.array(1.25, dtype=np.float32)}, ("x",), exact=True)
    parity(lambda F, x: x.mean(0), {"x": np.array([1.25], dtype=np.float32)}, ("x",), exact=True)


# ------------------------------------------------------------------ layout (bit for bit)
LAYOUT: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "reshape": (lambda F, x: x.reshape(4, 6), (2, 3, 4)),
    "reshape_tuple": (lambda F, x: x.reshape((6, 4)), (2, 3, 4)),
    "reshape_-1": (lambda F, x: x.reshape(-1), (2, 3, 4)),
    "reshape_mid_-1": (lambda F, x: x.reshape(3, -1, 2), (2, 3, 4)),
    "reshape_to_scalar": (lambda F, x: x.reshape(()), (1, 1)),
    "reshape_noop": (lambda F, x: x.reshape(2, 3, 4) * 1.0, (2, 3, 4)),
    "transpose_0_2": (lambda F, x: x.transpose(0, 2), (2, 3, 4)),
    "transpose_neg": (lambda F, x: x.transpose(-1, -2), (2, 3, 4)),
    "permute": (lambda F, x: x.permute(2, 0, 1), (2, 3, 4)),
    "permute_tuple": (lambda F, x: x.permute((1, 2, 0)), (2, 3, 4)),
    "permute_neg": (lambda F, x: x.permute(-1, 0, 1), (2, 3, 4)),
    ".T": (lambda F, x: x.T, (3, 5)),
    "unsqueeze_0": (lambda F, x: x.unsqueeze(0), (3, 5)),
    "unsqueeze_1": (lambda F, x: x.unsqueeze(1), (3, 5)),
    "unsqueeze_-1": (lambda F, x: x.unsqueeze(-1), (3, 5)),
    "unsqueeze_scalar": (lambda F, x: x.unsqueeze(0), ()),
    "chain": (lambda F, x: x.permute(1, 0, 2).reshape(3, 8).T.unsqueeze(0).transpose(0, 2), (2, 3, 4)),
}


@pytest.mark.parametrize("name", list(LAYOUT))
def test_layout(name):
    body, shape = LAYOUT[name]
    parity(body, {"x": wide(shape, 60)}, ("x",), exact=True)


def test_layout_then_arithmetic():
    body = lambda F, x, y: x.T * y.reshape(4, 3) + x.permute(1, 0).unsqueeze(0)  # noqa: E731
    parity(body, {"x": wide((3, 4), 61), "y": wide((2, 6), 62)}, ("x", "y"), exact=True, exact_grads=False)


# ------------------------------------------------------------------ matmul
# numpy's and torch's BLAS accumulate the products in different orders; with K <= 6
# and unit-scale inputs the difference stays well inside rtol 1e-5, but an entry that
# nearly cancels to 0 can be off by a few ulp of the terms, so atol is 1e-5 there.
MATMUL_ATOL = 1e-5

MATMUL_SHAPES = [
    ((4,), (4,)),              # 1-D @ 1-D: dot
    ((4,), (4, 3)),            # 1-D @ 2-D
    ((3, 4), (4,)),            # 2-D @ 1-D
    ((3, 4), (4, 5)),          # 2-D @ 2-D
    ((2, 3, 4), (2, 4, 5)),    # batched
    ((2, 1, 3, 4), (5, 4, 2)),  # broadcast batch dims
    ((4,), (2, 4, 3)),         # 1-D @ 3-D
    ((2, 3, 4), (4,)),         # 3-D @ 1-D
    ((2, 3, 4), (4, 5)),       # 3-D @ 2-D (broadcast)
    ((3, 4), (2, 4, 5)),       # 2-D @ 3-D (broadcast)
    ((1, 3, 4), (2, 4, 2)),    # size-1 batch dim
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul(shapes):
    a_shape, b_shape = shapes
    inputs = {"a": normal(a_shape, 70), "b": normal(b_shape, 71)}
    parity(lambda F, a, b: a @ b, inputs, ("a", "b"), atol=MATMUL_ATOL)


@pytest.mark.parametrize("leaves", [("a",), ("b",)])
def test_matmul_one_leaf(leaves):
    inputs = {"a": normal((2, 1, 3, 4), 72), "b": normal((5, 4, 2), 73)}
    parity(lambda F, a, b: (a @ b).sum(), inputs, leaves, atol=MATMUL_ATOL)


@pytest.mark.parametrize("x_shape", [(3, 4), (2, 3, 4), (4,)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_linear(x_shape, bias):
    inputs = {"x": normal(x_shape, 74), "w": normal((5, 4), 75)}
    if bias:
        inputs["b"] = normal((5,), 76)
        body = lambda F, x, w, b: F.linear(x, w, b)  # noqa: E731
    else:
        body = lambda F, x, w: F.linear(x, w)  # noqa: E731
    parity(body, inputs, tuple(inputs), atol=MATMUL_ATOL)


def test_linear_relu_loss():
    body = lambda F, x, w: F.relu(x @ w.T).sum()  # noqa: E731
    parity(body, {"x": normal((4, 3), 77), "w": normal((5, 3), 78)}, ("w",), atol=MATMUL_ATOL)
    parity(body, {"x": normal((4, 3), 77), "w": normal((5, 3), 78)}, ("x", "w"), atol=MATMUL_ATOL)


# ------------------------------------------------------------------ basic indexing (bit for bit)
INDEXING: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "a[i]": (lambda a: a[1], (4, 6)),
    "a[-1]": (lambda a: a[-1], (4, 6)),
    "a[:, 2:5]": (lambda a: a[:, 2:5], (4, 6)),
    "a[1:3, 0]": (lambda a: a[1:3, 0], (4, 6)),
    "a[::2]": (lambda a: a[::2], (5, 6)),
    "a[1:6:2, ::3]": (lambda a: a[1:6:2, ::3], (6, 7)),
    "a[..., 1]": (lambda a: a[..., 1], (2, 3, 4)),
    "a[1, ..., 2:]": (lambda a: a[1, ..., 2:], (2, 3, 4)),
    "a[-2:, :-1]": (lambda a: a[-2:, :-1], (4, 6)),
    "a[0, 1]": (lambda a: a[0, 1], (4, 6)),
    "a[:]": (lambda a: a[:] * 2.0, (4, 6)),
    "a[2][1:]": (lambda a: a[2][1:], (4, 6)),
    "a[10:]": (lambda a: a[2:100], (4, 6)),
}


@pytest.mark.parametrize("name", list(INDEXING))
def test_indexing(name):
    pick, shape = INDEXING[name]
    parity(lambda F, a: pick(a), {"a": wide(shape, 80)}, ("a",), exact=True)


def test_overlapping_indexing_accumulates():
    """Two overlapping slices of one leaf: their scattered gradients are added."""
    body = lambda F, a: a[1:4] * a[0:3] + a[2]  # noqa: E731
    parity(body, {"a": wide((5, 3), 81)}, ("a",), exact=True)


# ------------------------------------------------------------------ index_select and gather
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dtype, dim):
    """Repeated indices: the backward index_add_ accumulates in index order (bit for bit)."""
    x = wide((4, 5), 90)
    index = int_index([2, 0, 2, 2, 1, 2, 4 if dim != 0 else 3], dtype)
    parity(lambda F, x, i: F.index_select(x, dim, i), {"x": x, "i": index}, ("x",), exact=True, seed="wide")


def test_index_select_3d():
    x = wide((2, 3, 4), 92)
    index = int_index([1, 1, 0, 1])
    parity(lambda F, x, i: F.index_select(x, 1, i), {"x": x, "i": index}, ("x",), exact=True, seed="wide")


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dim", [0, 1])
def test_gather(dtype, dim):
    """Repeated indices in each row/column: scatter_add_ order matters (bit for bit)."""
    x = wide((4, 3), 94)
    if dim == 1:
        index = int_index([[0, 0, 0, 2, 0], [1, 2, 1, 1, 1], [2, 2, 2, 0, 2], [0, 1, 0, 0, 0]], dtype)
    else:
        index = int_index([[0, 1, 3], [0, 1, 3], [3, 1, 0], [0, 0, 0], [3, 1, 3]], dtype)
    parity(lambda F, x, i: F.gather(x, dim, i), {"x": x, "i": index}, ("x",), exact=True, seed="wide")


def test_gather_smaller_index():
    """An index smaller than the input in the other dims picks a corner of it."""
    x = wide((4, 5), 96)
    index = int_index([[4, 4, 0], [1, 4, 4]])
    parity(lambda F, x, i: F.gather(x, 1, i), {"x": x, "i": index}, ("x",), exact=True, seed="wide")


def test_gather_3d_negative_dim():
    x = wide((2, 3, 4), 98)
    index = _rng(99).integers(0, 4, (2, 3, 6)).astype(np.int64)
    parity(lambda F, x, i: F.gather(x, -1, i), {"x": x, "i": index}, ("x",), exact=True, seed="wide")


# ------------------------------------------------------------------ softmax family and losses
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((3, 5), 0), ((3, 5), 1), ((3, 5), -1), ((2, 3, 4), 1),
                                       ((2, 3, 4), -3), ((2, 3, 4), 2), ((6,), 0)], ids=str)
def test_softmax_family(fn, shape, dim):
    body = lambda F, x: getattr(F, fn)(x, dim)  # noqa: E731
    parity(body, {"x": normal(shape, 110, 3.0)}, ("x",))


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_method(fn):
    parity(lambda F, x: getattr(x, fn)(-1), {"x": normal((3, 4), 111, 3.0)}, ("x",))


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_rows_with_special_values(fn):
    """Rows longer than the kernels' 8 lanes (and not a multiple of them) with masked cells (-inf), a
    row all -inf, a NaN, +inf, zeros of both signs tying for the max, and the max in the last lane
    or the remainder: NaN where torch has NaN, the other values as torch's."""
    x = normal((9, 21), 115, 3.0)
    x[0, 5:] = -np.inf             # a causal-style masked row
    x[1, :] = -np.inf              # nothing left: NaN
    x[2, 7] = np.nan               # a NaN anywhere: the row is NaN
    x[3, 3] = np.inf               # +inf: NaN (inf - inf)
    x[4, :] = -5.0
    x[4, 2], x[4, 11] = 0.0, -0.0  # the max a tie of +0.0 and -0.0
    x[5, :] = -200.0
    x[5, 19] = -0.0                # the max alone in a lane past the first block; the rest underflows
    x[6, 20] = 100.0               # the max in the remainder (lane 0's tail): exp overflows if missed
    x[7, 15] = 100.0               # the max in the last lane
    got = np.asarray(bendc.jit(lambda x: getattr(BF, fn)(x, 1), target="cpu")(x))
    expected = getattr(torch, fn)(torch.from_numpy(x), 1).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got[~np.isnan(got)], expected[~np.isnan(expected)], rtol=2e-6, atol=1e-7)


def test_softmax_large_logits():
    """The max shift keeps exp finite for logits near 100."""
    x = normal((3, 5), 112, 3.0) + np.float32(100.0)
    parity(lambda F, x: F.softmax(x, 1), {"x": x}, ("x",))
    parity(lambda F, x: F.log_softmax(x, 1), {"x": x}, ("x",), atol=1e-5)  # values near 1e0, x near 1e2


@pytest.mark.parametrize("shape", [(4, 3), (7,), (2, 3, 2)], ids=str)
def test_mse_loss(shape):
    inputs = {"a": normal(shape, 113), "b": normal(shape, 114)}
    parity(lambda F, a, b: F.mse_loss(a, b), inputs, ("a", "b"))
    parity(lambda F, a, b: F.mse_loss(a, b), inputs, ("a",))


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_cross_entropy(dtype):
    logits = normal((5, 4), 115, 2.0)
    target = int_index([3, 0, 0, 2, 3], dtype)
    parity(lambda F, z, t: F.cross_entropy(z, t), {"z": logits, "t": target}, ("z",))


def test_cross_entropy_of_linear():
    inputs = {"x": normal((6, 3), 116), "w": normal((4, 3), 117), "b": normal((4,), 118),
              "t": int_index([0, 1, 2, 3, 3, 1])}
    parity(lambda F, x, w, b, t: F.cross_entropy(F.linear(x, w, b), t), inputs, ("w", "b"), atol=MATMUL_ATOL)


# ------------------------------------------------------------------ optimizers
def _torch_leaf(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True)).requires_grad_(True)


# torch applies lr through add_(grad, alpha=-lr), which its vectorized CPU kernel runs as
# a fused multiply-add (one rounding); bendc's reference computes param - lr * grad with two
# roundings. So the parameter agrees to an ulp of the update, not bit for bit.
OPT_RTOL, OPT_ATOL = 1e-6, 1e-7


@pytest.mark.parametrize("momentum,with_buf", [(0.0, False), (0.9, False), (0.9, True), (0.5, True)])
def test_sgd_step(momentum, with_buf):
    x, y = normal((4, 3), 120), normal((4, 2), 121)
    w0, buf0 = normal((2, 3), 122), normal((2, 3), 123, 0.1)
    lr = 0.05

    if momentum == 0.0:
        @bendc.jit(leaves=("w",), target="reference")
        def step(x, y, w):
            loss = BF.mse_loss(x @ w.T, y)
            loss.backward()
            return BF.sgd_step(w, w.grad, lr), None
        new_w, new_buf = step(x, y, w0)
    elif not with_buf:
        @bendc.jit(leaves=("w",), target="reference")
        def step(x, y, w):
            loss = BF.mse_loss(x @ w.T, y)
            loss.backward()
            return BF.sgd_step(w, w.grad, lr, momentum=momentum)
        new_w, new_buf = step(x, y, w0)
    else:
        @bendc.jit(leaves=("w",), target="reference")
        def step(x, y, w, buf):
            loss = BF.mse_loss(x @ w.T, y)
            loss.backward()
            return BF.sgd_step(w, w.grad, lr, momentum=momentum, buf=buf)
        new_w, new_buf = step(x, y, w0, buf0)

    w = _torch_leaf(w0)
    optimizer = torch.optim.SGD([w], lr=lr, momentum=momentum)
    if with_buf:
        optimizer.state[w]["momentum_buffer"] = torch.from_numpy(buf0.copy())
    torch.nn.functional.mse_loss(torch.from_numpy(x) @ w.T, torch.from_numpy(y)).backward()
    torch_grad = w.grad.numpy().copy()
    optimizer.step()

    assert_close(new_w, w.detach().numpy(), "param", rtol=OPT_RTOL, atol=OPT_ATOL)
    if momentum == 0.0:
        assert new_buf is None
    else:
        # The gradient itself comes through a matrix product, so it is close, not bitwise;
        # test_sgd_momentum_buffer_bitwise checks the update on given arrays.
        expected_buf = optimizer.state[w]["momentum_buffer"].numpy()
        assert_close(new_buf, expected_buf, "momentum buffer")
        if not with_buf:
            assert_close(new_buf, torch_grad, "first buffer is the gradient")


def test_sgd_step_is_param_minus_lr_grad():
    """On given arrays the update is param - lr * grad, as torch computes it unfused."""
    @bendc.jit(target="reference")
    def step(p, g):
        return BF.sgd_step(p, g, 0.1)

    p, g = wide((3, 4), 124), wide((3, 4), 125)
    expected = (torch.from_numpy(p) - np.float32(0.1) * torch.from_numpy(g)).numpy()
    assert_bitwise(step(p, g), expected, "param")


@pytest.mark.parametrize("with_buf", [False, True])
def test_sgd_momentum_buffer_bitwise(with_buf):
    """buf.mul_(momentum).add_(grad) has two roundings in both (alpha=1 makes the FMA exact)."""
    p, g, buf = wide((3, 4), 126), wide((3, 4), 127), wide((3, 4), 128)

    if with_buf:
        step = bendc.jit(lambda p, g, buf: BF.sgd_step(p, g, 0.1, momentum=0.9, buf=buf), target="reference")
        new_p, new_buf = step(p, g, buf)
    else:
        step = bendc.jit(lambda p, g: BF.sgd_step(p, g, 0.1, momentum=0.9), target="reference")
        new_p, new_buf = step(p, g)
    param = torch.from_numpy(p.copy())
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.grad = torch.from_numpy(g.copy())
    if with_buf:
        optimizer.state[param]["momentum_buffer"] = torch.from_numpy(buf.copy())
    optimizer.step()
    assert_bitwise(new_buf, optimizer.state[param]["momentum_buffer"].numpy(), "momentum buffer")
    assert_close(new_p, param.numpy(), "param", rtol=OPT_RTOL, atol=OPT_ATOL)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_step(weight_decay):
    x, y = normal((4, 3), 130), normal((4, 2), 131)
    w0 = normal((2, 3), 132)
    lr, betas, eps = 0.01, (0.9, 0.999), 1e-8

    @bendc.jit(leaves=("w",), target="reference")
    def step(x, y, w, m, v, t):
        loss = BF.mse_loss(x @ w.T, y)
        loss.backward()
        return BF.adam_step(w, w.grad, m, v, t, lr, betas=betas, eps=eps, weight_decay=weight_decay)

    w_torch = _torch_leaf(w0)
    optimizer = torch.optim.AdamW([w_torch], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for t in (1, 2, 3):
        w, m, v = step(x, y, w, m, v, t)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(torch.from_numpy(x) @ w_torch.T, torch.from_numpy(y)).backward()
        optimizer.step()
        state = optimizer.state[w_torch]
        assert int(state["step"]) == t
        # Several roundings (sqrt, division, the fused addcdiv_) differ in the last bit.
        assert_close(m, state["exp_avg"].numpy(), f"m at step {t}", rtol=1e-5, atol=1e-7)
        assert_close(v, state["exp_avg_sq"].numpy(), f"v at step {t}", rtol=1e-5, atol=1e-9)
        assert_close(w, w_torch.detach().numpy(), f"param at step {t}", rtol=1e-5, atol=1e-6)
    assert len(step._cache) == 3, "each static step value is a new signature"


def test_adam_with_a_traced_step_count_matches_adamw(target):
    """One trace for the whole loop: the step count is a 0-d array, bias corrections in float64."""
    rng = np.random.default_rng(5)
    p, g = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)

    def update(p, g, m, v, step):
        return BF.adam_step(p, g, m, v, step, 1e-2, weight_decay=0.01)

    step_fn = bendc.jit(update, target=target)
    tp = torch.tensor(p, requires_grad=True)
    optimizer = torch.optim.AdamW([tp], lr=1e-2, weight_decay=0.01)
    param, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
    for count in range(1, 6):
        tp.grad = torch.tensor(g)
        optimizer.step()
        param, m, v = step_fn(param, g, m, v, np.array(count, np.int64))
    state = optimizer.state[tp]
    assert_close(param, tp.detach().numpy(), "param", rtol=1e-6, atol=1e-7)
    assert_close(m, state["exp_avg"].numpy(), "m", rtol=1e-6, atol=1e-9)  # torch's lerp_ may fuse (FMA)
    assert_close(v, state["exp_avg_sq"].numpy(), "v", rtol=1e-6, atol=1e-9)
    assert len(step_fn._cache) == 1  # no retrace per step
