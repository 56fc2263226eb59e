"""conv2d, its VJP products and the pools on the cuda target under numba's CUDA simulator, against
the reference interpreter (tests/cuda/run_simulator.sh runs this file in its own process; in any
other process it is skipped). Shapes are tiny: a simulated thread costs ~170 us.

The forward conv is the implicit-GEMM tiled kernel (shared-memory tiles, so it also runs with
tiles larger than the problem), the gradients and pools one element per thread; the pools sum and
route gradients in the CPU kernels' order, so their outputs match the reference bit for bit.
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
import bendc.ops.conv as conv  # noqa: E402
from cuda_programs import CONV_PROGRAMS, Program, report_kinds  # noqa: E402
from test_simulator import check_program  # noqa: E402  (also makes the simulator's shared arrays thread safe)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-conv-kernels"))


@pytest.mark.parametrize("program", CONV_PROGRAMS, ids=lambda p: p.name)
def test_conv_program_matches_reference(program: Program, cache_dir: str) -> None:
    step = check_program(program, cache_dir)
    assert program.kinds <= report_kinds(step.report()), step.report()
    if program.name == "conv_block":
        kernels = "\n".join(step.kernels().values())
        assert "Implicit GEMM" in kernels and "cuda.shared.array((TILE, PADDED)" in kernels


def test_conv_tiles_smaller_than_the_problem_and_one_block_loops(cache_dir: str, monkeypatch) -> None:
    """Tiles of 2x2 over a 4 x 40 product (several tiles on both axes and along k), and the
    per-element kernels with one block of two threads: every cell is still covered."""
    monkeypatch.setattr(conv, "CONV_TILE", 2)
    monkeypatch.setattr(cuda_kit, "MAX_GRID", 1)
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 2)
    (program,) = [p for p in CONV_PROGRAMS if p.name == "conv_block"]
    step = check_program(program, cache_dir)
    assert re.search(r"launch: conv2d\d+: kernel\[grid=\(20, 2, 1\), block=\(2, 2, 1\)\]", step.report()), step.report()
    launches = re.findall(r"grid=\((\d+), (\d+), (\d+)\), block=\((\d+), (\d+), (\d+)\)", step.report())
    assert launches and any(launch[:3] != ("1", "1", "1") for launch in launches), step.report()
