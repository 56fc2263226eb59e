"""group_norm and group_norm_grad (bendc/ops/group_norm.py) against PyTorch eager, on every target.

Tolerances. bendc computes each row in float64 and rounds once; PyTorch computes the same
formulas in float32, whose own error shows where a gradient nearly cancels (dx of groups of two
elements is ~1e-4 off the exact result in PyTorch). So each result must agree with float32
PyTorch within the conftest tolerances (RTOL 1e-5, ATOL 1e-6) plus PyTorch's own error at that
element (its distance from PyTorch in float64), and be no farther from float64 PyTorch than
float32 PyTorch is (``assert_as_close_as_torch``, tests/conftest.py). Where a group is nearly constant (x = 1000 + 1e-3 * noise)
PyTorch's float32 cancels (x * scale + (b - scale * mean) forward, ds - db * mean backward): its
dweight is off by ~10% there. Those cases are compared with PyTorch in float64 (the exact result,
to float32's rounding: NEAR_RTOL of the largest magnitude), and bendc's error must not exceed
float32 PyTorch's. A group of one element normalizes to exactly 0 in bendc; PyTorch keeps a
residue of a few ulp of x / sqrt(eps) (ONE_ELEMENT_*, as in tests/ops/test_norms.py).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from bendc.builder import Builder
from bendc.errors import ShapeError
from bendc.ir.graph import Graph
from bendc.ir.types import TensorType
from bendc.ops import OPS
from conftest import ATOL, assert_as_close_as_torch, assert_bitwise, assert_close
from parity_harness import normal, target  # noqa: F401  (target: the autouse fixture)

ONE_ELEMENT_ATOL = 2e-4
NEAR_RTOL = 1e-6  # of the largest magnitude of each result, against float64 PyTorch
NAMES = ("y", "dx", "dweight", "dbias")


def _bendc(target: str, x, w, b, g, groups: int, weight: bool, bias: bool, eps: float, leaves=("x", "w", "b")):
    """y, dx, dweight, dbias (None where not asked for) from one bendc step on ``target``."""
    def step(x, w, b, g):
        y = BF.group_norm(x, groups, w if weight else None, b if bias else None, eps)
        y.backward(g)
        return (y,) + tuple(v.grad if name in leaves else None for name, v in (("x", x), ("w", w), ("b", b)))

    jitted = bendc.jit(step, leaves=leaves, target=target)
    return [None if v is None else np.asarray(v) for v in jitted(x, w, b, g)], jitted


def _torch(x, w, b, g, groups: int, weight: bool, bias: bool, eps: float, dtype=torch.float32):
    """The same through torch; a bias without a weight runs with a constant weight of ones (torch
    2.13's backward fails on a bias without a weight: "tensor does not have a device")."""
    xt, wt, bt = (torch.tensor(v, dtype=dtype, requires_grad=True) for v in (x, w, b))
    ones = torch.ones(x.shape[1], dtype=dtype)
    y = torch.nn.functional.group_norm(xt, groups, wt if weight else (ones if bias else None),
                                       bt if bias else None, eps)
    y.backward(torch.tensor(g, dtype=dtype))
    grads = [xt.grad, wt.grad if weight else None, bt.grad if bias else None]
    return [y.detach().numpy()] + [None if v is None else v.numpy() for v in grads]


def _inputs(shape, seed: int, scale: float = 2.0, offset: float = -0.5):
    channels = shape[1]
    return (normal(shape, seed, scale) + np.float32(offset), normal((channels,), seed + 1),
            normal((channels,), seed + 2), normal(shape, seed + 3))


def _compare(target, shape, groups, weight=True, bias=True, eps=1e-5, seed=300, atol=ATOL, inputs=None):
    x, w, b, g = inputs if inputs is not None else _inputs(shape, seed)
    got, jitted = _bendc(target, x, w, b, g, groups, weight, bias, eps)
    single = _torch(x, w, b, g, groups, weight, bias, eps)
    exact = _torch(x, w, b, g, groups, weight, bias, eps, torch.float64)
    for name, mine, theirs, want in zip(NAMES, got, single, exact):
        if theirs is None:
            assert mine is None, name
        else:
            assert_as_close_as_torch(name, mine, theirs, want, atol)
    return got, jitted


# ------------------------------------------------------------------ parity with torch
CASES = {
    # name: (x shape, groups)
    "NC": ((3, 6), 3),
    "NC_one_group": ((3, 6), 1),
    "NCL": ((2, 4, 5), 2),
    "NCL_C_groups": ((2, 4, 5), 4),
    "NCHW": ((2, 6, 3, 4), 3),
    "NCHW_one_group": ((2, 6, 3, 4), 1),
    "NCHW_C_groups": ((2, 6, 3, 4), 6),
    "NCDHW": ((2, 4, 3, 2, 5), 2),
    "odd": ((3, 15, 7, 3), 5),          # rows of 63: 7 full lane blocks and a tail of 7
    "long_rows": ((2, 4, 37, 11), 2),   # rows of 814, channels of 407
    "parallel": ((4, 8, 48, 48), 4),    # 73728 elements: the cpu kernels' prange path
    "example": ((64, 16, 8, 8), 4),     # examples/cnn.py's second block
}


@pytest.mark.parametrize("case", list(CASES))
def test_group_norm_matches_torch(target, case):
    shape, groups = CASES[case]
    _compare(target, shape, groups)


def test_group_norm_one_element_groups(target):
    """G = C on (N, C): each group is one element, normalized to exactly 0 (y = bias); dx, PyTorch's
    formula in float64, cancels to within 1e-12 of 0."""
    got, _ = _compare(target, (3, 6), 6, atol=ONE_ELEMENT_ATOL)
    x, w, b, g = _inputs((3, 6), 300)
    assert_bitwise(got[0], np.broadcast_to(b, (3, 6)), "y is the bias")
    assert np.abs(got[1]).max() < 1e-12, got[1]


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("shape, groups", [((2, 6, 5), 3), ((3, 4, 2, 3), 1)])
def test_group_norm_partial_affine(target, affine, shape, groups):
    _compare(target, shape, groups, *affine)


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.5])
def test_group_norm_eps(target, eps):
    """eps matters where the variance is small: groups of scale 0.01 here."""
    x, w, b, g = _inputs((3, 4, 5, 2), 310, scale=0.01, offset=0.0)
    _compare(target, (3, 4, 5, 2), 2, eps=eps, inputs=(x, w, b, g))


