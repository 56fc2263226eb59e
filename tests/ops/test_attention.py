"""scaled_dot_product_attention: values and gradients against PyTorch, the
attention_schedule pass, and the triangular layout and work dealing.

Attention is a reduction (dot products, a softmax, weighted sums), so values
and gradients are compared with the conftest tolerances (rtol 1e-5, atol
1e-6), not bit for bit. The two schedules of one program are compared with
each other bit for bit: the dense kernels add exact zeros where the
triangular ones skip the cells above the diagonal, in the same order.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as F
from bendc.codegen.cache import default_cache_dir, kernel_path, write_kernel
from bendc.codegen.cpu import HEADER
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.ir.types import TensorType
from bendc.ops import OPS
from bendc.ops.attention import pack, row_start, score_cells, work_items
from bendc.passes import default_passes
from conftest import assert_bitwise, assert_close
from runtime.artifact import load_module

TARGETS = ("reference", "cpu")
DENSE = [p if p != "attention_schedule" else "attention_schedule_dense" for p in default_passes()]
TRIANGULAR_PASSES = [p if p != "attention_schedule" else "attention_schedule_triangular" for p in default_passes()]


def normal(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def inputs(batch, heads, kv_heads, t, depth, width=None, seed=0):
    width = depth if width is None else width
    return {"q": normal((batch, heads, t, depth), seed), "k": normal((batch, kv_heads, t, depth), seed + 1),
            "v": normal((batch, kv_heads, t, width), seed + 2), "g": normal((batch, heads, t, width), seed + 3)}


def attention_step(leaves, **options):
    """A jitted-ready step: o = sdpa(q, k, v, **options), o.backward(g); returns o and the leaves' grads."""
    def step(q, k, v, g):
        o = F.scaled_dot_product_attention(q, k, v, **options)
        o.backward(g)
        named = {"q": q, "k": k, "v": v}
        return (o,) + tuple(named[name].grad for name in leaves)

    return step


def run_bendc(arrays, leaves, target, passes=None, **options):
    step = bendc.jit(attention_step(leaves, **options), leaves=leaves, target=target, passes=passes)
    return step, step(arrays["q"], arrays["k"], arrays["v"], arrays["g"])


def run_torch(arrays, leaves, **options):
    tensors = {name: torch.from_numpy(arrays[name].copy()) for name in "qkv"}
    for name in leaves:
        tensors[name].requires_grad_(True)
    o = torch.nn.functional.scaled_dot_product_attention(tensors["q"], tensors["k"], tensors["v"], **options)
    o.backward(torch.from_numpy(arrays["g"].copy()))
    return (o.detach().numpy(),) + tuple(tensors[name].grad.numpy() for name in leaves)


def check_parity(arrays, leaves, target, **options):
    step, got = run_bendc(arrays, leaves, target, **options)
    want = run_torch(arrays, leaves, **options)
    for name, a, b in zip(("o",) + tuple(f"d{n}" for n in leaves), got, want):
        assert_close(a, b, f"{name} ({target})")
    return step, got


# ------------------------------------------------------------------ values and gradients
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t", [1, 2, 5, 8])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_matches_torch(target, causal, t, kv_heads):
    """GQA with H=4 over Hkv=2 and Hkv=1, odd and even t, causal or not: o, dq, dk, dv."""
    arrays = inputs(2, 4, kv_heads, t, 4, seed=t)
    check_parity(arrays, ("q", "k", "v"), target, is_causal=causal, enable_gqa=True)


