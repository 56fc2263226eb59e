"""Gradient all-reduce at run time: buckets, communication backends, and their failures.

A compiled step that all-reduces (IR op ``all_reduce``) has, per bucket, plan steps of kind
``collective``: ``start`` packs the bucket's gradients into one flat float32 message and starts a
non-blocking exchange; ``wait``, placed just before the first reader of a reduced gradient, waits
for it (with a timeout), reduces, and unpacks into the step's outputs; a ``poll`` after each
kernel in between lets MPI advance the message. The generated modules of all of them name the same
:class:`Bucket` (``bucket(key, ...)`` returns one object per key).

Backends (:class:`Backend`) move the bytes: :class:`LocalBackend` (one process: the reduction of
one rank's gradient is the gradient itself) and :class:`MpiBackend` (mpi4py, imported only when a
world of more than one rank is made). A second engine (NCCL) is a third class with the same
methods. ``world()`` is the process's world: the one ``use_world`` set (``bendc.distributed.init``),
else MPI when the process was launched by ``mpiexec`` with more than one rank, else local.

Reduction schemes (BENDC_ALLREDUCE):

- ``ordered`` (the default): a rank-ordered reduce-scatter, then an all-gather. A bucket of n
  elements is cut into one contiguous shard per rank (:func:`shard_counts`: n // N each, the first
  n % N ranks one more). An all-to-all (non-blocking point-to-point, posted at once: see
  ``MpiBackend.start_alltoallv``) sends shard s of every rank's message to rank s, its owner;
  the owner sums the N copies in rank order in float64 and rounds once to float32 (a mean divides
  the float64 sum by N first); ``Iallgatherv`` then hands every owner's reduced shard to every
  rank. Each element is reduced once, by one rank, in a fixed order, so every rank gets the same
  bits, whatever algorithm the MPI library picks; a rank sends (and receives) 2 (N-1)/N times the
  bucket's bytes per exchange, about twice the gradients whatever N is.
- ``allgather``: the previous scheme, kept for comparison: ``Iallgather`` of every rank's whole
  message, then every rank sums the N rows in rank order (the same bits as ``ordered``); a rank
  receives (N-1) times the gradients.
- ``native``: the library's ``Iallreduce`` (MPI's reduction order depends on its algorithm and is
  not guaranteed identical across ranks or runs).

Sharded optimizer (``jit(..., data_parallel="sharded")``, ZeRO-1): each tensor of n elements is
cut by :func:`shard_counts` too, and its shard on every rank is padded to :func:`shard_size`
(the largest shard, ceil(n / N)) so that every rank's program has the same types. A
``reduce_scatter`` bucket (:class:`ShardBucket`) sends each rank its shard of every tensor of
the bucket (one all-to-all, rank-major: the destination's pieces back to back) and the owner sums
the N copies in rank order in float64, as ``ordered`` does: the same bits. The optimizer then
updates the shard only, and an ``all_gather`` bucket hands every owner's updated shard to every
rank (``Iallgatherv``). A rank sends (and receives) (n - own) + own (N-1) elements per phase pair,
the ``ordered`` all-reduce's 2 (N-1)/N times the bytes.

:func:`traffic` gives the bytes a rank sent and received in each bucket's last exchange.

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


REDUCTION_MODES = ("ordered", "allgather", "native")


def reduction_mode() -> str:
    """BENDC_ALLREDUCE: ``ordered`` (default: rank-ordered reduce-scatter + all-gather),
    ``allgather`` (every rank gathers every message and sums them in rank order) or ``native``."""
    mode = os.environ.get("BENDC_ALLREDUCE", "ordered")
    if mode not in REDUCTION_MODES:
        raise CollectiveError(f"BENDC_ALLREDUCE={mode!r}: 'ordered' (default), 'allgather' or 'native'")
    return mode


def shard_counts(total: int, size: int) -> list[int]:
    """How many of a bucket's ``total`` elements each rank owns: ``total // size`` each, the first
    ``total % size`` ranks one more (rank s owns a contiguous run, after those of ranks < s)."""
    base, extra = divmod(total, size)
    return [base + (1 if rank < extra else 0) for rank in range(size)]


def shard_size(total: int, size: int) -> int:
    """The padded shard of a tensor of ``total`` elements on ``size`` ranks: its largest shard,
    ceil(total / size) elements (a rank that owns fewer holds zeros past its own)."""
    return -(-total // size)


def own_range(total: int, size: int, rank: int) -> tuple[int, int]:
    """[low, high) of the flat elements of a ``total``-element tensor that ``rank`` owns."""
    counts = shard_counts(total, size)
    low = sum(counts[:rank])
    return low, low + counts[rank]


def displacements(counts: Sequence[int]) -> list[int]:
    """Where each run of ``counts`` starts in a buffer that holds them back to back."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist() if counts else []


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

    def start_alltoallv(self, send: Any, send_counts: Sequence[int], receive: Any,
                        receive_counts: Sequence[int]) -> Any:
        """Run k of ``send`` (runs of ``send_counts``, back to back) goes to rank k; rank k's run
        for this rank lands at run k of ``receive`` (runs of ``receive_counts``)."""
        raise NotImplementedError

    def start_allgatherv(self, send: Any, receive: Any, counts: Sequence[int]) -> Any:
        """Every rank's ``send`` (rank k's has ``counts[k]`` elements) lands at run k of ``receive``."""
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

    def start_alltoallv(self, send, send_counts, receive, receive_counts) -> Any:
        receive.reshape(-1)[:] = send
        return None

    def start_allgatherv(self, send, receive, counts) -> Any:
        receive[:] = send
        return None

    def test(self, handle: Any) -> bool:
        return True

    def abort(self, code: int) -> None:
        os._exit(code)


