"""The cuda kernels of the op-coverage issue's selection, power and shape programs compiled for sm_90
without a GPU (NVVM to PTX, nvJitLink to cubin), as tests/cuda/test_ptx.py compiles the others: no
spills, and float32 arithmetic only (a bare literal would make .f64 instructions)."""
from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from ops_shape_programs import PROGRAMS  # noqa: E402
from test_ptx import check_cubins  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_every_kernel_compiles_to_cubin_in_float32(program, cache_dir: str) -> None:
    check_cubins(program, cache_dir, float64_ops=frozenset())