@pytest.mark.parametrize("shape, groups", [((4, 8, 8, 8), 2), ((3, 6, 17), 3)])
def test_group_norm_near_constant_groups(target, shape, groups):
    """x = 1000 + 1e-3 * noise: against float64 PyTorch (the exact result), bendc within NEAR_RTOL
    and no farther than float32 PyTorch (which cancels: its dweight is off by ~10% here)."""
    rng = np.random.default_rng(320)
    x = (1000.0 + 1e-3 * rng.standard_normal(shape)).astype(np.float32)
    _, w, b, g = _inputs(shape, 321)
    got, _ = _bendc(target, x, w, b, g, groups, True, True, 1e-5)
    exact = _torch(x, w, b, g, groups, True, True, 1e-5, torch.float64)
    single = _torch(x, w, b, g, groups, True, True, 1e-5)
    for name, mine, want, theirs in zip(NAMES, got, exact, single):
        error = np.abs(mine.astype(np.float64) - want).max()
        torch_error = np.abs(theirs.astype(np.float64) - want).max()
        assert error <= NEAR_RTOL * np.abs(want).max(), (name, error, np.abs(want).max())
        assert error <= torch_error, (name, error, torch_error)


def test_group_norm_cpu_matches_reference_bitwise(target):
    """The cpu kernels sum in the reference's order (LANES partial sums, a tail, a fixed tree;
    samples in order): the same bits, also on the prange path and with a strided input."""
    if target != "cpu":
        pytest.skip("compares the cpu kernels with the reference")
    for shape, groups in [((3, 15, 7, 3), 5), ((4, 8, 48, 48), 4), ((2, 4, 5), 4)]:
        x, w, b, g = _inputs(shape, 330)
        got, _ = _bendc("cpu", x, w, b, g, groups, True, True, 1e-5)
        want, _ = _bendc("reference", x, w, b, g, groups, True, True, 1e-5)
        for name, mine, theirs in zip(NAMES, got, want):
            assert_bitwise(mine, theirs, f"{name} of {shape}")

    def transposed(x, w, b, g):
        y = BF.group_norm(x.transpose(0, 1), 2, w, b)
        y.backward(g)
        return y, x.grad, w.grad, b.grad

    args = (normal((6, 4, 5), 331), normal((6,), 332), normal((6,), 333), normal((4, 6, 5), 334))
    cpu = bendc.jit(transposed, leaves=("x", "w", "b"), target="cpu")(*args)
    reference = bendc.jit(transposed, leaves=("x", "w", "b"), target="reference")(*args)
    for name, mine, theirs in zip(NAMES, cpu, reference):
        assert_bitwise(np.asarray(mine), np.asarray(theirs), f"{name} of a transposed input")


