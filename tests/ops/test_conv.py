"""conv1d, conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d: parity with PyTorch eager (CPU, float32)
on every target, values and gradients of the input, the weight and the bias.

Tolerances. A convolution's outputs and gradients are sums of products: bendc's reference sums in
float64 and rounds once, its cpu kernels sum in BLAS order, PyTorch in oneDNN's; they agree within
CONV_RTOL / CONV_ATOL (sums of up to a few hundred terms of unit size). The pools are compared bit
for bit where the sums have PyTorch's order: max_pool2d (values, and the gradient, routed to the
first max of each window exactly as torch) and avg_pool2d (float32 window sums in row order, one
division; the gradient g / divisor added in output order). adaptive_avg_pool2d is bit for bit too
except a global pool (output 1x1), which PyTorch sums as a vectorized mean (ADAPTIVE_*).
"""
from __future__ import annotations

import numpy as np
import pytest

import bendc
import bendc.functional as BF
from parity_harness import assert_user_error, normal, parity, target  # noqa: F401  (target: the autouse fixture)

CONV_RTOL, CONV_ATOL = 2e-5, 2e-5
ADAPTIVE_RTOL, ADAPTIVE_ATOL = 1e-6, 1e-6


def conv_parity(body, inputs, leaves):
    return parity(body, inputs, leaves, rtol=CONV_RTOL, atol=CONV_ATOL)


# ------------------------------------------------------------------ conv2d
CONV2D_CASES = {
    # name: (x shape, weight shape, keyword arguments)
    "basic": ((2, 3, 8, 8), (4, 3, 3, 3), {}),
    "stride2_pad1": ((2, 3, 9, 7), (5, 3, 3, 3), {"stride": 2, "padding": 1}),
    "mixed": ((1, 2, 7, 6), (3, 2, 2, 3), {"stride": (2, 1), "padding": (1, 2), "dilation": (2, 1)}),
    "dilation2": ((2, 2, 9, 9), (3, 2, 3, 3), {"dilation": 2, "padding": 2}),
    "groups": ((2, 4, 6, 6), (6, 2, 3, 3), {"groups": 2, "padding": 1}),
    "depthwise": ((2, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "padding": 1, "stride": 2}),
    "one_by_one": ((3, 5, 4, 4), (7, 5, 1, 1), {}),
    "one_by_one_strided": ((2, 3, 5, 5), (2, 3, 1, 1), {"stride": 2}),
    "kernel_as_large_as_input": ((2, 3, 5, 4), (4, 3, 5, 4), {}),
    "kernel_larger_than_input_padded": ((1, 2, 3, 3), (2, 2, 5, 5), {"padding": 1}),
    "same_odd": ((2, 2, 6, 5), (3, 2, 3, 3), {"padding": "same"}),
    "same_even": ((2, 2, 6, 5), (3, 2, 4, 2), {"padding": "same"}),
    "same_dilated": ((1, 2, 7, 7), (2, 2, 2, 3), {"padding": "same", "dilation": 2}),
    "valid": ((2, 2, 6, 5), (3, 2, 3, 2), {"padding": "valid"}),
    "odd": ((3, 3, 11, 7), (2, 3, 3, 2), {"stride": 3, "padding": 2}),
    "stride_larger_than_kernel": ((2, 2, 9, 8), (3, 2, 2, 2), {"stride": (4, 3)}),
}


# Every geometry with a bias; without one (no bias gradient, another epilogue) a few geometries in
# make test, the rest in make test-long: the bias changes no index arithmetic.
NO_BIAS_IN_MAKE_TEST = ("basic", "stride2_pad1", "groups", "depthwise")
CONV2D_PARAMS = [pytest.param(case, bias, id=f"{case}-{'bias' if bias else 'no_bias'}",
                              marks=() if bias or case in NO_BIAS_IN_MAKE_TEST else pytest.mark.long)
                 for case in CONV2D_CASES for bias in (True, False)]


@pytest.mark.parametrize("case, bias", CONV2D_PARAMS)
def test_conv2d(case, bias):
    x_shape, w_shape, kwargs = CONV2D_CASES[case]
    inputs = {"x": normal(x_shape, 300), "w": normal(w_shape, 301, 0.5)}
    if bias:
        inputs["b"] = normal((w_shape[0],), 302)
        conv_parity(lambda F, x, w, b: F.conv2d(x, w, b, **kwargs), inputs, ("x", "w", "b"))
    else:
        conv_parity(lambda F, x, w: F.conv2d(x, w, **kwargs), inputs, ("x", "w"))


