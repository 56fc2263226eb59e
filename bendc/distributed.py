"""Data-parallel training on MPI: ``init()``, and the set-up of ``bendc.jit(..., data_parallel=True)``.

Run a script under ``mpiexec -n N python script.py``; each rank calls ``init()`` once, traces the
same step on its shard of the batch, and the step's ``all_reduce`` ops (F.all_reduce, or every
``.grad`` read under ``data_parallel=True``) average the gradients over the ranks inside the
compiled step (runtime/collective.py moves them: mpi4py, imported here only when ``init`` runs),
by default as a rank-ordered reduce-scatter and all-gather: about twice the gradient bytes per
rank per step whatever the number of ranks (``traffic()`` gives this rank's bytes).

``init`` also installs an excepthook: a rank that raises prints its error and aborts the whole
job (MPI_Abort), so the other ranks exit within the collective timeout at worst, never hang.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from runtime import collective

_STATE: dict[str, Any] = {}

# mpich's hydra forks the ranks here (no ssh) with its control socket on the loopback interface;
# the ofi netmod with libfabric's shared-memory provider: ranks talk through shared memory only.
LOOPBACK_ENV = {"HYDRA_IFACE": "lo", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "shm"}


def mpiexec() -> Path:
    """The mpiexec the ``distributed`` extra installs beside this interpreter (may be absent)."""
    return Path(sys.executable).parent / "mpiexec"


def loopback_command(ranks: int, arguments: list[str]) -> list[str]:
    """``mpiexec -n ranks <this python> arguments...`` on this machine only (with LOOPBACK_ENV)."""
    return [str(mpiexec()), "-launcher", "fork", "-iface", "lo", "-n", str(ranks), sys.executable, *arguments]


def init(abort_on_error: bool = True) -> tuple[int, int]:
    """Join the MPI world (mpi4py; the ``bendc[distributed]`` extra): returns (rank, world_size).
    A process started without mpiexec is rank 0 of a world of 1 (MPI's singleton start)."""
    if "world" not in _STATE:
        try:
            backend = collective.MpiBackend()
        except ImportError as error:
            from bendc.errors import UnsupportedError, user_location

            raise UnsupportedError(f"bendc.distributed.init needs mpi4py and an MPI library: pip install "
                                   f"'bendc[distributed]' ({error})", loc=user_location(),
                                   op="distributed.init") from None
        _STATE["world"] = collective.use_world(backend)
        if abort_on_error and backend.size > 1:
            _install_excepthook(backend)
    world = _STATE["world"]
    return world.rank, world.size


def rank() -> int:
    return collective.world().rank


def world_size() -> int:
    return collective.world().size


def _install_excepthook(backend: collective.Backend) -> None:
    previous = sys.excepthook

    def abort_job(kind, value, traceback) -> None:
        previous(kind, value, traceback)
        sys.stderr.write(f"bendc.distributed: rank {backend.rank} of {backend.size} raised "
                         f"{kind.__name__}; aborting every rank (MPI_Abort)\n")
        sys.stdout.flush()
        sys.stderr.flush()
        # MPI_Abort tears the job down at once, and the process manager (hydra) can drop output it
        # has not forwarded yet: under load the error above was sometimes lost. Half a second of a
        # failing job lets it through.
        time.sleep(0.5)
        backend.abort(1)

    sys.excepthook = abort_job


def bucket_pass(bucket_mb: float | None):
    """The ``bucket`` pass with a cap of ``bucket_mb`` MB: its name for DDP's 25 MB (None), else the
    pass configured (a Pass object: such a step is compiled per process, not kept in the disk cache)."""
    from bendc.passes import get_pass
    from bendc.passes.bucket import DDP_BUCKET_BYTES

    cap_bytes = DDP_BUCKET_BYTES if bucket_mb is None else int(bucket_mb * 1024 * 1024)
    if cap_bytes == DDP_BUCKET_BYTES:
        return "bucket"
    return get_pass("bucket").configured("bucket", f"bucket with a cap of {cap_bytes} bytes", cap_bytes=cap_bytes)


def overlap() -> dict[str, float]:
    """Of each bucket's last exchange, summed: seconds from start to done (``in_flight_s``) and
    seconds its wait blocked (``blocked_s``: the exchange's cost the compute did not cover, including
    waiting for a slower rank)."""
    in_flight = blocked = 0.0
    for started, waited, done in collective.world().stats.values():
        in_flight += (done - started) / 1e9
        blocked += (done - waited) / 1e9
    return {"in_flight_s": in_flight, "blocked_s": blocked}


def traffic() -> dict[str, Any]:
    """This rank's bytes in the last step's exchanges (each bucket's last), summed:
    ``gradient_bytes``, ``bytes_sent``, ``bytes_received`` (None under BENDC_ALLREDUCE=native, whose
    algorithm MPI chooses), ``scheme``, ``ranks`` and ``buckets`` (runtime/collective.py). Under the
    default ``ordered`` scheme a rank sends 2 (N-1)/N times the gradient bytes."""
    return collective.traffic()


def average(value: Any) -> Any:
    """The mean over the ranks of a host value (a loss to print): every rank gets the same number."""
    import numpy as np

    array = np.asarray(value.copy_to_host() if hasattr(value, "copy_to_host") else value, dtype=np.float32)
    return collective.reference_all_reduce(array, "mean")