# ------------------------------------------------------------------ the IR: one op each way
def test_group_norm_is_one_op_each_way(target):
    """Forward one group_norm, backward one group_norm_grad whose packed result views take apart;
    only the gradients asked for are computed."""
    x, w, b, g = _inputs((2, 8, 3, 5), 340)
    _, jitted = _compare(target, (2, 8, 3, 5), 4)
    final = jitted.ir("final")
    assert final.count("= group_norm[") == 1 and final.count("= group_norm_grad[") == 1, final
    assert not re.search(r"= (sum|sum_to_size|sqrt|sub)[\[ ]", final), final  # no composed statistics
    assert "grad_affine=True, grad_input=True" in final, final
    if target == "cpu":  # two row kernels; the one other kernel is backward(g)'s seed product
        report = jitted.report()
        assert len(re.findall(r"\[cpu\] group_norm(_grad)?\d+: row,", report)) == 2, report
        assert jitted.stats()["launches"] == 3, report

    # x not a leaf: only dweight and dbias; w and b not leaves: only dx (the op's whole result)
    for leaves, flags in ((("w", "b"), "grad_affine=True, grad_input=False"),
                          (("x",), "grad_affine=False, grad_input=True")):
        got, jitted = _bendc(target, x, w, b, g, 4, True, True, 1e-5, leaves=leaves)
        want = _torch(x, w, b, g, 4, True, True, 1e-5)
        assert flags in jitted.ir("final"), jitted.ir("final")
        for name, mine, theirs, leaf in zip(NAMES[1:], got[1:], want[1:], ("x", "w", "b")):
            if leaf in leaves:
                assert_close(mine, theirs, name)
            else:
                assert mine is None, name


def test_group_norm_through_torch_spellings(target):
    """nn.GroupNorm through bendc.functional_call and torch.nn.functional.group_norm (through
    __torch_function__) trace to the same op: values and gradients as torch's."""
    torch.manual_seed(0)
    model = torch.nn.GroupNorm(3, 6, eps=1e-4)
    with torch.no_grad():
        model.weight.normal_()
        model.bias.normal_()
    params = bendc.params(model)
    x, _, _, g = _inputs((2, 6, 4), 350)

    @bendc.jit(leaves=("params", "x"), target=target)
    def step(params, x, g):
        y = bendc.functional_call(model, params, x)
        z = torch.nn.functional.group_norm(x, 2, params["weight"], None)
        ((y * g).sum() + (z * z).sum()).backward()
        return y, x.grad, bendc.tree.map(lambda p: p.grad, params)

    y, dx, grads = step(params, x, g)
    xt = torch.tensor(x, requires_grad=True)
    want = model(xt)
    ((want * torch.tensor(g)).sum() + (torch.nn.functional.group_norm(xt, 2, model.weight, None) ** 2).sum()).backward()
    assert_close(np.asarray(y), want.detach().numpy(), "y")
    assert_close(np.asarray(dx), xt.grad.numpy(), "dx")
    for name, p in model.named_parameters():
        assert_close(np.asarray(grads[name]), p.grad.numpy(), f"d{name}")


# ------------------------------------------------------------------ errors
def test_group_norm_op_errors_name_the_shapes():
    graph = Graph()
    builder = Builder(graph)
    x, w = (graph.add("param", (), {"name": name, "leaf": False, "dtype": "f32", "shape": shape},
                      TensorType("f32", shape)).id for name, shape in (("x", (2, 6, 4)), ("w", (4,))))
    with pytest.raises(ShapeError, match=r"weight must be of shape \[6\].*f32\[4\]"):
        builder.emit("group_norm", (x, w), groups=3, eps=1e-5, weight=True, bias=False)
    with pytest.raises(ShapeError, match="groups 4 must be a positive int dividing the 6 channels"):
        builder.emit("group_norm", (x,), groups=4, eps=1e-5, weight=False, bias=False)
    with pytest.raises(ShapeError, match="takes x, weight, bias: 3 operands, got 2"):
        builder.emit("group_norm", (x, w), groups=3, eps=1e-5, weight=True, bias=True)
    with pytest.raises(ShapeError, match="computes nothing"):
        builder.emit("group_norm_grad", (x, x), groups=3, eps=1e-5, weight=False, grad_input=False,
                     grad_affine=False)
    assert OPS["group_norm_grad"].no_vjp


def test_group_norm_empty_inputs(target):
    """No spatial elements: torch's values (dweight NaN from the empty groups' 0/0 mean, dbias 0).
    No samples: dweight and dbias are sums over no samples, 0 (torch 2.13 gives NaN for dweight)."""
    for shape in ((2, 4, 0), (0, 4, 3)):
        x, g = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        w, b = normal((4,), 360), normal((4,), 361)
        got, _ = _bendc(target, x, w, b, g, 2, True, True, 1e-5)
        assert [v.shape for v in got] == [shape, shape, (4,), (4,)]
        assert_bitwise(got[3], np.zeros(4, np.float32), f"dbias of {shape}")
        if shape[0]:
            want = _torch(x, w, b, g, 2, True, True, 1e-5)
            assert np.isnan(got[2]).all() and np.isnan(want[2]).all(), (got[2], want[2])
        else:
            assert_bitwise(got[2], np.zeros(4, np.float32), f"dweight of {shape}")
