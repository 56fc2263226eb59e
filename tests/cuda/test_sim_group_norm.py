"""group_norm and group_norm_grad (bendc/ops/group_norm.py) on the cuda target under numba's CUDA
simulator, against the reference interpreter (tests/cuda/run_simulator.sh runs this file in its own
process; in any other process it is skipped). Shapes are tiny: a simulated thread costs ~170 us.

The kernels are one block per (sample, group) row (float64 trees for the statistics and each
channel's ds and db) and, for dweight and dbias, one block per channel; the trees add in another
order than the reference's lanes, so results agree to float64 rounding (the usual tolerances).
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

import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
from cuda_programs import Program, report_kinds  # noqa: E402
from group_norm_programs import PROGRAMS  # noqa: E402
from test_simulator import check_program  # noqa: E402  (also makes the simulator's shared arrays thread safe)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-group-norm-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_group_norm_program_matches_reference(program: Program, cache_dir: str) -> None:
    step = check_program(program, cache_dir)
    assert program.kinds <= report_kinds(step.report()), step.report()
    sources = step.kernels()
    assert all("numba.float64" in sources[n] for n in sources if n.startswith("group_norm")), sources
    (grad,) = [source for name, source in sources.items() if name.startswith("group_norm_grad")]
    assert ("def affine(" in grad) == bool({"w", "b"} & set(program.leaves)), grad
    assert ("def kernel(" in grad) == (program.name != "group_norm_affine_only"), grad


def test_group_norm_blocks_of_two_threads_and_one_block_looping(cache_dir: str, monkeypatch) -> None:
    """Blocks of two threads (each thread strides over its row) and a grid of one block (which
    loops over the rows and the channels): every element is still covered."""
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 2)
    monkeypatch.setattr(cuda_kit, "MAX_ROWS", 1)
    step = check_program(PROGRAMS[0], cache_dir)
    lines = "\n".join(line for line in step.report().splitlines() if line.startswith("[cuda] launch: group_norm"))
    launches = re.findall(r"(\w+)\[grid=\((\d+), 1, 1\), block=\((\d+), 1, 1\)", lines)
    assert {kernel for kernel, _, _ in launches} == {"kernel", "affine"}, step.report()
    assert all(grid == "1" and block == "2" for _, grid, block in launches), step.report()
