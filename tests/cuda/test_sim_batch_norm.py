"""Training batch norm (bendc/ops/batch_norm.py) on the cuda target under numba's CUDA simulator,
against the reference interpreter (tests/cuda/batch_norm_programs.py). Runs in its own process
(tests/cuda/run_simulator.sh); skipped elsewhere. The kernels sum in float64 trees, the reference in
lanes: values and gradients within the conftest tolerances."""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
from batch_norm_programs import PROGRAMS  # noqa: E402
from cuda_programs import Program, report_kinds  # noqa: E402
from test_simulator import check_program  # noqa: E402  (also makes the simulator's shared arrays thread safe)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-batch-norm-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_batch_norm_program_matches_reference(program: Program, cache_dir: str) -> None:
    step = check_program(program, cache_dir)
    assert program.kinds <= report_kinds(step.report()), step.report()
    sources = step.kernels()
    assert all("numba.float64" in sources[n] for n in sources if n.startswith("batch_norm")), sources
    (grad,) = [source for name, source in sources.items() if name.startswith("batch_norm_grad")]
    assert ("np.float32(xc * rstd)" in grad) == bool({"w", "b"} & set(program.leaves)), grad


def test_batch_norm_blocks_of_two_threads_and_one_block_looping(cache_dir: str, monkeypatch) -> None:
    """Blocks of two threads (each strides over its channel's values) and a grid of one block (which
    loops over the channels): every element is still covered."""
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 2)
    monkeypatch.setattr(cuda_kit, "MAX_ROWS", 1)
    step = check_program(PROGRAMS[0], cache_dir)
    lines = "\n".join(line for line in step.report().splitlines() if line.startswith("[cuda] launch: batch_norm"))
    launches = re.findall(r"(\w+)\[grid=\((\d+), 1, 1\), block=\((\d+), 1, 1\)", lines)
    assert len(launches) == 3, step.report()  # batch_norm_stats, batch_norm, batch_norm_grad
    assert all(grid == "1" and block == "2" for _, grid, block in launches), step.report()
