"""The tiled (flash-attention) attention schedule: values and gradients against PyTorch's SDPA,
the attention_schedule pass's choice and rewrite, and the kernels' block dealing.

The tiled kernels sum in another order than torch (tile products in blocks of registers, an online softmax), so
results are compared relative to the largest magnitude of torch's: max |a - b| <= 2e-5 max |b|
(the tolerance issue 11 names for attention), for o, dq, dk and dv. The magnitude has a floor of
0.1: at t=1 dq and dk are zero in exact arithmetic and torch's are rounding noise (~1e-6).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as F
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.ops.attention.layout import SMALL_HEAD, TILE
from bendc.passes import PASSES, default_passes
from test_attention import inputs, kernel_module, ops_with, run_bendc, run_torch

RELATIVE = 2e-5
TILED = [p if p != "attention_schedule" else "attention_schedule_tiled" for p in default_passes()]
LEAVES = ("q", "k", "v")


def assert_relative(actual, expected, what: str) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    error = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 0.1)
    assert error <= RELATIVE * scale, f"{what}: max error {error:.3g} > {RELATIVE} * {scale:.3g}"


def check_tiled(arrays, leaves, target, **options):
    step, got = run_bendc(arrays, leaves, target, passes=TILED, **options)
    assert "attention_tiled" in step.ir("final")
    want = run_torch(arrays, leaves, **options)
    for name, a, b in zip(("o",) + tuple(f"d{n}" for n in leaves), got, want):
        assert_relative(a, b, f"{name} ({target})")
    return step


# ------------------------------------------------------------------ values and gradients
@pytest.mark.parametrize("target", ["reference", "cpu"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t", [1, 5, 64, 70, 130])
def test_matches_torch(target, causal, t):
    """GQA H=4 over Hkv=2, D=16: t below one block, exactly one, ragged (70 = 64 + 6), three blocks."""
    arrays = inputs(2, 4, 2, t, 16, seed=t)
    check_tiled(arrays, LEAVES, target, is_causal=causal, enable_gqa=True)


@pytest.mark.parametrize("depth", [16, 64, 128])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 1), (8, 2)])
def test_head_dims_and_groups(depth, heads, kv_heads):
    """D up to 128, no grouping, one key/value head for all, groups of 4; ragged t, causal."""
    arrays = inputs(1, heads, kv_heads, 100, depth, seed=depth + heads)
    check_tiled(arrays, LEAVES, "cpu", is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("t, depth, width, heads, kv_heads, causal", [
    (40, 3, 5, 4, 1, True),      # D and Dv not multiples of 4 (the products' single-source tail), t not of 16
    (17, 64, 64, 2, 2, False),   # one cell past a lane chunk, no grouping
    (48, 16, 8, 8, 2, True),     # whole lane chunks, groups of 4, Dv < D
    (23, 5, 7, 2, 1, False),     # odd D and Dv unmasked: rows added two a pass and the last one alone
])
def test_fused_small_heads(t, depth, width, heads, kv_heads, causal):
    """Up to SMALL positions the cpu kernels run each head fused (templates/tiled.py
    _small_forward_head/_small_backward_head): ragged chunks, head sizes, groups, both maskings."""
    arrays = inputs(2, heads, kv_heads, t, depth, width=width, seed=t + depth)
    check_tiled(arrays, LEAVES, "cpu", is_causal=causal, enable_gqa=True)


# Each case compiles its module's kernels with numba too (15-25 s on a 2-core Zen 3): the whole
# heads at full lane chunks (64, 32, 32) and the tiles at D = Dv (100, 16, 16) run in make test-long;
# make test keeps a masked last vector, the tiles with D != Dv and a ragged block, and unmasked tiles.
@pytest.mark.parametrize("t, depth, width, causal", [
    (40, 3, 5, True), pytest.param(64, 32, 32, True, marks=pytest.mark.long),
    pytest.param(100, 16, 16, True, marks=pytest.mark.long), (150, 24, 40, True), (130, 5, 7, False)])
def test_native_kernels_give_numbas_bits(monkeypatch, t, depth, width, causal):
    """BENDC_NATIVE_CHECK runs numba beside every native call on copies of its arguments and raises
    on the first bit that differs: the fused heads' register-blocked products (bendc_rows_fma, a
    masked last vector at Dv=5) and the tiles' (t=100 and more: the diagonal tiles' chunked products,
    the accumulation into dQ, dK and dV, a ragged last block, D != Dv) give numba's bits, and no two
    arguments of a kernel view the same memory (the copies would not share it: a false difference)."""
    monkeypatch.setenv("BENDC_NATIVE_CHECK", "1")
    arrays = inputs(1, 4, 2, t, depth, width=width, seed=t)
    check_tiled(arrays, LEAVES, "cpu", is_causal=causal, enable_gqa=True)


def test_benchmark_shape():
    """The benchmark's shape (B=4 H=8 Hkv=2 T=512 D=64), causal, chosen by the pass itself."""
    arrays = inputs(4, 8, 2, 512, 64, seed=1)
    step, got = run_bendc(arrays, LEAVES, "cpu", is_causal=True, enable_gqa=True)
    assert "attention_tiled_grad" in step.ir("final")
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, run_torch(arrays, LEAVES, is_causal=True, enable_gqa=True)):
        assert_relative(a, b, name)


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_value_width_and_scale(target):
    """v's head dimension differs from q's (the packed gradients take max(D, Dv) columns); scale given."""
    arrays = inputs(1, 2, 1, 70, 8, width=3, seed=4)
    check_tiled(arrays, LEAVES, target, is_causal=True, scale=0.3, enable_gqa=True)
    arrays = inputs(1, 2, 1, 9, 3, width=8, seed=5)
    check_tiled(arrays, LEAVES, target, is_causal=False, enable_gqa=True)


