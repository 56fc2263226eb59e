"""The cubin runtime's bookkeeping, round-tripped through numba's CUDA simulator (its own process:
tests/cuda/run_simulator.sh).

runtime/cuda_graph.py's CubinProgram is driven with a device whose pointers stand for numpy
buffers: its launches decode the packed parameter words back into arrays (checking numba's
layout word by word: meminfo, parent, nitems, itemsize, data, shape, stride) and run the step's
kernel from the artifact's own source under the simulator; its "graph" is the recorded list of
launches replayed. So static allocation, views, planned buffers, constants, hoisted steps, index
checks, input copies and both output contracts run as on a GPU, and the results are compared with
the cpu build of the same step. What is left for a GPU: cuda.core itself (loading, launching,
capture), tests/gpu/test_cubin_runtime.py.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("runs under numba's CUDA simulator: tests/cuda/run_simulator.sh", allow_module_level=True)
if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)

import runtime  # noqa: E402
from runtime.artifact import load_module, read_manifest, read_plan  # noqa: E402
from runtime.cpu import KernelError  # noqa: E402
from runtime.cli import random_inputs  # noqa: E402
from runtime.cuda_graph import CubinProgram, array_words_count, check_cubins  # noqa: E402
from runtime.dtypes import DTYPES  # noqa: E402
from bendc.errors import UnsupportedError  # noqa: E402
from momentum_program import (DONATED, EXAMPLE_SHAPES, FEEDS, GRADIENTS, IN_PLACE, NORM,  # noqa: E402
                              momentum)

ROOT = Path(__file__).resolve().parents[2]
TINY = "x=f32[4,8] y=i64[4] w1=f32[8,8]:leaf b1=f32[8]:leaf w2=f32[3,8]:leaf b2=f32[3]:leaf"
ALIGN = 256
FULL_BLOCKS = True  # runs kernels `bendc compile` built in another process, at cuda_kit.MAX_BLOCK (tests/conftest.py)


class SimulatedDevice:
    """CubinProgram's device, with numpy buffers for device memory and the simulator for kernels."""

    def __init__(self, cubins: dict[str, bytes], modules: dict) -> None:
        self.cubins = cubins
        self.modules = modules  # step name -> its kernel module
        self.memory: dict[int, np.ndarray] = {}
        self.next = 0x7F0000000000
        self.launched: list[str] = []
        self.uploads: list[int] = []  # destination of each host-to-device copy
        self.copies: list[int] = []  # destination of each device-to-device copy

    @classmethod
    def for_artifact(cls, folder: Path, plan: dict) -> "SimulatedDevice":
        cubins = check_cubins(str(folder), plan)  # the build's records agree with its cubins
        return cls(cubins, {step["name"]: load_module(str(folder / "kernels" / f"{step['module']}.py"),
                                                       step["module"]) for step in plan["steps"] if step["launches"]})

    def allocate(self, nbytes: int) -> tuple[int, np.ndarray]:
        base, self.next = self.next, self.next + -(-nbytes // ALIGN) * ALIGN + ALIGN
        self.memory[base] = buffer = np.full(nbytes, 0xA5, np.uint8)  # uninitialized memory is garbage
        return base, buffer

    def bytes_at(self, pointer: int, nbytes: int) -> np.ndarray:
        for base, buffer in self.memory.items():
            if base <= pointer < base + len(buffer):
                assert pointer + nbytes <= base + len(buffer), "a word points past its allocation"
                return buffer[pointer - base:pointer - base + nbytes]
        raise AssertionError(f"{pointer:#x} is no allocation")

    def upload(self, pointer: int, host: np.ndarray) -> None:
        self.bytes_at(pointer, host.nbytes)[:] = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.uploads.append(pointer)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        self.bytes_at(destination, nbytes)[:] = self.bytes_at(source, nbytes)
        self.copies.append(destination)

    def download(self, pointer: int, host: np.ndarray) -> None:
        host.reshape(-1).view(np.uint8)[:] = self.bytes_at(pointer, host.nbytes)

    def select_stream(self, inputs) -> None:
        pass

    def stream_handle(self) -> int:
        return 0

    def synchronize(self) -> None:
        pass

    def load(self, step: str, launch: dict):
        assert launch["cubin"] in self.cubins
        return getattr(self.modules[step], launch["kernel"])

    def decode(self, words: tuple[int, ...], arguments: list[dict]) -> list[np.ndarray]:
        """The arrays numba's kernel ABI words describe."""
        arrays, position = [], 0
        for argument in arguments:
            assert argument["ndim"] == 1
            meminfo, parent, count, itemsize, data, shape, stride = words[position:position + array_words_count(1)]
            position += array_words_count(1)
            dtype = DTYPES[argument["dtype"]]
            assert (meminfo, parent) == (0, 0) and itemsize == stride == dtype.itemsize and shape == count
            arrays.append(self.bytes_at(data, count * itemsize).view(dtype))
        assert position == len(words)
        return arrays

    def launch(self, call) -> None:
        arrays = self.decode(call.words, call.launch["arguments"])
        call.kernel[tuple(call.launch["grid"]), tuple(call.launch["block"])](*arrays)
        self.launched.append(f"{call.step}.{call.launch['kernel']}")

    def record(self, calls) -> list:
        return list(calls)

    def replay(self, graph: list) -> None:
        for call in graph:
            self.launch(call)

    # streams: this device is synchronous (every operation is done when it returns)
    def wait_stream(self, handle: int) -> None:
        pass

    def record_event(self) -> None:
        return None

    def wait_event(self, event) -> None:
        pass

    def event_done(self, event) -> bool:
        return True


class Streams:
    """A simulated GPU's streams: each a queue of operations that run, in order, only when the
    stream is synchronised or when another stream that runs reaches a wait on an event recorded
    after them. Nothing runs ahead on its own, so a read not ordered after its producer sees the
    memory as it was before the producer's work; a stream-ordered free runs when its stream does."""

    def __init__(self) -> None:
        self.queues: dict[int, list] = {}
        self.enqueued: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.memory: dict[int, np.ndarray] = {}  # shared by every device on this GPU
        self.next = 0x7F0000000000

    def new(self) -> int:
        handle = 0x5000 + 0x10 * len(self.queues)
        self.queues[handle], self.enqueued[handle], self.done[handle] = [], 0, 0
        return handle

    def enqueue(self, handle: int, operation) -> None:
        self.queues[handle].append(operation)
        self.enqueued[handle] += 1

    def event(self, handle: int) -> tuple[int, int]:
        """An event recorded on ``handle`` now: passed once the operations enqueued so far ran."""
        return handle, self.enqueued[handle]

    def run_until(self, event: tuple[int, int]) -> None:
        handle, count = event
        while self.done[handle] < count:
            operation = self.queues[handle].pop(0)
            operation()
            self.done[handle] += 1

    def passed(self, event: tuple[int, int]) -> bool:
        return self.done[event[0]] >= event[1]


class Allocation:
    """Device memory freed stream-ordered on the stream that allocated it when dropped (as
    cuda.core's stream-ordered memory resource does)."""

    def __init__(self, streams: Streams, stream: int, base: int, nbytes: int) -> None:
        self.streams, self.stream, self.base = streams, stream, base
        streams.memory[base] = self.buffer = np.full(nbytes, 0xA5, np.uint8)

    def __del__(self) -> None:
        memory, base = self.streams.memory, self.base
        self.streams.enqueue(self.stream, lambda: memory.pop(base))


class AsyncSimulatedDevice(SimulatedDevice):
    """SimulatedDevice with asynchronous streams (Streams): every copy, launch and free is queued
    on this device's own stream; a download synchronises it. Devices made over the same Streams
    share memory, as two programs on one GPU do."""

    def __init__(self, streams: Streams, cubins: dict[str, bytes], modules: dict) -> None:
        super().__init__(cubins, modules)
        self.streams = streams
        self.memory = streams.memory
        self.handle = streams.new()

    @classmethod
    def for_artifact(cls, streams: Streams, folder: Path, plan: dict) -> "AsyncSimulatedDevice":
        device = SimulatedDevice.for_artifact(folder, plan)
        return cls(streams, device.cubins, device.modules)

    def allocate(self, nbytes: int) -> tuple[int, Allocation]:
        base = self.streams.next
        self.streams.next += -(-nbytes // ALIGN) * ALIGN + ALIGN
        allocation = Allocation(self.streams, self.handle, base, nbytes)
        return base, allocation

    def _queue(self, operation) -> None:
        self.streams.enqueue(self.handle, operation)

    def upload(self, pointer: int, host: np.ndarray) -> None:
        staged = np.array(host)  # pageable host memory: staged before the call returns
        self._queue(lambda: SimulatedDevice.upload(self, pointer, staged))

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        self._queue(lambda: SimulatedDevice.copy(self, destination, source, nbytes))

    def download(self, pointer: int, host: np.ndarray) -> None:
        self._queue(lambda: SimulatedDevice.download(self, pointer, host))
        self.synchronize()

    def launch(self, call) -> None:
        self._queue(lambda: SimulatedDevice.launch(self, call))

    def stream_handle(self) -> int:
        return self.handle

    def synchronize(self) -> None:
        self.streams.run_until(self.streams.event(self.handle))

    def wait_stream(self, handle: int) -> None:
        self.wait_event(self.streams.event(handle))

    def record_event(self) -> tuple[int, int]:
        return self.streams.event(self.handle)

    def wait_event(self, event) -> None:
        self._queue(lambda: self.streams.run_until(event))

    def event_done(self, event) -> bool:
        return self.streams.passed(event)


class FakeDeviceArray:
    """An input already in (simulated) device memory: read through __cuda_array_interface__."""

    def __init__(self, device: SimulatedDevice, array: np.ndarray) -> None:
        self.pointer, _ = device.allocate(array.nbytes)
        device.upload(self.pointer, array)
        self.__cuda_array_interface__ = {"version": 3, "shape": array.shape, "typestr": array.dtype.str,
                                         "strides": None, "data": (self.pointer, False)}


def build(target: str, folder: Path, function: str = "tests/flat_mlp.py:train_step", shapes: str = TINY,
          *options: str, cache: Path | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}  # PTX needs the real numba.cuda
    if cache is not None:
        env["BENDC_CACHE_DIR"] = str(cache)
    result = subprocess.run([sys.executable, "-m", "bendc", "compile", function, "--shapes", shapes,
                             "--target", target, "-o", str(folder), *options], cwd=ROOT, capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cubin-sim")
    build("cuda", folder / "cuda")
    build("cpu", folder / "cpu")
    manifest = read_manifest(str(folder / "cuda"))
    inputs = random_inputs(manifest, 0)
    want = runtime.load(str(folder / "cpu")).run_flat(list(inputs))
    return folder / "cuda", read_plan(str(folder / "cuda"), manifest), inputs, want


def check_outputs(got, want) -> None:
    for index, (mine, theirs) in enumerate(zip(got, want)):
        host = mine.copy_to_host()
        assert host.shape == theirs.shape and host.dtype == theirs.dtype, index
        np.testing.assert_allclose(host, theirs, rtol=1e-5, atol=1e-6, err_msg=f"out{index}")


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_packed_launches_run_like_the_cpu_build(built, mode: str) -> None:
    folder, plan, inputs, want = built
    device = SimulatedDevice.for_artifact(folder, plan)
    program = CubinProgram(plan, device, mode=mode)
    hoisted = len(device.launched)
    check_outputs(program.run(inputs), want)
    assert device.launched[hoisted:] == [f"{c.step}.{c.launch['kernel']}" for c in program.static.calls]
    assert program.launches == sum(len(s["launches"]) for s in plan["steps"] if not s["hoisted"])


@pytest.mark.long  # two bendc compile builds, 21 s; key_grads in parts runs in make test (test_sim_attention_tiled.py)
def test_a_step_with_a_scratch_array_runs_like_the_cpu_build(tmp_path) -> None:
    """The tiled attention backward's key_grads splits its walk in parts written to a scratch array
    (Kernels.scratch: a plan value after the step's outputs, in a planned buffer, garbage until
    key_grads writes it) that key_grads_sum adds in order: its launches' packed words carry the
    array, and the step built as cubins (shrunken tiles: small_tiled_attention.py) runs like the
    cpu build, as a graph and eagerly."""
    shapes = "q=f32[1,2,9,4]:leaf k=f32[1,1,9,4]:leaf v=f32[1,1,9,3]:leaf g=f32[1,2,9,3]"
    build("cuda", tmp_path / "cuda", "tests/cuda/small_tiled_attention.py:step", shapes)
    build("cpu", tmp_path / "cpu", "tests/cuda/small_tiled_attention.py:step", shapes)
    manifest = read_manifest(str(tmp_path / "cuda"))
    plan = read_plan(str(tmp_path / "cuda"), manifest)
    (grad,) = [s for s in plan["steps"] if [l["kernel"] for l in s["launches"]][:2] == ["key_grads", "key_grads_sum"]]
    scratch = grad["outputs"][-1]
    assert str(scratch) in plan["storage"] and scratch not in plan["outputs"]
    assert all(len(l["arguments"]) == len(grad["inputs"]) + len(grad["outputs"]) for l in grad["launches"])
    inputs = random_inputs(manifest, 0)
    want = runtime.load(str(tmp_path / "cpu")).run_flat(list(inputs))
    for mode in ("graph", "eager"):
        device = SimulatedDevice.for_artifact(tmp_path / "cuda", plan)
        got = CubinProgram(plan, device, mode=mode).run(inputs)
        assert f"{grad['name']}.key_grads_sum" in device.launched
        for index, (mine, theirs) in enumerate(zip(got, want)):
            host, scale = mine.copy_to_host(), max(float(np.max(np.abs(theirs))), 0.1)
            assert float(np.max(np.abs(host - theirs))) <= 2e-5 * scale, f"{mode} out{index}"


def test_output_contracts_and_device_inputs(built) -> None:
    folder, plan, inputs, want = built
    device = SimulatedDevice.for_artifact(folder, plan)
    static = CubinProgram(plan, device, outputs="static")
    first = static.run(inputs)
    kept = [o.copy_to_host() for o in first]
    check_outputs(first, want)
    other = [np.ascontiguousarray(a * 2 if a.dtype == np.float32 else a) for a in inputs]
    second = static.run([FakeDeviceArray(device, a) for a in other])  # device to device copies
    assert [o.pointer for o in first] == [o.pointer for o in second]  # the same static buffers...
    assert not np.array_equal(first[0].copy_to_host(), kept[0])  # ...which the next call overwrote
    copying = CubinProgram(plan, device, outputs="copy")
    again = copying.run(inputs)
    check_outputs(again, want)
    later = copying.run(other)
    assert {o.pointer for o in again}.isdisjoint(o.pointer for o in later)
    check_outputs(again, want)  # still the first call's values
    for mine, theirs in zip(later, second):
        np.testing.assert_array_equal(mine.copy_to_host(), theirs.copy_to_host())


def test_a_bad_index_raises_the_steps_check_and_the_next_call_is_clean(built) -> None:
    folder, plan, inputs, want = built
    program = CubinProgram(plan, SimulatedDevice.for_artifact(folder, plan))
    bad = list(inputs)
    bad[1] = np.array([0, 7, 1, 2], np.int64)
    with pytest.raises(KernelError, match="7"):
        program.run(bad)
    check_outputs(program.run(inputs), want)


# ------------------------------------------------------------------ streams: __cuda_array_interface__
def two_programs(folder: Path, plan: dict, outputs: str = "copy"):
    """Two programs of the same step on one simulated GPU with asynchronous streams, each on its
    own stream (two CudaCoreDevices), and a synchronous reference program."""
    streams = Streams()
    first, second = (CubinProgram(plan, AsyncSimulatedDevice.for_artifact(streams, folder, plan), outputs=outputs)
                     for _ in range(2))
    return first, second, CubinProgram(plan, SimulatedDevice.for_artifact(folder, plan))


def host(arrays) -> list[np.ndarray]:
    return [a.copy_to_host() for a in arrays]


def check_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for index, (mine, theirs) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(mine, theirs, err_msg=f"out{index}")


# make test-long (~30 s under the simulator): make test checks the same wait, bit for bit, in the device
# script's dry run (tests/gpu/test_race_probe.py: the momentum artifact's outputs fed to a second program
# on another stream of the simulated GPU, for both output contracts).
@pytest.mark.long
def test_a_consumer_waits_for_the_producers_stream(built) -> None:
    """Program A's outputs fed to program B (another stream): B's stream waits on an event recorded
    on the stream A's outputs name in __cuda_array_interface__ before copying them."""
    folder, plan, inputs, _ = built
    a, b, reference = two_programs(folder, plan)

    def chained(outputs: list) -> list:  # the same data, the updated w1, b1, w2, b2 (outputs 1..)
        return list(inputs[:2]) + list(outputs[1:])

    produced = a.run(inputs)
    assert all(o.__cuda_array_interface__["stream"] == a.device.handle for o in produced)
    got = host(b.run(chained(produced)))  # only B's stream is synchronised here
    first = host(reference.run(inputs))
    check_same(host(produced), first)
    check_same(got, host(reference.run(chained(first))))


def fed_back(manifest: dict, inputs: list, outputs: list) -> list:
    """The optimizer's next inputs: the updates in place of the parameters they update."""
    return [outputs[FEEDS[spec["name"]]] if spec["name"] in FEEDS else value
            for spec, value in zip(manifest["inputs"], inputs)]


def test_a_consumer_keeps_its_inputs_alive_until_its_stream_has_read_them(optimizer) -> None:
    """A's copy-contract output (the optimizer's c: not updated in place), dropped by the caller
    once B's call returned, is freed on A's stream; B holds it until its own stream has passed its
    copies. (The optimizer has no index checks, whose read-back would synchronise B's call.)"""
    folder, manifest, plan = optimizer
    a, b, reference = two_programs(folder / "cuda", plan)
    inputs = list(random_inputs(manifest, 0))
    produced = a.run(inputs)
    a.device.synchronize()
    first = host(produced)
    results = b.run(fed_back(manifest, inputs, produced))
    del produced
    a.device.synchronize()  # A's stream runs on: the frees of the outputs dropped above, unless B holds them
    check_same(host(results), host(reference.run(fed_back(manifest, inputs, first))))
    assert b.held  # released at B's next call or synchronize, once B's stream passed the copies
    b.synchronize()
    assert not b.held


def test_a_producer_waits_for_its_readers_before_overwriting_its_buffers(optimizer) -> None:
    """Resident outputs (donated parameters updated in place) and static ones are overwritten by the
    producer's next call: that call's stream first waits for the streams that read them (the
    events B recorded on A's arrays)."""
    folder, manifest, plan = optimizer
    for contract in ("copy", "static"):
        a, b, reference = two_programs(folder / "cuda", plan, outputs=contract)
        inputs, other = list(random_inputs(manifest, 0)), list(random_inputs(manifest, 1))
        produced = a.run(inputs)
        a.device.synchronize()
        results = b.run(fed_back(manifest, inputs, produced))
        again = a.run(other)  # writes over the buffers B copies from
        a.device.synchronize()
        first = host(reference.run(inputs))
        check_same(host(results), host(reference.run(fed_back(manifest, inputs, first))))
        check_same(host(again), host(reference.run(other)))


def test_the_stream_protocols_edge_values() -> None:
    from runtime.cuda_graph import producer_stream

    class Exported:
        def __init__(self, **extra) -> None:
            self.__cuda_array_interface__ = {"version": 3, "shape": (2,), "typestr": "<f4", "strides": None,
                                             "data": (0x1000, False), **extra}

    assert producer_stream(Exported()) is None and producer_stream(Exported(stream=None)) is None
    assert producer_stream(Exported(stream=1)) == 1  # the legacy default stream (numba's default)
    assert producer_stream(np.zeros(2)) is None
    with pytest.raises(ValueError, match="stream 0 is disallowed"):
        producer_stream(Exported(stream=0))


# ------------------------------------------------------------------ donated parameters, resident
# tests/cuda/momentum_program.py: an optimizer step with donated parameters, + - * only.
MOMENTUM = str(ROOT / "tests" / "cuda" / "momentum_program.py")
STEPS = 4


@pytest.fixture(scope="module")
def optimizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resident")
    for target in ("cuda", "cpu"):
        build(target, folder / target, f"{MOMENTUM}:momentum", EXAMPLE_SHAPES, "--donate", ",".join(DONATED),
              cache=folder / "cache")
    manifest = read_manifest(str(folder / "cuda"))
    return folder, manifest, read_plan(str(folder / "cuda"), manifest)


def optimizer_inputs(manifest: dict, step: int) -> dict[str, np.ndarray]:
    return {spec["name"]: array for spec, array in zip(manifest["inputs"], random_inputs(manifest, step))}


def cpu_steps(folder: Path, manifest: dict) -> list[list[np.ndarray]]:
    """Each step's outputs on the cpu build, the updates fed back (copies: it writes over donated inputs)."""
    cpu = runtime.load(str(folder / "cpu"))
    state = optimizer_inputs(manifest, 0)
    steps = []
    for step in range(STEPS):
        state.update({name: optimizer_inputs(manifest, step)[name] for name in GRADIENTS})
        outputs = [np.array(o) for o in cpu.run_flat([np.array(state[spec["name"]]) for spec in manifest["inputs"]])]
        steps.append(outputs)
        state.update({name: outputs[index] for name, index in FEEDS.items()})
    return steps


def check_optimizer_outputs(got: list[np.ndarray], want: list[np.ndarray], where: str) -> None:
    """The updates bit for bit (+ - * only); the norm, a sum whose order differs on the GPU, to 1e-6."""
    for index, (mine, theirs) in enumerate(zip(got, want)):
        if index == NORM:
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, err_msg=f"{where} out{index}")
        else:
            np.testing.assert_array_equal(mine, theirs, err_msg=f"{where} out{index}")


def test_the_plan_updates_donated_parameters_in_place_where_safe_and_says_where_not(optimizer) -> None:
    folder, manifest, plan = optimizer
    names = {p: name for p, name in zip(plan["params"], plan["param_names"])}
    in_place = {names[p]: plan["outputs"].index(int(o)) for o, p in plan["donations"].items()}
    assert in_place == {name: FEEDS[name] for name in IN_PLACE}
    assert manifest["feeds"] == in_place  # what Program.loop and bendc run --feed-outputs feed back
    report = (folder / "cuda" / "report.txt").read_text()
    for name in IN_PLACE:
        assert f"in place over the donated parameter {name} in" in report
    # c's last reader is the norm's kernel, after its update: no output of that kernel may take its memory
    assert re.search(r"the donated parameter c is not updated in place \(its last reader k\d+ writes no returned "
                     r"output of its type\)", report), report


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_donated_parameters_stay_resident_across_steps_bit_for_bit(optimizer, mode: str) -> None:
    folder, manifest, plan = optimizer
    want = cpu_steps(folder, manifest)
    device = SimulatedDevice.for_artifact(folder / "cuda", plan)
    program = CubinProgram(plan, device, mode=mode)
    slot = {spec["name"]: index for index, spec in enumerate(manifest["inputs"])}
    buffer = {name: program.static.inputs[slot[name]][0] for name in slot}
    state: dict = optimizer_inputs(manifest, 0)
    for step in range(STEPS):
        state.update({name: optimizer_inputs(manifest, step)[name] for name in GRADIENTS})
        device.uploads.clear(), device.copies.clear()
        got = program.run([state[spec["name"]] for spec in manifest["inputs"]])
        check_optimizer_outputs([o.numpy() for o in got], want[step], f"step {step}")
        for name in IN_PLACE:
            assert got[FEEDS[name]].resident and got[FEEDS[name]].pointer == buffer[name]  # the update: in place
        assert not got[FEEDS["c"]].resident and got[FEEDS["c"]].pointer != buffer["c"]
        if step:  # fed back: no copy of a resident parameter; the gradients and c are copied
            assert not {buffer[name] for name in IN_PLACE} & set(device.uploads + device.copies)
            assert device.copies.count(buffer["c"]) == 1
        for name in GRADIENTS:
            assert device.uploads.count(buffer[name]) == 1
        state.update({name: got[index] for name, index in FEEDS.items()})


def test_a_resident_output_is_overwritten_by_the_next_call_and_a_snapshot_is_not(optimizer) -> None:
    folder, manifest, plan = optimizer
    program = CubinProgram(plan, SimulatedDevice.for_artifact(folder / "cuda", plan), outputs="copy")
    inputs = list(random_inputs(manifest, 0))
    first = program.run(inputs)
    snapshot = first[FEEDS["w"]].numpy()
    loss = first[NORM].numpy()
    second = program.run([first[FEEDS.get(spec["name"], -1)] if spec["name"] in FEEDS else a
                          for spec, a in zip(manifest["inputs"], inputs)])
    assert not np.array_equal(first[FEEDS["w"]].numpy(), snapshot)  # the parameter moved on, in place
    np.testing.assert_array_equal(first[FEEDS["w"]].numpy(), second[FEEDS["w"]].numpy())
    np.testing.assert_array_equal(first[NORM].numpy(), loss)  # a non-donated output: copied ("copy")


def test_program_loop_feeds_the_resident_updates_back(optimizer) -> None:
    folder, manifest, plan = optimizer
    cpu = runtime.load(str(folder / "cpu"))
    gpu = runtime.load(str(folder / "cuda"), cuda_runtime="numba")  # the simulator's; then the cubin runtime's
    device = SimulatedDevice.for_artifact(folder / "cuda", plan)
    gpu._program = CubinProgram(plan, device)
    inputs = list(random_inputs(manifest, 0))
    want = cpu.loop(STEPS, *[np.array(a) for a in inputs])
    device.copies.clear()
    got = gpu.loop(STEPS, *inputs)
    check_optimizer_outputs(got, want, f"after {STEPS} steps")
    resident = {gpu._program.static.inputs[gpu.names.index(name)][0] for name in gpu.feeds}
    assert not resident & set(device.copies)


# ------------------------------------------------------------------ bendc.jit(target="cuda") on cubins
def jitted_optimizer():
    import bendc

    return bendc.jit(momentum.fn, target="cuda", donate=DONATED)


def run_jitted(step, manifest: dict) -> list[list[np.ndarray]]:
    """Each step's outputs (host copies), the updates fed back as the step returned them."""
    state: dict = optimizer_inputs(manifest, 0)
    steps = []
    for number in range(STEPS):
        state.update({name: optimizer_inputs(manifest, number)[name] for name in GRADIENTS})
        got = step(*[state[spec["name"]] for spec in manifest["inputs"]])
        steps.append([o.copy_to_host() for o in got])
        state.update({name: got[index] for name, index in FEEDS.items()})
    return steps


def test_jit_cuda_runs_its_cubins_through_the_cubin_runtime(optimizer, monkeypatch) -> None:
    import bendc.cuda_jit as cuda_jit

    folder, manifest, plan = optimizer
    # The simulated device says it is an sm_90 (bendc compile's default arch): the fixture's cuda build
    # left that architecture's cubins in the kernel cache, which the jit finds (this process cannot
    # compile PTX: the simulator replaced numba.cuda).
    monkeypatch.setenv("BENDC_CACHE_DIR", str(folder / "cache"))
    monkeypatch.delenv("BENDC_CUDA_RUNTIME", raising=False)
    monkeypatch.setattr(cuda_jit, "device_arch", lambda: "sm_90")
    devices: list[SimulatedDevice] = []

    def simulated(cubins: dict, plan: dict, modules: dict) -> SimulatedDevice:
        assert set(cubins) == {launch["cubin"] for step in plan["steps"] for launch in step["launches"]}
        devices.append(SimulatedDevice(cubins, modules))
        return devices[-1]

    monkeypatch.setattr(cuda_jit, "cubin_device", simulated)
    step = jitted_optimizer()
    got = run_jitted(step, manifest)
    program = step._last.run.program
    assert isinstance(program, CubinProgram) and program.mode == "graph" and len(devices) == 1
    launches = sum(len(s["launches"]) for s in plan["steps"] if not s["hoisted"])
    assert re.search(rf"cuda runtime: graph \(cubins for sm_90: 0 compiled, {launches} from the kernel cache",
                     step.report())
    assert len(devices[0].launched) == STEPS * program.launches
    with pytest.raises(UnsupportedError, match="profile with BENDC_CUDA_RUNTIME=numba"):
        step.profile(*random_inputs(manifest, 0), runs=1)
    names = [spec["name"] for spec in manifest["inputs"]]
    resident = {program.static.inputs[names.index(name)][0] for name in IN_PLACE}
    assert not resident & set(devices[0].copies)  # fed back with no copy
    for number, (mine, theirs) in enumerate(zip(got, cpu_steps(folder, manifest))):
        check_optimizer_outputs(mine, theirs, f"step {number}")


def test_jit_cuda_raises_a_bendc_error_naming_the_kernel_when_the_capture_fails(optimizer, monkeypatch) -> None:
    import bendc.cuda_jit as cuda_jit
    from bendc.errors import InternalError
    from runtime.cuda_graph import CaptureError

    folder, manifest, _ = optimizer
    monkeypatch.setenv("BENDC_CACHE_DIR", str(folder / "cache"))
    monkeypatch.delenv("BENDC_CUDA_RUNTIME", raising=False)
    monkeypatch.setattr(cuda_jit, "device_arch", lambda: "sm_90")

    class FailingCapture(SimulatedDevice):
        def record(self, calls):
            raise CaptureError(f"kernel {calls[0].step}.{calls[0].launch['kernel']}", RuntimeError("CUDA_ERROR_X"))

    monkeypatch.setattr(cuda_jit, "cubin_device", lambda cubins, plan, modules: FailingCapture(cubins, modules))
    with pytest.raises(InternalError, match=r"momentum: capturing the CUDA graph failed at kernel \w+\.\w+: "
                                            r"RuntimeError: CUDA_ERROR_X; BENDC_CUDA_RUNTIME=eager"):
        jitted_optimizer()(*random_inputs(manifest, 0))


def test_jit_cuda_falls_back_to_numbas_jit_when_no_cubin_can_be_built(optimizer, monkeypatch, tmp_path,
                                                                      capfd) -> None:
    import bendc.cuda_jit as cuda_jit
    from runtime.cuda import CudaProgram

    folder, manifest, _ = optimizer
    monkeypatch.setenv("BENDC_CACHE_DIR", str(tmp_path))  # no cubins cached, and none can be compiled here
    monkeypatch.delenv("BENDC_CUDA_RUNTIME", raising=False)
    monkeypatch.setattr(cuda_jit, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_jit, "cubin_device", lambda *_: pytest.fail("no cubins: no cubin device"))
    step = jitted_optimizer()
    got = run_jitted(step, manifest)
    assert isinstance(step._last.run.program, CudaProgram)
    assert "cuda runtime: numba JIT (no cubin could be built for sm_90: " in step.report()
    assert "runs on numba-cuda's JIT: no cubin could be built for sm_90" in capfd.readouterr().err
    for number, (mine, theirs) in enumerate(zip(got, cpu_steps(folder, manifest))):
        check_optimizer_outputs(mine, theirs, f"step {number}")


def test_jit_cuda_runtime_choice_is_checked(monkeypatch, optimizer) -> None:
    monkeypatch.setenv("BENDC_CUDA_RUNTIME", "cubin")
    step = jitted_optimizer()
    with pytest.raises(UnsupportedError, match="BENDC_CUDA_RUNTIME='cubin': expected one of auto, graph"):
        step(*random_inputs(optimizer[1], 0))


def test_bendc_run_feeds_a_cuda_steps_device_outputs_back(optimizer, tmp_path) -> None:
    """``bendc run --steps N --feed-outputs`` on the cuda build (numba's runtime under the simulator,
    which returns device arrays) feeds the recorded feeds back and matches the cpu build."""
    folder, manifest, _ = optimizer
    outputs = {}
    for target in ("cpu", "cuda"):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM" or target == "cuda"}
        result = subprocess.run([sys.executable, "-m", "runtime", str(folder / target), "--random-inputs",
                                 "--steps", str(STEPS), "--feed-outputs", "--outputs", str(tmp_path / f"{target}.npz")],
                                cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr
        assert f"fed {len(IN_PLACE)} outputs back each step" in result.stdout
        with np.load(tmp_path / f"{target}.npz") as stored:
            outputs[target] = [stored[f"out{index}"] for index in range(len(stored.files))]
    check_optimizer_outputs(outputs["cuda"], outputs["cpu"], f"after {STEPS} steps")