SCATTER_TAG = 26


class Requests:
    """Several MPI requests as one handle: ``Test`` is true once all are done."""

    def __init__(self, MPI: Any, requests: list) -> None:
        self.MPI = MPI
        self.requests = requests

    def Test(self) -> bool:
        return bool(self.MPI.Request.Testall(self.requests))


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
        # the reduce-scatter's point-to-point messages, apart from anything the user sends; every
        # rank starts the buckets in the same order and MPI keeps a pair's messages in order
        self.exchange = self.comm.Dup()

    def start_allgather(self, send: Any, receive: Any) -> Any:
        return self.comm.Iallgather(send, receive)

    def start_allreduce_sum(self, buffer: Any) -> Any:
        return self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)

    def start_alltoallv(self, send, send_counts, receive, receive_counts) -> Any:
        """Point-to-point, all posted at once (Irecv from and Isend to every other rank, on a
        communicator of their own): MPICH's Ialltoallv advances one step per Test, and under the
        polled wait a 2.6 MB bucket on 2 ranks took 170 ms (1.4 ms this way, 3.5 ms blocking)."""
        receive = receive.reshape(-1)
        sends, receives = displacements(send_counts), displacements(receive_counts)
        requests = []
        for peer in range(self.size):
            low, count = receives[peer], receive_counts[peer]
            if peer == self.rank:
                receive[low:low + count] = send[sends[peer]:sends[peer] + count]
            else:
                requests.append(self.exchange.Irecv([receive[low:low + count], self.MPI.FLOAT], source=peer,
                                                    tag=SCATTER_TAG))
        for peer in range(self.size):
            if peer != self.rank:
                low, count = sends[peer], send_counts[peer]
                requests.append(self.exchange.Isend([send[low:low + count], self.MPI.FLOAT], dest=peer,
                                                    tag=SCATTER_TAG))
        return Requests(self.MPI, requests)

    def start_allgatherv(self, send, receive, counts) -> Any:
        float32 = self.MPI.FLOAT
        return self.comm.Iallgatherv([send, float32], [receive, (list(counts), displacements(counts)), float32])

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
    # bucket key -> its last exchange: (scheme, gradient bytes, bytes sent, bytes received) by this rank
    traffic: dict[str, tuple[str, int, int | None, int | None]] = field(default_factory=dict)

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


