"""Epilogue sums under numba's CUDA simulator (tests/cuda/run_simulator.sh): the cuda step against
float64 numpy, and two runs bitwise equal (codegen/cuda.py renders each sum as a block per output
element with a fixed tree, no atomics). Blocks of 8 threads (cuda_kit.MAX_BLOCK), so each thread
adds several cells before the tree, and the simulator's barriers stay cheap."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc  # noqa: E402
import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
from epilogue_programs import LEAVES, float64_outputs, fused_sums, inputs  # noqa: E402
from test_simulator import as_tuple, host  # noqa: E402  (also makes the simulator's shared arrays thread safe)


def test_epilogue_sums_match_float64_and_repeat_bit_for_bit(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 8)
    given = inputs()
    step = bendc.jit(fused_sums, leaves=LEAVES, target="cuda", cache_dir=str(tmp_path))
    first = [host(o) for o in as_tuple(step(*given))]
    second = [host(o) for o in as_tuple(step(*given))]
    assert any("sum0[grid=" in line and "block=(8, 1, 1)" in line for line in step.report().splitlines())
    for index, (mine, again, exact) in enumerate(zip(first, second, float64_outputs(*given))):
        np.testing.assert_array_equal(mine, again, err_msg=f"output {index}: two runs differ")
        np.testing.assert_allclose(mine, exact, rtol=2e-6, atol=2e-6, err_msg=f"output {index} vs float64")
