"""`bendc compile --target cuda`: PTX and cubin per kernel without a GPU, in an artifact
the runtime verifies; running it needs a GPU (or, in its own process, the simulator)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX cannot be compiled in a simulator process", allow_module_level=True)

from runtime.artifact import read_manifest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def bendc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bendc", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("aot") / "mlp-cuda"
    result = bendc("compile", "tests/flat_mlp.py:train_step", "--target", "cuda", "--arch", "sm_90", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_every_launch_has_ptx_and_cubin(artifact: Path) -> None:
    manifest = read_manifest(str(artifact))  # every hash checked
    assert manifest["target"] == "cuda" and manifest["arch"] == "sm_90"
    plan = json.loads((artifact / "plan.json").read_text())
    launches = [(step, launch["kernel"]) for step in plan["steps"] for launch in step["launches"]]
    assert launches
    for step, kernel in launches:
        ptx = artifact / "ptx" / f"{step['name']}.{kernel}.ptx"
        cubin = artifact / "cubin" / f"{step['name']}.{kernel}.sm_90.cubin"
        assert ptx.is_file() and ".target sm_90" in ptx.read_text()
        if "math." not in step["source"]:  # libdevice's exp/log use fma inside; our own arithmetic must not
            assert "fma.rn.f32" not in ptx.read_text(), f"{step['name']}: contracted a*b+c"
        assert cubin.is_file() and cubin.read_bytes()[:4] == b"\x7fELF"
    report = (artifact / "report.txt").read_text()
    assert report.count("compiled: ") == len(launches)
    # each kernel's residency on sm_90 (bendc.codegen.ptx.occupancy): blocks per SM, occupancy, the binding limit
    resident = re.findall(r"^(?:\[cuda\] )?compiled: .*, (\d+) blocks of (\d+) threads per SM \((\d+)% occupancy, limited by "
                          r"(warps|registers|shared memory|blocks per SM)\); ", report, re.M)
    assert len(resident) == len(launches), report
    assert all(0 < int(blocks) <= 32 and 0 < int(percent) <= 100 for blocks, _, percent, _ in resident)
    assert " 0 bytes spill stores" in report


def test_running_a_cuda_artifact_without_a_gpu_is_a_clear_error(artifact: Path) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is present")
    result = bendc("run", str(artifact), "--random-inputs")
    assert result.returncode == 1
    assert "built for cuda" in result.stderr and "Traceback" not in result.stderr


def test_a_changed_cubin_is_refused(artifact: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    cubin = next((copy / "cubin").iterdir())
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 1
    cubin.write_bytes(bytes(data))
    result = bendc("run", str(copy), "--random-inputs")
    assert result.returncode == 1 and "changed" in result.stderr


TINY = "x=f32[4,8] y=i64[4] w1=f32[8,8]:leaf b1=f32[8]:leaf w2=f32[3,8]:leaf b2=f32[3]:leaf"


# make test-long (15 s): in make test the same cuda build of flat_mlp runs under the simulator against
# the cpu build's outputs in the device script's dry run (tests/gpu/test_carried.py, eager and graph),
# and `python -m runtime` on a cuda build in test_bendc_run_feeds_a_cuda_steps_device_outputs_back
# (tests/cuda/test_cubin_simulator.py).
@pytest.mark.long
def test_the_cuda_artifact_runs_under_the_simulator_like_the_cpu_build(tmp_path: Path) -> None:
    """Tiny shapes: the simulator costs ~170 us per simulated thread."""
    folders = {}
    for target in ("cpu", "cuda"):
        folders[target] = tmp_path / f"mlp-{target}"
        result = bendc("compile", "tests/flat_mlp.py:train_step", "--shapes", TINY, "--target", target,
                       "-o", str(folders[target]))
        assert result.returncode == 0, result.stderr
    outputs = {}
    for name, folder, extra in (("cpu", folders["cpu"], {}),
                                ("cuda", folders["cuda"], {"NUMBA_ENABLE_CUDASIM": "1"})):
        result = subprocess.run([sys.executable, "-m", "runtime", str(folder), "--random-inputs", "--outputs",
                                 str(tmp_path / f"{name}.npz")], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, **extra}, timeout=900)
        assert result.returncode == 0, result.stderr
        outputs[name] = np.load(tmp_path / f"{name}.npz")
    for key in outputs["cpu"].files:
        np.testing.assert_allclose(outputs["cuda"][key], outputs["cpu"][key], rtol=1e-5, atol=1e-6, err_msg=key)
