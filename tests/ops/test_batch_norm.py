"""Training batch norm's fused ops (bendc/ops/batch_norm.py: batch_norm, batch_norm_grad,
batch_norm_stats) against PyTorch eager, on every target.

Tolerances, as tests/ops/test_group_norm.py's: bendc computes each channel in float64 and rounds
once; PyTorch computes in float32 (x * alpha + beta forward), so each result must agree with float32
PyTorch within the conftest tolerances plus PyTorch's own error at that element (its distance from
PyTorch in float64), and be no farther from float64 PyTorch than float32 PyTorch is (``assert_as_close_as_torch``, tests/conftest.py),
the updated running statistics included.
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
from bendc.ops.batch_norm import CHANNEL_BLOCK
from conftest import assert_as_close_as_torch, assert_bitwise, child_report
from parity_harness import normal, target  # noqa: F401  (target: the autouse fixture)

NAMES = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")
MOMENTUM = 0.3


def _bendc(target: str, x, w, b, g, weight=True, bias=True, eps=1e-5, leaves=("x", "w", "b")):
    """y, dx, dweight, dbias (None where not asked for), the updated running mean and variance."""
    def step(x, w, b, g, mean, var):
        y = BF.batch_norm(x, mean, var, w if weight else None, b if bias else None, True, MOMENTUM, eps)
        y.backward(g)
        return (y,) + tuple(v.grad if name in leaves else None for name, v in (("x", x), ("w", w), ("b", b))) + (
            mean, var)

    jitted = bendc.jit(step, leaves=leaves, target=target)
    stats = (normal((x.shape[1],), 7), np.abs(normal((x.shape[1],), 8)) + np.float32(0.5))
    return [None if v is None else np.asarray(v) for v in jitted(x, w, b, g, *stats)], jitted


def _torch(x, w, b, g, weight=True, bias=True, eps=1e-5, dtype=torch.float32):
    xt, wt, bt = (torch.tensor(v, dtype=dtype, requires_grad=True) for v in (x, w, b))
    mean = torch.tensor(normal((x.shape[1],), 7), dtype=dtype)
    var = torch.tensor(np.abs(normal((x.shape[1],), 8)) + np.float32(0.5), dtype=dtype)
    y = torch.nn.functional.batch_norm(xt, mean, var, wt if weight else None, bt if bias else None, True,
                                       MOMENTUM, eps)
    y.backward(torch.tensor(g, dtype=dtype))
    grads = [xt.grad, wt.grad if weight else None, bt.grad if bias else None]
    return [y.detach().numpy()] + [None if v is None else v.numpy() for v in grads] + [mean.numpy(), var.numpy()]


def _inputs(shape, seed: int, scale: float = 2.0, offset: float = -0.5):
    channels = shape[1]
    return (normal(shape, seed, scale) + np.float32(offset), normal((channels,), seed + 1),
            normal((channels,), seed + 2), normal(shape, seed + 3))


def _compare(target, shape, weight=True, bias=True, eps=1e-5, seed=400, inputs=None):
    x, w, b, g = inputs if inputs is not None else _inputs(shape, seed)
    got, jitted = _bendc(target, x, w, b, g, weight, bias, eps)
    single = _torch(x, w, b, g, weight, bias, eps)
    exact = _torch(x, w, b, g, weight, bias, eps, torch.float64)
    for name, mine, theirs, want in zip(NAMES, got, single, exact):
        if theirs is None:
            assert mine is None, name
        else:
            assert_as_close_as_torch(name, mine, theirs, want)
    return got, jitted


# the cpu kernels: runs of S >= LANES one channel a prange cell ("wide"); shorter runs samples outer,
# blocks of CHANNEL_BLOCK channels inner ("narrow")
CASES = {
    "NC": (8, 6),                                 # BatchNorm1d over (N, C): S = 1, narrow
    "NC_two_blocks": (5, CHANNEL_BLOCK + 6),      # narrow, a second channel block
    "NCL": (4, 3, 5),                             # narrow, runs of 5
    "NCHW": (4, 3, 8, 8),                         # wide, runs of 64: two full lane blocks
    "odd": (3, 5, 7, 5),                          # wide, runs of 35: one lane block and a tail of 3
    "NCDHW": (2, 4, 3, 2, 6),                     # wide, runs of 36
    "parallel": (16, 8, 24, 24),                  # 73728 elements: the prange path
}


@pytest.mark.parametrize("case", list(CASES))
def test_batch_norm_matches_torch(target, case):
    _compare(target, CASES[case])


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("shape", [(6, 3, 4), (3, 2, 6, 6)])
def test_batch_norm_partial_affine(target, affine, shape):
    _compare(target, shape, *affine)


@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_batch_norm_eps(target, eps):
    x, w, b, g = _inputs((5, 4, 3), 410, scale=0.01, offset=0.0)
    _compare(target, (5, 4, 3), eps=eps, inputs=(x, w, b, g))


def test_batch_of_two_nearly_equal_values_normalizes_antisymmetrically(target):
    """Two samples of a channel normalize to exactly -y and y: the mean, the deviations and the
    products are float64. Composed of float32 ops (before bendc/ops/batch_norm.py), the mean's
    rounding times rstd (~50 here) left 3e-6 between them (fuzz program 16168), 16x torch's error;
    the next norm's running mean then fell outside the fuzz's tolerance."""
    x = np.array([[0.90123105, 0.2, -1.0, 5.0], [0.8646664, 0.2000001, -1.0001, 5.0003]], np.float32)
    w, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    g = normal((2, 4), 420)
    got, _ = _bendc(target, x, w, b, g)
    assert_bitwise(got[0][0], -got[0][1], "y[0] = -y[1]")
    exact = _torch(x, w, b, g, dtype=torch.float64)
    for name, mine, want in zip(NAMES[:4], got, exact):
        np.testing.assert_allclose(mine, want, rtol=2 ** -23, atol=0, err_msg=name)  # one rounding


def test_batch_norm_cpu_matches_reference_bitwise(target):
    """The cpu kernels sum in the reference's order (each sample's run through LANES partial sums,
    the samples in order): the same bits on both kernel shapes, the prange path and partial gradients."""
    if target != "cpu":
        pytest.skip("compares the cpu kernels with the reference")
    for shape in ((5, CHANNEL_BLOCK + 6), (4, 3, 5), (3, 5, 7, 5), (16, 8, 24, 24)):
        x, w, b, g = _inputs(shape, 430)
        for leaves in (("x", "w", "b"), ("w",), ("x",)):
            got, _ = _bendc("cpu", x, w, b, g, leaves=leaves)
            want, _ = _bendc("reference", x, w, b, g, leaves=leaves)
            for name, mine, theirs in zip(NAMES, got, want):
                if theirs is None:
                    assert mine is None, name
                else:
                    assert_bitwise(mine, theirs, f"{name} of {shape}, leaves {leaves}")


def test_batch_norm_bits_do_not_depend_on_the_thread_count(tmp_path):
    """A channel's sums run in one thread, in a fixed order: 1 and 3 threads give the same bits."""
    code = f"""
import json, sys
import numpy as np
import bendc, bendc.functional as BF
rng = np.random.default_rng(440)
out = {{}}
for shape in ((16, 8, 24, 24), (512, 2 * {CHANNEL_BLOCK} + 3)):
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    def step(x, w, g):
        y = BF.batch_norm(x, None, None, w, None, True)
        y.backward(g)
        return y, x.grad, w.grad
    y, dx, dw = bendc.jit(step, leaves=("x", "w"), target="cpu", cache_dir=sys.argv[1])(x, w, g)
    out[str(shape)] = [np.asarray(v).tobytes().hex() for v in (y, dx, dw)]
print(json.dumps(out))
"""
    one = child_report(code, str(tmp_path / "one"), threads="1")
    three = child_report(code, str(tmp_path / "three"), threads="3")
    assert one == three