@pytest.mark.parametrize("target", TARGETS)
def test_longer_sequence(target):
    """t = 37: several column blocks of dk and dv, and rows long enough for the unrolled loops."""
    arrays = inputs(1, 2, 1, 37, 4, seed=10)
    check_parity(arrays, ("q", "k", "v"), target, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("passes", [None, TRIANGULAR_PASSES], ids=["tiled", "triangular"])
def test_parallel_kernels(passes):
    """Large enough for prange (B*H*t*t*D >= PARALLEL_CELLS): the parallel kernels, on the cpu target
    (t=64 is tiled by default; the triangular schedule forced)."""
    arrays = inputs(1, 2, 1, 64, 8, seed=9)
    step, got = run_bendc(arrays, ("q", "k", "v"), "cpu", passes=passes, is_causal=True, enable_gqa=True)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, run_torch(arrays, ("q", "k", "v"), is_causal=True,
                                                                  enable_gqa=True)):
        assert_close(a, b, name)
    kernels = {name: source for name, source in step.kernels().items() if name.startswith("attention")}
    assert kernels and all("parallel=True" in source for source in kernels.values())


@pytest.mark.parametrize("target", TARGETS)
def test_explicit_scale_and_value_width(target):
    """scale given; v's head dimension differs from q's (torch allows it)."""
    arrays = inputs(1, 2, 2, 5, 4, width=3, seed=11)
    check_parity(arrays, ("q", "k", "v"), target, is_causal=True, scale=0.3)


@pytest.mark.parametrize("target", TARGETS)
def test_one_kv_head_broadcasts_without_enable_gqa(target):
    """torch broadcasts a single key/value head without enable_gqa."""
    arrays = inputs(1, 2, 1, 5, 4, seed=12)
    check_parity(arrays, ("q", "k", "v"), target, is_causal=False)


def ops_with(ir: str) -> list[tuple[str, dict]]:
    return [(node.op, node.attr) for node in parse_graph(ir).nodes()]


@pytest.mark.parametrize("target", TARGETS)
def test_frozen_key_and_value_get_no_gradient_work(target):
    """k and v constants: only dq is built (no dk/dv vjp nodes); dq matches torch."""
    arrays = inputs(1, 4, 2, 5, 4, seed=13)
    step, _ = check_parity(arrays, ("q",), target, is_causal=True, enable_gqa=True)
    vjps = [attrs["wrt"] for op, attrs in ops_with(step.ir("autodiff")) if op == "attention_vjp"]
    assert vjps == ["q"]


def test_frozen_query_and_key_build_no_score_gradient():
    """Only v a leaf: P is recomputed for dv, and neither G nor dq/dk exist."""
    arrays = inputs(1, 4, 2, 5, 4, seed=14)
    step, _ = check_parity(arrays, ("v",), "reference", is_causal=True, enable_gqa=True)
    ops = ops_with(step.ir("autodiff"))
    assert [a["wrt"] for op, a in ops if op == "attention_vjp"] == ["v"]
    assert not [op for op, _ in ops if op == "attention_score_grad"]


def test_frozen_value_builds_dq_and_dk_only():
    arrays = inputs(1, 2, 2, 5, 4, seed=15)
    step, _ = check_parity(arrays, ("q", "k"), "reference", is_causal=False)
    assert sorted(a["wrt"] for op, a in ops_with(step.ir("autodiff")) if op == "attention_vjp") == ["k", "q"]


# ------------------------------------------------------------------ the schedule pass
@pytest.mark.parametrize("target", TARGETS)
def test_schedule_shows_in_ir_and_report(target):
    """t=6 is below the tiled schedule's crossover (tests/ops/test_attention_tiled.py): triangular
    when causal, dense when not, on both targets."""
    arrays = inputs(1, 4, 2, 6, 4, seed=16)
    causal, _ = run_bendc(arrays, ("q", "k", "v"), target, is_causal=True, enable_gqa=True)
    final = causal.ir("final")
    assert 'schedule="auto"' in causal.ir("autodiff") and 'schedule="auto"' not in final
    scheduled = [(op, a["schedule"]) for op, a in ops_with(final) if op.startswith("attention")]
    assert len(scheduled) == 6 and {s for _, s in scheduled} == {"triangular"}
    assert "f32[1,4,21]" in final  # P and G: 6*7/2 cells per head
    report = causal.report()
    line = next(l for l in report.splitlines() if l.startswith("[attention_schedule]"))
    assert "triangular" in line and "causal" in line and "test_attention.py" in line
    assert "3 work items per head" in line and "7 cells each" in line

    dense, _ = run_bendc(arrays, ("q", "k", "v"), target, is_causal=False, enable_gqa=True)
    assert {a["schedule"] for op, a in ops_with(dense.ir("final")) if op.startswith("attention")} == {"dense"}
    assert "f32[1,4,36]" in dense.ir("final")
    assert "dense: not causal" in dense.report()


