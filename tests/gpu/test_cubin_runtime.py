"""The cubin runtime on a real GPU (runtime/cuda_graph.py): artifacts built for this GPU's
architecture, run from their cubins through cuda.core as one CUDA graph, as eager launches and
through the numba JIT path, against the cpu build. Skipped without a usable GPU and cuda.core.

Bitwise where bendc promises it (+ - * / chains without fastmath: no FMA); the mlp step sums with
atomics on the GPU (the order varies), so there a tolerance. tests/gpu/device_check.sh runs this.
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


def compile_artifact(spec: str, target: str, folder: Path, shapes: str | None = None) -> Path:
    command = [sys.executable, "-m", "bendc", "compile", spec, "--target", target, "-o", str(folder)]
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
