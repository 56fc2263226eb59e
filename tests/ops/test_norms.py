"""layer_norm, group_norm and rope: parity with PyTorch eager (CPU, float32) on every target.

Tolerances. The statistics are float64 sums rounded once, PyTorch's are float
Welford moments: the saved mean and rstd agree to an ulp, and the values and
gradients (dx a combination of row sums, dweight and dbias sums over the rows,
in another order than PyTorch's fused backward) stay within the conftest
tolerances. The exception is a row or group of one element: bendc's
``(x - mean) * rstd`` is exactly 0 there, while PyTorch computes
``x * rstd - mean * rstd`` with rstd = 1/sqrt(eps) = 316 and keeps a residue
of a few ulp of 316 * |x| (``ONE_ELEMENT_*``). rope's forward is + - * only
and matches the torch formula bit for bit, and so does its x gradient (the
inverse rotation); the cos and sin gradients are sums over the leading dims
(bit for bit when there are none).
"""
from __future__ import annotations

import re

import numba
import numpy as np
import pytest

import bendc
import bendc.functional as BF
from bendc.builder import Builder
from bendc.ir.graph import Graph
from bendc.ir.interp import interpret
from bendc.ir.types import TensorType
from bendc.ops import OPS
from conftest import assert_bitwise
from parity_harness import normal, parity, target  # noqa: F401  (target: the autouse fixture)

ONE_ELEMENT_ATOL, ONE_ELEMENT_GRAD_ATOL = 2e-4, 1e-4


def norm_parity(body, inputs, leaves, one_element: bool = False):
    if one_element:
        return parity(body, inputs, leaves, atol=ONE_ELEMENT_ATOL, grad_atol=ONE_ELEMENT_GRAD_ATOL)
    return parity(body, inputs, leaves)


# ------------------------------------------------------------------ layer_norm
LAYER_NORM_CASES = {
    # name: (x shape, normalized_shape)
    "rows": ((5, 7), (7,)),
    "3d_last": ((2, 3, 6), (6,)),
    "3d_two_dims": ((2, 3, 6), (3, 6)),
    "list_shape": ((4, 9), [9]),
    "whole_1d": ((7,), (7,)),
    "one_element": ((4, 1), (1,)),
    "odd": ((3, 5, 11), (5, 11)),
}


@pytest.mark.parametrize("case", list(LAYER_NORM_CASES))
def test_layer_norm(case):
    shape, normalized = LAYER_NORM_CASES[case]
    affine = tuple(normalized)
    inputs = {"x": normal(shape, 200, 2.0) + np.float32(0.5), "w": normal(affine, 201), "b": normal(affine, 202)}
    norm_parity(lambda F, x, w, b: F.layer_norm(x, normalized, w, b), inputs, ("x", "w", "b"),
                one_element=case == "one_element")


def test_layer_norm_of_views():
    """x a transposed view (its rows strided: the kernels read it in place) and a permuted 3-d view
    (its rows reshaped from a layout no strides describe)."""
    inputs = {"x": normal((9, 6), 212, 2.0), "w": normal((9,), 213), "b": normal((9,), 214)}
    norm_parity(lambda F, x, w, b: F.layer_norm(x.transpose(0, 1), (9,), w, b) * x.transpose(0, 1), inputs,
                ("x", "w", "b"))
    inputs = {"x": normal((2, 3, 5), 215, 2.0), "w": normal((5,), 216), "b": normal((5,), 217)}
    norm_parity(lambda F, x, w, b: F.layer_norm(x.permute(1, 0, 2), (5,), w, b) ** 2, inputs, ("x", "w", "b"))