@pytest.mark.parametrize("target", TARGETS)
def test_forced_dense_schedule_gives_the_same_bits(target):
    """attention_schedule_dense on a causal site: t*t cells, masked; the same results bit for bit."""
    arrays = inputs(1, 4, 2, 37, 4, seed=17)
    leaves = ("q", "k", "v")
    triangular, expected = run_bendc(arrays, leaves, target, passes=TRIANGULAR_PASSES, is_causal=True,
                                     enable_gqa=True)
    dense, got = run_bendc(arrays, leaves, target, passes=DENSE, is_causal=True, enable_gqa=True)
    assert 'schedule="dense"' in dense.ir("final") and "f32[1,4,1369]" in dense.ir("final")
    assert "forced dense" in dense.report()
    for a, b, name in zip(got, expected, ("o", "dq", "dk", "dv")):
        assert_bitwise(a, b, name)


def test_printed_ir_parses_back():
    arrays = inputs(1, 2, 1, 3, 4, seed=18)
    step, _ = run_bendc(arrays, ("q", "k", "v"), "reference", is_causal=True, scale=0.3)
    for stage in ("traced", "autodiff", "final"):
        assert format_graph(parse_graph(step.ir(stage))) == step.ir(stage)


# ------------------------------------------------------------------ the triangular layout and dealing
def kernel_module(op: str, attrs: dict, ins: list[str], out: str):
    """The generated CPU kernel module of one op, loaded as the runtime loads it."""
    types = [TensorType.parse(text) for text in ins]
    source = HEADER.format(name=op, summary=op, nodes="") + OPS[op].lowering.cpu(attrs, types, TensorType.parse(out))
    cache = default_cache_dir()
    module = write_kernel(cache, source)
    return load_module(kernel_path(cache, module), module)


TRIANGULAR = {"causal": True, "scale": 0.5, "schedule": "triangular"}


@pytest.fixture(scope="module")
def triangular_probs():
    return kernel_module("attention_probs", TRIANGULAR, ["f32[1,1,2,4]", "f32[1,1,2,4]"], "f32[1,1,3]")


@pytest.fixture(scope="module")
def triangular_columns():
    return kernel_module("attention_vjp", {"causal": True, "heads": 1, "schedule": "triangular", "wrt": "k"},
                         ["f32[1,2,3]", "f32[1,2,2,3]"], "f32[1,1,2,3]")


