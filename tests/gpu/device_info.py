"""The device machine's driver, GPU and package versions, one JSON line (tests/gpu/device_check.sh)."""
from __future__ import annotations

import importlib
import json
import platform
import subprocess


def main() -> None:
    facts: dict = {"python": platform.python_version()}
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        facts["nvidia_smi"] = f"error: {error}"
    for name in ("numpy", "torch", "numba", "numba_cuda", "cuda.core", "cuda.bindings", "networkx", "pytest",
                 "hypothesis"):
        try:
            facts[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as error:  # noqa: BLE001 - recorded
            facts[name] = f"missing: {type(error).__name__}: {error}"
    try:
        from cuda.bindings import driver
        driver.cuInit(0)
        facts["cuda_driver"] = driver.cuDriverGetVersion()[1]
    except Exception as error:  # noqa: BLE001
        facts["cuda_driver"] = f"error: {error}"
    try:
        import torch
        facts["torch_cuda"] = torch.version.cuda
        facts["torch_device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception as error:  # noqa: BLE001
        facts["torch_device"] = f"error: {error}"
    from bendc.compile import cuda_status
    from runtime.cuda_graph import device_arch

    facts["arch"] = device_arch()
    facts["bendc_cuda_status"] = cuda_status()
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
