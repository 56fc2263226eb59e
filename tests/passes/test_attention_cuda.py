"""The attention_schedule pass on the cuda target: when it tiles (forced, over the memory budget, or
from two key tiles of the cuda forward kernel: a rule from the work the tiles skip, not a crossover
measured on a GPU), what the report says (tiles, threads, shared memory) and where it keeps the row
schedules (short sequences, head sizes no tile fits). The graphs are traced without running them
(``lower``) and the pass is run on the autodiff stage with a cuda PassContext; no numba needed."""
from __future__ import annotations

import pytest

import bendc
import bendc.functional as F
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.passes import PASSES, PassContext, Pipeline


def autodiff_ir(t: int, depth: int, width: int | None = None, causal: bool = True) -> str:
    width = depth if width is None else width

    def step(q, k, v, g):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        o.backward(g)
        return o, q.grad, k.grad, v.grad

    jitted = bendc.jit(step, leaves=("q", "k", "v"), target="reference")
    jitted.lower(f"q=f32[1,4,{t},{depth}]:leaf k=f32[1,2,{t},{depth}]:leaf v=f32[1,2,{t},{width}]:leaf "
                 f"g=f32[1,4,{t},{width}]")
    return jitted.ir("autodiff")


def schedule_on_cuda(ir: str, name: str = "attention_schedule", target: str = "cuda", pass_=None):
    """(ops of the rewritten graph, the pass's report line)."""
    context = PassContext(target=target)
    graph = Pipeline([pass_ or name]).run(parse_graph(ir), context, lambda stage, g: None)
    (text,) = [text for pass_name, text in context.decisions if pass_name == "attention_schedule"]
    return [node.op for node in parse_graph(format_graph(graph)).nodes()], text


@pytest.mark.parametrize("causal", [True, False])
def test_tiled_from_two_key_tiles(causal):
    """D=64: the forward's key tile is 32, so t=64 is tiled and t=63 keeps the row schedule."""
    ops, text = schedule_on_cuda(autodiff_ir(64, 64, causal=causal))
    assert "attention_tiled" in ops and "attention_tiled_grad" in ops and "attention" not in ops
    assert ": tiled: t=64 >= 2 key tiles of 32: each query tile streams K and V through shared memory" in text
    assert ("skips the tiles above the diagonal" in text) == causal
    assert "not measured on a GPU" in text
    assert ("cuda forward: tiles of 64 queries x 32 keys, 128 threads, 34176 bytes of shared memory per block, "
            "48 accumulators per thread, 1 query tiles per head") in text
    assert ("backward (dK, dV per key tile, then dQ per query tile): tiles of 32 queries x 32 keys, 128 threads, "
            "37760 bytes and 37760 bytes of shared memory per block") in text
    assert "registers and spills: the compile report's 'compiled:' lines" in text
    ops, text = schedule_on_cuda(autodiff_ir(63, 64, causal=causal))
    rows = "triangular" if causal else "dense"
    assert "attention_tiled" not in ops and f": {rows}: " in text
    assert "t=63 < 2 key tiles of 32: too short for the tiles to skip work (a threshold not measured on a GPU)" in text


def test_head_size_128_and_a_different_value_width():
    """D=128 takes 32 x 32 forward tiles (the threshold is then t=64), 16 x 16 backward tiles; Dv=64 with D=128."""
    _, text = schedule_on_cuda(autodiff_ir(64, 128))
    assert "t=64 >= 2 key tiles of 32" in text and "tiles of 32 queries x 32 keys" in text
    assert "tiles of 16 queries x 16 keys" in text
    ops, text = schedule_on_cuda(autodiff_ir(100, 128, width=64, causal=False))
    assert "attention_tiled" in ops and "tiles of 32 queries x 16 keys" in text


def test_forced_tiled_on_short_sequences():
    ops, text = schedule_on_cuda(autodiff_ir(5, 4), "attention_schedule_tiled")
    assert "attention_tiled" in ops and ": tiled: forced tiled (attention_schedule_tiled)" in text
    assert "tiles of 64 queries x 64 keys" in text


def test_no_tile_fits_keeps_the_row_schedule():
    """D=256: the forward fits 16 x 16 tiles, the backward nothing: triangular even when tiled is forced."""
    for name in ("attention_schedule", "attention_schedule_tiled"):
        ops, text = schedule_on_cuda(autodiff_ir(128, 256), name)
        assert "attention_tiled" not in ops
        assert "no cuda tile fits head sizes D=256, Dv=256 in shared memory, so triangular on cuda" in text
    assert "forced tiled, but causal" in text


def test_memory_budget_tiles_short_sequences():
    budget = PASSES["attention_schedule"].configured("attention_schedule_budget", "test", memory_budget=4096)
    ops, text = schedule_on_cuda(autodiff_ir(40, 4, causal=False), pass_=budget)
    assert "attention_tiled" in ops
    assert ": tiled: the dense schedule's P and G would take 51200 bytes, over the 4096 bytes budget" in text


def test_the_cpu_and_reference_rule_is_unchanged():
    """The CPU's measured crossover (t >= 8) still decides for the cpu and the reference targets."""
    for target in ("cpu", "reference"):
        ops, text = schedule_on_cuda(autodiff_ir(8, 64), target=target)
        assert "attention_tiled" in ops and ": tiled: t=8 >= 8" in text and "blocks of 64 queries x 64 keys" in text