@pytest.mark.parametrize("t", range(1, 10))
def test_pair_dealing_covers_each_cell_once(triangular_probs, t):
    """The kernel's own helpers: items of rows (i, t-1-i) hold t+1 cells (the middle row of an odd t
    alone), rows start at i(i+1)/2, and every (i, j <= i) is one cell, reached exactly once."""
    module = triangular_probs
    assert module._items(t) == (t + 1) // 2 == len(work_items(t, "triangular"))
    seen = np.zeros(t * (t + 1) // 2, dtype=int)
    rows_seen = []
    for item in range(module._items(t)):
        rows = [i for i in module._deal(item, t) if i >= 0]
        assert tuple(rows) == work_items(t, "triangular")[item]
        cells = 0
        for i in rows:
            assert module._row_start(i, t) == i * (i + 1) // 2 == row_start(i, t, "triangular")
            length = module._row_length(i, t)
            assert length == i + 1
            for j in range(length):
                seen[module._row_start(i, t) + j] += 1
            cells += length
        assert cells == (t + 1 if len(rows) == 2 else (t + 1) // 2)
        rows_seen += rows
    assert sorted(rows_seen) == list(range(t))
    assert (seen == 1).all() and seen.size == score_cells(t, "triangular")


@pytest.mark.parametrize("t", [1, 2, 5, 9, 16, 17, 37, 48, 64])
def test_column_block_dealing_covers_each_cell_once(triangular_columns, t):
    """dk and dv read columns in blocks of COLUMN_BLOCK, dealt in pairs (b, blocks-1-b): the
    kernel's loop bounds reach every (i >= j) once and the pairs hold equal work where t allows."""
    module = triangular_columns
    size = module.COLUMN_BLOCK
    blocks = (t + size - 1) // size
    reached = np.zeros((t, t), dtype=int)
    work = []
    for item in range(module._items(blocks)):
        cells = 0
        for block in module._deal(item, blocks):
            if block < 0:
                continue
            first, end = block * size, min(block * size + size, t)
            for i in range(module._column_first(first, t), t):
                for j in range(first, min(end, module._row_length(i, t))):
                    reached[i, j] += 1
                    cells += 1
        work.append(cells)
    assert (reached == np.tril(np.ones((t, t), dtype=int))).all()
    if t % (2 * size) == 0:
        assert len(set(work)) == 1


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 6, 7, 8, 9, 37])
def test_kernels_write_every_packed_cell(triangular_probs, triangular_columns, t):
    """The kernels on outputs filled with NaN: every cell is written, equal to the reference."""
    rng = np.random.default_rng(t)
    q = rng.standard_normal((1, 2, t, 3)).astype(np.float32)
    k = rng.standard_normal((1, 1, t, 3)).astype(np.float32)
    attrs = TRIANGULAR
    probs = np.full((1, 2, score_cells(t, "triangular")), np.nan, dtype=np.float32)
    triangular_probs.kernel(q, k, probs)
    expected = OPS["attention_probs"].reference([q, k], attrs)
    assert_close(probs, expected, "P")
    full = np.asarray(OPS["attention"].reference([q, k, np.eye(t, dtype=np.float32)[None, None]],
                                                 {"causal": True, "scale": 0.5, "schedule": "auto"}))
    assert_close(probs, pack(full, "triangular"), "P vs attention's probabilities")
    score_grad = kernel_module("attention_score_grad", attrs, ["f32[1,2,3]", "f32[1,1,2,3]", "f32[1,2,2,3]"],
                               "f32[1,2,3]")
    v = rng.standard_normal((1, 1, t, 3)).astype(np.float32)
    g = rng.standard_normal((1, 2, t, 3)).astype(np.float32)
    scores = np.full_like(probs, np.nan)
    score_grad.kernel(probs, v, g, scores)
    assert_close(scores, OPS["attention_score_grad"].reference([probs, v, g], attrs), "G")
    grad_k = np.full(k.shape, np.nan, dtype=np.float32)
    triangular_columns.kernel(scores, q, grad_k)
    wrt_k = {"causal": True, "heads": 1, "schedule": "triangular", "wrt": "k"}
    assert_close(grad_k, OPS["attention_vjp"].reference([scores, q], wrt_k), "dk")


# ------------------------------------------------------------------ errors
def test_errors_name_the_users_line():
    arrays = inputs(1, 4, 2, 3, 4)
    with pytest.raises(bendc.ShapeError, match="enable_gqa") as info:
        run_bendc(arrays, ("q",), "reference", is_causal=True)
    assert "test_attention.py" in str(info.value)

    def masked(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, q)

    with pytest.raises(bendc.UnsupportedError, match="attn_mask"):
        bendc.jit(masked, target="reference")(arrays["q"], arrays["q"], arrays["q"])

    def three_d(q, k, v):
        return F.scaled_dot_product_attention(q[0], k[0], v[0])

    with pytest.raises(bendc.ShapeError, match="4-D"):
        bendc.jit(three_d, target="reference")(arrays["q"], arrays["q"], arrays["q"])