# ------------------------------------------------------------------ the IR
def test_batch_norm_is_one_op_each_way(target):
    """Forward one batch_norm (and one batch_norm_stats for the running statistics), backward one
    batch_norm_grad whose packed result views take apart; only the gradients asked for."""
    x, w, b, g = _inputs((4, 6, 3, 5), 450)
    _, jitted = _compare(target, (4, 6, 3, 5))
    final = jitted.ir("final")
    for op in ("batch_norm", "batch_norm_stats", "batch_norm_grad"):
        assert len(re.findall(rf"= {op}[\[ ]", final)) == 1, (op, final)
    assert "grad_affine=True, grad_input=True" in final, final
    assert not re.search(r"= (sum|sqrt|sub)[\[ ]", final), final  # no composed statistics
    for leaves, flags in ((("w", "b"), "grad_affine=True, grad_input=False"),
                          (("x",), "grad_affine=False, grad_input=True")):
        got, jitted = _bendc(target, x, w, b, g, leaves=leaves)
        assert flags in jitted.ir("final"), jitted.ir("final")
        want = _torch(x, w, b, g)
        for name, mine, theirs, leaf in zip(NAMES[1:4], got[1:4], want[1:4], ("x", "w", "b")):
            if leaf in leaves:
                np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5, err_msg=name)
            else:
                assert mine is None, name


def test_batch_norm_op_errors_name_the_shapes():
    graph = Graph()
    builder = Builder(graph)
    x, w = (graph.add("param", (), {"name": name, "leaf": False, "dtype": "f32", "shape": shape},
                      TensorType("f32", shape)).id for name, shape in (("x", (2, 6, 4)), ("w", (4,))))
    with pytest.raises(ShapeError, match=r"weight must be of shape \[6\].*f32\[4\]"):
        builder.emit("batch_norm", (x, w), eps=1e-5, weight=True, bias=False)
    with pytest.raises(ShapeError, match="takes x, weight, bias: 3 operands, got 2"):
        builder.emit("batch_norm", (x, w), eps=1e-5, weight=True, bias=True)
    with pytest.raises(ShapeError, match="computes nothing"):
        builder.emit("batch_norm_grad", (x, x), eps=1e-5, weight=False, grad_input=False, grad_affine=False)
    assert OPS["batch_norm_grad"].no_vjp and OPS["batch_norm_stats"].no_vjp
