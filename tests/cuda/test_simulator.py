"""The cuda target under numba's CUDA simulator, against the reference interpreter.

numba reads NUMBA_ENABLE_CUDASIM when it is imported, so these tests run in
their own pytest process: ``tests/cuda/run_simulator.sh``. In any other
process they are skipped. Shapes are tiny: a simulated thread costs ~170 us.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc  # noqa: E402
import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
import bendc.functional as F  # noqa: E402
from bendc.errors import RuntimeCheckError  # noqa: E402
from conftest import assert_bitwise, assert_close  # noqa: E402
from cuda_programs import PROGRAMS, Program, jitted, mlp_tiny, report_kinds  # noqa: E402
from numba import cuda  # noqa: E402
from runtime.cuda import to_device_flat  # noqa: E402


def _thread_safe_shared_arrays() -> None:
    """numba-cuda's simulator allocates a block's ``cuda.shared.array`` on the first call from each
    source line, checking and then filling a dict without a lock: two threads of a block that get
    there together can get different arrays, and the block computes garbage (seen here as a NaN
    loss or a wrong gradient, in roughly one run in ten of the decoder block; more often with a
    cold linecache, which the simulator reads for every allocation, and a short switch interval).
    Allocate under a lock, keyed as the simulator keys it (the caller's file and line)."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    original = shared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (or an unsupported alignment)
            return original(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        with lock:
            allocated = self._allocations.get(key)
            if allocated is None:
                allocated = self._allocations[key] = np.empty(shape, dtype)
        return allocated

    shared.array = array


_thread_safe_shared_arrays()
# The simulator runs a block's threads as Python threads, and its block manager polls them (holding
# the GIL) until all reach syncthreads: with the default 5 ms switch interval each syncthreads costs
# milliseconds, which the tree kernels (rows, statistics, attention) pay at every level.
sys.setswitchinterval(1e-4)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


def host(value) -> np.ndarray:
    assert hasattr(value, "copy_to_host"), f"cuda outputs are device arrays, got {type(value).__name__}"
    return value.copy_to_host()


def as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def check_program(program: Program, cache_dir: str, inputs: tuple | None = None):
    """Run a program on cuda and on the reference; outputs must agree. Returns the cuda JitFunction."""
    inputs = inputs if inputs is not None else program.make_inputs(np.random.default_rng(0))
    step = jitted(program, "cuda", cache_dir)
    got = as_tuple(step(*inputs, **program.static))
    want = as_tuple(jitted(program, "reference")(*inputs, **program.static))
    assert len(got) == len(want)
    for index, (mine, theirs) in enumerate(zip(got, want)):
        what = f"{program.name} output {index}"
        if index in program.bitwise:
            assert_bitwise(host(mine), theirs, what)
        else:
            assert_close(host(mine), theirs, what)
    return step


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program: Program, cache_dir: str) -> None:
    step = check_program(program, cache_dir)
    assert program.kinds <= report_kinds(step.report()), step.report()


def test_mlp_example_tiny_trains_on_device_arrays(cache_dir: str) -> None:
    """tests/flat_mlp.py with batch 4, features 8, hidden 8, classes 3: two steps, the second fed the
    first's device outputs (no copies back to the host in between)."""
    program = mlp_tiny()
    x, y, *params = program.make_inputs(np.random.default_rng(1))
    step = jitted(program, "cuda", cache_dir)
    reference = jitted(program, "reference")
    device_params = params
    for _ in range(2):
        loss, *device_params = step(x, y, *device_params, lr=0.1)
        want_loss, *params = reference(x, y, *params, lr=0.1)
        assert_close(host(loss), want_loss, "loss")
        for name, mine, theirs in zip(program.leaves, device_params, params):
            assert_close(host(mine), theirs, name)
    assert program.kinds <= report_kinds(step.report()), step.report()


def test_index_out_of_range_is_the_users_error(cache_dir: str) -> None:
    def pick(x, i):
        return F.index_select(x, 0, i) * 2.0  # the line the error names

    x = np.ones((5, 3), np.float32)
    step = bendc.jit(pick, target="cuda", cache_dir=cache_dir)
    with pytest.raises(RuntimeCheckError) as caught:
        step(x, np.array([1, 7], np.int64))
    with pytest.raises(RuntimeCheckError) as expected:
        bendc.jit(pick, target="reference")(x, np.array([1, 7], np.int64))
    assert str(caught.value) == str(expected.value)
    assert "test_simulator.py" in str(caught.value) and "index 7 is out of range" in str(caught.value)
    assert_close(host(step(x, np.array([4, 0], np.int64))), np.full((2, 3), 2.0, np.float32))  # flags cleared


def test_device_inputs_are_used_in_place_and_outputs_are_fresh(cache_dir: str) -> None:
    x = cuda.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    flat = to_device_flat(x)
    assert np.shares_memory(flat._ary, x._ary)  # the simulator's device arrays wrap numpy arrays

    def f(x, w):
        return x * 2.0, w

    step = bendc.jit(f, target="cuda", cache_dir=cache_dir)
    w = cuda.to_device(np.ones(3, np.float32))
    doubled, same = step(x, w)
    assert host(doubled).tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert not np.shares_memory(same._ary, w._ary)  # a returned parameter is a copy
    assert step.resolved_target == "cuda"


def test_grid_stride_and_block_loops_cover_every_cell(cache_dir: str, monkeypatch) -> None:
    """With one block of one warp per launch, every kernel must loop over its cells, rows and batches."""
    monkeypatch.setattr(cuda_kit, "MAX_GRID", 1)
    monkeypatch.setattr(cuda_kit, "MAX_ROWS", 1)
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 32)
    for name in ("softmax_rows", "sums", "batched_matmul", "indexing"):
        (program,) = [p for p in PROGRAMS if p.name == name]
        step = check_program(program, cache_dir)
        grids = re.findall(r"grid=\((\d+), (\d+), (\d+)\)", step.report())
        assert grids and all(grid == ("1", "1", "1") for grid in grids), step.report()


