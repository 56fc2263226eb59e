"""Running a script on N ranks of this machine: mpiexec from the venv's own bin folder, loopback only
(bendc.distributed.loopback_command)."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bendc.distributed import LOOPBACK_ENV, loopback_command, mpiexec, remove_stale_shared_memory

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("mpi_worker.py")


def require_mpi() -> None:
    """Skip unless the distributed extra is installed: mpi4py, and mpiexec beside python (mpich's wheel)."""
    pytest.importorskip("mpi4py", reason="the distributed extra is not installed: pip install -e '.[distributed]'")
    if not mpiexec().exists():
        pytest.skip(f"no mpiexec beside {sys.executable}: pip install -e '.[distributed]' (the mpich wheel)")


def run_ranks(ranks: int, arguments: list[str], timeout: float = 240, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python arguments...``, loopback only, one numba thread a rank; a hang is a
    failure after ``timeout`` seconds."""
    require_mpi()
    command = loopback_command(ranks, arguments)
    environment = {**os.environ, **LOOPBACK_ENV, "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    # One MPI job at a time on this machine: make test runs test_sharded.py and test_distributed.py
    # on two xdist workers, and a 3-rank job once failed in MPI_Init's address exchange ("Message
    # truncated" in MPIR_Allgather) while the other worker could be running a job of its own.
    with open(os.path.join(tempfile.gettempdir(), "bendc-tests-mpi.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # The killed-rank tests leave their ranks' shared memory behind; a later job whose rank got
        # such a pid failed in MPI_Init ("Message truncated") or took signal 11 (2 of 6 runs of
        # make test on a machine with 587 stale regions). Swept before each job and after it.
        remove_stale_shared_memory()
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment, cwd=ROOT)
        except subprocess.TimeoutExpired as error:
            pytest.fail(f"{' '.join(command)} did not finish in {timeout} s (a rank hangs):\n{error.stdout}\n{error.stderr}")
        finally:
            remove_stale_shared_memory()
