"""The tiled (flash-attention) schedule's cuda kernels under numba's CUDA simulator: values and
gradients against PyTorch's SDPA, the CPU tiled kernels and the reference interpreter (the ops'
numpy semantics). Runs in its own process (tests/cuda/run_simulator.sh); skipped elsewhere.

Shapes are tiny (a simulated thread costs ~170 us), so most cases shrink the kernels' tiles and
threads (``cuda_tiled.CANDIDATES`` and ``THREADS``) until a sequence of 3 to 18 positions spans
several query and key tiles with a ragged last one: causal and not, GQA, Dv != D, tiles with
more queries than keys and the reverse (the diagonal then crosses tiles unevenly), a sequence
shorter than one tile, and one block looping over every tile. One case keeps the real tiles
(64 x 64 forward, 64 x 32 backward, 128 threads for D = 4). These check what the code computes,
not GPU timing or GPU rounding (the simulator computes with numpy; there is no GPU here).

Tolerance: max |a - b| <= 2e-5 max(|b|, 0.1), attention's tolerance in tests/ops/test_attention_tiled.py
(the sums run in another order than torch's, and exp differs).
"""
from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import torch  # noqa: E402

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402
import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
import bendc.ops.attention.cuda_tiled as cuda_tiled  # noqa: E402
from bendc.compile import build  # noqa: E402
from bendc.ir.parser import parse_graph  # noqa: E402
from bendc.passes import default_passes  # noqa: E402
from runtime.artifact import module_name  # noqa: E402
from test_simulator import host  # noqa: E402  (also makes the simulator's shared arrays thread safe)

TILED = tuple("attention_schedule_tiled" if p == "attention_schedule" else p for p in default_passes())
RELATIVE = 2e-5
LEAVES = ("q", "k", "v")

# name, (batch, heads, kv heads, t, D, Dv), causal, (queries, keys) per tile, threads
CASES = [
    ("gqa_causal_ragged", (1, 2, 1, 13, 4, 4), True, (4, 4), 8),
    ("full_value_narrower", (1, 2, 2, 10, 5, 3), False, (4, 4), 8),
    ("shorter_than_a_tile", (1, 2, 1, 3, 4, 6), True, (4, 4), 8),
    ("queries_twice_the_keys", (1, 4, 2, 18, 8, 8), True, (8, 4), 16),
    ("keys_twice_the_queries", (2, 2, 1, 11, 3, 7), True, (4, 8), 16),
    ("full_keys_twice_the_queries", (1, 2, 1, 9, 4, 4), False, (4, 8), 8),
]


def attention_step(causal: bool):
    def step(q, k, v, g):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        o.backward(g)
        return o, q.grad, k.grad, v.grad

    return step


def make_inputs(shape, seed: int = 0) -> tuple:
    batch, heads, kv_heads, t, depth, width = shape
    rng = np.random.default_rng(seed)

    def normal(*dims):
        return rng.standard_normal(dims).astype(np.float32)

    return (normal(batch, heads, t, depth), normal(batch, kv_heads, t, depth), normal(batch, kv_heads, t, width),
            normal(batch, heads, t, width))


def torch_values(arrays, causal: bool) -> list[np.ndarray]:
    q, k, v = (torch.from_numpy(a.copy()).requires_grad_(True) for a in arrays[:3])
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    o.backward(torch.from_numpy(arrays[3].copy()))
    return [o.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]


