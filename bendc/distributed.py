"""Data-parallel training on MPI: ``init()``, and the set-up of ``bendc.jit(..., data_parallel=True)``.

Run a script under ``mpiexec -n N python script.py``; each rank calls ``init()`` once, traces the
same step on its shard of the batch, and the step's ``all_reduce`` ops (F.all_reduce, or every
``.grad`` read under ``data_parallel=True``) average the gradients over the ranks inside the
compiled step (runtime/collective.py moves them: mpi4py, imported here only when ``init`` runs),
by default as a rank-ordered reduce-scatter and all-gather: about twice the gradient bytes per
rank per step whatever the number of ranks (``traffic()`` gives this rank's bytes).

``data_parallel="sharded"`` (ZeRO-1) shards the optimizer of ``bendc.optim`` over the ranks: each
tensor's flat elements are cut as the reduce-scatter cuts them (runtime/collective.py
``shard_counts``), each rank holding a padded shard of ceil(n / N) elements (the same types on
every rank). Inside the step the optimizer's gradient is ``reduce_scatter`` (this rank's shard of
the reduced gradient), the update runs on the shard with the shard of the optimizer state, and
``all_gather`` gives every rank the whole new parameters: the state is 1/N of its size per rank,
and the parameters end bit-identical to the unsharded step (the same float64 rank-ordered sums,
the same elementwise update on each element). ``bendc.optim.init_*(params, sharded=True)`` makes
the state's shards; ``full_state`` gathers a sharded state into whole arrays (a checkpoint) and
``shard_state`` cuts whole arrays into this rank's shards (loading one).

``init`` also installs an excepthook: a rank that raises prints its error and aborts the whole
job (MPI_Abort), so the other ranks exit within the collective timeout at worst, never hang.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

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


def remove_stale_shared_memory(folder: str | Path = "/dev/shm", quiet_s: float = 60.0) -> list[str]:
    """Remove the shared-memory regions that MPI ranks killed by a signal left in ``folder``; returns
    their names. A rank that ends normally removes its own; one killed by SIGKILL (a test's kill, a
    scheduler's, the OOM killer) leaves libfabric's shm provider's ``<pid>:...`` regions (13 MB each
    here) and MPICH's ``mpich_shm_*``. A later rank that gets the dead rank's pid opens the stale region
    as its peers' mailbox: MPI_Init or the first collective fails ("Message ... truncated") or a rank
    takes signal 11. Removed: ``<pid>:...`` regions whose pid is not a live process, and
    ``mpich_shm_*`` regions no live process maps, untouched for ``quiet_s`` seconds (a starting job
    maps its own within that). Only this user's regions; a live job's are never touched."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    mapped = _mapped_paths(folder)
    removed = []
    uid = os.getuid()
    now = time.time()
    for path in folder.iterdir():
        name = path.name
        parts = name.split(":")
        stale = False
        try:
            info = path.stat()
            if info.st_uid != uid or not path.is_file():
                continue
            if len(parts) > 1 and all(part.isdigit() for part in parts):  # <pid>:<endpoint>:...
                stale = not _alive(int(parts[0]))
            elif name.startswith("mpich_shm_"):
                stale = str(path) not in mapped and now - info.st_mtime > quiet_s
            if stale:
                path.unlink()
                removed.append(name)
        except (FileNotFoundError, PermissionError):
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _mapped_paths(folder: Path) -> set[str]:
    """The files under ``folder`` that some process of this machine maps (/proc/*/maps)."""
    prefix = str(folder) + "/"
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            at = line.find(prefix)
            if at >= 0:
                mapped.add(line[at:].removesuffix(" (deleted)"))
    return mapped


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


# ------------------------------------------------------------------ the sharded optimizer (ZeRO-1)
SHARDED = "sharded"


def sharding(values: Any) -> tuple[int, int] | None:
    """(rank, ranks) when the step tracing ``values`` (a list that may hold traced tensors) runs
    under ``data_parallel="sharded"``, else None."""
    from bendc.trace import Tensor

    tracer = next((v.tracer for v in values if isinstance(v, Tensor)), None)
    if tracer is None or getattr(tracer, "data_parallel", False) != SHARDED:
        return None
    current = collective.world()
    return current.rank, current.size


