"""What `bendc compile --target cuda` records for the cubin runtime, checked offline against the
cubins themselves: each launch's entry symbol and parameter layout as the cubin's ELF states them
(symbol table and ``.nv.info.<entry>`` KPARAM_INFO records, what the driver reports as
``arguments_info``), the constants' values, the packing of every launch's argument words, and the
refusals (an old format, a cubin that disagrees with the plan) that come before any GPU work."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX cannot be compiled in a simulator process", allow_module_level=True)

import runtime  # noqa: E402
from runtime.artifact import ArtifactInvalid, content_hash, file_hash, read_manifest, read_plan  # noqa: E402
from runtime.cubin_elf import entry_symbols, kernel_parameters  # noqa: E402
from runtime import trust  # noqa: E402
from runtime.cuda_graph import (CubinMismatch, StaticPlan, array_words_count, check_cubin, check_cubins,  # noqa: E402
                                expected_parameters)
from runtime.dtypes import DTYPES, numel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = "x=f32[4,8] y=i64[4] w1=f32[8,8]:leaf b1=f32[8]:leaf w2=f32[3,8]:leaf b2=f32[3]:leaf"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cubin") / "mlp-cuda"
    result = subprocess.run([sys.executable, "-m", "bendc", "compile", "tests/flat_mlp.py:train_step", "--shapes", TINY,
                             "--target", "cuda", "-o", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out


# A step whose backward materializes a constant (the 1.0 seed of the sum, expanded into a scatter):
# a cuda source step, which the cubin runtime uploads from plan.json.
CONSTANT_PROGRAM = """\
import bendc
import bendc.functional as F

EXAMPLE_SHAPES = "x=f32[4,3]:leaf idx=i64[4,1]"


@bendc.jit(leaves=("x",))
def step(x, idx):
    loss = F.gather(x * 3.0, 1, idx).sum()
    loss.backward()
    return loss, x.grad
"""


@pytest.fixture(scope="module")
def constant_artifact(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("constant")
    (folder / "constant_program.py").write_text(CONSTANT_PROGRAM)
    out = folder / "constant-cuda"
    result = subprocess.run([sys.executable, "-m", "bendc", "compile", f"{folder / 'constant_program.py'}:step",
                             "--target", "cuda", "-o", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out


def launches(plan: dict) -> list[tuple[dict, dict]]:
    return [(step, launch) for step in plan["steps"] for launch in step["launches"]]


def plan_of(folder: Path) -> dict:
    return read_plan(str(folder), read_manifest(str(folder)))


def test_each_launch_records_the_cubins_one_entry_and_its_parameters(artifact: Path) -> None:
    plan = plan_of(artifact)
    assert len(launches(plan)) >= 20
    for step, launch in launches(plan):
        data = (artifact / launch["cubin"]).read_bytes()
        assert entry_symbols(data) == [launch["entry"]], step["name"]
        ptx = (artifact / "ptx" / f"{step['name']}.{launch['kernel']}.ptx").read_text()
        assert f".visible .entry {launch['entry']}(" in ptx
        from_elf = kernel_parameters(data, launch["entry"])
        assert from_elf == [tuple(p) for p in launch["parameters"]] == expected_parameters(launch), step["name"]
        # numba's layout: 7 words per flat array; inputs, outputs and the error words of a check
        arguments = step["inputs"] + step["outputs"] + (["err"] if step["check"] else [])
        assert [a["ndim"] for a in launch["arguments"]] == [1] * len(arguments)
        assert len(from_elf) == sum(array_words_count(1) for _ in arguments)
        assert [a["dtype"] for a in launch["arguments"][:len(step["inputs"]) + len(step["outputs"])]] == \
            [plan["values"][str(v)][0] for v in step["inputs"] + step["outputs"]]


def test_constants_are_in_the_plan(constant_artifact: Path) -> None:
    artifact = constant_artifact
    plan = plan_of(artifact)
    sources = [step for step in plan["steps"] if step["kind"] == "source"]
    assert sources
    for step in sources:
        module = (artifact / "kernels" / f"{step['module']}.py").read_text()
        line = next(line for line in module.splitlines() if line.startswith("VALUE = "))
        assert np.float32(step["value"]) == eval(line.split("=", 1)[1], {"np": np, "math": __import__("math")})


@pytest.mark.parametrize("windowed", [False, True])
def test_packed_words_point_at_each_values_memory(artifact: Path, windowed: bool) -> None:
    """Each argument's words point at its value's memory: a view at its root's, an input with a
    window (codegen/views.py StepReads: a slice of a packed output) at the window's first element,
    its length the window's (windowed: every kernel step's first input given one, as the renders of
    a group_norm_grad's weight gradient or a rope of one of several heads are)."""
    plan = plan_of(artifact)
    if windowed:
        for step in plan["steps"]:
            if step["launches"] and step["inputs"]:
                dims = plan["values"][str(step["inputs"][0])][1]
                step["windows"] = [[0, 1, numel(dims) - 1]] if numel(dims) > 1 else []
    allocations: list[tuple[int, int]] = []

    def allocate(nbytes: int) -> tuple[int, None]:
        base = 0x10000 + sum(-(-size // 256) * 256 for _, size in allocations)
        allocations.append((base, nbytes))
        return base, None

    static = StaticPlan(plan, allocate)
    views = {step["outputs"][0]: step["inputs"][0] for step in plan["steps"]
             if step["convention"] == "view" and step["inputs"]}

    def root(value: int) -> int:
        return root(views[value]) if value in views else value

    buffers = {int(v): b for v, b in plan["storage"].items()}
    checked_windows = 0
    for call in static.hoisted + static.calls:
        step = next(s for s in plan["steps"] if s["name"] == call.step)
        values = step["inputs"] + step["outputs"]
        words = [call.words[k:k + 7] for k in range(0, len(call.words), 7)]
        assert len(words) == len(values) + bool(step["check"])
        windows = {position: (first, cells) for position, first, cells in step.get("windows", ())}
        assert windowed or not windows  # the build itself windows nothing of this mlp
        checked_windows += len(windows)
        for position, (value, (meminfo, parent, count, itemsize, data, shape, stride)) in enumerate(zip(values, words)):
            dtype, dims = plan["values"][str(root(value))]  # a view passes its operand's flat array
            first, cells = windows.get(position, (0, numel(dims)))
            assert (meminfo, parent) == (0, 0)
            assert count == shape == cells and itemsize == stride == DTYPES[dtype].itemsize
            assert data == static.pointer[root(value)] + first * itemsize
            base, size = next((b, s) for b, s in allocations if b <= data < b + s)
            assert data + max(count * itemsize, 1) <= base + max(size, 8)
            if root(value) in buffers:  # a planned temporary: its buffer's memory
                assert size == max(plan["buffers"][buffers[root(value)]], 8)
        if step["check"]:
            assert words[-1][2:] == (2, 8, words[-1][4], 2, 8)
    assert [p for p, _, _ in static.inputs] == [static.pointer[p] for p in plan["params"]]
    assert len({p for p, _, _ in static.inputs}) == len(plan["params"])  # each input its own buffer
    assert (checked_windows > 5) == windowed


def rewrite_plan(folder: Path, change) -> None:
    """Change plan.json and reseal the manifest (as a mistaken build would have written it)."""
    plan = json.loads((folder / "plan.json").read_text())
    change(plan)
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["plan.json"] = file_hash(str(folder / "plan.json"))
    manifest["content_hash"] = content_hash(manifest)
    manifest["signature"] = trust.sign(manifest["content_hash"], trust.load_key())
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))


