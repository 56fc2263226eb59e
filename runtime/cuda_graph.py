"""The cubin runtime: a cuda artifact's own cubins, launched through cuda.core as one CUDA graph.

No numba and no NVVM at run time. ``bendc compile --target cuda`` records, for
every launch of the plan, the kernel's entry symbol (numba's mangled name holds
a per-process counter: it cannot be guessed here), its cubin, its arguments
(flat C-contiguous arrays) and its parameters as the PTX declares them
(bendc/codegen/ptx.py). Loading checks each cubin's ELF against that record
(runtime/cubin_elf.py, no GPU needed) and then each loaded kernel's
``num_arguments`` and ``arguments_info`` against it.

Arguments follow numba's kernel ABI (numba-cuda 0.30 ``dispatcher._prepare_args``,
``ArrayModel``): an array of ``ndim`` dimensions is 5 + 2*ndim 8-byte words,
meminfo, parent, nitems, itemsize, data, shape[ndim], strides[ndim] (bytes);
meminfo and parent are 0 for device arrays. bendc's kernels take 1-D arrays
only: ``[0, 0, n, itemsize, pointer, n, itemsize]``.

One binding per artifact (its shapes are fixed: one signature): every value
gets a device allocation made once (planned temporaries share the memory
plan's buffers, views their operand's, each input a static buffer), so every
launch's argument words are packed once. Constants (the plan's source steps)
are uploaded and the hoisted steps run at binding. Then, in ``graph`` mode (the
default), the step's launches are captured once, in plan order, on a
non-blocking stream into one CUDA graph, instantiated and uploaded; a call
copies the inputs into their static buffers (host to device, or device to
device from a torch CUDA tensor's ``data_ptr()`` or any
``__cuda_array_interface__`` array), replays the graph and returns the
outputs. ``eager`` mode launches the same packed launches one by one (for A/B
comparisons and to bisect a graph that goes wrong).

Outputs, as torch.compile's ``reduce-overhead`` offers them:
``outputs="copy"`` (the default) gives each call's outputs fresh device
memory, copied from the static buffers (one device-to-device copy each), so
they stay valid; ``outputs="static"`` returns views of the static buffers
themselves, overwritten by the next call and not to be written to (no copy;
torch.compile's default).

Donated parameters stay resident (``bendc compile --donate``, ``jit(donate=...)``):
where the memory plan writes a donated parameter's update over the parameter
(plan.donations: an elementwise step that is the old value's last reader), that
output *is* the parameter's static input buffer, updated in place by the graph.
It comes back, under either contract, as a :class:`DeviceArray` over that
buffer with ``resident = True`` (a torch CUDA tensor over it when the call's
inputs were torch CUDA tensors). Feeding it back as the next call's input costs
nothing: an input whose pointer already is its static buffer is not copied
(non-donated inputs are still copied every call). The contract: a resident
output always holds the parameter's current value; the next call reads it and
overwrites it in place (so does a call given other values for that input,
which are copied into the same buffer). Keep a snapshot with
``copy_to_host()`` / ``numpy()``; never write to it while a call may run. A
donated parameter the plan could not update safely in place (its old value is
read later, or its update is not elementwise; the compile report says which)
gets its own output buffer and follows the output contract; feeding that back
is one device-to-device copy. The caller's own arrays are never written.

Streams: when an input is a torch CUDA tensor the call runs on torch's current
stream (``torch.cuda.current_stream()``), so torch work before and after needs
no synchronisation by the caller; otherwise on the program's own non-blocking
stream. Index checks read back two int64 words per checked step after a call
(one small copy that waits for the step), as the numba runtime does.

The ``__cuda_array_interface__`` stream protocol (version 3), both ways:

- as a consumer, a device input whose interface names a ``stream`` (another
  program's DeviceArray, a CuPy array, a numba array written on the legacy
  stream: 1) is read only after that stream's work so far: the call's stream
  waits on an event recorded there before the input copies (no host sync).
  torch tensors export no stream: a torch input puts the call on torch's current
  stream instead.
- the call keeps every device input it read alive until an event recorded after
  its copies has passed (checked at each call and at ``synchronize``), so a
  producer's buffer freed stream-ordered on the producer's stream cannot be
  reused while this call's stream still reads it;
- as a producer, every DeviceArray exports the stream it was written on; a
  bendc consumer records its after-the-copies event on the array it read, and a
  program's next call waits on those events before it overwrites a static or
  resident buffer that another stream may still be reading.

:class:`CubinProgram` does the bookkeeping for any device object (the methods of
:class:`CudaCoreDevice`); only :class:`CudaCoreDevice` touches a GPU. Offline,
tests/cuda/test_cubin_simulator.py drives CubinProgram with a device whose
pointers stand for numpy buffers and whose launches decode the packed words
back into arrays and run the kernels under numba's CUDA simulator.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from runtime.cpu import KernelError
from runtime.cubin_elf import entry_symbols, kernel_parameters
from runtime.dtypes import DTYPES, numel

WORD_BYTES = 8
OUTPUT_CONTRACTS = ("copy", "static")
MODES = ("graph", "eager")
TORCH_DTYPES = {"torch.float32": "f32", "torch.int64": "i64", "torch.int32": "i32", "torch.bool": "bool"}


class CubinMismatch(Exception):
    """A cubin (or a loaded kernel) whose entry or parameters differ from what the plan records."""


class CaptureError(Exception):
    """Recording the step's CUDA graph failed: the capture was ended and the partial graph discarded
    (the stream is usable again). ``kernel`` names the launch being captured (``step.kernel``), or
    the stage after the launches (instantiating, uploading) when they were all captured."""

    def __init__(self, kernel: str, error: BaseException) -> None:
        first = str(error).splitlines()[0] if str(error) else ""
        super().__init__(f"capturing the CUDA graph failed at {kernel}: {type(error).__name__}: {first}")
        self.kernel = kernel
        self.error = error


def array_words_count(ndim: int) -> int:
    """How many 8-byte parameter words numba passes for an array of ``ndim`` dimensions."""
    return 5 + 2 * ndim


def array_words(pointer: int, count: int, itemsize: int) -> tuple[int, ...]:
    """numba's parameter words for a flat C-contiguous device array of ``count`` elements."""
    return (0, 0, count, itemsize, pointer, count, itemsize)


