"""Gradient all-reduce at run time: buckets, communication backends, and their failures.

A compiled step that all-reduces (IR op ``all_reduce``) has, per bucket, plan steps of kind
``collective``: ``start`` packs the bucket's gradients into one flat float32 message and starts a
non-blocking exchange; ``wait``, placed just before the first reader of a reduced gradient, waits
for it (with a timeout), reduces, and unpacks into the step's outputs; a ``poll`` after each
kernel in between lets MPI advance the message. The generated modules of all of them name the
same :class:`Bucket` (``bucket(key, ...)`` returns one object per key).

Backends (:class:`Backend`) move the bytes: :class:`LocalBackend` (one process: the reduction of
one rank's gradient is the gradient itself) and :class:`MpiBackend` (mpi4py, imported only when a
world of more than one rank is made). A second engine (NCCL) is a third class with the same four
methods. ``world()`` is the process's world: the one ``use_world`` set (``bendc.distributed.init``),
else MPI when the process was launched by ``mpiexec`` with more than one rank, else local.

Reduction order: the default ``ordered`` reduction gathers every rank's message (``Iallgather``)
and sums the ranks in rank order in float64, rounding once to float32 (a mean divides the float64
sum by the world size first). Every rank sums the same bytes in the same order, so every rank gets
the same bits, whatever algorithm the MPI library picks for the message size. ``native`` uses the
library's ``Iallreduce`` (MPI's reduction order depends on its algorithm and is not guaranteed
identical across ranks or runs; chosen with BENDC_ALLREDUCE=native).

Failure: every wait has a deadline (BENDC_COLLECTIVE_TIMEOUT seconds, 300 by default); past it,
or when the ranks' programs differ (checked at a bucket's first exchange, by a digest of the
program's signature gathered from every rank), a :class:`CollectiveError` names what happened.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

DEFAULT_TIMEOUT_S = 300.0
LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


class CollectiveError(RuntimeError):
    """A collective that could not complete: a peer rank is gone or stuck, or runs another program."""


def timeout_s() -> float:
    return float(os.environ.get("BENDC_COLLECTIVE_TIMEOUT", DEFAULT_TIMEOUT_S))


def reduction_mode() -> str:
    mode = os.environ.get("BENDC_ALLREDUCE", "ordered")
    if mode not in ("ordered", "native"):
        raise CollectiveError(f"BENDC_ALLREDUCE={mode!r}: 'ordered' (default) or 'native'")
    return mode


# ------------------------------------------------------------------ backends
class Backend:
    """How bytes move between ranks. ``start_*`` return a handle that ``test`` polls."""

    name = "backend"
    rank = 0
    size = 1
    device_buffers = False  # takes device buffers (__cuda_array_interface__) as they are

    def start_allgather(self, send: Any, receive: Any) -> Any:
        raise NotImplementedError

    def start_allreduce_sum(self, buffer: Any) -> Any:
        raise NotImplementedError

    def test(self, handle: Any) -> bool:
        raise NotImplementedError

    def abort(self, code: int) -> None:
        raise NotImplementedError


class LocalBackend(Backend):
    """One process: every exchange is complete as soon as it starts."""

    name = "local"

    def start_allgather(self, send: Any, receive: Any) -> Any:
        receive[:] = send
        return None

    def start_allreduce_sum(self, buffer: Any) -> Any:
        return None

    def test(self, handle: Any) -> bool:
        return True

    def abort(self, code: int) -> None:
        os._exit(code)


class MpiBackend(Backend):
    """mpi4py over a communicator (MPI_COMM_WORLD by default)."""

    name = "mpi"

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.device_buffers = mpi_cuda_aware(MPI)

    def start_allgather(self, send: Any, receive: Any) -> Any:
        return self.comm.Iallgather(send, receive)

    def start_allreduce_sum(self, buffer: Any) -> Any:
        return self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)

    def test(self, handle: Any) -> bool:
        return handle.Test()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)


def mpi_cuda_aware(MPI: Any) -> bool:
    """Whether the MPI library takes CUDA device buffers: BENDC_MPI_CUDA_AWARE=1/0 when set, else
    MPIX_Query_cuda_support where mpi4py exposes it, else False (staging through host memory is
    always correct; a device pointer handed to a library without CUDA support would crash it)."""
    forced = os.environ.get("BENDC_MPI_CUDA_AWARE")
    if forced in ("0", "1"):
        return forced == "1"
    query = getattr(MPI, "Query_cuda_support", None)
    if query is None:
        return False
    try:
        return bool(query())
    except Exception:  # noqa: BLE001 (a library without the MPIX extension)
        return False


def launched_ranks() -> int:
    """The world size a launcher (mpiexec) announced in the environment, 1 when none."""
    for variable in LAUNCHER_SIZE_VARIABLES:
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 1


@dataclass
class World:
    backend: Backend
    # bucket key -> (started, waited, done) of its last exchange, perf_counter_ns
    stats: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.backend.rank

    @property
    def size(self) -> int:
        return self.backend.size


_WORLD: list[World] = []


def use_world(backend: Backend) -> World:
    """Make ``backend`` the process's world (bendc.distributed.init)."""
    _WORLD[:] = [World(backend)]
    return _WORLD[0]