def reference_reduce_scatter(x: np.ndarray, op: str) -> np.ndarray:
    """This rank's padded shard (:func:`shard_size`) of the reduction of ``x`` over the world,
    blocking: the numpy spec of ``reduce_scatter`` (zeros past the rank's own elements)."""
    current = world()
    reduced = reference_all_reduce(x, op).reshape(-1)
    low, high = own_range(reduced.size, current.size, current.rank)
    out = np.zeros(shard_size(reduced.size, current.size), np.float32)
    out[:high - low] = reduced[low:high]
    return out


def reference_all_gather(shard: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """The tensor of ``shape`` whose shard on each rank is that rank's ``shard`` (padded, only its
    own elements read), blocking: the numpy spec of ``all_gather``."""
    current = world()
    total = int(np.prod(shape, dtype=np.int64))
    message = np.ascontiguousarray(shard, dtype=np.float32).reshape(-1)
    gathered = message[None, :]
    if current.size > 1:
        gathered = np.empty((current.size, message.size), np.float32)
        wait_for(current.backend, current.backend.start_allgather(message, gathered), "all_gather (reference)")
    counts = shard_counts(total, current.size)
    return np.concatenate([gathered[r, :counts[r]] for r in range(current.size)]).reshape(tuple(shape))


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
def exchange_bytes(mode: str, total: int, rank: int, size: int) -> tuple[int | None, int | None]:
    """Bytes one rank sends and receives in one exchange of a bucket of ``total`` float32 values,
    its own shard not counted: ``ordered`` sends the N-1 shards it does not own (reduce-scatter)
    and its reduced shard to N-1 ranks (all-gather), receives as much; ``allgather`` sends its
    whole message to N-1 ranks and receives N-1 messages; ``native`` is the library's algorithm
    (None: not known here; a ring all-reduce moves what ``ordered`` does)."""
    if size == 1:
        return 0, 0
    if mode == "native":
        return None, None
    if mode == "allgather":
        return 4 * total * (size - 1), 4 * total * (size - 1)
    counts = shard_counts(total, size)
    mine = counts[rank]
    sent = (total - mine) + mine * (size - 1)
    received = mine * (size - 1) + (total - mine)
    return 4 * sent, 4 * received


class Bucket:
    """One message: the gradients of a bucket packed flat, exchanged, reduced, unpacked.

    ``phase`` is where its exchange stands: ``idle``; ``scatter`` (ordered: the reduce-scatter's
    all-to-all in flight), ``gather`` (ordered: the owner's shard reduced, Iallgatherv in flight),
    ``gather_all`` (allgather: the Iallgather in flight) or ``native`` (the Iallreduce in flight)."""

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
        self.phase = "idle"
        self.device = False  # this call's buffers are device arrays
        self.message: Any = None
        self.received: Any = None  # ordered: [N, my shard] (every rank's copy of my shard); allgather: [N, total]
        self.shard: Any = None  # ordered: my shard, reduced
        self.reduced: Any = None  # the reduced bucket (native: the message itself)
        self.mode = "ordered"
        self.shards: list[int] = [self.total]  # elements each rank owns (ordered)
        self.layout: tuple = ()
        self.started_ns = 0

    def describe(self) -> str:
        return f"bucket {self.key} ({len(self.shapes)} tensors, {4 * self.total} bytes)"

    def _buffers(self, current: World, device: bool) -> None:
        """The exchange's buffers: host numpy, or device arrays for a backend that takes them."""
        self.mode = reduction_mode() if current.size > 1 else "ordered"
        self.shards = shard_counts(self.total, current.size)
        mine = self.shards[current.rank]
        if device and current.backend.device_buffers:
            from numba import cuda

            allocate = cuda.device_array
        else:
            allocate = np.empty
        self.message = allocate(self.total, np.float32)
        self.received = self.shard = None
        self.reduced = self.message
        if self.mode == "ordered":
            self.received = allocate((current.size, mine), np.float32)
            self.shard = allocate(mine, np.float32)
            self.reduced = allocate(self.total, np.float32)
        elif self.mode == "allgather":
            self.received = allocate((current.size, self.total), np.float32)
            self.reduced = allocate(self.total, np.float32)

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
        backend = current.backend
        if self.mode == "native":
            self.handle, self.phase = backend.start_allreduce_sum(self.message), "native"
        elif self.mode == "allgather":
            self.handle, self.phase = backend.start_allgather(self.message, self.received), "gather_all"
        else:
            mine = self.shards[current.rank]
            self.handle = backend.start_alltoallv(self.message, self.shards, self.received, [mine] * current.size)
            self.phase = "scatter"

    def _reduce_shard_and_gather(self, current: World) -> None:
        """The reduce-scatter is done: sum my shard's N copies in rank order, start the all-gather."""
        if self.device and current.backend.device_buffers:
            from runtime.collective_cuda import device_ordered_reduce

            device_ordered_reduce(self.received, self.op, current.size, self.shard)
        else:
            ordered_reduce(self.received, self.op, current.size, self.shard)
        self.handle = current.backend.start_allgatherv(self.shard, self.reduced, self.shards)
        self.phase = "gather"

    def poll(self) -> None:
        """Let the backend advance the message (MPI progresses non-blocking exchanges only inside
        calls). A reduce-scatter found done does not go on to its all-gather here: whether it is
        done depends on timing, and every rank must start its collectives (the all-gathers, the
        program checks) in the same order, which the plan's waits give."""
        if self.phase != "idle":
            world().backend.test(self.handle)

    def wait(self, *outputs: Any) -> None:
        current = world()
        waited = time.perf_counter_ns()
        what = f"the all_reduce of {self.describe()}"
        if self.phase == "scatter":
            wait_for(current.backend, self.handle, f"{what} (reduce-scatter)")
            self._reduce_shard_and_gather(current)
        wait_for(current.backend, self.handle, f"{what} (all-gather)" if self.phase == "gather" else what)
        phase, self.handle, self.phase = self.phase, None, "idle"
        done = time.perf_counter_ns()
        current.stats[self.key] = (self.started_ns, waited, done)
        current.traffic[self.key] = (self.mode, 4 * self.total,
                                     *exchange_bytes(self.mode, self.total, current.rank, current.size))
        on_device = self.device and current.backend.device_buffers
        reduced = self.reduced
        if phase == "native":
            if on_device:
                reduced = self.message.copy_to_host()
            if self.op == "mean":
                reduced = (reduced.astype(np.float64) / current.size).astype(np.float32)
        elif phase == "gather_all":
            if on_device:  # reduced on the device, copied device to device below
                from runtime.collective_cuda import device_ordered_reduce

                device_ordered_reduce(self.received, self.op, current.size, self.reduced)
            else:
                ordered_reduce(self.received, self.op, current.size, self.reduced)
        for output, low, high in zip(outputs, self.offsets, self.offsets[1:]):
            if self.device:
                output.reshape(high - low).copy_to_device(reduced[low:high])
            else:
                output.reshape(-1)[:] = reduced[low:high]


class ShardBucket:
    """One message of a sharded optimizer step: a ``reduce_scatter`` bucket (gradients in, this
    rank's padded shards of their reductions out) or an ``all_gather`` bucket (this rank's padded
    shards of the updated parameters in, the whole parameters out).

    Layout: tensor i of n_i elements is cut by ``shard_counts(n_i, N)``; the rank-major message
    holds, for each rank s in turn, s's piece of every tensor in bucket order (``pack``: indices
    into the tensors' flat concatenation). The reduce-scatter sends block s to rank s and sums the
    N blocks it receives in rank order (float64, one rounding: ``ordered_reduce``); the all-gather
    receives every rank's block into that same layout. Host buffers only: device arrays are staged
    through host memory."""

    def __init__(self, key: str, kind: str, op: str, shapes: Sequence[Sequence[int]], signature: str) -> None:
        assert kind in ("reduce_scatter", "all_gather")
        self.key, self.kind, self.op, self.signature = key, kind, op, signature
        # reduce_scatter: the padded shards' shapes (the whole sizes come with the first start);
        # all_gather: the whole tensors' shapes
        self.shapes = [tuple(s) for s in shapes]
        self.sizes: list[int] = []
        self.padded_shapes: list[int] = []  # the padded shards' sizes, as traced
        self.device = False  # this call's arrays are device arrays (staged through host memory)
        self.checked = False
        self.handle: Any = None
        self.phase = "idle"
        self.layout: tuple = ()
        self.started_ns = 0

    def describe(self) -> str:
        return f"{self.kind} bucket {self.key} ({len(self.shapes)} tensors)"

    def _plan(self, current: World, sizes: list[int]) -> None:
        """Counts, offsets and the pack index of ``sizes`` on this world; buffers."""
        size, rank = current.size, current.rank
        self.sizes = sizes
        self.total = sum(sizes)
        self.counts = [shard_counts(n, size) for n in sizes]  # [tensor][rank]
        self.padded = [shard_size(n, size) for n in sizes]
        self.per_rank = [sum(c[s] for c in self.counts) for s in range(size)]  # a rank's block
        bases = displacements(sizes)
        pieces = []
        for s in range(size):
            for n, base in zip(sizes, bases):
                low, high = own_range(n, size, s)
                pieces.append(np.arange(base + low, base + high))
        self.pack = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)
        self.mine = [c[rank] for c in self.counts]
        self.mine_offsets = displacements(self.mine) + [self.per_rank[rank]]
        self.flat = np.empty(self.total, np.float32)  # the tensors back to back
        self.message = np.empty(self.total, np.float32)  # rank-major
        self.received = np.empty((size, self.per_rank[rank]), np.float32)
        self.shard = np.empty(self.per_rank[rank], np.float32)

    def _check_ranks(self, current: World) -> None:
        """The padded shapes the program was traced with are this world's (one trace per world size)."""
        for n, padded in zip(self.sizes, self.padded_shapes):
            if shard_size(n, current.size) != padded:
                raise CollectiveError(f"rank {current.rank} of {current.size}: {self.describe()} was traced for "
                                      f"another number of ranks (a shard of {padded} of {n} elements; "
                                      f"{shard_size(n, current.size)} on {current.size} ranks): trace the step "
                                      "again in this world")

    def start(self, *values: Any) -> None:
        current = world()
        if not self.checked:
            check_program(current, self.signature, self.describe())
            self.checked = True
        host = [v if isinstance(v, np.ndarray) else v.copy_to_host() for v in values]
        if self.kind == "reduce_scatter":
            sizes, self.padded_shapes = [int(v.size) for v in host], [int(np.prod(s)) for s in self.shapes]
        else:
            sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
            self.padded_shapes = [int(v.size) for v in host]
        if self.layout != (current.size, tuple(sizes)):
            self.layout = (current.size, tuple(sizes))
            self._plan(current, sizes)
        self._check_ranks(current)
        self.device = bool(values) and not isinstance(values[0], np.ndarray)
        self.started_ns = time.perf_counter_ns()
        backend = current.backend
        if self.kind == "reduce_scatter":
            for value, low, high in zip(host, displacements(sizes), displacements(sizes)[1:] + [self.total]):
                self.flat[low:high] = value.reshape(-1)
            np.take(self.flat, self.pack, out=self.message)
            mine = self.per_rank[current.rank]
            self.handle = backend.start_alltoallv(self.message, self.per_rank, self.received, [mine] * current.size)
            self.phase = "scatter"
        else:
            for value, count, low in zip(host, self.mine, self.mine_offsets):
                self.shard[low:low + count] = value.reshape(-1)[:count]
            self.handle = backend.start_allgatherv(self.shard, self.message, self.per_rank)
            self.phase = "gather"

    def poll(self) -> None:
        if self.phase != "idle":
            world().backend.test(self.handle)

    def wait(self, *outputs: Any) -> None:
        current = world()
        waited = time.perf_counter_ns()
        part = "reduce-scatter" if self.kind == "reduce_scatter" else "all-gather"
        wait_for(current.backend, self.handle, f"the {self.kind} of {self.describe()} ({part})")
        self.handle, self.phase = None, "idle"
        done = time.perf_counter_ns()
        current.stats[self.key] = (self.started_ns, waited, done)
        mine = self.per_rank[current.rank]
        others = 4 * (self.total - mine) if current.size > 1 else 0
        gathered = 4 * mine * (current.size - 1)
        if self.kind == "reduce_scatter":
            current.traffic[self.key] = ("sharded", 4 * self.total, others, gathered)
            ordered_reduce(self.received, self.op, current.size, self.shard)
            for output, count, low, padded in zip(outputs, self.mine, self.mine_offsets, self.padded_shapes):
                piece = np.zeros(padded, np.float32)
                piece[:count] = self.shard[low:low + count]
                _store(output, piece, self.device)
        else:  # parameters, not gradients: no gradient bytes
            current.traffic[self.key] = ("sharded", 0, gathered, others)
            self.flat[self.pack] = self.message
            for output, low, n in zip(outputs, displacements(self.sizes), self.sizes):
                _store(output, self.flat[low:low + n], self.device)