@pytest.mark.parametrize("leaves", [("q",), ("v",), ("q", "k"), ("k", "v")])
def test_frozen_operands(leaves):
    """Only some of q, k, v leaves: one attention_tiled_grad, a view for each gradient needed."""
    arrays = inputs(1, 4, 2, 70, 8, seed=6)
    step = check_tiled(arrays, leaves, "cpu", is_causal=True, enable_gqa=True)
    ops = [op for op, _ in ops_with(step.ir("final"))]
    assert ops.count("attention_tiled_grad") == 1 and not {"attention_probs", "attention_vjp"} & set(ops)


@pytest.mark.parametrize("target", ["reference", "cpu"])
@pytest.mark.parametrize("leaves", [("q", "k", "v"), ("q", "v")])
def test_two_backward_calls_through_one_site(target, leaves):
    """Two losses' .backward() through one attention call: two sets of attention_vjp nodes, which
    may share the recomputed probabilities; each set is its own attention_tiled_grad, the gradients
    accumulated as torch's (found by make fuzz N=2000 SEED=20261214: the pass kept only the last set
    and failed with "%20 still has users")."""
    import torch

    import bendc
    import bendc.functional as F

    def step(q, k, v):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.relu(o).sum().backward()
        (o * o).mean().backward()
        named = {"q": q, "k": k, "v": v}
        return tuple(named[name].grad for name in leaves)

    given = inputs(1, 2, 2, 9, 4, seed=5)
    arrays = [given[name] for name in "qkv"]
    got = bendc.jit(step, leaves=leaves, target=target, passes=TILED)(*arrays)
    tensors = [torch.tensor(a, requires_grad=name in leaves) for name, a in zip("qkv", arrays)]
    o = torch.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True)
    torch.relu(o).sum().backward(retain_graph=True)
    (o * o).mean().backward()
    want = [t.grad.numpy() for t in tensors if t.grad is not None]
    assert len(got) == len(want) == len(leaves)
    for name, a, b in zip(leaves, got, want):
        assert_relative(a, b, f"d{name} ({target})")


def test_forward_only():
    """No gradient: attention_tiled and the view of O, no backward."""
    import bendc
    import bendc.functional as F

    arrays = inputs(1, 2, 1, 70, 8, seed=7)
    step = bendc.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), target="cpu",
                     passes=TILED)
    got = step(arrays["q"], arrays["k"], arrays["v"])
    assert "attention_tiled_grad" not in step.ir("final")
    import torch

    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(arrays[n]) for n in "qkv"),
                                                            is_causal=True)
    assert_relative(got, want.numpy(), "o")


# ------------------------------------------------------------------ the schedule pass
def _site_line(step) -> str:
    return next(line for line in step.report().splitlines() if line.startswith("[attention_schedule]"))