def world() -> World:
    if not _WORLD:
        use_world(MpiBackend() if launched_ranks() > 1 else LocalBackend())
    return _WORLD[0]


def wait_for(backend: Backend, handle: Any, what: str) -> None:
    """Poll ``handle`` until done; past the deadline a CollectiveError says which exchange waited."""
    limit = timeout_s()
    deadline = time.monotonic() + limit
    pause = 0.0
    while not backend.test(handle):
        if time.monotonic() > deadline:
            raise CollectiveError(f"rank {backend.rank} of {backend.size}: {what} got no answer from every rank "
                                  f"within {limit:g} s (BENDC_COLLECTIVE_TIMEOUT): another rank died, raised "
                                  "or is stuck")
        time.sleep(pause)
        pause = min(0.001, pause + 0.00002)


# ------------------------------------------------------------------ the reduction
def ordered_reduce(gathered: np.ndarray, op: str, size: int, out: np.ndarray) -> None:
    """Rank-ordered float64 sum of ``gathered`` ([size, n]) into ``out`` (float32, n); mean divides
    by ``size`` before the one rounding."""
    total = gathered[0].astype(np.float64)
    for rank in range(1, size):
        total += gathered[rank]
    if op == "mean":
        total /= size
    out[:] = total.astype(np.float32)


def reference_all_reduce(x: np.ndarray, op: str) -> np.ndarray:
    """The reduction of one value across the world, blocking: the numpy spec of ``all_reduce``."""
    current = world()
    message = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if current.size == 1:
        return np.array(x, dtype=np.float32)
    gathered = np.empty((current.size, message.size), np.float32)
    wait_for(current.backend, current.backend.start_allgather(message, gathered), "all_reduce (reference)")
    out = np.empty(message.size, np.float32)
    ordered_reduce(gathered, op, current.size, out)
    return out.reshape(np.shape(x))