def expected_parameters(launch: dict) -> list[tuple[int, int]]:
    """(offset, size) of each parameter word of a recorded launch, from its arguments' layout."""
    words = sum(array_words_count(argument["ndim"]) for argument in launch["arguments"])
    return [(WORD_BYTES * k, WORD_BYTES) for k in range(words)]


def check_parameters(where: str, launch: dict, reported: Sequence[Sequence[int]]) -> None:
    """The parameters a cubin or the driver ``reported`` for a launch are the ones the plan records
    and the ones its arguments' layout needs, or CubinMismatch."""
    recorded = [tuple(p) for p in launch["parameters"]]
    reported = [tuple(int(x) for x in p) for p in reported]
    needed = expected_parameters(launch)
    if not recorded == reported == needed:
        raise CubinMismatch(f"{where}: kernel {launch['kernel']} has parameters {_short(reported)}; the plan records "
                            f"{_short(recorded)} and its {len(launch['arguments'])} array arguments need "
                            f"{len(needed)} words of 8 bytes")


def _short(parameters: list) -> str:
    return f"{len(parameters)} [{', '.join(f'{o}:{s}' for o, s in parameters[:3])}{', ...' if len(parameters) > 3 else ''}]"


def require_entry(step: dict, launch: dict) -> None:
    """A launch records what the cubin runtime needs (an ahead-of-time build does), or CubinMismatch."""
    missing = [key for key in ("entry", "cubin", "arguments", "parameters") if key not in launch]
    if missing:
        raise CubinMismatch(f"step {step['name']}: the plan records no {', '.join(missing)} for kernel "
                            f"{launch['kernel']} (not an ahead-of-time cuda build: rebuild with bendc compile)")


def check_cubin(folder: str, launch: dict) -> bytes:
    """The launch's cubin after checking, from its ELF, that it defines the recorded entry with the
    recorded parameters (no GPU needed)."""
    with open(os.path.join(folder, launch["cubin"]), "rb") as stream:
        data = stream.read()
    return check_cubin_data(data, launch)


def check_cubin_data(data: bytes, launch: dict) -> bytes:
    """``data`` after checking that its ELF defines the launch's recorded entry with the recorded
    parameters (check_cubin, for a cubin in memory: bendc.jit's cubins)."""
    if launch["entry"] not in entry_symbols(data):
        raise CubinMismatch(f"{launch['cubin']} defines no kernel {launch['entry'][:60]}...")
    check_parameters(launch["cubin"], launch, kernel_parameters(data, launch["entry"]))
    return data


