"""The cubin runtime on a real GPU (runtime/cuda_graph.py): artifacts built for this GPU's
architecture, run from their cubins through cuda.core as one CUDA graph, as eager launches and
through the numba JIT path, against the cpu build. Skipped without a usable GPU and cuda.core.

Bitwise where bendc promises it (+ - * / chains without fastmath: no FMA); the mlp step sums in
another order than the cpu (a fixed tree per block), so there a tolerance. Also: donated parameters resident in
their static buffers across steps (no copy when fed back, torch tensors over the same memory), and
bendc.jit(target="cuda") building this GPU's cubins and running them in the cubin runtime (numba's
JIT when BENDC_CUDA_RUNTIME=numba). tests/gpu/device_check.sh runs this.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bendc.compile import cuda_status

if cuda_status() != "gpu":
    pytest.skip("needs numba-cuda and a usable GPU", allow_module_level=True)

import runtime  # noqa: E402
from runtime.cli import random_inputs  # noqa: E402
from runtime.cuda_graph import CubinProgram, device_arch  # noqa: E402

ARCH = device_arch()
if ARCH is None:
    pytest.skip("cuda.core cannot see the GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
CHAIN = '''
def chain(x, w, b):
    return ((x * w + b) * x - b) / (w * w + 1.0), (x - w) * (b + 2.0)
'''


def compile_artifact(spec: str, target: str, folder: Path, shapes: str | None = None, *options: str) -> Path:
    command = [sys.executable, "-m", "bendc", "compile", spec, "--target", target, "-o", str(folder), *options]
    if target == "cuda":
        command += ["--arch", ARCH]
    if shapes:
        command += ["--shapes", shapes]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.fixture(scope="module")
def chain_artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chain")
    (folder / "chain.py").write_text(textwrap.dedent(CHAIN))
    shapes = "x=f32[1000,333] w=f32[1000,333] b=f32[333]"
    return {target: compile_artifact(f"{folder}/chain.py:chain", target, folder / target, shapes)
            for target in ("cpu", "cuda")}


@pytest.fixture(scope="module")
def mlp_artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlp")
    return {target: compile_artifact("tests/flat_mlp.py:train_step", target, folder / target) for target in ("cpu", "cuda")}


@pytest.mark.parametrize("mode", ["graph", "eager", "numba"])
def test_elementwise_chain_is_bitwise_the_cpu_build(chain_artifacts, mode: str) -> None:
    cpu = runtime.load(str(chain_artifacts["cpu"]))
    gpu = runtime.load(str(chain_artifacts["cuda"]), cuda_runtime=mode)
    if mode != "numba":
        assert isinstance(gpu._program, CubinProgram) and gpu._program.mode == mode
    inputs = random_inputs(cpu.manifest, 3)
    for got, want in zip(gpu.run_flat(list(inputs)), cpu.run_flat(list(inputs))):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["graph", "eager", "numba"])
def test_mlp_step_matches_the_cpu_build_for_several_steps(mlp_artifacts, mode: str) -> None:
    cpu = runtime.load(str(mlp_artifacts["cpu"]))
    gpu = runtime.load(str(mlp_artifacts["cuda"]), cuda_runtime=mode)
    inputs = random_inputs(cpu.manifest, 0)
    mine, theirs = list(inputs), list(inputs)
    for _ in range(3):
        got, want = gpu.run_flat(mine), cpu.run_flat(theirs)
        for index, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"out{index}")
        mine[2:], theirs[2:] = got[1:], want[1:]  # train_step returns the loss and the updated parameters


def test_graph_and_eager_launches_agree_and_static_outputs_are_reused(chain_artifacts) -> None:
    graph = runtime.load(str(chain_artifacts["cuda"]), cuda_runtime="graph", outputs="static")
    eager = runtime.load(str(chain_artifacts["cuda"]), cuda_runtime="eager")
    inputs = random_inputs(graph.manifest, 5)
    first = graph.run_device(*inputs)
    kept = first[0].copy_to_host()
    np.testing.assert_array_equal(kept, eager.run_device(*inputs)[0].copy_to_host())
    second = graph.run_device(*[a + 1 for a in inputs])
    assert first[0].pointer == second[0].pointer
    assert not np.array_equal(first[0].copy_to_host(), kept)  # overwritten by the next call


def test_torch_tensors_in_and_out_on_torchs_current_stream(chain_artifacts) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    program = runtime.load(str(chain_artifacts["cuda"]), cuda_runtime="graph")
    cpu = runtime.load(str(chain_artifacts["cpu"]))
    x = torch.randn(1000, 333, device="cuda")
    w = torch.randn(1000, 333, device="cuda", requires_grad=True)
    b = torch.randn(333, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x2 = x * 2  # queued on the side stream: bendc must run after it there, with no sync by us
        (out, other) = program.run_device(x2, w, b)
        assert program._program.device.stream_handle() in (side.cuda_stream, 1)
        result = torch.as_tensor(out, device="cuda") + 0  # reads bendc's output on the same stream
    torch.cuda.synchronize()
    want = cpu.run_flat([x2.cpu().numpy(), w.detach().cpu().numpy(), b.cpu().numpy()])
    np.testing.assert_array_equal(result.cpu().numpy(), want[0])
    np.testing.assert_array_equal(other.copy_to_host(), want[1])


def test_every_loaded_kernels_arguments_info_is_the_cubins_elf(mlp_artifacts) -> None:
    from runtime.cubin_elf import kernel_parameters

    program = runtime.load(str(mlp_artifacts["cuda"]), cuda_runtime="eager")._program
    calls = program.static.hoisted + program.static.calls
    assert calls
    for call in calls:
        kernel, _ = call.kernel
        data = (mlp_artifacts["cuda"] / call.launch["cubin"]).read_bytes()
        reported = [(int(i.offset), int(i.size)) if hasattr(i, "offset") else tuple(map(int, i))
                    for i in kernel.arguments_info]
        assert kernel.num_arguments == len(reported)
        assert reported == kernel_parameters(data, call.launch["entry"]), call.step


# ------------------------------------------------------------------ donated parameters, resident
sys.path.insert(0, str(ROOT / "tests" / "cuda"))
from momentum_program import DONATED, EXAMPLE_SHAPES, FEEDS, GRADIENTS, IN_PLACE, NORM, momentum  # noqa: E402

MOMENTUM = str(ROOT / "tests" / "cuda" / "momentum_program.py")
STEPS = 5


@pytest.fixture(scope="module")
def momentum_artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("momentum")
    return {target: compile_artifact(f"{MOMENTUM}:momentum", target, folder / target, EXAMPLE_SHAPES,
                                     "--donate", ",".join(DONATED)) for target in ("cpu", "cuda")}


def momentum_inputs(manifest: dict, step: int) -> dict[str, np.ndarray]:
    return {spec["name"]: array for spec, array in zip(manifest["inputs"], random_inputs(manifest, step))}


def momentum_steps(run, manifest: dict, to_host, state: dict | None = None) -> list[list[np.ndarray]]:
    """Each step's outputs as host arrays, the updates fed back as ``run`` returned them."""
    state = dict(state or momentum_inputs(manifest, 0))
    steps = []
    for step in range(STEPS):
        state.update({name: momentum_inputs(manifest, step)[name] for name in GRADIENTS})
        got = run([state[spec["name"]] for spec in manifest["inputs"]])
        steps.append([to_host(o) for o in got])
        state.update({name: got[index] for name, index in FEEDS.items()})
    return steps