def check_program(current: World, signature: str, what: str) -> None:
    """Every rank runs the same program: their signatures' digests are gathered and compared; on a
    mismatch every rank names each rank's signature (all of them saw the mismatch, so all gather)."""
    if current.size == 1:
        return
    backend = current.backend
    digest = np.frombuffer(hashlib.sha256(signature.encode()).digest(), np.uint8).copy()
    digests = np.empty((current.size, digest.size), np.uint8)
    wait_for(backend, backend.start_allgather(digest, digests), f"the program check of {what}")
    if all((digests[r] == digests[0]).all() for r in range(current.size)):
        return
    text = np.zeros(4096, np.uint8)
    encoded = signature.encode()[:4096]
    text[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    texts = np.empty((current.size, text.size), np.uint8)
    wait_for(backend, backend.start_allgather(text, texts), f"the program check of {what}")
    names = [bytes(texts[r]).rstrip(b"\0").decode(errors="replace") for r in range(current.size)]
    lines = [f"  rank {r}: {name}" for r, name in enumerate(names)]
    raise CollectiveError(f"rank {current.rank} of {current.size}: the ranks run different programs at {what} "
                          "(every rank must trace the same step with the same shapes):\n" + "\n".join(lines))


# ------------------------------------------------------------------ buckets
class Bucket:
    """One message: the gradients of a bucket packed flat, exchanged, reduced, unpacked."""

    def __init__(self, key: str, op: str, shapes: Sequence[Sequence[int]], signature: str) -> None:
        self.key = key
        self.op = op
        self.shapes = [tuple(s) for s in shapes]
        self.counts = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(int).tolist()
        self.total = self.offsets[-1]
        self.signature = signature
        self.checked = False
        self.handle: Any = None
        self.device = False  # this call's buffers are device arrays
        self.message: Any = None
        self.gathered: Any = None
        self.reduced = np.empty(self.total, np.float32)
        self.mode = "ordered"
        self.layout: tuple = ()
        self.started_ns = 0

    def describe(self) -> str:
        return f"bucket {self.key} ({len(self.shapes)} tensors, {4 * self.total} bytes)"

    def _buffers(self, current: World, device: bool) -> None:
        """The message and gather buffers: host numpy, or device arrays for a backend that takes them."""
        self.mode = reduction_mode() if current.size > 1 else "ordered"
        rows = current.size if self.mode == "ordered" else 1
        if device and current.backend.device_buffers:
            from numba import cuda

            self.message = cuda.device_array(self.total, np.float32)
            self.gathered = cuda.device_array((rows, self.total), np.float32)
        else:
            self.message = np.empty(self.total, np.float32)
            self.gathered = np.empty((rows, self.total), np.float32)

    def start(self, *gradients: Any) -> None:
        current = world()
        if not self.checked:
            check_program(current, self.signature, self.describe())
            self.checked = True
        device = not isinstance(gradients[0], np.ndarray) if gradients else False
        on_device = device and current.backend.device_buffers
        layout = (device, on_device, current.size, reduction_mode())
        if self.layout != layout:  # the first call, or another world or kind of array
            self.layout, self.device = layout, device
            self._buffers(current, device)
        for gradient, low, high in zip(gradients, self.offsets, self.offsets[1:]):
            if on_device:
                self.message[low:high].copy_to_device(gradient.reshape(high - low))
            elif device:  # staged through host memory
                gradient.reshape(high - low).copy_to_host(self.message[low:high])
            else:
                self.message[low:high] = gradient.reshape(-1)
        self.started_ns = time.perf_counter_ns()
        if self.mode == "native":
            self.handle = current.backend.start_allreduce_sum(self.message)
        else:
            self.handle = current.backend.start_allgather(self.message, self.gathered)

    def poll(self) -> None:
        """Let the backend advance the message (MPI progresses non-blocking exchanges only inside calls)."""
        if self.handle is not None:
            world().backend.test(self.handle)

    def wait(self, *outputs: Any) -> None:
        current = world()
        waited = time.perf_counter_ns()
        wait_for(current.backend, self.handle, f"the all_reduce of {self.describe()}")
        self.handle = None
        done = time.perf_counter_ns()
        current.stats[self.key] = (self.started_ns, waited, done)
        on_device = self.device and current.backend.device_buffers
        if self.mode == "native":
            reduced = self.message if not on_device else self.message.copy_to_host()
            if self.op == "mean":
                reduced = (reduced.astype(np.float64) / current.size).astype(np.float32)
        elif on_device:  # reduced on the device, copied device to device below
            reduced = self.message
            from runtime.collective_cuda import device_ordered_reduce

            device_ordered_reduce(self.gathered, self.op, current.size, self.message)
        else:
            reduced = self.reduced
            ordered_reduce(self.gathered, self.op, current.size, reduced)
        for output, low, high in zip(outputs, self.offsets, self.offsets[1:]):
            if self.device:
                output.reshape(high - low).copy_to_device(reduced[low:high])
            else:
                output.reshape(-1)[:] = reduced[low:high]


_BUCKETS: dict[str, Bucket] = {}


def bucket(key: str, op: str, shapes: Sequence[Sequence[int]], signature: str) -> Bucket:
    """The process's bucket for ``key`` (the start and wait modules of one bucket share it)."""
    if key not in _BUCKETS:
        _BUCKETS[key] = Bucket(key, op, shapes, signature)
    return _BUCKETS[key]


def cuda_transport() -> str:
    """How the cuda runtime hands gradients to the backend, for the compile report."""
    current = world()
    if current.size == 1:
        return "one rank: no exchange (the all-reduce of one rank's gradient is itself)"
    if current.backend.device_buffers:
        return f"device buffers go to {current.backend.name} directly (__cuda_array_interface__, CUDA-aware)"
    return f"{current.backend.name} is not CUDA-aware here: gradients are staged through host memory"