def shard_of(value: Any, rank: int, ranks: int) -> Any:
    """This rank's padded shard of a traced tensor (flat; ``collective.shard_size`` elements). The
    flat tensor is first padded with zeros to ranks * shard_size elements, then indexed at the
    rank's first element, so that every rank's program has the same ops: a rank that owns fewer
    than shard_size elements reads one element past its own (another rank's, or a zero) into a
    slot the all-gather drops."""
    tracer = value.tracer
    total = value.type.numel
    padded = collective.shard_size(total, ranks)
    low, _ = collective.own_range(total, ranks, rank)
    with tracer.at_user_line("shard"):
        flat = value.reshape(total)
        if padded * ranks > total:
            zeros = tracer.emit("expand", (tracer.const(0.0).id,), shape=(padded * ranks - total,))
            flat = tracer.emit("concat", (flat.id, zeros.id), axis=0)
        return tracer.emit("index", (flat.id,), spec=((low, low + padded, 1),))


def sharded_gradient(grad: Any, rank: int, ranks: int) -> Any:
    """This rank's padded shard of a reduced gradient: a gradient that is an ``all_reduce``
    (every ``.grad`` under data parallel) becomes the ``reduce_scatter`` of the local gradient
    (the all-reduce, left unread, is dropped by dce); any other value (a gradient the user
    transformed after its all-reduce) is already the same on every rank and is sliced."""
    tracer = grad.tracer
    node = tracer.graph.node(grad.id)
    if node.op != "all_reduce":
        return shard_of(grad, rank, ranks)
    with tracer.at_user_line("reduce_scatter"):
        return tracer.emit("reduce_scatter", (node.inputs[0],), op=node.attr["op"], group=node.attr["group"],
                           ranks=ranks)


def gather_shard(shard: Any, shape: tuple[int, ...], ranks: int) -> Any:
    """The whole tensor of ``shape`` from every rank's updated shard (``all_gather``)."""
    tracer = shard.tracer
    with tracer.at_user_line("all_gather"):
        return tracer.emit("all_gather", (shard.id,), op="concat", group="world", ranks=ranks, shape=tuple(shape))


def _state_parts(state: Any, params: Any):
    """The keys of ``state`` whose values have the parameters' structure (the per-parameter
    arrays: momentum_buffer, exp_avg, exp_avg_sq), with their leaves, and the parameters' leaves."""
    from bendc import tree

    leaves, treedef = tree.flatten(params)
    parts = {}
    for key, value in state.items():
        if key == "step":
            continue
        try:
            parts[key] = tree.flatten_up_to(treedef, value)
        except (ValueError, TypeError):
            continue
    return parts, leaves, treedef


def full_state(state: dict, params: Any) -> dict:
    """The whole optimizer state from every rank's shards (sharded state as the step returns it):
    a collective, so every rank calls it; every rank gets the same whole arrays (a checkpoint)."""
    from bendc import tree

    parts, leaves, treedef = _state_parts(state, params)
    whole = dict(state)
    for key, shards in parts.items():
        whole[key] = tree.unflatten(treedef, [
            collective.reference_all_gather(np.asarray(shard, np.float32), np.shape(param))
            for shard, param in zip(shards, leaves)])
    return whole


def shard_state(state: dict, params: Any) -> dict:
    """This rank's shards of a whole optimizer state (a checkpoint that ``full_state`` or an
    unsharded step made): the state a ``data_parallel="sharded"`` step takes."""
    from bendc import tree

    current = collective.world()
    parts, leaves, treedef = _state_parts(state, params)
    sharded = dict(state)
    for key, arrays in parts.items():
        sharded[key] = tree.unflatten(treedef, [shard_array(np.asarray(a, np.float32), current.rank, current.size)
                                                for a in arrays])
    return sharded


def shard_array(array: np.ndarray, rank: int, ranks: int) -> np.ndarray:
    """``rank``'s padded shard of a whole array: its own flat elements, zeros after them."""
    flat = np.ascontiguousarray(array, np.float32).reshape(-1)
    low, high = collective.own_range(flat.size, ranks, rank)
    shard = np.zeros(collective.shard_size(flat.size, ranks), np.float32)
    shard[:high - low] = flat[low:high]
    return shard
