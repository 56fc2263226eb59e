"""Dropout with Philox-4x32-10: the generator, the mask's distribution and determinism, forward and
backward sharing the mask, the reference and cpu targets agreeing bit for bit, attention's dropout_p.

Bits cannot match torch's generator, so the tests check what the mask must be: kept elements are
x * float32(1 / (1 - p)) exactly (torch's noise), the others x * 0; the keep rate lies within a
binomial tolerance; the same seed gives the same mask and another seed or another call (offset)
another; the gradient is the upstream gradient times the same noise.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as F
from bendc.ir.parser import parse_graph
from bendc.kernels.templates.philox import bendc_philox
from bendc.ops.random import dropout_scale, dropout_words, keep_threshold, philox4x32
from conftest import assert_bitwise, assert_close

TARGETS = ("reference", "cpu")

# Random123's known-answer vectors for Philox-4x32-10 (its tests/kat_vectors): counter, key, output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def seed(value: int) -> np.ndarray:
    return np.array(value, dtype=np.int64)


def data(shape, rng_seed=0) -> np.ndarray:
    """Nonzero values of both signs (so a zero in the output is a dropped element)."""
    rng = np.random.default_rng(rng_seed)
    return np.asarray(rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape), dtype=np.float32)


# ------------------------------------------------------------------ the generator
@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_matches_random123_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox4x32(counter, key)) == expected


def test_kernel_helper_draws_the_reference_words():
    """The template the kernels inline (numba, uint64 arithmetic) gives the numpy reference's words,
    for large indexes (a high counter word), offsets and negative seeds too."""
    rng = np.random.default_rng(1)
    for trial in range(200):
        seed_value = int(rng.integers(-2 ** 63, 2 ** 63 - 1))
        index = int(rng.integers(0, 2 ** 40)) if trial % 2 else int(rng.integers(0, 1000))
        offset = int(rng.integers(0, 2 ** 32))
        key = np.int64(seed_value).astype(np.uint64)
        want = philox4x32((index & 0xFFFFFFFF, index >> 32, offset, 0), (key & np.uint64(0xFFFFFFFF),
                                                                          key >> np.uint64(32)))[0]
        assert int(bendc_philox(np.int64(seed_value), np.int64(index), offset)) == int(want)


def test_thresholds_and_scales():
    assert keep_threshold(0.0) == 2 ** 32 and keep_threshold(1.0) == 0
    assert dropout_scale(0.5) == 2.0 and dropout_scale(1.0) == 0.0
    assert np.float32(dropout_scale(0.1)) == np.float32(1.0) / np.float32(0.9)


# ------------------------------------------------------------------ the mask
def _dropout_step(p, target, training=True):
    return bendc.jit(lambda x, s: F.dropout(x, p, training, seed=s), target=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_within_binomial_tolerance_and_exact_scaling(target, p):
    x = data((64, 96))
    out = np.asarray(_dropout_step(p, target)(x, seed(2024)))
    kept = out != 0
    n = x.size
    rate = kept.mean()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) < 5 * sigma, f"keep rate {rate} for p={p} (5 sigma = {5 * sigma})"
    scale = np.float32(1.0) / np.float32(1.0 - p)
    assert_bitwise(out[kept], x[kept] * scale, "kept elements")
    assert_bitwise(out[~kept], x[~kept] * np.float32(0.0), "dropped elements")
    # rows and columns are not correlated: each row's rate is near 1 - p too
    row_sigma = math.sqrt(p * (1 - p) / x.shape[1])
    assert np.all(np.abs(kept.mean(axis=1) - (1 - p)) < 6 * row_sigma)


@pytest.mark.parametrize("target", TARGETS)
def test_p0_and_eval_are_the_identity_and_p1_gives_torch_zeros(target):
    x = data((3, 5))
    x[0, 0] = -0.0
    assert_bitwise(_dropout_step(0.0, target)(x, seed(1)), x, "p=0")
    assert_bitwise(_dropout_step(0.7, target, training=False)(x, seed(1)), x, "training=False")
    assert_bitwise(_dropout_step(1.0, target)(x, seed(1)),
                   torch.nn.functional.dropout(torch.from_numpy(x), 1.0).numpy(), "p=1")
    traced = bendc.jit(lambda x, s: F.dropout(x, 0.0, seed=s), target=target)
    traced(x, seed(1))
    assert "dropout" not in traced.ir("traced")


@pytest.mark.parametrize("target", TARGETS)
def test_same_seed_same_mask_other_seed_or_call_another(target):
    x = np.ones((32, 32), np.float32)

    @bendc.jit(target=target)
    def two_calls(x, s):
        return F.dropout(x, 0.5, seed=s), F.dropout(x, 0.5, seed=s)

    step = _dropout_step(0.5, target)
    first, again, other = (np.asarray(step(x, seed(v))) for v in (7, 7, 8))
    assert np.array_equal(first, again)
    assert (first != other).mean() > 0.3
    a, b = (np.asarray(v) for v in two_calls(x, seed(7)))
    assert np.array_equal(a, first), "the first call of a trace has offset 0"
    assert (a != b).mean() > 0.3, "a second dropout call in one step draws another mask"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p", [0.3, 1.0])
def test_backward_recomputes_the_forward_mask(target, p):
    """grad = upstream * noise, the forward's noise: zero exactly where the output is zero (x has no
    zeros), 1/(1-p) * upstream elsewhere; the mask is recomputed (a second dropout node), not stored."""
    x, c = data((16, 24), 3), data((16, 24), 4)

    @bendc.jit(leaves=("x",), target=target)
    def step(x, c, s):
        y = F.dropout(x, p, seed=s)
        (y * c).sum().backward()
        return y, x.grad

    y, grad = (np.asarray(v) for v in step(x, c, seed(99)))
    kept = y != 0
    assert_bitwise(grad[~kept], c[~kept] * np.float32(0.0), "grad where dropped")
    assert_bitwise(grad[kept], c[kept] * np.float32(dropout_scale(p)), "grad where kept")
    nodes = [n for n in parse_graph(step.ir("final")).nodes() if n.op == "dropout"]
    assert len(nodes) == 2 and len({n.attr["offset"] for n in nodes}) == 1


def test_reference_and_cpu_give_the_same_bits():
    x = data((7, 5, 9), 5)

    def program(x, s):
        a = F.dropout(x, 0.4, seed=s)
        b = F.dropout(a * 2.0 + 1.0, 0.2, seed=s)
        loss = (b * x).sum()
        loss.backward()
        return a, b, x.grad

    results = [bendc.jit(program, leaves=("x",), target=t)(x, seed(-12345)) for t in TARGETS]
    for name, got, want in zip(("a", "b", "grad"), results[1], results[0]):
        assert_bitwise(got, want, name)
    expected = np.where(dropout_words(-12345, 0, x.shape) < keep_threshold(0.4),
                        x * np.float32(dropout_scale(0.4)), x * np.float32(0.0))
    assert_bitwise(results[0][0], expected, "reference against dropout_words")


def test_int32_seed_and_a_large_tensor_on_cpu():
    """A kernel past parallel_from("elementwise") cells (270400 here) runs its cells in parallel (prange):
    the same words."""
    x = data((520, 520), 6)
    s32 = np.array(5, np.int32)
    step = _dropout_step(0.25, "cpu")
    got = np.asarray(step(x, s32))
    assert any("prange(" in source for source in step.kernels().values()), "the dropout kernel is not parallel"
    want = np.asarray(_dropout_step(0.25, "reference")(x, s32))
    assert_bitwise(got, want, "large cpu dropout")


def test_errors_name_the_problem():
    x = data((2, 3))
    with pytest.raises(bendc.BendcError, match="needs a seed"):
        bendc.jit(lambda x: F.dropout(x, 0.5))(x)
    with pytest.raises(bendc.BendcError, match="0-d int64"):
        bendc.jit(lambda x, s: F.dropout(x, 0.5, seed=s))(x, np.array(1.0, np.float32))
    with pytest.raises(bendc.BendcError, match="between 0 and 1"):
        bendc.jit(lambda x, s: F.dropout(x, 1.5, seed=s))(x, seed(1))
    with pytest.raises(bendc.BendcError, match="array parameter"):
        bendc.jit(lambda x: F.dropout(x, 0.5, seed=3))(x)


# ------------------------------------------------------------------ torch spellings
def test_nn_dropout_in_a_module_uses_dropout_seed_and_eval_is_identity():
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    params = bendc.params(model)
    x = data((5, 6), 7)

    @bendc.jit(leaves=("p",))
    def step(p, x, s):
        F.dropout_seed(s)
        out = bendc.functional_call(model, p, x)
        out.sum().backward()
        return out, p["0.weight"].grad

    @bendc.jit()
    def by_hand(p, x, s):
        hidden = F.dropout(F.linear(x, p["0.weight"], p["0.bias"]), 0.5, seed=s)
        return F.linear(hidden, p["2.weight"], p["2.bias"])

    out, grad = step(params, x, seed(3))
    assert_bitwise(out, by_hand(params, x, seed(3)), "nn.Dropout == F.dropout at offset 0")
    assert np.isfinite(np.asarray(grad)).all()
    model.eval()
    evaluated = bendc.jit(lambda p, x: bendc.functional_call(model, p, x))(params, x)
    assert_close(evaluated, model(torch.from_numpy(x)).detach().numpy(), "eval", rtol=2e-5, atol=2e-6)


# ------------------------------------------------------------------ attention's dropout_p
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal, heads, kv_heads", [(False, 2, 2), (True, 2, 1), (True, 4, 2)])
def test_attention_dropout_p_is_softmax_dropout_matmul(target, causal, heads, kv_heads):
    """With dropout_p, attention is torch's math path: probabilities * noise @ v; the noise is the
    mask dropout draws for the (B, H, T, T) probabilities at the same seed and offset."""
    b, t, d, p = 2, 5, 4, 0.3
    q, k, v = data((b, heads, t, d), 8), data((b, kv_heads, t, d), 9), data((b, kv_heads, t, d), 10)
    gqa = heads != kv_heads

    @bendc.jit(leaves=("q", "k", "v"), target=target)
    def step(q, k, v, s):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, enable_gqa=gqa, seed=s)
        (out * out).sum().backward()
        return out, q.grad, k.grad, v.grad

    ours = [np.asarray(o) for o in step(q, k, v, seed(11))]
    noise = torch.from_numpy(np.asarray(_dropout_step(p, target)(np.ones((b, heads, t, t), np.float32), seed(11))))
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    keys, values = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (tk, tv))
    scores = tq @ keys.transpose(-1, -2) * (1.0 / math.sqrt(d))
    if causal:
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    out = (scores.softmax(-1) * noise) @ values
    (out * out).sum().backward()
    for name, got, want in zip(("out", "dq", "dk", "dv"), ours, (out, tq.grad, tk.grad, tv.grad)):
        assert_close(got, want.detach().numpy(), name, rtol=5e-5, atol=5e-6)
    plain = bendc.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                      target=target)
    plain(q, k, v)
    assert "attention[" in plain.ir("traced") and "dropout" not in plain.ir("traced")