def check_momentum(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> None:
    for step, (mine, theirs) in enumerate(zip(got, want)):
        for index, (a, b) in enumerate(zip(mine, theirs)):
            if index == NORM:  # a sum: its order differs on the GPU
                np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"step {step} out{index}")
            else:  # + - * only, no FMA: bit for bit
                np.testing.assert_array_equal(a, b, err_msg=f"step {step} out{index}")


def counted_copies(program: CubinProgram) -> list[int]:
    """The destination of every device-to-device copy the program's device makes from now on."""
    destinations: list[int] = []
    copy = program.device.copy

    def counting(destination: int, source: int, nbytes: int) -> None:
        destinations.append(destination)
        copy(destination, source, nbytes)

    program.device.copy = counting
    return destinations


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_donated_parameters_stay_resident_bit_for_bit(momentum_artifacts, mode: str) -> None:
    cpu = runtime.load(str(momentum_artifacts["cpu"]))
    gpu = runtime.load(str(momentum_artifacts["cuda"]), cuda_runtime=mode)
    program = gpu._program
    manifest = gpu.manifest
    names = [spec["name"] for spec in manifest["inputs"]]
    buffers = {program.static.inputs[names.index(name)][0] for name in IN_PLACE}
    copies = counted_copies(program)
    got = momentum_steps(program.run, manifest, lambda o: o.copy_to_host())
    want = momentum_steps(lambda inputs: [np.array(o) for o in cpu.run_flat([np.array(a) for a in inputs])],
                          manifest, np.asarray)
    check_momentum(got, want)
    assert not buffers & set(copies)  # fed back resident: never copied
    assert copies.count(program.static.inputs[names.index("c")][0]) == STEPS - 1  # c: not in place, copied