@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_layer_norm_partial_affine(affine):
    inputs = {"x": normal((6, 10), 203)}
    if affine == "none":
        norm_parity(lambda F, x: F.layer_norm(x, (10,)), inputs, ("x",))
    elif affine == "weight":
        inputs["w"] = normal((10,), 204)
        norm_parity(lambda F, x, w: F.layer_norm(x, (10,), weight=w), inputs, ("x", "w"))
    else:
        inputs["b"] = normal((10,), 205)
        norm_parity(lambda F, x, b: F.layer_norm(x, (10,), bias=b), inputs, ("x", "b"))


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.5])
def test_layer_norm_eps(eps):
    """eps matters where the variance is small: rows of scale 0.01 here."""
    inputs = {"x": normal((4, 8), 206, 0.01), "w": normal((8,), 207), "b": normal((8,), 208)}
    norm_parity(lambda F, x, w, b: F.layer_norm(x, (8,), w, b, eps=eps), inputs, ("x", "w", "b"))


def test_layer_norm_scalar_loss_and_constant_input():
    """Through scalar losses (a seed of ones: dx nearly cancels), in a residual; and x a constant."""
    inputs = {"x": normal((3, 16), 209), "w": normal((16,), 210), "b": normal((16,), 211)}
    norm_parity(lambda F, x, w, b: F.layer_norm(x, (16,), w, b).sum(), inputs, ("x", "w", "b"))
    norm_parity(lambda F, x, w, b: F.mse_loss(x + F.layer_norm(x, (16,), w, b), w * x), inputs, ("x", "w", "b"))
    norm_parity(lambda F, x, w, b: F.layer_norm(x, (16,), w, b).tanh(), inputs, ("w", "b"))


def test_layer_norm_output_times_input(target, request):
    """(layer_norm(x) * x).sum(): x's gradient reads the forward output directly."""
    # On cpu the dx kernel holds xhat and reads a row sum that the backward's epilogue kernel
    # computes from xhat: two convex groups that need each other. The fusion pass splits them
    # (break_cycles); this program caught the bug.
    inputs = {"x": normal((3, 16), 212), "w": normal((16,), 213), "b": normal((16,), 214)}
    norm_parity(lambda F, x, w, b: (F.layer_norm(x, (16,), w, b) * x).sum(), inputs, ("x", "w", "b"))


# ------------------------------------------------------------------ group_norm
GROUP_NORM_CASES = {
    # name: (x shape, num_groups)
    "NC_groups": ((3, 6), 3),
    "NC_one_group": ((3, 6), 1),
    "NC_C_groups": ((3, 6), 6),
    "NCL": ((2, 4, 5), 2),
    "NCL_C_groups": ((2, 4, 5), 4),
    "NCHW": ((2, 6, 3, 4), 3),
    "NCHW_one_group": ((2, 6, 3, 4), 1),
    "odd": ((3, 5, 7), 5),
}


@pytest.mark.parametrize("case", list(GROUP_NORM_CASES))
def test_group_norm(case):
    shape, groups = GROUP_NORM_CASES[case]
    channels = shape[1]
    inputs = {"x": normal(shape, 220, 2.0) - np.float32(0.5), "w": normal((channels,), 221),
              "b": normal((channels,), 222)}
    norm_parity(lambda F, x, w, b: F.group_norm(x, groups, w, b), inputs, ("x", "w", "b"),
                one_element=shape[1] == groups and len(shape) == 2)


def test_group_norm_no_affine_and_eps():
    inputs = {"x": normal((2, 4, 3, 2), 223, 0.05)}
    norm_parity(lambda F, x: F.group_norm(x, 2), inputs, ("x",))
    norm_parity(lambda F, x: F.group_norm(x, 2, eps=0.01), inputs, ("x",))


def test_group_norm_weight_only_scalar_loss():
    inputs = {"x": normal((2, 6, 5), 224), "w": normal((6,), 225)}
    norm_parity(lambda F, x, w: (F.group_norm(x, 3, weight=w) * x).sum(), inputs, ("x", "w"))