def test_a_cubin_that_disagrees_with_the_plan_is_refused_before_the_gpu(artifact: Path, tmp_path: Path) -> None:
    plan = plan_of(artifact)
    check_cubins(str(artifact), plan)  # the build's own records pass
    step, launch = next((s, l) for s, l in launches(plan) if s["check"])
    with pytest.raises(CubinMismatch, match="defines no kernel"):
        check_cubin(str(artifact), {**launch, "entry": launch["entry"].replace("kernel", "kernal")})
    with pytest.raises(CubinMismatch, match="has parameters 28"):
        check_cubin(str(artifact), {**launch, "arguments": launch["arguments"][:-1]})
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)

    def drop_error_words(plan: dict) -> None:
        for step in plan["steps"]:
            for launch in step["launches"]:
                if step["check"]:
                    launch["parameters"] = launch["parameters"][:-7]

    rewrite_plan(copy, drop_error_words)
    with pytest.raises(ArtifactInvalid, match="the plan records 21"):
        runtime.load(str(copy), cuda_runtime="graph")


def test_without_a_gpu_the_cubin_runtime_is_a_clear_error(artifact: Path) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is present")
    with pytest.raises(ArtifactInvalid, match=r"cubin runtime needs cuda.core and a usable NVIDIA GPU"):
        runtime.load(str(artifact), cuda_runtime="graph")
    with pytest.raises(ArtifactInvalid, match="expected one of auto, graph, eager, numba"):
        runtime.load(str(artifact), cuda_runtime="cubin")


def test_an_older_format_is_refused_saying_what_it_lacks(artifact: Path, tmp_path: Path) -> None:
    copy = tmp_path / "old"
    shutil.copytree(artifact, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format"] = 3
    manifest["content_hash"] = content_hash(manifest)
    manifest["signature"] = trust.sign(manifest["content_hash"], trust.load_key())
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactInvalid, match=r"format 3; this runtime reads format 7 \(it lacks the cuda launches' "
                                              r"entry symbols .*; a signature; the lifted constants "
                                              r"\(constants/\*\.npy\); the cuda steps' argument windows .*\): rebuild"):
        read_manifest(str(copy))