def test_resident_parameters_come_back_as_torch_tensors_over_the_same_buffers(momentum_artifacts) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    cpu = runtime.load(str(momentum_artifacts["cpu"]))
    gpu = runtime.load(str(momentum_artifacts["cuda"]), cuda_runtime="graph")
    program = gpu._program
    manifest = gpu.manifest
    names = [spec["name"] for spec in manifest["inputs"]]
    copies = counted_copies(program)
    start = {name: torch.from_numpy(a).cuda() for name, a in momentum_inputs(manifest, 0).items()}
    outputs = []

    def run(inputs):
        got = program.run([torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in inputs])
        if not outputs:
            copies.clear()  # the first call copies every input in
        outputs.append(got)
        return got

    got = momentum_steps(run, manifest, lambda o: o.cpu().numpy() if hasattr(o, "cpu") else o.copy_to_host(), start)
    want = momentum_steps(lambda inputs: [np.array(o) for o in cpu.run_flat([np.array(a) for a in inputs])],
                          manifest, np.asarray)
    check_momentum(got, want)
    for name in IN_PLACE:
        tensor = outputs[-1][FEEDS[name]]
        assert isinstance(tensor, torch.Tensor) and tensor.data_ptr() == program.static.inputs[names.index(name)][0]
    assert not {program.static.inputs[names.index(name)][0] for name in IN_PLACE} & set(copies)  # then never


# ------------------------------------------------------------------ bendc.jit(target="cuda") on cubins
def test_jit_cuda_builds_and_runs_cubins_for_this_gpu(momentum_artifacts, monkeypatch, tmp_path) -> None:
    import bendc
    from runtime.cuda import CudaProgram

    cpu = runtime.load(str(momentum_artifacts["cpu"]))
    want = momentum_steps(lambda inputs: [np.array(o) for o in cpu.run_flat([np.array(a) for a in inputs])],
                          cpu.manifest, np.asarray)
    monkeypatch.setenv("BENDC_CACHE_DIR", str(tmp_path))  # compiled now, for this GPU
    results = {}
    for choice in ("auto", "numba"):
        monkeypatch.setenv("BENDC_CUDA_RUNTIME", choice)
        step = bendc.jit(momentum.fn, target="cuda", donate=DONATED)
        results[choice] = momentum_steps(lambda inputs: step(*inputs), cpu.manifest, lambda o: o.copy_to_host())
        program = step._last.run.program
        if choice == "auto":
            assert isinstance(program, CubinProgram) and program.mode == "graph", step.report()
            assert f"cuda runtime: graph (cubins for {ARCH}: " in step.report()
        else:
            assert isinstance(program, CudaProgram)
        check_momentum(results[choice], want)
