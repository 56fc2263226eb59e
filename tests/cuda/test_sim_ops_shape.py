"""The op-coverage issue's selection, power and shape ops on the cuda target under numba's CUDA
simulator, against the reference interpreter (tiny shapes: a simulated thread costs ~170 us).
Runs in its own process (tests/cuda/run_simulator.sh); skipped elsewhere."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import test_simulator  # noqa: E402,F401  (its thread-safe simulator shared arrays and short switch interval)
from conftest import assert_bitwise, assert_close  # noqa: E402
from cuda_programs import Program, jitted, report_kinds  # noqa: E402
from ops_shape_programs import PROGRAMS  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


def _host(value) -> np.ndarray:
    assert hasattr(value, "copy_to_host"), f"cuda outputs are device arrays, got {type(value).__name__}"
    return value.copy_to_host()


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program: Program, cache_dir: str) -> None:
    inputs = program.make_inputs(np.random.default_rng(0))
    step = jitted(program, "cuda", cache_dir)
    got = step(*inputs)
    want = jitted(program, "reference")(*inputs)
    assert len(got) == len(want)
    for index, (mine, theirs) in enumerate(zip(got, want)):
        mine = _host(mine)
        assert mine.dtype == theirs.dtype, f"{program.name} output {index}: {mine.dtype} vs {theirs.dtype}"
        if index in program.bitwise or theirs.dtype == np.bool_:
            assert_bitwise(mine.astype(np.float32), theirs.astype(np.float32), f"{program.name} output {index}")
        else:
            assert_close(mine, theirs, f"{program.name} output {index}")
    assert program.kinds <= report_kinds(step.report()), step.report()