def test_the_cuda_benchmarks_stop_with_a_message_without_a_gpu() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is present")
    result = subprocess.run([sys.executable, "bench/run.py", "--target", "cuda", "--quick"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "bench/run.py --target cuda needs an NVIDIA GPU" in result.stderr


def test_the_cuda_core_names_the_gpu_path_calls_exist(artifact: Path) -> None:
    """The GPU-only code (CudaCoreDevice) cannot run here; what it calls must at least exist in the
    installed cuda.core and cuda.bindings, and what builds without a driver builds."""
    from cuda.bindings import driver
    from runtime.cuda_graph import cuda_core

    core = cuda_core()
    for owner, names in ((core, ("Device", "ObjectCode", "LaunchConfig", "StreamOptions", "Stream", "launch")),
                         (core.Device, ("set_current", "create_stream", "memory_resource", "compute_capability")),
                         (core.Stream, ("from_handle", "create_graph_builder", "sync", "handle", "record", "wait")),
                         (core.Event, ("is_done",)),
                         (core, ("LEGACY_DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM")),
                         (core.ObjectCode, ("from_cubin", "get_kernel")),
                         (core.Kernel, ("num_arguments", "arguments_info")),
                         (driver, ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync", "CUresult"))):
        assert [n for n in names if not hasattr(owner, n)] == [], owner
    from cuda.core.graph import Graph, GraphBuilder

    assert all(hasattr(GraphBuilder, n) for n in ("begin_building", "end_building", "complete"))
    assert all(hasattr(Graph, n) for n in ("upload", "launch"))
    core.LaunchConfig(grid=(4, 1, 1), block=(256, 1, 1), shmem_size=0)
    core.StreamOptions(nonblocking=True)
    _, launch = launches(plan_of(artifact))[0]
    core.ObjectCode.from_cubin((artifact / launch["cubin"]).read_bytes(), name=launch["cubin"])  # loads lazily


def test_a_plan_without_launch_records_is_refused(artifact: Path) -> None:
    plan = plan_of(artifact)
    _, launch = launches(plan)[0]
    del launch["entry"], launch["parameters"]
    with pytest.raises(CubinMismatch, match="records no entry, parameters .*not an ahead-of-time cuda build"):
        StaticPlan(plan, lambda nbytes: (0x1000, None))
    with pytest.raises(CubinMismatch, match="records no entry, parameters"):
        check_cubins(str(artifact), plan)


# ------------------------------------------------------------------ a failed capture (CudaCoreDevice.record)
class FakeBuilder:
    """cuda.core's GraphBuilder as record() drives it: capturing between begin and end_building."""

    def __init__(self, log: list) -> None:
        self.log, self.is_building = log, False

    def begin_building(self, mode: str) -> "FakeBuilder":
        self.is_building = True
        self.log.append("begin")
        return self

    def end_building(self) -> "FakeBuilder":
        self.is_building = False
        self.log.append("end")
        return self

    def complete(self):
        self.log.append("complete")
        return FakeGraph(self.log)

    def close(self) -> None:
        self.log.append("closed builder")


class FakeGraph:
    def __init__(self, log: list) -> None:
        self.log = log

    def upload(self, stream) -> None:
        if "fail upload" in self.log:
            raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY")

    def close(self) -> None:
        self.log.append("closed graph")


def capturing_device(log: list, failing_launch: int | None):
    """A CudaCoreDevice over fakes (no GPU): its record() is the real one."""
    from types import SimpleNamespace

    from runtime.cuda_graph import CudaCoreDevice

    launched = []

    def launch(stream, config, kernel, *words) -> None:
        if len(launched) == failing_launch:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")
        launched.append(kernel)

    device = CudaCoreDevice.__new__(CudaCoreDevice)
    device.core = SimpleNamespace(launch=launch)
    device.own_stream = device.stream = SimpleNamespace(create_graph_builder=lambda: FakeBuilder(log),
                                                        sync=lambda: None)
    return device


def fake_calls():
    from runtime.cuda_graph import Call

    return [Call(f"s{k}", {"kernel": f"k{k}"}, (0,), kernel=(f"kernel{k}", None)) for k in range(3)]


def test_a_failed_capture_ends_the_capture_discards_the_graph_and_names_the_kernel() -> None:
    from runtime.cuda_graph import CaptureError

    log: list = []
    with pytest.raises(CaptureError, match=r"capturing the CUDA graph failed at kernel s1\.k1: RuntimeError: "
                                           "CUDA_ERROR_INVALID_VALUE") as caught:
        capturing_device(log, failing_launch=1).record(fake_calls())
    assert caught.value.kernel == "kernel s1.k1"
    assert log == ["begin", "end", "closed builder"]  # the stream left capture mode; nothing kept
    log = ["fail upload"]
    with pytest.raises(CaptureError, match="failed at the graph's upload: RuntimeError: CUDA_ERROR_OUT_OF_MEMORY"):
        capturing_device(log, failing_launch=None).record(fake_calls())
    assert log[1:] == ["begin", "end", "complete", "closed graph", "closed builder"]
    log = []
    graph = capturing_device(log, failing_launch=None).record(fake_calls())
    assert isinstance(graph, FakeGraph) and log == ["begin", "end", "complete"]
