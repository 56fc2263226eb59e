"""A tiny fixed-seed sample of the differential fuzzer (tests/fuzz) on the cuda target, under numba's
CUDA simulator: each program against torch eager (float32/float64), as tests/fuzz/test_fuzz.py does
for "reference" and "cpu". Runs in its own process (tests/cuda/run_simulator.sh); skipped elsewhere.

Only cheap families (elementwise, scalars, identities, layout, a backward): the simulator costs
~170 us per simulated thread, and row reductions and attention synchronize a block many times.
``BENDC_FUZZ_CUDA_N`` sets the number of programs (default 30).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from fuzz_check import KNOWN_HITS, run_and_check  # noqa: E402
from fuzz_gen import programs  # noqa: E402

CHEAP = ("arith_tensor", "arith_scalar", "unary", "pow", "identity", "layout", "index", "backward",
         "arith_tensor", "unary", "backward", "zero_grad", "grad_read")
N = int(os.environ.get("BENDC_FUZZ_CUDA_N", "30"))


def test_fuzz_sample_on_the_simulator(tmp_path_factory) -> None:
    cache_dir = str(tmp_path_factory.mktemp("fuzz-cuda-kernels"))

    @settings(max_examples=N, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(program=programs(families=CHEAP, large_shapes=False))
    def check(program) -> None:
        run_and_check(program, "cuda", cache_dir)

    check()
    print(dict(KNOWN_HITS))