def test_row_and_attention_kernels_loop_over_rows_items_cells_and_outputs(cache_dir: str, monkeypatch) -> None:
    """One block of two threads per launch: the norm statistics loop over rows and columns, rope
    over its cells, and the attention kernels over work items, an item's cells (t + 1 of them in
    a triangular pair) and its output elements."""
    monkeypatch.setattr(cuda_kit, "MAX_GRID", 1)
    monkeypatch.setattr(cuda_kit, "MAX_ROWS", 1)
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 2)
    for name in ("layer_norm", "rope", "attention_causal_t3", "attention_full_t4"):
        (program,) = [p for p in PROGRAMS if p.name == name]
        step = check_program(program, cache_dir)
        launches = re.findall(r"grid=\((\d+), (\d+), (\d+)\), block=\((\d+), (\d+), (\d+)\)", step.report())
        assert launches and all(launch[:3] == ("1", "1", "1") for launch in launches), step.report()
        assert all(int(launch[3]) * int(launch[4]) <= 2 for launch in launches), step.report()


def test_steps_on_constants_run_once_at_bind(cache_dir: str) -> None:
    (program,) = [p for p in PROGRAMS if p.name == "hoisted"]
    step = check_program(program, cache_dir)
    assert "reduce, 4 cells, 64 bytes moved (hoisted: runs once at bind)" in step.report(), step.report()
    first, second = step(*program.make_inputs(np.random.default_rng(0)))[1], step(
        *program.make_inputs(np.random.default_rng(0)))[1]
    assert first is not second and host(first).tolist() == host(second).tolist() == [3.0] * 4


