"""Running a script on N ranks of this machine: mpiexec from the venv's own bin folder, loopback only."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("mpi_worker.py")

# mpich's hydra: fork the ranks here (no ssh), its control socket on the loopback interface, and
# libfabric's shared-memory provider (ranks on one machine talk through shared memory).
LOOPBACK = {"HYDRA_IFACE": "lo", "FI_PROVIDER": "shm", "NUMBA_NUM_THREADS": "1"}


def mpiexec() -> str:
    """The venv's mpiexec (the mpich wheel installs it beside python), or skip."""
    pytest.importorskip("mpi4py", reason="the distributed extra is not installed: pip install -e '.[distributed]'")
    path = Path(sys.executable).parent / "mpiexec"
    if not path.exists():
        pytest.skip(f"no mpiexec beside {sys.executable}: pip install -e '.[distributed]' (the mpich wheel)")
    return str(path)


def run_ranks(ranks: int, arguments: list[str], timeout: float = 240, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python arguments...``; a hang is a failure after ``timeout`` seconds."""
    command = [mpiexec(), "-launcher", "fork", "-iface", "lo", "-n", str(ranks), sys.executable, *arguments]
    environment = {**os.environ, **LOOPBACK, "PYTHONPATH": str(ROOT), **(env or {})}
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment, cwd=ROOT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s (a rank hangs):\n{error.stdout}\n{error.stderr}")