def assert_relative(actual, expected, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    error = float(np.max(np.abs(actual - expected)))
    scale = max(float(np.max(np.abs(expected))), 0.1)
    assert error <= RELATIVE * scale, f"{what}: max error {error:.3g} > {RELATIVE} * {scale:.3g}"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-attention-tiled-kernels"))


def small_tiles(monkeypatch, tiles: tuple[int, int], threads: int) -> None:
    monkeypatch.setattr(cuda_tiled, "CANDIDATES", (tiles,))
    monkeypatch.setattr(cuda_tiled, "THREADS", threads)


def run_cuda(arrays, causal: bool, cache_dir: str):
    step = bendc.jit(attention_step(causal), leaves=LEAVES, target="cuda", cache_dir=cache_dir, passes=TILED)
    return step, [host(value) for value in step(*arrays)]


@pytest.mark.parametrize("name, shape, causal, tiles, threads", CASES, ids=[case[0] for case in CASES])
def test_values_and_gradients_match_torch_and_the_cpu_tiled_op(name, shape, causal, tiles, threads, cache_dir,
                                                              monkeypatch) -> None:
    small_tiles(monkeypatch, tiles, threads)
    arrays = make_inputs(shape, seed=len(name))
    step, got = run_cuda(arrays, causal, cache_dir)
    final = step.ir("final")
    assert "attention_tiled[" in final and "attention_tiled_grad[" in final
    report = step.report()
    assert f"tiles of {tiles[0]} queries x {tiles[1]} keys, {threads} threads" in report, report
    assert re.search(r"launch: attention_tiled_grad\d+: key_grads\[grid=.*; query_grads\[grid=", report), report
    cpu = bendc.jit(attention_step(causal), leaves=LEAVES, target="cpu", cache_dir=cache_dir, passes=TILED)(*arrays)
    reference = bendc.jit(attention_step(causal), leaves=LEAVES, target="reference", passes=TILED)(*arrays)
    for index, what in enumerate(("o", "dq", "dk", "dv")):
        assert_relative(got[index], torch_values(arrays, causal)[index], f"{name} {what} against torch")
        assert_relative(got[index], cpu[index], f"{name} {what} against the cpu tiled op")
        assert_relative(got[index], reference[index], f"{name} {what} against the reference")


def test_one_block_loops_over_every_tile(cache_dir, monkeypatch) -> None:
    """A grid of one block: each kernel walks all its (head, tile) items, reusing shared memory."""
    small_tiles(monkeypatch, (4, 4), 8)
    monkeypatch.setattr(cuda_kit, "MAX_ROWS", 1)
    arrays = make_inputs((1, 2, 1, 10, 4, 3), seed=3)
    step, got = run_cuda(arrays, True, cache_dir)
    one = r"\[grid=\(1, 1, 1\), block=\(8, 1, 1\)\]"
    assert re.search(rf"launch: attention_tiled\d+: kernel{one}", step.report()), step.report()
    assert re.search(rf"launch: attention_tiled_grad\d+: key_grads{one}.*; query_grads{one}", step.report())
    for index, want in enumerate(torch_values(arrays, True)):
        assert_relative(got[index], want, f"output {index}")


def test_the_real_tiles_on_a_short_sequence(cache_dir) -> None:
    """The tiles the kernels pick by themselves for D = 4 (a sequence of 5: one ragged tile), 128 threads."""
    arrays = make_inputs((1, 2, 1, 5, 4, 4), seed=5)
    step, got = run_cuda(arrays, True, cache_dir)
    report = step.report()
    assert "cuda forward: tiles of 64 queries x 64 keys, 128 threads" in report, report
    assert "then dQ per query tile): tiles of 64 queries x 32 keys, 128 threads" in report, report
    for index, want in enumerate(torch_values(arrays, True)):
        assert_relative(got[index], want, f"output {index}")


def test_no_float_atomics_and_a_rerun_is_bitwise_identical(cache_dir, monkeypatch) -> None:
    """Every output element is written by the one block that owns it: no atomics in the sources, and
    the same inputs give the same bits."""
    small_tiles(monkeypatch, (4, 4), 8)
    arrays = make_inputs((1, 2, 1, 9, 4, 4), seed=6)
    step, first = run_cuda(arrays, False, cache_dir)
    second = [host(value) for value in step(*arrays)]
    sources = "\n".join(source for name, source in step.kernels().items() if "attention_tiled" in name)
    assert "def key_grads(" in sources and "def query_grads(" in sources and "cuda.atomic" not in sources
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("min_blocks, parts", [(0, 1), (24, 3), (10**6, 8)], ids=["whole", "3 parts", "8 parts"])
def test_key_grads_in_parts_matches_torch_and_reruns_bitwise(min_blocks, parts, cache_dir, monkeypatch) -> None:
    """key_grads' walk over (query head, query tile) whole or split in parts (1 x 2 kv heads x 4 key
    tiles = 8 blocks; 3 parts: uneven shares of a walk of 2 heads x 1 to 4 query tiles; 8 parts: some
    empty), the parts added in order by key_grads_sum: the same gradients as torch and the same bits
    on a rerun."""
    small_tiles(monkeypatch, (4, 4), 8)
    monkeypatch.setattr(cuda_tiled, "MIN_BLOCKS", min_blocks)
    arrays = make_inputs((1, 4, 2, 13, 4, 3), seed=11)
    step, got = run_cuda(arrays, True, cache_dir)
    report = step.report()
    launch = re.search(r"launch: attention_tiled_grad\d+: (.*)", report).group(1)
    kernels = re.findall(r"(\w+)\[grid=\((\d+), 1, 1\)", launch)
    if parts == 1:
        assert [k for k, _ in kernels] == ["key_grads", "query_grads"] and kernels[0][1] == "8", launch
    else:
        assert [k for k, _ in kernels] == ["key_grads", "key_grads_sum", "query_grads"], launch
        sources = "\n".join(step.kernels().values())
        assert kernels[0][1] == str(8 * parts) and f"in {parts} parts of each tile's walk" in sources, launch
    for index, want in enumerate(torch_values(arrays, True)):
        assert_relative(got[index], want, f"{parts} parts: output {index}")
    again = [host(value) for value in step(*arrays)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, again))


