"""Every cuda kernel of the reduction programs (tests/cuda/reduce_programs.py) compiled for sm_90
without a GPU, as tests/cuda/test_ptx.py compiles the others: NVVM to PTX, nvJitLink to cubin, no
spills, float32 throughout except the float64 running sums of cumsum and logsumexp.

Needs numba-cuda and a process without the CUDA simulator."""
from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from reduce_programs import FLOAT64_OPS, PROGRAMS  # noqa: E402
from test_ptx import check_cubins  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-reduce-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_every_kernel_compiles_to_cubin_without_spills(program, cache_dir: str) -> None:
    ops = {step.op for step, _, _ in check_cubins(program, cache_dir, FLOAT64_OPS)}
    assert ops & {"amax", "argmax", "cumsum", "logsumexp", "int_sum"}, ops
