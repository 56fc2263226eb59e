"""The tiled kernels' block loops over grid.y and grid.z (kernels/cuda_kit.py block_loop) under
numba's CUDA simulator (tests/cuda/run_simulator.sh; skipped in any other process).

On a GPU they loop only past 65535 row tiles, batch entries or groups, which no simulator can run;
here the limit (cuda_kit.MAX_ROWS) is lowered to one block, so every block walks all the row tiles
and batch entries of a matmul, and all the channel tiles and groups of conv2d and its two
gradients. Each output must be the same bits as with one block per tile (the loop only regroups
blocks: every element is the same sum in the same order) and match the reference interpreter.
tests/cuda/test_grid_limits.py checks the launches at shapes past the real limits.
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
import bendc.ops.matmul as matmul  # noqa: E402
from conftest import assert_bitwise  # noqa: E402
from conv_programs import CONV_GRAD_PROGRAMS  # noqa: E402
from cuda_programs import CONV_PROGRAMS, PROGRAMS, jitted  # noqa: E402
from test_simulator import as_tuple, check_program, host  # noqa: E402  (also makes the simulator's shared arrays thread safe)

# conv_block (a conv2d forward chain, ~8 s) in make test-long: groups2_stride2x1 loops conv2d's forward
# (two groups, several channel tiles) as well as its two gradients.
CASES = ([p for p in PROGRAMS if p.name == "batched_matmul"]
         + [pytest.param(p, marks=pytest.mark.long) for p in CONV_PROGRAMS if p.name == "conv_block"]
         + [p for p in CONV_GRAD_PROGRAMS if p.name == "groups2_stride2x1"])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-grid-loops"))


@pytest.mark.parametrize("program", CASES, ids=lambda p: getattr(p, "name", None))
def test_one_block_looping_over_every_tile_gives_the_same_bits(program, cache_dir: str, monkeypatch) -> None:
    monkeypatch.setattr(conv, "CONV_TILE", 2)  # several channel tiles a group
    monkeypatch.setattr(matmul, "MATMUL_TILE", 2)  # several row tiles a batch entry
    inputs = program.make_inputs(np.random.default_rng(0))
    tiled = [host(value) for value in as_tuple(jitted(program, "cuda", cache_dir)(*inputs, **program.static))]
    monkeypatch.setattr(cuda_kit, "MAX_ROWS", 1)
    step = check_program(program, cache_dir, inputs)  # against the reference interpreter
    kernels = "\n".join(step.kernels().values())
    assert any(f"while {loop} <" in kernels for loop in ("row_tile", "z", "g")), kernels
    grids = re.findall(r"grid=\((\d+), (\d+), (\d+)\)", step.report())
    assert grids and all(grid[1:] == ("1", "1") for grid in grids), step.report()  # y and z: one block
    looped = [host(value) for value in as_tuple(step(*inputs, **program.static))]
    for index, (mine, theirs) in enumerate(zip(looped, tiled)):
        assert_bitwise(mine, theirs, f"{program.name} output {index}")