# ------------------------------------------------------------------ inputs on the device
def device_input(value: Any) -> tuple[int, str, tuple[int, ...]] | None:
    """(device pointer, dtype name, shape) of a C-contiguous device array: a torch CUDA tensor (its
    ``data_ptr()``: no export, works for tensors that require grad) or anything with
    ``__cuda_array_interface__``; None for host values. A strided device array is an error."""
    if is_torch_cuda(value):
        if not value.is_contiguous():
            raise ValueError("a torch CUDA input must be contiguous (.contiguous())")
        dtype = TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise ValueError(f"unsupported torch dtype {value.dtype}")
        return int(value.data_ptr()), dtype, tuple(value.shape)
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is None:
        return None
    if interface.get("mask") is not None:
        raise ValueError("a masked device array cannot be an input")
    dtype = np.dtype(interface["typestr"])
    shape = tuple(interface["shape"])
    strides = interface.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise ValueError("a device input must be C-contiguous")
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"unsupported device array dtype {dtype}")
    return int(interface["data"][0]), names[dtype], shape


def producer_stream(value: Any) -> int | None:
    """The stream a device input's ``__cuda_array_interface__`` says to order reads after (version 3:
    an integer handle, 1 the legacy default stream, 2 the per-thread one), or None: no stream named
    (torch tensors, version 2 exporters, host values), nothing to wait for. 0 is not allowed by the
    protocol: an error."""
    if is_torch_cuda(value):
        return None  # read through data_ptr() on torch's current stream (select_stream)
    interface = getattr(value, "__cuda_array_interface__", None)
    stream = None if interface is None else interface.get("stream")
    if stream is None:
        return None
    if int(stream) == 0:
        raise ValueError("__cuda_array_interface__ stream 0 is disallowed by the protocol (1: the legacy "
                         "default stream, 2: the per-thread default stream)")
    return int(stream)