def test_pass_tiles_from_the_crossover_on_the_cpu():
    """Default pass, cpu: t=8 (the crossover) is tiled, t=7 triangular; the report says why."""
    long, _ = run_bendc(inputs(1, 2, 1, 8, 4, seed=8), LEAVES, "cpu", is_causal=True)
    line = _site_line(long)
    assert ": tiled: t=8 >= 8" in line and "blocks of 64 queries x 64 keys" in line and "rewritten to" in line
    final = long.ir("final")
    assert "attention_tiled[" in final and "attention_probs" not in final and " attention[" not in final
    assert format_graph(parse_graph(final)) == final
    short, _ = run_bendc(inputs(1, 2, 1, 7, 4, seed=8), LEAVES, "cpu", is_causal=True)
    assert ": triangular: causal" in _site_line(short) and "t=7 < 8" in _site_line(short)


def test_pass_tiles_over_the_memory_budget():
    """With the crossover out of reach, a site whose P and G exceed the budget is tiled anyway."""
    budget = PASSES["attention_schedule"].configured("attention_schedule_budget", "test", tiled_from=10 ** 6,
                                                     memory_budget=4096)
    passes = [budget if p == "attention_schedule" else p for p in default_passes()]
    small, _ = run_bendc(inputs(1, 1, 1, 16, 4, seed=9), LEAVES, "cpu", passes=passes, is_causal=True)
    assert ": triangular:" in _site_line(small)  # 2 * 136 cells * 4 bytes = 1088
    big, got = run_bendc(inputs(1, 2, 1, 40, 4, seed=9), LEAVES, "cpu", passes=passes, is_causal=False)
    line = _site_line(big)
    assert ": tiled: the dense schedule's P and G would take 25600 bytes, over the 4096 bytes budget" in line
    assert "attention_tiled_grad" in big.ir("final")


# ------------------------------------------------------------------ the kernels' dealing
@pytest.fixture(scope="module")
def tiled_module():
    return kernel_module("attention_tiled", {"causal": True, "scale": 0.5},
                         ["f32[1,1,2,4]", "f32[1,1,2,4]", "f32[1,1,2,4]"], "f32[1,1,3,4]")


def test_block_is_the_layouts_tile(tiled_module):
    assert tiled_module.BLOCK == TILE
    assert tiled_module.SMALL == SMALL_HEAD  # the pass's report names the fused kernels' reach


@pytest.mark.parametrize("blocks", range(1, 10))
def test_block_rows_are_dealt_in_equal_pairs(tiled_module, blocks):
    """Causal: items hold block rows (b, blocks-1-b), blocks + 1 tiles each (the middle one of an odd
    count alone); every block row once. Not causal: a block row an item."""
    module = tiled_module
    rows = []
    for item in range(module._tiled_items(blocks, True)):
        dealt = [b for b in module._tiled_deal(item, blocks, True) if b >= 0]
        tiles = sum(b + 1 for b in dealt)
        assert tiles == (blocks + 1 if len(dealt) == 2 else (blocks + 1) // 2)
        rows += dealt
    assert sorted(rows) == list(range(blocks))
    assert [module._tiled_deal(i, blocks, False)[0] for i in range(module._tiled_items(blocks, False))] == \
        list(range(blocks))


@pytest.mark.parametrize("check", ["", "1"])
@pytest.mark.parametrize("t", [40, 150])
def test_fused_heads_read_the_projections_layout(monkeypatch, check, t):
    """q, k and v sliced from one (B, T, 3 H D) projection and moved to (B, H, T, D): strided views the
    fused heads (t=40) and the tiles (t=150) read in place (no contiguous copies), the projection's
    gradient against torch's; under BENDC_NATIVE_CHECK the native kernels against numba on the same
    views."""
    if check:
        monkeypatch.setenv("BENDC_NATIVE_CHECK", "1")
    batch, heads, depth = 2, 4, 8
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((batch, t, 3 * heads * depth)).astype(np.float32)
    grad = rng.standard_normal((batch, heads, t, depth)).astype(np.float32)

    def split(x, lib):
        parts = [x[..., i * heads * depth:(i + 1) * heads * depth].reshape(batch, t, heads, depth) for i in range(3)]
        return [p.transpose(1, 2) for p in parts]

    def step(qkv, g):
        q, k, v = split(qkv, F)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (o * g).sum().backward()
        return o, qkv.grad

    compiled = bendc.jit(step, leaves=("qkv",), target="cpu", passes=TILED)
    o, dqkv = compiled(qkv, grad)
    assert "attention_tiled" in compiled.ir("final")
    x = torch.from_numpy(qkv.copy()).requires_grad_(True)
    q, k, v = split(x, torch)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    (want * torch.from_numpy(grad)).sum().backward()
    assert_relative(o, want.detach().numpy(), "o")
    assert_relative(dqkv, x.grad.numpy(), "dqkv")