# dense (11 s under the simulator) reads the batch as triangular does (the same row kernels' length
# code): make test-long
@pytest.mark.parametrize("schedule", ["tiled", "triangular", pytest.param("dense", marks=pytest.mark.long)])
def test_a_new_batch_size_runs_the_same_attention_modules(schedule, tmp_path, monkeypatch) -> None:
    """Issue 25 item 7: the attention kernels read the batch from their output's length (and the tiled
    key_grads its parts from the scratch array's), so batch 2 runs batch 1's modules, named by the
    same structural hash (the cubin cache's key), with grids sized from its own shapes (key_grads:
    1 kv head x 4 key tiles x 4 parts at batch 1, x 2 parts at batch 2) and matches torch."""
    small_tiles(monkeypatch, (4, 4), 8)
    monkeypatch.setattr(cuda_tiled, "MIN_BLOCKS", 16)
    passes = tuple(f"attention_schedule_{schedule}" if p == "attention_schedule" else p for p in default_passes())
    step = bendc.jit(attention_step(True), leaves=LEAVES, target="cuda", cache_dir=str(tmp_path), passes=passes)
    modules, grids = [], []
    for batch in (1, 2):
        arrays = make_inputs((batch, 2, 1, 13, 4, 3), seed=batch)
        got = [host(value) for value in step(*arrays)]
        for index, want in enumerate(torch_values(arrays, True)):
            assert_relative(got[index], want, f"{schedule} batch {batch} output {index}")
        attention = {name: source for name, source in step.kernels().items() if "attention" in name}
        assert attention, step.kernels().keys()
        modules.append({name: module_name(source) for name, source in attention.items()})
        grids.append(re.findall(r"launch: (attention\w+): (.*)", step.report()))
    assert modules[0] == modules[1], "batch 2 renders new attention modules"
    assert grids[0] != grids[1], grids
    if schedule == "tiled":
        assert "key_grads[grid=(16, 1, 1)" in str(grids[0]) and "key_grads[grid=(16, 1, 1)" in str(grids[1])


PACKED = ("func @f(%q: f32[1,2,7,4], %k: f32[1,1,7,4], %v: f32[1,1,7,3], %g: f32[1,2,7,3]) "
          "-> (f32[1,2,10,3], f32[1,4,7,4]) {\n"
          "  %4 = attention_tiled[causal=True, scale=0.5] %q, %k, %v : f32[1,2,10,3]\n"
          "  %5 = attention_tiled_grad[causal=True, scale=0.5] %q, %k, %v, %4, %g : f32[1,4,7,4]\n"
          "  return %4, %5\n"
          "}\n")


def test_packed_outputs_match_the_ops_reference(cache_dir, monkeypatch) -> None:
    """The two ops' whole packed values (IR built by hand, no passes): O with the 7 logsumexps in 3 rows of
    Dv=3 (2 spare cells), and dq | dk | dv in W = max(4, 3) columns (dv's spare column): every cell
    against the ops' numpy reference, the spare ones +0.0."""
    small_tiles(monkeypatch, (4, 4), 8)
    rng = np.random.default_rng(7)
    shapes = [(1, 2, 7, 4), (1, 1, 7, 4), (1, 1, 7, 3), (1, 2, 7, 3)]
    inputs = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    got = [host(value) for value in build("cuda", parse_graph(PACKED), cache_dir).run(inputs)]
    want = build("reference", parse_graph(PACKED), None).run(inputs)
    for what, mine, theirs in zip(("attention_tiled", "attention_tiled_grad"), got, want):
        assert_relative(mine, np.asarray(theirs), what)
    saved, grads = got
    assert not saved[:, :, 7:, :].reshape(1, 2, 9)[:, :, 7:].any()  # past the last logsumexp
    assert not grads[:, 3:, :, 3:].any()  # dv's spare column
