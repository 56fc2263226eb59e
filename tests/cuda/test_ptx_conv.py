"""The cuda kernels of conv2d and its two VJP products (bendc/ops/conv_cuda.py) compiled for sm_90
without a GPU, at the tiny shapes the simulator runs (tests/cuda/conv_programs.py) and at GPU
shapes: NVVM to PTX, nvJitLink to cubin (tests/cuda/test_ptx.py's check_cubins: no spills, no
float64, launch sizes and static shared memory in bounds). Here also: each conv block's threads
times its registers fit one SM's 64K registers (else the launch fails on a GPU), and the SASS of
every conv kernel holds no FFMA (a*b+c rounded twice, as PyTorch's CPU does; tests/cuda/test_sass.py).
Each conv kernel's tiles, registers, spills and shared memory are printed (``pytest -s``).

Needs numba-cuda and a process without the CUDA simulator."""
from __future__ import annotations

import collections
import importlib.util
import os
import re

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from bendc.compile import build_cuda_artifact  # noqa: E402
from conv_programs import CONV_GRAD_GPU_PROGRAMS, CONV_GRAD_PROGRAMS  # noqa: E402
from test_ptx import check_cubins, lowered  # noqa: E402
from test_sass import sass_ops  # noqa: E402

REGISTERS_PER_SM = 64 * 1024
CONV_OPS = frozenset({"conv2d", "conv2d_grad_input", "conv2d_grad_weight"})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-conv-kernels"))


# of the tiny programs, those whose kernels the GPU-shape ones do not have: stride phases that no
# tap reaches (kernels that only write zeros), 8-wide tiles, conv1d with groups
TINY = ("stride2_dilation2", "stride3_kernel2", "conv1d_stride2_groups2")


# The GPU-shape builds (~100 s together) run in make test-long; make test builds the tiny ones, whose
# kernels hold every code path (stride phases, tile widths, groups) at a few seconds each.
@pytest.mark.parametrize("program", [p for p in CONV_GRAD_PROGRAMS if p.name in TINY] +
                         [pytest.param(p, marks=pytest.mark.long) for p in CONV_GRAD_GPU_PROGRAMS],
                         ids=lambda p: p.name)
def test_conv_kernels_compile_without_spills_or_contraction(program, cache_dir: str, tmp_path) -> None:
    checked = [(step, launch, kernel) for step, launch, kernel in check_cubins(program, cache_dir)
               if step.op in CONV_OPS]
    assert {step.op for step, _, _ in checked} == CONV_OPS, [step.op for step, _, _ in checked]
    products: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for step, launch, kernel in checked:
        name = f"{step.name}.{launch['kernel']}"
        threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
        print(f"\n  {program.name:22} {name:34} grid {tuple(launch['grid'])} block {tuple(launch['block'])}: "
              f"{kernel.registers} registers, {kernel.spill_stores + kernel.spill_loads} spill bytes, "
              f"{kernel.shared_bytes} bytes smem", end="")
        assert threads * kernel.registers <= REGISTERS_PER_SM, (name, threads, kernel.registers)
        ops = sass_ops(kernel.cubin, tmp_path)
        assert ops["FFMA"] == 0, (name, ops)
        products[step.name] += ops
    # every step multiplies and adds (a stride phase that no tap reaches only writes zeros)
    assert all(ops["FMUL"] >= 1 and ops["FADD"] >= 1 for ops in products.values()), products


def test_the_build_report_gives_each_conv_kernels_tiles_and_registers(cache_dir: str) -> None:
    """``bendc compile --target cuda``'s report: a ``tiles:`` line per conv step (its implicit GEMM's
    sides and tile sizes, the weight gradient's slices) and a ``compiled:`` line per conv kernel
    (registers, spills, shared memory)."""
    (program,) = [p for p in CONV_GRAD_PROGRAMS if p.name == "stride2_pad1_odd"]
    graph, kernels = lowered(program, cache_dir)
    report = "\n".join(build_cuda_artifact(graph, cache_dir, "sm_90").report)
    steps = {step.op: step for step in kernels.plan.steps if step.op in CONV_OPS}
    assert set(steps) == CONV_OPS
    assert re.search(rf"^tiles: {steps['conv2d'].name}: conv2d 1 group\(s\) of \[3,18\] @ \[18,12\] implicit GEMM, "
                     r"16x16 tiles$", report, re.M), report
    assert re.search(rf"^tiles: {steps['conv2d_grad_input'].name}: conv2d_grad_input 1 group\(s\), implicit GEMM "
                     r"per stride phase: \[2,12\] @ \[12,6\] in 2x16 tiles; \[2,6\] @ \[6,9\] in 2x16 tiles; "
                     r"\[2,6\] @ \[6,8\] in 2x8 tiles; \[2,3\] @ \[3,12\] in 2x16 tiles$", report, re.M), report
    assert re.search(rf"^tiles: {steps['conv2d_grad_weight'].name}: conv2d_grad_weight 1 group\(s\) of \[3,12\] @ "
                     r"\[12,18\] implicit GEMM, 4x16 tiles, the reduction in 1 slice\(s\) per block$", report, re.M), report
    for op, step in steps.items():
        for launch in step.launches:
            assert re.search(rf"^compiled: {step.name}\.{launch['kernel']} \(sm_90\): \d+ registers, 0 bytes spill stores, "
                             r"0 bytes spill loads, \d+ bytes shared memory", report, re.M), (op, report)