def test_launches_are_recorded_in_the_plan_and_report(cache_dir: str) -> None:
    program = mlp_tiny()
    inputs = program.make_inputs(np.random.default_rng(0))
    step = jitted(program, "cuda", cache_dir)
    step(*inputs, **program.static)
    report = step.report()
    assert "[cuda] launch: matmul7: kernel[grid=" in report, report
    # gather's gradient (cross-entropy's backward): one launch, a thread per output element, no
    # cleared output for atomics to add into
    assert re.search(r"launch: scatter_add\d+: kernel\[grid=\(1, 1, 1\), block=\(32, 1, 1\)\] \(32 threads\)\n",
                     report), report
    for source in step.kernels().values():
        assert "fastmath" not in source
        assert "\n@jit\n" in source or "VALUE =" in source or "no kernel" in source


def test_auto_target_is_cpu_under_the_simulator() -> None:
    assert bendc.jit(lambda x: x * 2.0).resolved_target == "cpu"


# ------------------------------------------------------------------ a tiny decoder block
VOCAB, T, C, HEADS, KV_HEADS, HEAD, HIDDEN = 5, 3, 8, 4, 2, 2, 8
PARAMS = ("embed", "wq", "wk", "wv", "wo", "ln_w", "ln_b", "w1", "w2")


def decoder_loss(nn, tokens, targets, cos, sin, embed, wq, wk, wv, wo, ln_w, ln_b, w1, w2):
    """A pre-norm decoder block with tied embeddings; ``nn`` is bendc.functional or a torch shim."""
    x = nn.index_select(embed, 0, tokens)                                    # (T, C)
    h = nn.layer_norm(x, (C,), ln_w, ln_b)
    q = nn.linear(h, wq).reshape(1, T, HEADS, HEAD).transpose(1, 2)          # (1, H, T, D)
    k = nn.linear(h, wk).reshape(1, T, KV_HEADS, HEAD).transpose(1, 2)       # (1, Hkv, T, D)
    v = nn.linear(h, wv).reshape(1, T, KV_HEADS, HEAD).transpose(1, 2)
    q, k = nn.rope(q, cos, sin), nn.rope(k, cos, sin)
    a = nn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + nn.linear(a.transpose(1, 2).reshape(T, C), wo)
    x = x + nn.linear(nn.gelu(nn.linear(nn.layer_norm(x, (C,)), w1)), w2)
    return nn.cross_entropy(nn.linear(x, embed), targets)


def decoder_train_step(tokens, targets, cos, sin, step,
                       embed, wq, wk, wv, wo, ln_w, ln_b, w1, w2,
                       m_embed, m_wq, m_wk, m_wv, m_wo, m_ln_w, m_ln_b, m_w1, m_w2,
                       v_embed, v_wq, v_wk, v_wv, v_wo, v_ln_w, v_ln_b, v_w1, v_w2):
    """Loss, the parameters' gradients, and adam_step's (param, m, v) for each parameter."""
    params = (embed, wq, wk, wv, wo, ln_w, ln_b, w1, w2)
    loss = decoder_loss(F, tokens, targets, cos, sin, *params)
    loss.backward()
    moments = zip(params, (m_embed, m_wq, m_wk, m_wv, m_wo, m_ln_w, m_ln_b, m_w1, m_w2),
                  (v_embed, v_wq, v_wk, v_wv, v_wo, v_ln_w, v_ln_b, v_w1, v_w2))
    updated = [F.adam_step(p, p.grad, m, v, step, 1e-2) for p, m, v in moments]
    return (loss,) + tuple(p.grad for p in params) + tuple(x for triple in updated for x in triple)