@pytest.mark.parametrize("case", list(CONV2D_CASES))
def test_conv2d_weight_gradient_in_kernel(case, monkeypatch):
    """The weight gradient's in-kernel products (bendc/ops/conv.py _CPU_CONV_GRAD_WEIGHT: per block of
    samples, each sample's columns @ g^T added in sample order) for every geometry, with the
    threshold that picks them lowered to 0 (at the real one only large convs take them)."""
    from bendc.ops import conv

    monkeypatch.setattr(conv, "GRAD_WEIGHT_IN_KERNEL", 0)
    x_shape, w_shape, kwargs = CONV2D_CASES[case]
    inputs = {"x": normal(x_shape, 310), "w": normal(w_shape, 311, 0.5)}
    conv_parity(lambda F, x, w: F.conv2d(x, w, **kwargs), inputs, ("x", "w"))


def test_conv2d_weight_gradient_in_kernel_blocks():
    """The MNIST net's conv2 geometry at a batch of 19: past the threshold, the samples split in 16
    parallel blocks of uneven sizes, their partial sums added in block order. The weight gradient sums
    19 x 144 terms: torch's float32 is 3e-5 (relative) off the reference's float64 there, so 1e-4."""
    inputs = {"x": normal((19, 8, 14, 14), 312), "w": normal((16, 8, 3, 3), 313, 0.5)}
    parity(lambda F, x, w: F.conv2d(x, w), inputs, ("x", "w"), rtol=1e-4, atol=1e-4)


def test_conv2d_unbatched_and_positional():
    inputs = {"x": normal((3, 6, 5), 303), "w": normal((2, 3, 3, 3), 304), "b": normal((2,), 305)}
    conv_parity(lambda F, x, w, b: F.conv2d(x, w, b, 1, 1), inputs, ("x", "w", "b"))


def test_conv2d_weight_only_leaf():
    """A frozen input: no input-gradient product is built, the weight still gets its gradient."""
    inputs = {"x": normal((2, 3, 6, 6), 306), "w": normal((4, 3, 3, 3), 307)}
    conv_parity(lambda F, x, w: F.conv2d(x, w, padding=1), inputs, ("w",))


# ------------------------------------------------------------------ conv1d
CONV1D_CASES = {
    "basic": ((2, 3, 10), (4, 3, 3), {}),
    "stride_pad": ((2, 3, 11), (4, 3, 3), {"stride": 2, "padding": 1}),
    "dilated_groups": ((2, 4, 12), (6, 2, 3), {"dilation": 2, "groups": 2, "padding": 2}),
    "same_even": ((1, 2, 9), (3, 2, 4), {"padding": "same"}),
    "one": ((3, 5, 7), (2, 5, 1), {}),
}


@pytest.mark.parametrize("case", list(CONV1D_CASES))
def test_conv1d(case):
    x_shape, w_shape, kwargs = CONV1D_CASES[case]
    inputs = {"x": normal(x_shape, 310), "w": normal(w_shape, 311, 0.5), "b": normal((w_shape[0],), 312)}
    conv_parity(lambda F, x, w, b: F.conv1d(x, w, b, **kwargs), inputs, ("x", "w", "b"))


