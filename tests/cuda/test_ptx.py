"""Every cuda kernel of the mlp example and of programs covering every kernel kind,
compiled for sm_90 without a GPU: NVVM to PTX, nvJitLink to cubin. A kernel
that does not compile, or that spills registers, fails the test; registers,
spills and shared memory are recorded (``$BENDC_PTX_REPORT``, or the test's
temporary folder, as JSON; printed with ``pytest -s``).

Needs numba-cuda (``pip install 'bendc[cuda]'``) and a process without the
CUDA simulator (the simulator replaces numba.cuda).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from bendc.codegen.cuda import CudaOptions, render_cuda_plan  # noqa: E402
from bendc.codegen.plan import build_plan  # noqa: E402
from bendc.codegen.ptx import CompiledKernel, compile_kernel, compile_plan, jit_options, parse_resources  # noqa: E402
from bendc.compile import render_cuda  # noqa: E402
from cuda_programs import Program, all_programs, jitted, plan_kinds, spec_of  # noqa: E402
from runtime.artifact import load_module  # noqa: E402
from bendc.codegen.cache import kernel_path, write_kernel  # noqa: E402

ARCH = "sm_90"
MAX_SHARED_BYTES = 48 * 1024  # static shared memory per block
MAX_THREADS = 1024
# Kernels that compute in float64 on purpose: layer norm's, group norm's and batch norm's fused rows
# are float64 inside and round once per output, as the CPU kernels and the reference do
# (bendc/ops/layer_norm.py, group_norm.py, batch_norm.py). Every other kernel is float32.
FLOAT64_OPS = frozenset({"layer_norm", "layer_norm_grad", "group_norm", "group_norm_grad", "batch_norm",
                         "batch_norm_grad", "batch_norm_stats"})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


@pytest.fixture(scope="module")
def resources(tmp_path_factory):
    """Collects every compiled kernel's resources; written as JSON when the module's tests end."""
    table: dict[str, list[dict]] = {}
    yield table
    path = os.environ.get("BENDC_PTX_REPORT") or str(tmp_path_factory.mktemp("ptx") / "ptx-resources.json")
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(table, stream, indent=1)
    print(f"\nPTX resources ({ARCH}) written to {path}")
    for program, kernels in table.items():
        for kernel in kernels:
            print(f"  {program:18} {kernel['kernel']:24} {kernel['registers']:3d} registers  "
                  f"{kernel['spill_stores'] + kernel['spill_loads']:3d} spill bytes  "
                  f"{kernel['shared_bytes']:5d} smem bytes  {kernel['ms']:5.0f} ms")


def lowered(program: Program, cache_dir: str):
    """The program's cuda kernels, rendered and imported (traced through the reference target: no GPU)."""
    inputs = program.make_inputs(np.random.default_rng(0))
    executable = jitted(program, "reference").lower(spec_of(program, inputs), **program.static)
    return executable.graph, render_cuda(executable.graph, cache_dir)


_COMPILED: dict[tuple[str, str], CompiledKernel] = {}


def compile_all(kernels) -> list[CompiledKernel]:
    """compile_plan, but each distinct module's kernel once per session (many steps share modules)."""
    compiled = []
    for step in kernels.plan.steps:
        module = kernels.modules[step.name]
        for launch in step.launches:
            key = (step.module, launch["kernel"])
            if key not in _COMPILED:
                dispatcher = getattr(module, launch["kernel"])
                _COMPILED[key] = compile_kernel(dispatcher.py_func, module.SIGNATURE, arch=ARCH,
                                                **jit_options(dispatcher), step=step.name,
                                                kernel=launch["kernel"])
            compiled.append(_COMPILED[key])
    return compiled


def check_cubins(program: Program, cache_dir: str, float64_ops: frozenset[str] = FLOAT64_OPS) -> list[tuple]:
    """Every cuda kernel of ``program`` compiled to an sm_90 cubin: no spills, registers and launch
    sizes in bounds, float64 only in ``float64_ops`` (which must accumulate in it). The
    (step, launch, compiled kernel) triples, in launch order."""
    _, kernels = lowered(program, cache_dir)
    assert program.kinds <= plan_kinds(kernels.plan), [s.kind for s in kernels.plan.steps]
    compiled = compile_all(kernels)
    launches = [(step, launch) for step in kernels.plan.steps for launch in step.launches]
    assert len(compiled) == len(launches) > 0
    for (step, launch), kernel in zip(launches, compiled):
        name = f"{step.name}.{launch['kernel']}"
        assert kernel.cubin, name
        assert kernel.spill_stores == 0 and kernel.spill_loads == 0, f"{name} spills:\n{kernel.info_log}"
        assert 0 < kernel.registers <= 255, f"{name}:\n{kernel.info_log}"
        threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
        assert threads <= MAX_THREADS and launch["shared_bytes"] <= MAX_SHARED_BYTES, (name, launch)
        if step.op in float64_ops:
            assert re.search(r"\badd\.rn\.f64\b", kernel.ptx), f"{name} should accumulate in float64"
        else:
            assert ".f64" not in kernel.ptx, f"{name} computes in float64 (an untyped literal?)"
    return [(step, launch, kernel) for (step, launch), kernel in zip(launches, compiled)]