def decoder_inputs(rng: np.random.Generator) -> tuple[tuple, list[np.ndarray]]:
    """(tokens, targets, cos, sin) and the parameters."""
    half = HEAD // 2
    angles = np.arange(T)[:, None] / 10000.0 ** (np.arange(half)[None, :] / half)
    data = (rng.integers(0, VOCAB, size=T).astype(np.int64), rng.integers(0, VOCAB, size=T).astype(np.int64),
            np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
    shapes = {"embed": (VOCAB, C), "wq": (HEADS * HEAD, C), "wk": (KV_HEADS * HEAD, C), "wv": (KV_HEADS * HEAD, C),
              "wo": (C, C), "ln_w": (C,), "ln_b": (C,), "w1": (HIDDEN, C), "w2": (C, HIDDEN)}
    params = [(rng.standard_normal(shapes[name]) * 0.5).astype(np.float32) for name in PARAMS]
    params[PARAMS.index("ln_w")] += np.float32(1.0)
    return data, params


def torch_decoder_grads(data: tuple, params: list[np.ndarray]) -> tuple:
    """The loss and the parameters' gradients from PyTorch (rope written out as torch ops)."""
    import types

    import torch

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    nn = types.SimpleNamespace(**{name: getattr(torch.nn.functional, name) for name in (
        "layer_norm", "linear", "scaled_dot_product_attention", "gelu", "cross_entropy")},
        index_select=torch.index_select, rope=rope)
    tensors = [torch.from_numpy(p.copy()).requires_grad_(True) for p in params]
    loss = decoder_loss(nn, *(torch.from_numpy(d.copy()) for d in data), *tensors)
    loss.backward()
    return (loss.detach().numpy(),) + tuple(t.grad.numpy() for t in tensors)


def test_decoder_block_trains_like_the_reference_and_pytorch(cache_dir: str) -> None:
    """index_select embedding, layer_norm, rope, causal GQA attention (t=3: a middle row of its own),
    a gelu MLP, tied-embedding cross-entropy and adam_step on every parameter (the step a 0-d array):
    two steps on the simulator, the second fed the first's device outputs; each against the reference
    interpreter, and the first step's loss and gradients against PyTorch."""
    data, params = decoder_inputs(np.random.default_rng(3))
    zeros = [np.zeros_like(p) for p in params]
    leaves = PARAMS
    step = bendc.jit(decoder_train_step, leaves=leaves, target="cuda", cache_dir=cache_dir)
    reference = bendc.jit(decoder_train_step, leaves=leaves, target="reference")
    count = len(PARAMS)
    state = params + zeros + zeros  # params, m, v
    device_state = state
    for number in (1, 2):
        counter = np.array(number, np.int64)
        got = step(*data, counter, *device_state)
        want = reference(*data, counter, *state)
        names = ["loss"] + [f"d{name}" for name in PARAMS] + [
            f"{what}{name}" for name in PARAMS for what in ("new ", "m ", "v ")]
        for name, mine, theirs in zip(names, got, want):
            assert_close(host(mine), theirs, f"step {number}: {name}")
        if number == 1:
            torch_values = torch_decoder_grads(data, params)
            for name, mine, theirs in zip(names, got[:1 + count], torch_values):
                assert_close(host(mine), theirs, f"step 1 against PyTorch: {name}", rtol=1e-4, atol=1e-5)
        updated = got[1 + count:]
        device_state = list(updated[0::3]) + list(updated[1::3]) + list(updated[2::3])
        state = list(want[1 + count:][0::3]) + list(want[1 + count:][1::3]) + list(want[1 + count:][2::3])
    kinds = report_kinds(step.report())
    assert {"attention", "row", "gather", "scatter", "matmul", "copy", "elementwise"} <= kinds, step.report()
    assert "triangular" in step.report()


def test_profile_times_every_cuda_step_with_events(cache_dir: str) -> None:
    """step.profile on the cuda target: CUDA events around each step (structure only)."""
    program = mlp_tiny()
    x, y, *params = program.make_inputs(np.random.default_rng(2))
    step = jitted(program, "cuda", cache_dir)
    table = step.profile(x, y, *params, runs=2, lr=0.1)
    kernels = [row for row in table.rows if row["kernel"] != "(launch overhead)"]
    assert kernels and all(row["calls"] == 2 and row["total_ms"] >= 0 for row in kernels)
    assert abs(sum(row["share"] for row in table.rows) - 1.0) < 1e-9
    assert all("@" in row["kernel"] and row["kernel"].rpartition("@")[2] in row["source_lines"] for row in kernels)
