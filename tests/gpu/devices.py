"""What the device script's stages bind the carried artifacts to: the GPU through cuda.core
(CudaCoreDevice), or, for the script's dry run under numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1), tests/cuda/test_cubin_simulator.py's simulated devices (synchronous, or
with asynchronous streams for the race probe)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def carried_folder() -> Path:
    """$BENDC_CARRIED, or tests/gpu/carried (tests/gpu/carried.py builds it); skips when missing."""
    folder = Path(os.environ.get("BENDC_CARRIED") or ROOT / "tests" / "gpu" / "carried")
    if not (folder / "carried.json").exists():
        pytest.skip(f"no carried artifacts in {folder}: build them with tests/gpu/carried.py")
    return folder


def listing() -> dict:
    return json.loads((carried_folder() / "carried.json").read_text())


def require_device() -> None:
    """Skip unless a GPU cuda.core can use is here (or this is the simulator's dry run)."""
    if SIMULATED:
        return
    from runtime.cuda_graph import device_arch

    if device_arch() is None:
        pytest.skip("needs a GPU that cuda.core can see (or NUMBA_ENABLE_CUDASIM=1 for the dry run)")


def new_streams() -> Any:
    """What devices made by :func:`program` with the same ``streams`` share: one simulated GPU's
    streams and memory under the simulator; nothing on a GPU (every CudaCoreDevice has its own
    stream on the one GPU)."""
    if SIMULATED:
        from test_cubin_simulator import Streams

        return Streams()
    return object()


def program(folder: Path, mode: str = "graph", outputs: str = "copy", streams: Any = None) -> Any:
    """The cuda artifact in ``folder`` bound on a device of its own (its own stream). Carried
    artifacts are signed with the build machine's key: trusted here deliberately (we built them)."""
    from runtime.artifact import read_manifest, read_plan
    from runtime.cuda_graph import CubinProgram, CudaCoreDevice, check_cubins

    plan = read_plan(str(folder), read_manifest(str(folder), trust=True))
    if SIMULATED:
        from test_cubin_simulator import AsyncSimulatedDevice, SimulatedDevice

        device = (SimulatedDevice.for_artifact(folder, plan) if streams is None
                  else AsyncSimulatedDevice.for_artifact(streams, folder, plan))
    else:
        device = CudaCoreDevice(check_cubins(str(folder), plan))  # the ELF checked against the plan
    return CubinProgram(plan, device, mode, outputs)


if SIMULATED:  # the simulated devices live beside the simulator's tests
    sys.path.insert(0, str(ROOT / "tests" / "cuda"))