def is_torch_cuda(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and bool(getattr(value, "is_cuda", False))


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


# ------------------------------------------------------------------ the bound plan
@dataclass
class Call:
    """One launch with its packed parameter words."""

    step: str
    launch: dict
    words: tuple[int, ...]
    kernel: Any = None  # the device's loaded kernel


class StaticPlan:
    """Every value's device pointer and every launch's packed words, for allocations made once by
    ``allocate(nbytes) -> (pointer, owner)`` (the owner keeps the memory alive)."""

    def __init__(self, plan: dict, allocate: Any) -> None:
        self.owners: list[Any] = []

        def new(nbytes: int) -> int:
            pointer, owner = allocate(max(nbytes, WORD_BYTES))
            self.owners.append(owner)
            return pointer

        values = {int(k): (d, tuple(s)) for k, (d, s) in plan["values"].items()}
        self.values = values
        buffers = [new(size) for size in plan["buffers"]]
        pointer = {int(value): buffers[buffer] for value, buffer in plan["storage"].items()}
        for param in plan["params"]:
            pointer[param] = new(_nbytes(values[param]))
        self.inputs = [(pointer[p], *values[p]) for p in plan["params"]]
        # An update written over its donated parameter lives in that parameter's static buffer:
        # a call leaves it there, resident, for the next call to read (memory plan: plan.donations).
        self.donations = {int(k): v for k, v in plan.get("donations", {}).items()}
        for output, param in self.donations.items():
            pointer[output] = pointer[param]
        self.sources: list[tuple[int, np.ndarray]] = []
        checked = [s for s in plan["steps"] if s.get("check")]
        self.errors = new(2 * WORD_BYTES * len(checked)) if checked else None
        self.checks = [(s["name"], s["check"]) for s in checked]
        error_words = {s["name"]: self.errors + 2 * WORD_BYTES * k for k, s in enumerate(checked)}
        self.calls: list[Call] = []
        self.hoisted: list[Call] = []
        root: dict[int, int] = {}  # a view -> the value whose memory it reads
        for step in plan["steps"]:
            if step["kind"] == "source":
                (value,) = step["outputs"]
                pointer[value] = new(_nbytes(values[value]))
                self.sources.append((pointer[value], np.array([step["value"]], DTYPES[values[value][0]])))
                continue
            if step["convention"] == "view" and step["inputs"]:
                # read in place through strides: the kernels get the operand's flat array itself
                pointer[step["outputs"][0]] = pointer[step["inputs"][0]]
                root[step["outputs"][0]] = root.get(step["inputs"][0], step["inputs"][0])
                continue
            for value in step["outputs"]:
                if value not in pointer:
                    pointer[value] = new(_nbytes(values[value]))
            words: list[int] = []
            windows = {position: (first, cells) for position, first, cells in step.get("windows", ())}
            for position, value in enumerate(step["inputs"] + step["outputs"]):
                dtype, shape = values[root.get(value, value)]
                itemsize = DTYPES[dtype].itemsize
                first, cells = windows.get(position, (0, numel(shape)))  # the part of its root it reads
                words += array_words(pointer[value] + first * itemsize, cells, itemsize)
            if step.get("check"):
                words += array_words(error_words[step["name"]], 2, WORD_BYTES)
            for launch in step["launches"]:
                require_entry(step, launch)
                call = Call(step["name"], launch, tuple(words))
                if len(call.words) != len(launch["parameters"]):
                    raise CubinMismatch(f"{step['name']}.{launch['kernel']}: {len(call.words)} argument words "
                                        f"for {len(launch['parameters'])} recorded parameters")
                (self.hoisted if step["hoisted"] else self.calls).append(call)
        self.pointer = pointer
        self.outputs = [(pointer[o], *values[o]) for o in plan["outputs"]]
        self.resident = [o in self.donations for o in plan["outputs"]]  # per output: in a parameter's buffer


def _nbytes(value: tuple[str, tuple[int, ...]]) -> int:
    dtype, shape = value
    return numel(shape) * DTYPES[dtype].itemsize


class DeviceArray:
    """An output in device memory: ``shape``, ``dtype``, ``copy_to_host()`` and
    ``__cuda_array_interface__`` (torch.as_tensor(x, device="cuda") reads it in place)."""

    def __init__(self, device: Any, pointer: int, dtype: str, shape: tuple[int, ...], owner: Any) -> None:
        self.device = device
        self.stream = device.stream_handle()  # where it was written: a consumer orders its reads after that
        self.pointer = pointer
        self.dtype = np.dtype(DTYPES[dtype])
        self.shape = tuple(shape)
        self.size = numel(shape)
        self.nbytes = self.size * self.dtype.itemsize
        self._owner = owner  # keeps the memory alive (a fresh copy) or the program (static buffers)
        self.resident = False  # True: a donated parameter's buffer, updated in place by every call

    def read_by(self, event: Any) -> None:
        """A consumer read this array on its stream up to ``event``: the program whose static or
        resident buffer this is waits on it before its next call overwrites the buffer."""
        readers = getattr(self._owner, "readers", None)
        if readers is not None:
            readers.append(event)

    @property
    def __cuda_array_interface__(self) -> dict:
        stream = self.stream
        return {"version": 3, "shape": self.shape, "typestr": self.dtype.str, "strides": None,
                "data": (self.pointer, False), **({"stream": stream} if stream else {})}

    def copy_to_host(self) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        self.device.download(self.pointer, host)
        return host

    def numpy(self) -> np.ndarray:
        """A host copy (as ``copy_to_host``)."""
        return self.copy_to_host()

    def __repr__(self) -> str:
        return f"<bendc DeviceArray {self.dtype}{list(self.shape)} at {self.pointer:#x}>"


def torch_view(array: DeviceArray) -> Any:
    """A torch CUDA tensor over a device array's memory (no copy; it keeps the array, and so the
    program's buffers, alive). GPU-only: torch reads ``__cuda_array_interface__``."""
    return sys.modules["torch"].as_tensor(array, device="cuda")


class CubinProgram:
    """A cuda plan bound to a device: ``run(inputs)`` like the other runtimes' programs."""

    def __init__(self, plan: dict, device: Any, mode: str = "graph", outputs: str = "copy") -> None:
        if mode not in MODES:
            raise ValueError(f"cuda runtime mode {mode!r}: expected one of {', '.join(MODES)}")
        if outputs not in OUTPUT_CONTRACTS:
            raise ValueError(f"output contract {outputs!r}: expected one of {', '.join(OUTPUT_CONTRACTS)}")
        self.device, self.mode, self.output_contract = device, mode, outputs
        self.readers: list[Any] = []  # events of other streams that read this program's static buffers
        self.held: list[tuple[Any, list[Any]]] = []  # (event after a call's input copies, the inputs read)
        self.static = static = StaticPlan(plan, device.allocate)
        self.modules: list[Any] = []  # none: no numba here (runtime.api counts compiled functions)
        for pointer, value in static.sources:
            device.upload(pointer, value)
        if static.errors is not None:
            device.upload(static.errors, np.zeros(2 * len(static.checks), np.int64))
        loaded: dict[tuple[str, str], Any] = {}
        for call in static.hoisted + static.calls:
            key = (call.step, call.launch["kernel"])
            if key not in loaded:
                loaded[key] = device.load(call.step, call.launch)
            call.kernel = loaded[key]
        for call in static.hoisted:
            device.launch(call)
        self.graph = device.record(static.calls) if mode == "graph" and static.calls else None
        if static.errors is not None:
            self._raise_index_errors()
        device.synchronize()  # the allocations, uploads and hoisted steps are done before any call's stream

    @property
    def launches(self) -> int:
        """Kernel launches per call."""
        return len(self.static.calls)

    def run(self, inputs: Sequence[Any]) -> list[DeviceArray]:
        device = self.device
        device.select_stream(inputs)
        self._release_inputs()
        for event in self.readers:  # another stream may still read the buffers this call overwrites
            device.wait_event(event)
        self.readers.clear()
        read: list[Any] = []  # device inputs this call's stream reads
        for (pointer, dtype, shape), value in zip(self.static.inputs, inputs):
            nbytes = _nbytes((dtype, shape))
            source = device_input(value)
            if source is None:
                host = np.ascontiguousarray(value, DTYPES[dtype])
                if host.shape != shape:
                    raise ValueError(f"an input of shape {list(host.shape)} for a parameter of shape {list(shape)}")
                if nbytes:
                    device.upload(pointer, host)
            else:
                if source[1:] != (dtype, shape):
                    raise ValueError(f"a device input {source[1]}{list(source[2])} for a parameter "
                                     f"{dtype}{list(shape)}")
                if nbytes and source[0] != pointer:  # (a static output fed back may be this very buffer)
                    stream = producer_stream(value)
                    if stream is not None and stream != device.stream_handle():
                        device.wait_stream(stream)  # the producer's writes so far come first
                    device.copy(pointer, source[0], nbytes)
                    read.append(value)
        if read:
            event = device.record_event()
            for value in read:
                if isinstance(value, DeviceArray):
                    value.read_by(event)
            self.held.append((event, read))
        if self.graph is not None:
            device.replay(self.graph)
        else:
            for call in self.static.calls:
                device.launch(call)
        if self.static.errors is not None:
            self._raise_index_errors()
        as_torch = any(is_torch_cuda(value) for value in inputs)
        return [self._output(pointer, dtype, shape, resident, as_torch)
                for (pointer, dtype, shape), resident in zip(self.static.outputs, self.static.resident)]

    def _output(self, pointer: int, dtype: str, shape: tuple[int, ...], resident: bool = False,
                as_torch: bool = False) -> Any:
        if resident:  # a donated parameter's update: its static buffer itself, whatever the contract
            array = DeviceArray(self.device, pointer, dtype, shape, self)
            array.resident = True
            return torch_view(array) if as_torch else array  # torch_view: GPU-only (torch CUDA inputs)
        if self.output_contract == "static":
            return DeviceArray(self.device, pointer, dtype, shape, self)
        nbytes = _nbytes((dtype, shape))
        fresh, owner = self.device.allocate(max(nbytes, WORD_BYTES))
        if nbytes:
            self.device.copy(fresh, pointer, nbytes)
        return DeviceArray(self.device, fresh, dtype, shape, owner)

    def _release_inputs(self) -> None:
        """Drop the device inputs of earlier calls whose copies the stream has passed."""
        self.held = [(event, values) for event, values in self.held if not self.device.event_done(event)]

    def synchronize(self) -> None:
        """Wait for this program's stream; the inputs its calls read are released."""
        self.device.synchronize()
        self.held.clear()

    def _raise_index_errors(self) -> None:
        words = np.zeros(2 * len(self.static.checks), np.int64)
        self.device.download(self.static.errors, words)
        if not words.any():
            return
        self.device.upload(self.static.errors, np.zeros_like(words))
        for k, (name, check) in enumerate(self.static.checks):
            if words[2 * k]:
                raise KernelError(name, check.format(index=int(words[2 * k + 1])))


# ------------------------------------------------------------------ the GPU (cuda.core)
# GPU-only from here on: never run without a GPU (no test here reaches it offline; on a GPU,
# tests/gpu/test_cubin_runtime.py and tests/gpu/device_check.sh do). Not yet run on a GPU.
def cuda_core() -> Any:
    """cuda.core's namespace (``cuda.core`` from 1.0, ``cuda.core.experimental`` before)."""
    import cuda.core as core

    if not hasattr(core, "ObjectCode"):
        import cuda.core.experimental as core
    return core


def device_arch() -> str | None:
    """``sm_90`` for the current GPU, None when cuda.core or a driver and device are missing.
    GPU-only beyond the import: it initialises the driver."""
    try:
        core = cuda_core()
        device = core.Device()
        major, minor = device.compute_capability
        return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no cuda.core, no driver, no device
        return None


class CudaCoreDevice:
    """The GPU, through cuda.core and cuda.bindings' driver API. GPU-only: nothing here runs
    without a driver and a device (device_check.sh exercises it; tests/gpu/test_cubin_runtime.py)."""

    def __init__(self, cubins: dict[str, bytes]) -> None:
        self.core = core = cuda_core()
        from cuda.bindings import driver

        self.driver = driver
        self.cubins = cubins  # file name in the artifact -> checked cubin (check_cubins)
        self.gpu = core.Device()
        self.gpu.set_current()
        self.own_stream = self.gpu.create_stream(options=core.StreamOptions(nonblocking=True))
        self.stream = self.own_stream
        self._torch_streams: dict[int, Any] = {}
        self._foreign: dict[int, Any] = {}  # __cuda_array_interface__ stream handle -> cuda.core stream
        self.memory = self.gpu.memory_resource

    # memory
    def allocate(self, nbytes: int) -> tuple[int, Any]:
        buffer = self.memory.allocate(nbytes, stream=self.stream)
        return int(buffer.handle), buffer

    def _check(self, result: tuple, what: str) -> None:
        if result[0] != self.driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what} failed: {result[0]!r}")

    def upload(self, pointer: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)  # pageable memory: the driver stages it before returning
        self._check(self.driver.cuMemcpyHtoDAsync(pointer, host.ctypes.data, host.nbytes, self.stream.handle),
                    "cuMemcpyHtoDAsync")

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        self._check(self.driver.cuMemcpyDtoDAsync(destination, source, nbytes, self.stream.handle),
                    "cuMemcpyDtoDAsync")

    def download(self, pointer: int, host: np.ndarray) -> None:
        self._check(self.driver.cuMemcpyDtoHAsync(host.ctypes.data, pointer, host.nbytes, self.stream.handle),
                    "cuMemcpyDtoHAsync")
        self.stream.sync()

    # streams
    def select_stream(self, inputs: Sequence[Any]) -> None:
        """torch's current stream when an input is a torch CUDA tensor, else the program's own.
        Switching streams waits for the previous one: the static buffers are shared by all calls."""
        stream = self.own_stream
        if any(is_torch_cuda(value) for value in inputs):
            handle = int(sys.modules["torch"].cuda.current_stream().cuda_stream)
            if handle not in self._torch_streams:  # 0: torch's default, the legacy default stream
                legacy = getattr(self.core, "LEGACY_DEFAULT_STREAM", None)
                self._torch_streams[handle] = (legacy if handle == 0 and legacy is not None
                                               else self.core.Stream.from_handle(handle))
            stream = self._torch_streams[handle]
        if stream is not self.stream:
            self.stream.sync()
            self.stream = stream

    def stream_handle(self) -> int:
        handle = int(self.stream.handle)
        return handle or 1  # __cuda_array_interface__: 1 is the legacy default stream

    def _foreign_stream(self, handle: int) -> Any:
        """A cuda.core stream for a ``__cuda_array_interface__`` stream handle (1: legacy default,
        2: per-thread default)."""
        if handle not in self._foreign:
            named = {1: "LEGACY_DEFAULT_STREAM", 2: "PER_THREAD_DEFAULT_STREAM"}.get(handle)
            stream = getattr(self.core, named, None) if named else None
            self._foreign[handle] = stream if stream is not None else self.core.Stream.from_handle(handle)
        return self._foreign[handle]

    def wait_stream(self, handle: int) -> None:
        """The current stream waits (on the GPU, no host sync) for the work so far on stream
        ``handle``: an event recorded there, waited on here."""
        self.stream.wait(self._foreign_stream(handle))

    def record_event(self) -> Any:
        return self.stream.record()

    def wait_event(self, event: Any) -> None:
        self.stream.wait(event)

    def event_done(self, event: Any) -> bool:
        return bool(event.is_done)

    # kernels
    def load(self, step: str, launch: dict) -> Any:
        code = self.core.ObjectCode.from_cubin(self.cubins[launch["cubin"]], name=launch["cubin"])
        kernel = code.get_kernel(launch["entry"])
        reported = [_offset_size(info) for info in kernel.arguments_info]
        if kernel.num_arguments != len(reported):
            raise CubinMismatch(f"{launch['cubin']}: num_arguments {kernel.num_arguments} but "
                                f"{len(reported)} entries in arguments_info")
        check_parameters(f"{launch['cubin']} (as loaded)", launch, reported)
        config = self.core.LaunchConfig(grid=tuple(launch["grid"]), block=tuple(launch["block"]), shmem_size=0)
        return kernel, config

    def launch(self, call: Call, stream: Any = None) -> None:
        kernel, config = call.kernel
        self.core.launch(self.stream if stream is None else stream, config, kernel, *call.words)

    def record(self, calls: list[Call]) -> Any:
        """The launches captured in order into one graph on a non-blocking stream, instantiated and
        uploaded. On any error the capture is ended, the builder and any graph made are discarded
        (the stream leaves capture mode) and CaptureError names the kernel being captured."""
        builder = self.own_stream.create_graph_builder()
        graph = None
        where = "the start of the capture"
        try:
            builder.begin_building("relaxed")
            for call in calls:
                where = f"kernel {call.step}.{call.launch['kernel']}"
                self.launch(call, builder)
            where = "the graph's instantiation (after its last kernel)"
            graph = builder.end_building().complete()
            where = "the graph's upload"
            graph.upload(self.own_stream)
            self.own_stream.sync()
            return graph
        except Exception as error:
            discard_capture(builder, graph)
            raise CaptureError(where, error) from error

    def replay(self, graph: Any) -> None:
        graph.launch(self.stream)

    def synchronize(self) -> None:
        self.stream.sync()