# ------------------------------------------------------------------ pools
MAX_POOL_CASES = {
    "two": ((2, 3, 8, 8), {"kernel_size": 2}),
    "odd_floor": ((2, 3, 7, 9), {"kernel_size": 2}),
    "three_stride2_pad1": ((2, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    "ceil": ((1, 3, 7, 8), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    "ceil_pad": ((2, 2, 6, 5), {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True}),
    "dilated": ((2, 2, 9, 8), {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 1), "dilation": (2, 1)}),
    "overlapping": ((1, 2, 6, 6), {"kernel_size": 3, "stride": 1}),
    "whole": ((2, 3, 5, 4), {"kernel_size": (5, 4)}),
    "one": ((2, 2, 3, 4), {"kernel_size": 1}),
    # the tiled gradient's work items hold 32 planes (conv.py POOL_GRAD_PLANES): two and a part
    "many_planes": ((5, 15, 6, 6), {"kernel_size": 2}),
    "three_tiled_leftover": ((3, 13, 10, 11), {"kernel_size": 3}),
}


@pytest.mark.parametrize("case", list(MAX_POOL_CASES))
def test_max_pool2d(case):
    shape, kwargs = MAX_POOL_CASES[case]
    parity(lambda F, x: F.max_pool2d(x, **kwargs), {"x": normal(shape, 320)}, ("x",), exact=True)


@pytest.mark.parametrize("case", ["two", "three_stride2_pad1", "overlapping", "ceil_pad", "dilated", "many_planes",
                                  "three_tiled_leftover"])
def test_max_pool2d_ties_go_to_the_first_max(case):
    """Few distinct values: most windows hold several maxima; torch routes the gradient to the first."""
    shape, kwargs = MAX_POOL_CASES[case]
    x = np.random.default_rng(321).integers(-1, 2, size=shape).astype(np.float32)
    parity(lambda F, x: F.max_pool2d(x, **kwargs), {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("case", ["two", "three_stride2_pad1", "many_planes", "three_tiled_leftover"])
def test_max_pool2d_nan_wins_and_routes_the_gradient(case):
    """A NaN in a window is its max, and the last NaN takes the gradient, as torch's CPU kernel
    (``val > max || isnan(val)``; the cpu kernels select on that test, branch-free)."""
    shape, kwargs = MAX_POOL_CASES[case]
    x = normal(shape, 322)
    flat = x.reshape(-1)
    flat[np.random.default_rng(323).choice(flat.size, flat.size // 7, replace=False)] = np.nan
    parity(lambda F, x: F.max_pool2d(x, **kwargs), {"x": x}, ("x",), exact=True)


def test_max_pool2d_all_equal_and_negative_infinity():
    x = np.full((1, 1, 4, 4), -np.inf, np.float32)
    x[0, 0, 3, 3] = 2.0
    parity(lambda F, x: F.max_pool2d(x, 2, padding=1), {"x": x}, ("x",), exact=True)
    parity(lambda F, x: F.max_pool2d(x, 3, stride=1), {"x": np.ones((2, 2, 5, 5), np.float32)}, ("x",), exact=True)


AVG_POOL_CASES = {
    "two": ((2, 3, 8, 8), {"kernel_size": 2}),
    "odd": ((2, 3, 7, 9), {"kernel_size": (2, 3)}),
    "pad_included": ((2, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    "pad_excluded": ((2, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    "ceil": ((1, 3, 7, 8), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    "ceil_pad_excluded": ((2, 2, 6, 5), {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True,
                                         "count_include_pad": False}),
    "ceil_pad_included": ((2, 2, 6, 5), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    "overlapping": ((1, 2, 6, 6), {"kernel_size": 3, "stride": 1}),
    "whole": ((2, 3, 5, 4), {"kernel_size": (5, 4)}),
}


@pytest.mark.parametrize("case", list(AVG_POOL_CASES))
def test_avg_pool2d(case):
    shape, kwargs = AVG_POOL_CASES[case]
    parity(lambda F, x: F.avg_pool2d(x, **kwargs), {"x": normal(shape, 330)}, ("x",), exact=True)


ADAPTIVE_CASES = {
    "divisible": ((2, 3, 8, 8), (4, 4)),
    "uneven": ((2, 3, 7, 9), (3, 4)),
    "same_size": ((1, 2, 5, 5), (5, 5)),
    "larger_than_input": ((1, 2, 3, 5), (4, 7)),
    "none_keeps": ((2, 2, 6, 5), (3, None)),
    "global": ((2, 4, 6, 5), 1),
}


@pytest.mark.parametrize("case", list(ADAPTIVE_CASES))
def test_adaptive_avg_pool2d(case):
    shape, size = ADAPTIVE_CASES[case]
    if case == "global":
        parity(lambda F, x: F.adaptive_avg_pool2d(x, size), {"x": normal(shape, 340)}, ("x",),
               rtol=ADAPTIVE_RTOL, atol=ADAPTIVE_ATOL)
    else:
        parity(lambda F, x: F.adaptive_avg_pool2d(x, size), {"x": normal(shape, 340)}, ("x",), exact=True)


def test_pools_unbatched():
    x = {"x": normal((3, 6, 7), 341)}
    parity(lambda F, x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2), x, ("x",), exact=True)


# ------------------------------------------------------------------ a small network, end to end
def test_conv_block_chain():
    """conv -> relu -> max pool -> conv (groups) -> avg pool -> global pool: every leaf's gradient."""
    def body(F, x, w1, b1, w2, b2):
        h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
        h = F.avg_pool2d(F.conv2d(h, w2, b2, padding=1, groups=2), 2, ceil_mode=True)
        return F.adaptive_avg_pool2d(h, 1).sum()

    inputs = {"x": normal((3, 2, 10, 9), 350), "w1": normal((4, 2, 3, 3), 351, 0.5), "b1": normal((4,), 352),
              "w2": normal((6, 2, 3, 3), 353, 0.5), "b2": normal((6,), 354)}
    conv_parity(body, inputs, ("x", "w1", "b1", "w2", "b2"))


def test_torch_modules_through_functional_call(target):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding="same"), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(4, 4, 2, groups=2), torch.nn.AvgPool2d(2, ceil_mode=True),
                                torch.nn.AdaptiveAvgPool2d((1, 1)))
    x = normal((2, 3, 9, 8), 355)

    @bendc.jit(leaves=("params",), target=target)
    def step(params, x):
        out = bendc.functional_call(model, params, x)
        loss = (out * out).sum()
        loss.backward()
        return loss, {name: value.grad for name, value in params.items()}

    loss, grads = step(bendc.params(model), x)
    expected = (model(torch.from_numpy(x)) ** 2).sum()
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=CONV_RTOL, atol=CONV_ATOL)
    for name, parameter in model.named_parameters():
        np.testing.assert_allclose(grads[name], parameter.grad.numpy(), rtol=CONV_RTOL, atol=CONV_ATOL)


# ------------------------------------------------------------------ bad input
def _raises(fn, args, kind, *words):
    assert_user_error(fn, args, kind, "test_conv.py", *words)


def test_bad_input_is_a_bendc_error_naming_line_op_and_shapes():
    x, w = normal((2, 6, 5, 5), 360), normal((4, 3, 3, 3), 361)
    shape_error = bendc.errors.ShapeError
    _raises(lambda x, w: BF.conv2d(x, w, groups=4), (x, w), shape_error, "conv2d", "groups=4", "f32[2,6,5,5]",
            "f32[4,3,3,3]")
    _raises(lambda x, w: BF.conv2d(x, w), (x, normal((4, 4, 3, 3), 362)), shape_error, "conv2d",
            "f32[4,4,3,3]", "6 input channels per group")
    _raises(lambda x, w: BF.conv2d(x, w), (x, normal((4, 6, 7, 2), 363)), shape_error, "conv2d",
            "larger than the padded input", "f32[4,6,7,2]")
    _raises(lambda x, w: BF.conv2d(x, w, padding=1), (x, normal((4, 6, 8, 8), 364)), shape_error, "conv2d",
            "larger than the padded input")
    _raises(lambda x, w, b: BF.conv2d(x, w, b), (x, normal((4, 6, 3, 3), 365), normal((3,), 366)), shape_error,
            "conv2d", "bias", "f32[3]")
    _raises(lambda x, w: BF.conv2d(x, w, stride=2, padding="same"), (x, normal((4, 6, 3, 3), 367)), shape_error,
            "conv2d", "same")
    _raises(lambda x, w: BF.conv1d(x, w), (normal((2, 3, 4), 368), normal((2, 3, 5), 369)), shape_error,
            "conv1d", "larger than the padded input")
    _raises(lambda x: BF.max_pool2d(x, 7), (x,), shape_error, "max_pool2d", "larger than the padded input",
            "f32[2,6,5,5]")
    _raises(lambda x: BF.max_pool2d(x, 2, padding=2), (x,), shape_error, "max_pool2d", "at most half")
    _raises(lambda x: BF.avg_pool2d(x.reshape(2, 150), 2), (x,), shape_error, "avg_pool2d", "f32[2,150]")
    _raises(lambda x: BF.max_pool2d(x, 2, return_indices=True), (x,), bendc.errors.UnsupportedError,
            "max_pool2d", "return_indices")