# The examples at their own (GPU) sizes are GPU-sized PTX builds (27 s and 11 s of numba-cuda's
# compiles): make test-long. Every kernel kind they launch is compiled in make test by the small
# programs (conv_block, layer_norm, group_norm, class_losses, the attention programs, mlp_example).
# The odd-length attention programs (t=3: a middle row without a partner) build the same kernels as
# their t=4 twins but for that literal (4-5 s each): their values run under the simulator in make
# test (test_simulator.py), their PTX builds in make test-long.
LONG_PROGRAMS = ("cnn_example", "transformer_example", "attention_causal_t3", "attention_full_t3")


@pytest.mark.parametrize("program", [pytest.param(p, marks=pytest.mark.long) if p.name in LONG_PROGRAMS else p
                                     for p in all_programs()], ids=lambda p: p.name)
def test_every_kernel_compiles_to_cubin_without_spills(program: Program, cache_dir: str, resources) -> None:
    resources[program.name] = [
        {"kernel": f"{step.name}.{launch['kernel']}", "registers": kernel.registers,
         "spill_stores": kernel.spill_stores, "spill_loads": kernel.spill_loads,
         "shared_bytes": kernel.shared_bytes, "launch_shared_bytes": launch["shared_bytes"],
         "grid": launch["grid"], "block": launch["block"], "ms": round(kernel.seconds * 1000)}
        for step, launch, kernel in check_cubins(program, cache_dir)]


def _chain_kernel_ptx(cache_dir: str, options: CudaOptions) -> str:
    """PTX of the fused kernel of ``elementwise_chain`` (x * w + b ...: multiplies feeding adds)."""
    (program,) = [p for p in all_programs() if p.name == "elementwise_chain"]
    graph, _ = lowered(program, cache_dir)
    plan = build_plan(graph)
    render_cuda_plan(plan, graph, options)
    step = plan.steps[0]
    assert step.kind == "elementwise" and len(step.nodes) > 10
    name = write_kernel(cache_dir, step.source)
    module = load_module(kernel_path(cache_dir, name), name)
    return compile_kernel(module.kernel.py_func, module.SIGNATURE, arch=ARCH,
                          fastmath=options.fastmath).ptx


def test_no_fma_contraction_unless_fastmath(cache_dir: str) -> None:
    """a*b+c stays a rounded multiply and a rounded add, as PyTorch's CPU computes it."""
    exact = _chain_kernel_ptx(cache_dir, CudaOptions())
    assert not re.search(r"\bfma\.rn\.f32\b", exact)
    assert re.search(r"\bmul\.rn\.f32\b", exact) and re.search(r"\badd\.rn\.f32\b", exact)
    fast = _chain_kernel_ptx(cache_dir, CudaOptions(fastmath=True))
    assert re.search(r"\bfma\.rn(\.ftz)?\.f32\b", fast)


def test_resource_parser_reads_the_linker_log() -> None:
    log = ("ptxas info    : Used 40 registers, used 1 barriers, 1536 bytes smem\n"
           "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
           "info    : used 40 registers, used 5 barriers, 8 stack, 1536 bytes smem, 696 bytes cmem[0], 0 bytes lmem\n")
    assert parse_resources(log) == {"registers": 40, "spill_stores": 12, "spill_loads": 16, "shared_bytes": 1536}


def test_compile_plan_covers_every_launch(cache_dir: str) -> None:
    (program,) = [p for p in all_programs() if p.name == "cross_entropy"]
    _, kernels = lowered(program, cache_dir)
    compiled = compile_plan(kernels.plan, kernels.modules, ARCH)
    assert [(c.step, c.kernel) for c in compiled] == [
        (s.name, l["kernel"]) for s in kernels.plan.steps for l in s.launches]
    assert all(c.describe().startswith(f"{c.step}.{c.kernel} (sm_90): ") for c in compiled)


# group norm as fused ops (tests/cuda/group_norm_programs.py): every variant of their kernels
from group_norm_programs import PROGRAMS as GROUP_NORM_PROGRAMS  # noqa: E402


@pytest.mark.parametrize("program", GROUP_NORM_PROGRAMS, ids=lambda p: p.name)
def test_group_norm_kernels_compile_to_cubin_without_spills(program: Program, cache_dir: str) -> None:
    ops = {(step.op, launch["kernel"]) for step, launch, _ in check_cubins(program, cache_dir)}
    assert ("group_norm", "kernel") in ops and any(op == "group_norm_grad" for op, _ in ops), ops


# training batch norm as fused ops (tests/cuda/batch_norm_programs.py)
from batch_norm_programs import PROGRAMS as BATCH_NORM_PROGRAMS  # noqa: E402


@pytest.mark.parametrize("program", BATCH_NORM_PROGRAMS, ids=lambda p: p.name)
def test_batch_norm_kernels_compile_to_cubin_without_spills(program: Program, cache_dir: str) -> None:
    ops = {step.op for step, _, _ in check_cubins(program, cache_dir)}
    assert {"batch_norm", "batch_norm_grad"} <= ops, ops