def discard_capture(builder: Any, graph: Any) -> None:
    """End a graph builder's capture if it is still capturing, then close the graph and the builder.
    Each step is tried whatever the ones before raised (the capture may be invalidated)."""
    steps = [lambda: builder.end_building() if builder.is_building else None]
    if graph is not None:
        steps.append(graph.close)
    steps.append(builder.close)
    for step in steps:
        try:
            step()
        except Exception:  # noqa: BLE001 - already failing: the first error is the one raised
            pass


def _offset_size(info: Any) -> tuple[int, int]:
    """(offset, size) of one of cuda.core's ``arguments_info`` entries (ParamInfo)."""
    if hasattr(info, "offset"):
        return int(info.offset), int(info.size)
    offset, size = info
    return int(offset), int(size)


def check_cubins(folder: str, plan: dict) -> dict[str, bytes]:
    """Every cubin the plan launches (file name -> bytes), each checked against its launches'
    records (check_cubin); CubinMismatch names the first that differs. No GPU needed."""
    cubins: dict[str, bytes] = {}
    for step in plan["steps"]:
        for launch in step["launches"]:
            require_entry(step, launch)
            data = check_cubin(folder, launch)
            cubins.setdefault(launch["cubin"], data)
    return cubins


def load_cubin_program(folder: str, plan: dict, mode: str = "graph", outputs: str = "copy") -> CubinProgram:
    """A cuda artifact's plan on the current GPU from its cubins, checked first (without the GPU).
    GPU-only from CudaCoreDevice on."""
    cubins = check_cubins(folder, plan)
    return CubinProgram(plan, CudaCoreDevice(cubins), mode, outputs)
