"""The cuda target under numba's CUDA simulator, against the reference interpreter.

numba reads NUMBA_ENABLE_CUDASIM when it is imported, so these tests run in
their own pytest process: ``tests/cuda/run_simulator.sh``. In any other
process they are skipped. Shapes are tiny: a simulated thread costs ~170 us.
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

import bendc  # noqa: E402
import bendc.codegen.cuda as cuda_codegen  # noqa: E402
import bendc.functional as F  # noqa: E402
from bendc.errors import RuntimeCheckError  # noqa: E402
from conftest import assert_bitwise, assert_close  # noqa: E402
from cuda_programs import PROGRAMS, Program, jitted, mlp_tiny, report_kinds  # noqa: E402
from numba import cuda  # noqa: E402
from runtime.cuda import to_device_flat  # noqa: E402


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
    """examples/mlp.py with batch 4, features 8, hidden 8, classes 3: two steps, the second fed the
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
    monkeypatch.setattr(cuda_codegen, "MAX_GRID", 1)
    monkeypatch.setattr(cuda_codegen, "MAX_ROWS", 1)
    monkeypatch.setattr(cuda_codegen, "MAX_BLOCK", 32)
    for name in ("softmax_rows", "sums", "batched_matmul", "indexing"):
        (program,) = [p for p in PROGRAMS if p.name == name]
        step = check_program(program, cache_dir)
        grids = re.findall(r"grid=\((\d+), (\d+), (\d+)\)", step.report())
        assert grids and all(grid == ("1", "1", "1") for grid in grids), step.report()


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
    assert "zero[grid=" in report  # epilogue sums and scatters clear their outputs first
    for source in step.kernels().values():
        assert "fastmath" not in source
        assert "@cuda.jit" in source or "VALUE =" in source or "no kernel" in source


def test_auto_target_is_cpu_under_the_simulator() -> None:
    assert bendc.jit(lambda x: x * 2.0).resolved_target == "cpu"
