"""The cuda kernels of issue 22's sorts and scatters compiled for sm_90 without a GPU (NVVM to PTX,
nvJitLink to cubin, as tests/cuda/test_ptx.py): no spills, and float32 throughout for the argsort
rank kernel, the index-ordered scatter_reduce kernel and the flips and gathers around them. (cumprod
runs a float64 product and float % computes in float64 by design: bendc/ops/scan.py,
bendc/ops/math_ops.py; the simulator test checks their values.)

Needs numba-cuda and a process without the CUDA simulator."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from cuda_programs import Program  # noqa: E402
from test_epilogue_sums import FLOAT_ATOMIC  # noqa: E402
from test_ptx import check_cubins  # noqa: E402


def sorts_and_scatters(x, src, index):
    values, order = x.sort(dim=1, descending=True)
    top, _ = x.topk(2, dim=0)
    spread = x.scatter_reduce(0, index, src, "amax", include_self=False) + x.scatter_reduce(0, index, src, "mean")
    loss = (values * x).sum() + top.sum() + (spread * spread).sum() + x.flip(1).sum()
    loss.backward()
    return loss, x.grad, src.grad, order


PROGRAM = Program("sorts_and_scatters", sorts_and_scatters, ("x", "src"), lambda rng: (
    rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32),
    np.array([[0, 2, 1, 1], [2, 0, 0, 1]], np.int64)), frozenset({"row", "scatter"}))


def test_sort_and_scatter_kernels_compile_to_cubin_in_float32(tmp_path) -> None:
    compiled = check_cubins(PROGRAM, str(tmp_path), frozenset())
    ops = {step.op for step, _, _ in compiled}
    assert {"argsort", "scatter_reduce", "scatter_add"} <= ops, ops
    # gather's gradient (scatter_add) sums in index order: no float atomic add in its PTX
    for step, _, kernel in compiled:
        if step.op == "scatter_add":
            assert not FLOAT_ATOMIC.search(kernel.ptx), f"{step.name} adds with float atomics"