def _store(output: Any, values: np.ndarray, device: bool) -> None:
    """``values`` (flat, host) into ``output`` (an array of as many elements, host or device)."""
    if device:
        output.reshape(values.size).copy_to_device(values)
    else:
        output.reshape(-1)[:] = values


_BUCKETS: dict[str, Bucket] = {}
_SHARD_BUCKETS: dict[str, ShardBucket] = {}


def bucket(key: str, op: str, shapes: Sequence[Sequence[int]], signature: str) -> Bucket:
    """The process's bucket for ``key`` (the start and wait modules of one bucket share it)."""
    if key not in _BUCKETS:
        _BUCKETS[key] = Bucket(key, op, shapes, signature)
    return _BUCKETS[key]


def shard_bucket(key: str, kind: str, op: str, shapes: Sequence[Sequence[int]], signature: str) -> ShardBucket:
    """The process's ``reduce_scatter`` or ``all_gather`` bucket for ``key``."""
    if key not in _SHARD_BUCKETS:
        _SHARD_BUCKETS[key] = ShardBucket(key, kind, op, shapes, signature)
    return _SHARD_BUCKETS[key]


def traffic() -> dict[str, Any]:
    """This rank's bytes in the last exchange of every bucket, summed: ``gradient_bytes`` (the
    buckets' sizes), ``bytes_sent`` and ``bytes_received`` (None under ``native``: the library's
    algorithm decides), the scheme (``sharded`` for a sharded optimizer step's reduce-scatter and
    all-gather buckets, whose all-gathers move parameters: no gradient bytes), and ``buckets``
    (how many messages)."""
    current = world()
    records = list(current.traffic.values())
    sent = [r[2] for r in records]
    received = [r[3] for r in records]
    return {"scheme": records[0][0] if records else reduction_mode(), "ranks": current.size,
            "buckets": len(records), "gradient_bytes": sum(r[1] for r in records),
            "bytes_sent": None if None in sent else sum(sent),
            "bytes_received": None if None in received else sum(received)}


def cuda_transport() -> str:
    """How the cuda runtime hands gradients to the backend, for the compile report."""
    current = world()
    if current.size == 1:
        return "one rank: no exchange (the all-reduce of one rank's gradient is itself)"
    if current.backend.device_buffers:
        return f"device buffers go to {current.backend.name} directly (__cuda_array_interface__, CUDA-aware)"
    return f"{current.backend.name} is not CUDA-aware here: gradients are staged through host memory"
