"""Every cuda kernel of the reduction programs (tests/cuda/reduce_programs.py) compiled for sm_90
without a GPU, as tests/cuda/test_ptx.py compiles the others: NVVM to PTX, nvJitLink to cubin, no
spills, float32 throughout except the float64 running sums of cumsum and logsumexp.

Needs numba-cuda and a process without the CUDA simulator."""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from cuda_programs import plan_kinds  # noqa: E402
from reduce_programs import FLOAT64_OPS, PROGRAMS  # noqa: E402
from test_ptx import MAX_SHARED_BYTES, MAX_THREADS, compile_all, lowered  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-reduce-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_every_kernel_compiles_to_cubin_without_spills(program, cache_dir: str) -> None:
    _, kernels = lowered(program, cache_dir)
    assert program.kinds <= plan_kinds(kernels.plan), [s.kind for s in kernels.plan.steps]
    compiled = compile_all(kernels)
    launches = [(step, launch) for step in kernels.plan.steps for launch in step.launches]
    assert len(compiled) == len(launches) > 0
    ops = {step.op for step, _ in launches}
    assert ops & {"amax", "argmax", "cumsum", "logsumexp"}, ops
    for (step, launch), kernel in zip(launches, compiled):
        name = f"{step.name}.{launch['kernel']}"
        assert kernel.cubin, name
        assert kernel.spill_stores == 0 and kernel.spill_loads == 0, f"{name} spills:\n{kernel.info_log}"
        assert 0 < kernel.registers <= 255, f"{name}:\n{kernel.info_log}"
        threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
        assert threads <= MAX_THREADS and launch["shared_bytes"] <= MAX_SHARED_BYTES, (name, launch)
        if step.op in FLOAT64_OPS:
            assert re.search(r"\badd\.rn\.f64\b", kernel.ptx), f"{name} should accumulate in float64"
        else:
            assert ".f64" not in kernel.ptx, f"{name} computes in float64 (an untyped literal?)"