# ------------------------------------------------------------------ rope
def _tables(t: int, half: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    angles = np.random.default_rng(seed).uniform(-3.0, 3.0, (t, half))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


ROPE_SHAPES = [(3, 4), (2, 3, 4), (2, 3, 5, 6), (1, 2, 7, 10)]


@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=str)
def test_rope_bitwise(shape):
    """Constant tables: the value and x's gradient (the inverse rotation) are bit for bit."""
    cos, sin = _tables(shape[-2], shape[-1] // 2, 230)
    inputs = {"x": normal(shape, 231), "cos": cos, "sin": sin}
    parity(lambda F, x, cos, sin: F.rope(x, cos, sin), inputs, ("x",), exact=True)


@pytest.mark.parametrize("depth, shape", [(16, (2, 5, 3)), (72, (2, 5, 3)), (64, (4, 64, 8))],
                         ids=["pairs in place", "long rows copied", "parallel"])
def test_rope_of_a_transposed_view(depth, shape):
    """q as attention lays it out: (B, T, H, D) transposed to (B, H, T, D), a strided view the cpu
    kernel reads in place up to ROPE_STRIDED_HALF pairs a row (copied contiguous above), its row
    loop in parallel for the last shape; bit for bit, value and gradient."""
    from bendc.ops.norm import ROPE_STRIDED_HALF

    batch, t, heads = shape
    assert (depth // 2 <= ROPE_STRIDED_HALF) == (depth == 16)
    cos, sin = _tables(t, depth // 2, 236)
    inputs = {"x": normal((batch, t, heads, depth), 237), "cos": cos, "sin": sin}
    parity(lambda F, x, cos, sin: F.rope(x.transpose(1, 2), cos, sin), inputs, ("x",), exact=True)


@pytest.mark.parametrize("shape", [(3, 4), (2, 2, 5, 6)], ids=str)
def test_rope_table_leaves(shape):
    """cos and sin as leaves: their gradients sum over the leading dims (bit for bit without any)."""
    cos, sin = _tables(shape[-2], shape[-1] // 2, 232)
    inputs = {"x": normal(shape, 233), "cos": cos, "sin": sin}
    exact = len(shape) == 2
    parity(lambda F, x, cos, sin: F.rope(x, cos, sin), inputs, ("x", "cos", "sin"), exact=True,
           exact_grads=exact)
    parity(lambda F, x, cos, sin: F.rope(x, cos, sin), inputs, ("sin",), exact=True, exact_grads=exact)


def test_rope_of_computed_input_and_chained():
    """rope of a product, rotated twice, in a scalar loss; as in attention, q and k both rotated."""
    cos, sin = _tables(5, 3, 234)
    inputs = {"q": normal((2, 5, 6), 235), "w": normal((2, 5, 6), 236), "cos": cos, "sin": sin}
    body = lambda F, q, w, cos, sin: F.rope(F.rope(q * w, cos, sin), cos, sin) * q  # noqa: E731
    parity(body, inputs, ("q", "w"), exact=True)
    # A scalar loss: the seed reaches rope as a broadcast (stride-0) view.
    parity(lambda F, q, w, cos, sin: F.rope(q * w, cos, sin).sum(), inputs, ("q", "w"), exact_grads=True)


def test_rope_gradient_zeros_are_torchs():
    """The torch formula's slice backward adds each half into +0.0: a -0.0 gradient becomes +0.0."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    cos = np.array([[0.0, 1.0]], dtype=np.float32)
    sin = np.array([[-0.0, 1.0]], dtype=np.float32)
    seed = np.array([[-1.0, 1.0, 1.0, 1.0]], dtype=np.float32)  # g1*cos + g2*sin = -0.0 + -0.0
    inputs = {"x": x, "cos": cos, "sin": sin}
    actual, expected = parity(lambda F, x, cos, sin: F.rope(x, cos, sin), inputs, ("x",), exact=True, seed=seed)
    assert np.asarray(expected.grads["x"]).view(np.int32)[0, 0] == 0  # the torch fact this test relies on


def test_rope_inverse_vjp_matches_central_differences():
    """rope[inverse=True] (only ever a VJP) has a VJP too: checked like the registry checks rope's."""
    rng = np.random.default_rng(237)
    graph = Graph("inverse")
    types = [TensorType("f32", s) for s in ((2, 3, 4), (3, 2), (3, 2))]
    operands = [graph.add("param", (), {"name": f"a{i}", "leaf": False, "dtype": "f32", "shape": t.shape}, t).id
                for i, t in enumerate(types)]
    builder = Builder(graph)
    out = builder.emit("rope", operands, inverse=True)
    g = graph.add("param", (), {"name": "g", "leaf": False, "dtype": "f32", "shape": (2, 3, 4)}, types[0]).id
    contributions = OPS["rope"].vjp(builder, graph.node(out), g, (True, True, True))
    graph.outputs = [builder.sum_to_size(c, t.shape) for c, t in zip(contributions, types)]
    values = [rng.uniform(-1, 1, t.shape).astype(np.float32) for t in types]
    cotangent = rng.uniform(-1, 1, (2, 3, 4)).astype(np.float32)
    grads = interpret(graph, values + [cotangent])
    for position, grad in enumerate(grads):
        direction = rng.uniform(-1, 1, types[position].shape)

        def phi(step: float) -> float:
            moved = list(values)
            moved[position] = (values[position] + step * direction).astype(np.float32)
            return float(np.sum(OPS["rope"].reference(moved, {"inverse": True}).astype(np.float64) * cotangent))

        numeric = (phi(1e-2) - phi(-1e-2)) / 2e-2
        assert abs(numeric - float(np.sum(grad * direction))) <= 1e-3 * (1.0 + abs(numeric)), position


# ------------------------------------------------------------------ errors name the user's line
def _raises(fn, args, kind, *words):
    step = bendc.jit(fn, target="reference")
    with pytest.raises(kind) as info:
        step(*args)
    message = str(info.value)
    assert "test_norms.py" in message, message
    for word in words:
        assert word in message, message


def test_shape_errors():
    x = normal((3, 6), 240)
    _raises(lambda x: BF.layer_norm(x, (5,)), (x,), bendc.errors.ShapeError, "layer_norm", "f32[3,6]", "[5]")
    _raises(lambda x, w: BF.layer_norm(x, (6,), w), (x, normal((5,), 241)), bendc.errors.ShapeError,
            "weight", "f32[5]")
    _raises(lambda x: BF.group_norm(x, 4), (x,), bendc.errors.ShapeError, "group_norm", "4", "6")
    _raises(lambda x: BF.group_norm(x.reshape(18), 1), (x,), bendc.errors.ShapeError, "group_norm", "f32[18]")
    cos, sin = _tables(3, 3, 242)
    _raises(lambda x, c, s: BF.rope(x, c, s), (x, cos[:2], sin[:2]), bendc.errors.ShapeError, "rope",
            "f32[2,3]")
    _raises(lambda x, c, s: BF.rope(x, c, s), (normal((3, 5), 243), cos, sin), bendc.errors.ShapeError,
            "rope", "f32[3,5]")
    _raises(lambda x: BF.layer_norm(x, (6,), eps=x), (x,), bendc.errors.UnsupportedError, "eps")
    _raises(lambda x: BF.layer_norm(x, 6), (x,), bendc.errors.UnsupportedError, "normalized_shape")
    _raises(lambda x: BF.layer_norm(x, ()), (x,), bendc.errors.ShapeError, "non-empty")
    _raises(lambda x: BF.layer_norm(x, (2, 3, 6)), (x,), bendc.errors.ShapeError, "[2,3,6]")
    _raises(lambda x, w: BF.group_norm(x, 3, w), (x, normal((3,), 244)), bendc.errors.ShapeError,
            "weight", "f32[3]", "[6]")


# ------------------------------------------------------------------ kernels
def test_layer_norm_kernels(target, tmp_path):
    """(2, 64, 128) over its last dim, forward and backward: one layer_norm kernel on the (128, 128)
    view, one layer_norm_grad (dx, dweight and dbias packed) and the loss's seed; the cpu kernels
    match the reference bit for bit, at one thread and two."""
    def step(x, w, b, seed):
        y = BF.layer_norm(x, (128,), w, b)
        (y * seed).sum().backward()
        return y, x.grad, w.grad, b.grad

    inputs = {"x": normal((2, 64, 128), 250) * 3.0 + 1.0, "w": normal((64, 128), 251)[0],
              "b": normal((128,), 252), "seed": normal((2, 64, 128), 253)}
    jitted = bendc.jit(step, leaves=("x", "w", "b"), target=target, cache_dir=str(tmp_path))
    got = jitted(*inputs.values())
    final = jitted.ir("final")
    assert final.count("= layer_norm[") == 1 and final.count("= layer_norm_grad[") == 1, final
    assert "layer_norm[bias=True, eps=1e-05, weight=True] %" in final and ": f32[128,128]" in final, final
    if target == "cpu":
        report = jitted.report()
        assert report.count(": row, 16384 cells") == 1 and report.count(": row, 16640 cells") == 1, report
        assert jitted.stats()["launches"] == 3, report
        reference = bendc.jit(step, leaves=("x", "w", "b"), target="reference")(*inputs.values())
        for name, a, r in zip(("y", "dx", "dweight", "dbias"), got, reference):
            assert_bitwise(a, r, f"{name}: the kernels match the reference")
        before = numba.get_num_threads()
        try:
            numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
            for name, a, r in zip(("y", "dx", "dweight", "dbias"), jitted(*inputs.values()), got):
                assert_bitwise(a, r, f"{name}: the same bits at {numba.get_num_threads()} threads")
        finally:
            numba.set_num_threads(before)


def test_layer_norm_kernels_are_parallel_over_row_blocks(tmp_path):
    """Past the policy's size the rows are dealt in blocks over the pool, each block summing its own
    dweight and dbias partials, added in block order after them: still the reference's bits."""
    def step(x, w, b):
        y = BF.layer_norm(x, (300,), w, b)
        (y * y).sum().backward()
        return y, x.grad, w.grad, b.grad

    inputs = (normal((330, 300), 260) - 2.0, normal((300,), 261), normal((300,), 262))
    jitted = bendc.jit(step, leaves=("x", "w", "b"), target="cpu", cache_dir=str(tmp_path))
    got = jitted(*inputs)
    sources = [s for name, s in jitted.kernels().items() if name.startswith("layer_norm")]
    assert len(sources) == 2 and all("for block in prange(blocks):" in s for s in sources), sources
    assert any("partial = np.zeros((blocks, 2, size), np.float64)" in s for s in sources), sources
    reference = bendc.jit(step, leaves=("x", "w", "b"), target="reference")(*inputs)
    for name, a, r in zip(("y", "dx", "dweight", "dbias"), got, reference):
        assert_bitwise(a, r, f"{name}: the parallel kernels match the reference")


def test_group_norm_kernels(target, tmp_path):
    """Group norm is one fused row kernel (bendc/ops/group_norm.py), not the composed statistics."""
    def step(x, w, b):
        return BF.group_norm(x, 4, w, b)

    jitted = bendc.jit(step, target=target, cache_dir=str(tmp_path))
    jitted(normal((2, 8, 3, 5), 254), normal((8,), 255), normal((8,), 256))
    final = jitted.ir("final")
    assert final.count("= group_norm[") == 1 and "[k0]" not in final, final
    assert not re.search(r"= (sum|sqrt|sub)[\[ ]", final), final  # no composed statistics
    if target == "cpu":
        assert jitted.stats()["launches"] == 1, jitted.report()
