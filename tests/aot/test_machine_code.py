"""Machine code in cpu artifacts, runtime.load and training loops over an artifact.

The transformer artifact is built once (its kernels compiled once, into a private cache), moved,
made read-only, and run by the runtime alone in fresh processes: no kernel is compiled (counted by
numba's dispatcher statistics, which `bendc run` prints), nothing is written into the folder, and
the outputs equal the jit's bit for bit.
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bendc
import runtime
from bendc import cli
from conftest import assert_bitwise
from runtime.artifact import FORMAT_VERSION, InputsInvalid, read_manifest
from runtime.cli import random_inputs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))

import flat_mlp as mlp  # noqa: E402
import transformer  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENDC_CACHE_DIR", str(folder))
        yield folder


def compile_example(example: str, out: Path, *extra: str) -> None:
    """Compile examples/EXAMPLE (or tests/flat_mlp.py, the flat-parameter mlp) for the cpu."""
    folder = ROOT / ("tests" if example == "flat_mlp.py" else "examples")
    assert cli.main(["compile", f"{folder / example}:train_step", "--target", "cpu",
                     "-o", str(out), *extra]) == 0


def make_read_only(folder: Path) -> None:
    for root, folders, files in os.walk(folder):
        for name in files + folders:
            path = os.path.join(root, name)
            os.chmod(path, os.stat(path).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    os.chmod(folder, os.stat(folder).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def make_writable(folder: Path) -> None:
    for root, folders, _ in os.walk(folder):
        os.chmod(root, os.stat(root).st_mode | stat.S_IWUSR)
        for name in os.listdir(root):
            path = os.path.join(root, name)
            os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)


def listing(folder: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime) for p in folder.rglob("*")}


def run_runtime(artifact: Path, *args: str, cache: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m runtime` (the runtime alone) in a fresh process, with its own bendc cache."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "BENDC_CACHE_DIR": str(cache), **(env or {})}
    result = subprocess.run([sys.executable, "-m", "runtime", str(artifact), *args], capture_output=True,
                            text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


def compiled_count(stdout: str) -> tuple[int, int]:
    match = re.search(r"kernels: (\d+) functions compiled, (\d+) loaded as machine code", stdout)
    assert match, stdout
    return int(match[1]), int(match[2])


@pytest.fixture(scope="module")
def transformer_artifact(tmp_path_factory, cache_dir):
    """The transformer's artifact, built in one folder and moved to another (the machine code must
    not depend on where it was built), then made read-only."""
    base = tmp_path_factory.mktemp("tr")
    compile_example("transformer.py", base / "built")
    os.rename(base / "built", base / "moved")
    make_read_only(base / "moved")
    yield base / "moved"
    make_writable(base / "moved")


def test_read_only_transformer_runs_twice_without_compiling(transformer_artifact, tmp_path, cache_dir) -> None:
    manifest = read_manifest(str(transformer_artifact))
    assert manifest["format"] == FORMAT_VERSION and manifest["machine"]["cpu"]  # machine code since format 3
    assert any(name.startswith("numba/") and name.endswith((".nbc", ".native.o")) for name in manifest["files"])
    inputs = random_inputs(manifest, 3)
    names = [spec["name"] for spec in manifest["inputs"]]
    np.savez(tmp_path / "in.npz", **dict(zip(names, inputs)))
    before = listing(transformer_artifact)
    for attempt in range(2):
        out = tmp_path / f"out{attempt}.npz"
        result = run_runtime(transformer_artifact, "--inputs", str(tmp_path / "in.npz"), "--outputs", str(out),
                             cache=tmp_path / "run-cache")
        compiled, loaded = compiled_count(result.stdout)
        assert compiled == 0 and loaded > 0, result.stdout
        assert "note:" not in result.stderr
    assert listing(transformer_artifact) == before  # nothing written, no __pycache__
    assert not list(transformer_artifact.rglob("__pycache__"))

    step = bendc.jit(transformer.train_step.fn, leaves=("params",), dynamic=("lr",), target="cpu",
                     cache_dir=str(cache_dir))
    arguments = runtime.load(str(transformer_artifact)).parameters  # the inputs by parameter, as traced
    flat = dict(zip(names, inputs))
    rebuilt = {name: _rebuild(tree, flat) for name, tree in arguments.items()}
    want = bendc.tree.leaves(step(**rebuilt))
    for attempt in range(2):
        with np.load(tmp_path / f"out{attempt}.npz") as got:
            for index, expected in enumerate(want):
                assert_bitwise(got[f"out{index}"], expected, f"run {attempt} out{index}")


def _rebuild(tree: dict, flat: dict):
    """A parameter's value from the manifest's structure and the flat inputs by name."""
    if tree["kind"] == "input":
        return flat[tree["value"]]
    if tree["kind"] == "static":
        return tree["value"]
    if tree["kind"] == "dict":
        return {key: _rebuild(item, flat) for key, item in tree["items"].items()}
    return [_rebuild(item, flat) for item in tree["items"]]


@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("mlp") / "mlp"
    compile_example("flat_mlp.py", out, "--donate", "w1,b1,w2,b2")
    make_read_only(out)
    yield out
    make_writable(out)


def test_another_cpu_compiles_outside_the_artifact(mlp_artifact, tmp_path) -> None:
    """NUMBA_CPU_NAME makes numba compile for another CPU than the one recorded."""
    before = listing(mlp_artifact)
    first = run_runtime(mlp_artifact, "--random-inputs", cache=tmp_path / "c", env={"NUMBA_CPU_NAME": "generic"})
    assert "holds machine code for" in first.stderr and "generic" in first.stderr
    assert compiled_count(first.stdout)[0] > 0
    second = run_runtime(mlp_artifact, "--random-inputs", cache=tmp_path / "c", env={"NUMBA_CPU_NAME": "generic"})
    assert compiled_count(second.stdout)[0] == 0  # the outside cache serves the second run
    assert any((tmp_path / "c" / "aot").rglob("*.native.o")) or any((tmp_path / "c" / "aot").rglob("*.nbc"))
    assert listing(mlp_artifact) == before


def mlp_inputs() -> list[np.ndarray]:
    x, y = mlp.make_data(mlp.BATCH)
    return [x, y, *mlp.init_params()]


def test_runtime_load_calls_like_the_function(mlp_artifact, cache_dir) -> None:
    program = runtime.load(str(mlp_artifact))
    x, y, w1, b1, w2, b2 = mlp_inputs()
    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(cache_dir))
    want = step(x, y, w1.copy(), b1.copy(), w2.copy(), b2.copy())
    got = program(x, y, w1.copy(), b1.copy(), w2.copy(), b2.copy())
    assert isinstance(got, tuple) and len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want)):
        assert_bitwise(a, b, f"out{index}")
    named = program(x, y, w1=w1.copy(), b1=b1.copy(), w2=w2.copy(), b2=b2.copy(), lr=0.1)
    assert_bitwise(named[0], want[0], "loss")
    assert program.compile_counts()["compiled"] == 0
    with pytest.raises(InputsInvalid, match="missing input b2"):
        program(x, y, w1, b1, w2)
    with pytest.raises(InputsInvalid, match="given twice"):
        program(x, y, w1, b1, w2, b2, x=x)
    with pytest.raises(InputsInvalid, match="lr was fixed to 0.1"):
        program(x, y, w1, b1, w2, b2, lr=0.5)
    with pytest.raises(InputsInvalid, match="unknown input 'z'"):
        program(x, y, w1, b1, w2, b2, z=x)


def test_feed_outputs_loop_equals_the_jit_loop(mlp_artifact, tmp_path, cache_dir) -> None:
    program = runtime.load(str(mlp_artifact))
    assert program.feeds == {"w1": 1, "b1": 2, "w2": 3, "b2": 4}
    x, y, *params = mlp_inputs()
    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(cache_dir))
    current = [p.copy() for p in params]
    for _ in range(3):
        loss, *current = step(x, y, *current)
    got = program.loop(3, x, y, *[p.copy() for p in params])
    assert_bitwise(got[0], loss, "loss")
    for index, expected in enumerate(current, start=1):
        assert_bitwise(got[index], expected, f"out{index}")

    np.savez(tmp_path / "in.npz", **dict(zip(["x", "y", "w1", "b1", "w2", "b2"], [x, y, *params])))
    result = run_runtime(mlp_artifact, "--inputs", str(tmp_path / "in.npz"), "--steps", "3", "--feed-outputs",
                         "--outputs", str(tmp_path / "out.npz"), cache=tmp_path / "c")
    assert len(re.findall(r"^step \d+: out0", result.stdout, re.M)) == 3 and "fed 4 outputs back each step" in result.stdout
    with np.load(tmp_path / "out.npz") as written:
        assert_bitwise(written["out0"], loss, "loss")
        assert_bitwise(written["out1"], current[0], "w1")
    explicit = run_runtime(mlp_artifact, "--inputs", str(tmp_path / "in.npz"), "--steps", "2", "--feed-outputs",
                           "out1=w1", cache=tmp_path / "c")
    assert "fed 1 outputs back" in explicit.stdout


def test_feed_outputs_are_checked(mlp_artifact, capsys) -> None:
    assert cli.main(["run", str(mlp_artifact), "--random-inputs", "--steps", "2", "--feed-outputs", "out2=x"]) == 1
    assert "out2 is f32[128] but x is f32[64,64]" in capsys.readouterr().err
    assert cli.main(["run", str(mlp_artifact), "--random-inputs", "--feed-outputs", "w1"]) == 1
    assert "write OUT=INPUT" in capsys.readouterr().err


def test_compile_and_run_options_are_checked(mlp_artifact, tmp_path, capsys) -> None:
    assert cli.main(["compile", f"{ROOT / 'tests' / 'flat_mlp.py'}:train_step", "--target", "cpu",
                     "-o", str(tmp_path / "x"), "--donate", "w9"]) == 1
    assert "--donate w9" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert cli.main(["run", str(mlp_artifact), "--random-inputs", "--steps", "0"]) == 1
    assert "--steps must be at least 1" in capsys.readouterr().err


def test_an_artifact_without_feeds_says_how_to_name_them(tmp_path, cache_dir, capsys) -> None:
    out = tmp_path / "plain"
    compile_example("flat_mlp.py", out)
    assert "  feeds " not in capsys.readouterr().out  # nothing donated: no feeds recorded
    assert cli.main(["run", str(out), "--random-inputs", "--steps", "2", "--feed-outputs"]) == 1
    assert "records no feeds" in capsys.readouterr().err
    program = runtime.load(str(out))
    with pytest.raises(InputsInvalid, match="records no outputs to feed back"):
        program.loop(2, *mlp_inputs())
    final = program.loop(2, *mlp_inputs(), feeds={"w1": 1})
    assert len(final) == 5
