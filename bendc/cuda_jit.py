"""``bendc.jit(target="cuda")``: which runtime binds the cuda kernels.

The choice is ``$BENDC_CUDA_RUNTIME`` as for ``runtime.load`` (``auto``, the
default; ``graph``; ``eager``; ``numba``). ``auto``, ``graph`` and ``eager``
build the plan's cubins for the present GPU's architecture (NVVM to PTX without
FMA, then nvJitLink: bendc/codegen/ptx.py, the path ``bendc compile --target
cuda`` takes; cached with the kernel modules, bendc/codegen/cubins.py) and bind
them in the cubin runtime (runtime/cuda_graph.py: static buffers, one CUDA graph
per call, or eager launches for ``eager``; donated parameters resident). When
no cubin can be had (no GPU cuda.core can see, a kernel NVVM or nvJitLink
refuses, collective steps, which only the numba runtime runs), the plan runs on
numba-cuda's JIT (runtime/cuda.py: the same no-FMA NVVM options, LTO off), and
the compile report says why (a note on stderr too when a GPU was found or a
cubin runtime was asked for). ``numba`` takes the JIT path directly.

:func:`device_arch` and :func:`cubin_device` are the only GPU-touching calls
(tests/cuda/test_cubin_simulator.py replaces them with a simulated device).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from bendc.errors import InternalError, UnsupportedError
from runtime.artifact import CUDA_RUNTIMES

ENV = "BENDC_CUDA_RUNTIME"


def runtime_choice() -> str:
    """The cuda runtime bendc.jit binds with: ``$BENDC_CUDA_RUNTIME`` or ``auto``."""
    choice = os.environ.get(ENV) or "auto"
    if choice not in CUDA_RUNTIMES:
        raise UnsupportedError(f"{ENV}={choice!r}: expected one of {', '.join(CUDA_RUNTIMES)}", op="jit")
    return choice


def device_arch() -> str | None:
    """The present GPU's architecture (``sm_90``), None without one. GPU-only beyond the import."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return None  # the simulator: no GPU to build for
    from runtime.cuda_graph import device_arch as arch

    return arch()


def cubin_device(cubins: dict[str, bytes], plan: dict, modules: dict[str, Any]) -> Any:
    """The device the cubin runtime launches on. GPU-only (cuda.core and a driver)."""
    from runtime.cuda_graph import CudaCoreDevice

    return CudaCoreDevice(cubins)


def bind_cuda(kernels: Any, cache_dir: str) -> tuple[dict, Any, list[str]]:
    """(plan JSON, bound program, report lines) of rendered cuda kernels (compile.CudaKernels)."""
    from runtime.cuda import CudaProgram

    choice = runtime_choice()
    reason = "BENDC_CUDA_RUNTIME=numba"
    if choice != "numba":
        bound = _bind_cubins(kernels, cache_dir, "eager" if choice == "eager" else "graph")
        if not isinstance(bound, str):
            return bound
        reason = bound
        if choice != "auto" or not reason.startswith("no GPU"):
            print(f"bendc: note: {kernels.plan.name} runs on numba-cuda's JIT: {reason}", file=sys.stderr,
                  flush=True)
    plan_json = kernels.plan.to_json()
    return plan_json, CudaProgram(plan_json, kernels.modules), [f"cuda runtime: numba JIT ({reason})"]


def _bind_cubins(kernels: Any, cache_dir: str, mode: str) -> tuple[dict, Any, list[str]] | str:
    """The plan bound in the cubin runtime, or why it cannot be."""
    from bendc.codegen.cubins import CubinCache
    from bendc.codegen.ptx import CompileError, compile_plan, cubin_file, record_launches
    from runtime.cpu import KernelError
    from runtime.cuda_graph import CaptureError, CubinProgram, check_cubin_data

    plan = kernels.plan
    arch = device_arch()
    if arch is None:
        return "no GPU that cuda.core can see"
    if any(step.kind == "collective" for step in plan.steps):
        return "collective steps run on the numba runtime only"
    cache = CubinCache(cache_dir, arch)
    try:
        compiled = compile_plan(plan, kernels.modules, arch, cache=cache)
    except CompileError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"no cubin could be built for {arch}: {first}"
    record_launches(plan, compiled)
    plan_json = plan.to_json()
    cubins = {cubin_file(k.step, k.kernel, arch): k.cubin for k in compiled}
    for step in plan_json["steps"]:
        for launch in step["launches"]:
            check_cubin_data(cubins[launch["cubin"]], launch)
    try:
        program = CubinProgram(plan_json, cubin_device(cubins, plan_json, kernels.modules), mode)
    except KernelError:
        raise  # a hoisted step's index check: as the numba runtime raises it
    except CaptureError as error:  # the capture was ended and its graph discarded (CudaCoreDevice.record)
        raise InternalError(f"{plan.name}: {error}; BENDC_CUDA_RUNTIME=eager runs the same cubins without "
                            "a graph", op="jit") from error
    except Exception as error:  # noqa: BLE001 - GPU-only: cuda.core failing to load or record
        first = str(error).splitlines()[0] if str(error) else ""
        return f"the cubin runtime failed on {arch}: {type(error).__name__}: {first}"
    note = (f"cuda runtime: {mode} (cubins for {arch}: {len(compiled) - cache.hits} compiled, "
            f"{cache.hits} from the kernel cache; {program.launches} launches per call)")
    return plan_json, program, [note] + [f"compiled: {kernel.describe()}" for kernel in compiled]
