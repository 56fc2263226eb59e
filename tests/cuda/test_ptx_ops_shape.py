"""The cuda kernels of the op-coverage issue's selection, power and shape programs compiled for sm_90
without a GPU (NVVM to PTX, nvJitLink to cubin), as tests/cuda/test_ptx.py compiles the others: no
spills, and float32 arithmetic only (a bare literal would make .f64 instructions)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from bendc.codegen.ptx import compile_kernel  # noqa: E402
from bendc.compile import render_cuda  # noqa: E402
from cuda_programs import Program, jitted, plan_kinds, spec_of  # noqa: E402
from ops_shape_programs import PROGRAMS  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_every_kernel_compiles_to_cubin_in_float32(program: Program, cache_dir: str) -> None:
    inputs = program.make_inputs(np.random.default_rng(0))
    executable = jitted(program, "reference").lower(spec_of(program, inputs))
    kernels = render_cuda(executable.graph, cache_dir)
    assert program.kinds <= plan_kinds(kernels.plan), [s.kind for s in kernels.plan.steps]
    compiled = 0
    for step in kernels.plan.steps:
        module = kernels.modules[step.name]
        for launch in step.launches:
            name = f"{step.name}.{launch['kernel']}"
            kernel = compile_kernel(getattr(module, launch["kernel"]).py_func, module.SIGNATURE, arch="sm_90",
                                    step=step.name, kernel=launch["kernel"])
            assert kernel.cubin, name
            assert kernel.spill_stores == 0 and kernel.spill_loads == 0, f"{name} spills:\n{kernel.info_log}"
            assert ".f64" not in kernel.ptx, f"{name} computes in float64 (an untyped literal?)"
            compiled += 1
    assert compiled > 0
