"""The device machine's driver, GPU, toolchain and package versions, one JSON line; then the
toolchain's checks (tests/gpu/device_check.sh runs it first and stops when it exits non-zero).

Recorded: nvidia-smi's line, the driver's CUDA version, NVVM (API and IR versions, the library
numba-cuda loads and how it found it), nvJitLink, CUDA_HOME (set to /usr/local/cuda when no wheel
brings NVVM and that toolkit has nvvm/: runtime.cuda.nvvm_home_fallback), the packages, and a
smoke compile of one kernel through NVVM and nvJitLink for this GPU's architecture.
``--no-driver`` checks the toolchain without a GPU (the simulator dry run).
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-driver", action="store_true", help="no GPU here: skip the driver's checks")
    args = parser.parse_args()
    from bendc.codegen.ptx import CompileError, smoke_compile, toolchain, toolchain_problems

    facts: dict = {"python": platform.python_version(), **toolchain()}
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        facts["nvidia_smi"] = f"error: {error}"
    for name in ("numpy", "torch", "numba", "networkx", "pytest", "hypothesis", "xdist", "pytest_timeout"):
        try:
            facts[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as error:  # noqa: BLE001 - recorded
            facts[name] = f"missing: {type(error).__name__}: {error}"
    try:
        import torch
        facts["torch_cuda"] = torch.version.cuda
        facts["torch_device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception as error:  # noqa: BLE001
        facts["torch_device"] = f"error: {error}"
    from bendc.compile import cuda_status
    from runtime.cuda_graph import device_arch

    facts["arch"] = None if args.no_driver else device_arch()
    facts["bendc_cuda_status"] = cuda_status()
    problems = toolchain_problems(facts, driver=not args.no_driver)
    arch = facts["arch"] or "sm_90"
    try:
        kernel = smoke_compile(arch)
        facts["smoke_compile"] = f"{arch}: {kernel.registers} registers, {kernel.seconds * 1000:.0f} ms"
    except CompileError as error:
        facts["smoke_compile"] = f"error: {error}"
        problems.append(f"smoke compile for {arch}: {error}")
    facts["problems"] = problems
    print(json.dumps(facts), flush=True)
    for problem in problems:
        print(f"device_info: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
