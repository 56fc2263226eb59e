"""Ahead-of-time builds: `bendc compile` -> artifact folder -> `bendc run` with the runtime alone.

One mlp artifact is compiled per module and copied where a test changes it;
tests that damage an artifact fail before any kernel runs, so they are fast.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import bendc
import bendc.artifact
import bendc.codegen.cpu
from bendc import cli
from bendc.ir.parser import parse_graph
from conftest import assert_bitwise
from runtime import cli as runtime_cli
from runtime import trust
from runtime.artifact import (FORMAT_VERSION, ArtifactInvalid, InputsInvalid, check_inputs, content_hash,
                              read_manifest)

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "tests" / "flat_mlp.py")  # the mlp with one parameter per array (examples/mlp.py takes pytrees)
sys.path.insert(0, str(ROOT / "tests"))

import flat_mlp as mlp  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    """Kernels that the compiler writes go to a private cache, not the user's."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENDC_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, cache_dir):
    """(artifact folder, stdout, stderr) of `bendc compile tests/flat_mlp.py:train_step --target cpu`.

    The artifact then runs once (it holds its kernels' machine code under numba/, which copies keep,
    so the other tests compile nothing).
    """
    out = tmp_path_factory.mktemp("build") / "mlp"
    with pytest.MonkeyPatch.context() as patch:
        stdout, stderr = _capture(patch, lambda: cli.main(["compile", f"{MLP}:train_step", "--target", "cpu",
                                                           "-o", str(out)]))
        _capture(patch, lambda: run(str(out), "--random-inputs"))
    return out, stdout, stderr


def _capture(patch: pytest.MonkeyPatch, call) -> tuple[str, str]:
    """Run ``call`` (which must return 0) with stdout and stderr captured."""
    stdout, stderr = io.StringIO(), io.StringIO()
    patch.setattr(sys, "stdout", stdout)
    patch.setattr(sys, "stderr", stderr)
    assert call() == 0, stderr.getvalue()
    return stdout.getvalue(), stderr.getvalue()


@pytest.fixture
def artifact(compiled, tmp_path) -> Path:
    """A private copy of the compiled artifact that a test may damage."""
    copy = tmp_path / "mlp"
    shutil.copytree(compiled[0], copy)
    return copy


def mlp_inputs() -> dict[str, np.ndarray]:
    x, y = mlp.make_data(mlp.BATCH)
    w1, b1, w2, b2 = mlp.init_params()
    return {"x": x, "y": y, "w1": w1, "b1": b1, "w2": w2, "b2": b2}


def run(*args: str) -> int:
    """`bendc run ...` through the console script's entry point, in this process."""
    return cli.main(["run", *args])


def error_line(capsys) -> str:
    """The one line a failed command printed (and nothing else)."""
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bendc: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


# ------------------------------------------------------------------ compile
def test_compile_writes_every_part(compiled) -> None:
    out, stdout, stderr = compiled
    manifest = read_manifest(str(out))
    plan = json.loads((out / "plan.json").read_text())
    assert manifest["format"] == FORMAT_VERSION and manifest["target"] == "cpu"
    assert manifest["function"] == "train_step" and manifest["static"] == {"lr": 0.1}
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    expected = {"manifest.json", "plan.json", "report.txt", "tape.txt"}
    expected |= {f"kernels/{step['module']}.py" for step in plan["steps"]}
    expected |= {f"ir/{index:02d}-{stage}.ir" for index, stage in enumerate(manifest["stages"])}
    machine_code = {name for name in names if name.startswith("numba/")}  # numba's cache files per kernel
    assert machine_code <= set(manifest["files"]) and manifest["machine"]["cpu"]
    # native object files (runtime/native), or numba's index and data files for what numba compiled
    assert any(name.endswith(".native.o") for name in machine_code) or \
        (any(name.endswith(".nbi") for name in machine_code) and any(name.endswith(".nbc") for name in machine_code))
    assert names == expected | machine_code
    assert manifest["stages"][0] == "traced" and manifest["stages"][-1] == "final"
    # y feeds cross_entropy's gather over 10 classes: class indices must stay below 10.
    bounds = {spec["name"]: spec.get("index_bound") for spec in manifest["inputs"]}
    assert bounds == {"x": None, "y": mlp.CLASSES, "w1": None, "b1": None, "w2": None, "b2": None}
    count = len(plan["steps"])
    assert count and stderr == ""  # no progress lines when stderr is not a terminal
    assert re.search(r"compile  \d+ of the kernels' \d+ functions compiled now", stdout), stdout
    assert f"compiled train_step for cpu into {out}" in stdout and "y=i64[64] (indices < 10)" in stdout
    assert f"bendc run {out} --random-inputs" in stdout


def test_compile_ir_files_equal_the_stages_of_bendc_ir(compiled, capsys) -> None:
    out = compiled[0]
    manifest = read_manifest(str(out))
    for index, stage in enumerate(manifest["stages"]):
        assert cli.main(["ir", f"{MLP}:train_step", "--stage", stage]) == 0
        printed = capsys.readouterr().out
        assert (out / "ir" / f"{index:02d}-{stage}.ir").read_text() == printed, stage


def test_arch_applies_to_cuda_only(tmp_path, capsys) -> None:
    out = tmp_path / "gpu"
    assert cli.main(["compile", f"{MLP}:train_step", "--target", "cpu", "--arch", "sm_90", "-o", str(out)]) == 1
    assert error_line(capsys) == "bendc: error: --arch applies to --target cuda only (got --target cpu)"
    assert not out.exists()


def test_interrupted_compile_leaves_nothing(tmp_path, monkeypatch) -> None:
    render = bendc.codegen.cpu.render_step
    calls = []

    def failing_render(step, *rest):
        calls.append(step.name)
        if len(calls) == 3:
            raise KeyboardInterrupt("interrupted while rendering the third kernel")
        return render(step, *rest)

    monkeypatch.setattr(bendc.codegen.cpu, "render_step", failing_render)
    out = tmp_path / "build" / "mlp"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["compile", f"{MLP}:train_step", "--target", "cpu", "-o", str(out)])
    assert len(calls) == 3
    assert not out.exists()
    assert not (tmp_path / "build").exists() or not list((tmp_path / "build").iterdir())


def test_failure_while_writing_keeps_the_old_artifact(artifact, monkeypatch, capsys) -> None:
    before = read_manifest(str(artifact))
    real_hash = bendc.artifact.file_hash
    hashed = []

    def failing_hash(path):
        hashed.append(path)
        if len(hashed) == 5:
            raise OSError(28, "No space left on device")
        return real_hash(path)

    monkeypatch.setattr(bendc.artifact, "file_hash", failing_hash)
    assert cli.main(["compile", f"{MLP}:train_step", "--target", "cpu", "-o", str(artifact),
                     "--static", "lr=0.5"]) == 1
    errors = capsys.readouterr().err.splitlines()  # kernel progress lines, then the error
    assert errors[-1] == f"bendc: error: compile: cannot write {artifact}: No space left on device"
    assert read_manifest(str(artifact)) == before  # the old artifact, whole and unchanged
    assert sorted(p.name for p in artifact.parent.iterdir()) == ["mlp"]  # no temporary folder left


def test_compile_replaces_an_artifact_but_nothing_else(artifact, tmp_path, capsys) -> None:
    assert cli.main(["compile", f"{MLP}:train_step", "--target", "cpu", "-o", str(artifact),
                     "--static", "lr=0.5"]) == 0
    assert read_manifest(str(artifact))["static"] == {"lr": 0.5}
    capsys.readouterr()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    assert cli.main(["compile", f"{MLP}:train_step", "--target", "cpu", "-o", str(precious)]) == 1
    assert "is not a bendc artifact; refusing to replace it" in error_line(capsys)
    assert (precious / "notes.txt").read_text() == "keep me"


PICK = """
import bendc.functional as F

EXAMPLE_SHAPES = "x=f32[2,5] table=f32[7,3]:leaf i=i64[4] unused=i32[3]"


def pick(x, table, i, unused):
    rows = F.index_select(table, 0, i)          # i < 7
    picked = F.gather(x, 1, i.reshape(2, 2))    # i < 5, through a reshape
    (rows.sum() + picked.sum()).backward()
    return rows, {"picked": picked, "grad": table.grad}, None
"""


def test_index_bounds_follow_views_and_take_the_smallest(tmp_path, capsys) -> None:
    (tmp_path / "pick.py").write_text(PICK)
    out = tmp_path / "out"
    assert cli.main(["compile", f"{tmp_path / 'pick.py'}:pick", "--target", "cpu", "-o", str(out)]) == 0
    manifest = read_manifest(str(out))
    bounds = {spec["name"]: spec.get("index_bound") for spec in manifest["inputs"]}
    assert bounds == {"x": None, "table": None, "i": 5, "unused": None}
    _, i, unused = runtime_cli.random_inputs(manifest, 0)[1:]
    assert i.max() < 5 and unused.dtype == np.int32 and unused.max() < runtime_cli.UNBOUNDED_INTEGERS
    capsys.readouterr()
    assert run(str(out), "--random-inputs") == 0
    assert "returns (out0, {'picked': out1, 'grad': out2}, None)" in capsys.readouterr().out


# ------------------------------------------------------------------ run
def test_round_trip_equals_jit_bit_for_bit(artifact, tmp_path, capsys) -> None:
    inputs = mlp_inputs()
    np.savez(tmp_path / "in.npz", **inputs)
    assert run(str(artifact), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz")) == 0
    summary = capsys.readouterr().out
    assert "returns (out0, out1, out2, out3, out4)" in summary
    assert "out0" in summary and "f32[128,64]" in summary and f"to {tmp_path / 'out.npz'}" in summary

    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path / "cache"))
    want = step(*inputs.values())
    with np.load(tmp_path / "out.npz") as got:
        assert sorted(got.files) == [f"out{index}" for index in range(len(want))]
        for index, expected in enumerate(want):
            assert_bitwise(got[f"out{index}"], expected, f"out{index}")


def test_random_inputs_are_valid_class_indices(artifact, capsys) -> None:
    manifest = read_manifest(str(artifact))
    for seed in range(3):
        x, y, *params = runtime_cli.random_inputs(manifest, seed)
        assert y.dtype == np.int64 and y.shape == (mlp.BATCH,)
        assert 0 <= y.min() and y.max() < mlp.CLASSES
        assert x.dtype == np.float32 and x.shape == (mlp.BATCH, mlp.FEATURES)
    assert run(str(artifact), "--random-inputs", "--seed", "5") == 0
    summary = capsys.readouterr().out
    assert "inputs random (seed 5)" in summary
    loss = float(summary.split("out0", 1)[1].split("value", 1)[1].split()[0])
    assert np.isfinite(loss)


def test_runtime_runs_with_the_compiler_blocked(artifact, tmp_path) -> None:
    """The console script's `bendc run` with the compiler (every bendc module but the front door:
    the package, bendc.cli, bendc.errors, bendc.version), networkx and torch unimportable, and
    `python -m runtime` with all of bendc unimportable."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    wrapper = tmp_path / "blocked.py"
    wrapper.write_text(BLOCKED_RUNNER)
    np.savez(tmp_path / "in.npz", **mlp_inputs())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    commands = [
        (FRONT_DOOR, [scripts["bendc"], "run", str(artifact), "--inputs", str(tmp_path / "in.npz"),
                      "--outputs", str(tmp_path / "out.npz")]),
        ("", ["runtime.__main__:", str(artifact), "--random-inputs"]),
        (FRONT_DOOR, [scripts["bendc"], "run", str(tmp_path), "--random-inputs"]),  # a user error, still one line
    ]
    results = [subprocess.run([sys.executable, str(wrapper), allowed, *command], capture_output=True, text=True,
                              env=env, cwd=tmp_path) for allowed, command in commands]
    assert results[0].returncode == 0, results[0].stderr
    assert "returns (out0, out1, out2, out3, out4)" in results[0].stdout
    assert (tmp_path / "out.npz").is_file()
    assert results[1].returncode == 0, results[1].stderr
    assert results[2].returncode == 1 and results[2].stderr.strip() == \
        f"bendc: error: {tmp_path} is not a bendc artifact (no manifest.json)"
    for result in results:
        assert "blocker: ok" in result.stdout, result.stdout + result.stderr


# The modules of bendc that the console script's `bendc run` may load: its front door (the parser and
# dispatch), never the compiler.
FRONT_DOOR = "bendc,bendc.cli,bendc.errors,bendc.version"

# Imports `entry` ("module:function", or "module:" to run the module) with bendc (but the allowed
# modules, comma-separated), networkx and torch unimportable, runs it as a console script would (argv
# in sys.argv), and checks that nothing blocked was imported by another route.
BLOCKED_RUNNER = '''
import importlib
import importlib.abc
import runpy
import sys

BLOCKED = ("bendc", "networkx", "torch")
ALLOWED = set(filter(None, sys.argv[1].split(",")))


def blocked(name):
    return name.split(".")[0] in BLOCKED and name not in ALLOWED


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ImportError(f"{name} is blocked: the runtime must run without it")
        return None


sys.meta_path.insert(0, Blocker())
entry, arguments = sys.argv[2], sys.argv[3:]
module, _, function = entry.partition(":")
sys.argv = ["bendc", *arguments]
try:
    if function:
        code = getattr(importlib.import_module(module), function)()
    else:
        runpy.run_module(module, run_name="__main__")
        code = 0
except SystemExit as exit:
    code = exit.code
loaded = sorted(name for name in sys.modules if blocked(name))
try:
    import networkx
except ImportError:
    print("blocker: ok" if not loaded else f"blocker: loaded {loaded}")
sys.stdout.flush()
sys.exit(code)
'''


# ------------------------------------------------------------------ refusing damaged artifacts
def change_byte(path: Path, offset: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[offset] = ord("#") if data[offset] != ord("#") else ord("!")
    path.write_bytes(bytes(data))


def first_kernel(folder: Path) -> Path:
    return sorted((folder / "kernels").glob("*.py"))[0]


def edit_manifest(folder: Path, change, sign: bool = True) -> None:
    """Change the manifest; ``sign``: recompute its content hash and signature (with the test run's
    key), as a genuine writer would."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    if sign:
        manifest["content_hash"] = content_hash(manifest)
        manifest["signature"] = trust.sign(manifest["content_hash"], trust.load_key())
    path.write_text(json.dumps(manifest, indent=1))


def setting(path: tuple, value) -> Callable[[dict], None]:
    """A manifest change: manifest[path[0]][path[1]]... = value."""
    def change(manifest: dict) -> None:
        holder = manifest
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value

    return change


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def add_listed_kernel(folder: Path) -> None:
    """A kernel module that the (re-signed) manifest lists but the plan does not run."""
    path = folder / "kernels" / "k_extra.py"
    path.write_text("def kernel():\n    pass\n")
    edit_manifest(folder, setting(("files", "kernels/k_extra.py"), hashlib.sha256(path.read_bytes()).hexdigest()))


def drop_content_hash(manifest: dict) -> None:
    del manifest["content_hash"]


# name -> (damage done to an artifact folder, what the error says)
DAMAGE = {
    "kernel byte": (lambda a: change_byte(first_kernel(a)), "was changed since it was built"),
    "plan byte": (lambda a: change_byte(a / "plan.json", 20), "plan.json was changed since it was built"),
    "deleted file": (lambda a: (a / "report.txt").unlink(), "report.txt is missing (truncated artifact)"),
    "deleted kernel": (lambda a: first_kernel(a).unlink(), "is missing (truncated artifact)"),
    "truncated file": (lambda a: truncate(first_kernel(a)), "was changed since it was built"),
    "truncated manifest": (lambda a: truncate(a / "manifest.json"), "manifest.json is not readable JSON"),
    "format version": (lambda a: edit_manifest(a, setting(("format",), 1), sign=False),
                       f"has artifact format 1; this runtime reads format {FORMAT_VERSION}"),
    "edited manifest": (lambda a: edit_manifest(a, setting(("inputs", 0, "shape"), [64, 65]), sign=False),
                        "manifest.json was changed since it was built"),
    "unsigned manifest": (lambda a: edit_manifest(a, drop_content_hash, sign=False),
                          "manifest.json lacks content_hash"),
    "foreign folder": (lambda a: (a / "manifest.json").unlink(), "is not a bendc artifact (no manifest.json)"),
    "another kind": (lambda a: edit_manifest(a, setting(("kind",), "web-app")),
                     "is not a bendc artifact (manifest.json is of another kind)"),
    "unknown file": (lambda a: (a / "kernels" / "notes.txt").write_text("hello"),
                     "kernels/notes.txt is not in the manifest (foreign file)"),
    "extra kernel": (add_listed_kernel, "kernels/k_extra.py is not a kernel of plan.json"),
    "file outside": (lambda a: edit_manifest(a, setting(("files", "../x"), "0")),
                     "lists a file outside the artifact"),
    "wrong target": (lambda a: edit_manifest(a, setting(("target",), "tpu")),
                     "was built for target 'tpu'; this runtime runs cpu"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_or_foreign_artifact_is_refused(artifact, capsys, damage) -> None:
    change, message = DAMAGE[damage]
    change(artifact)
    assert run(str(artifact), "--random-inputs") == 1
    assert message in error_line(capsys)
    with pytest.raises(ArtifactInvalid, match="artifact|changed|manifest|target|kernel"):
        cli.main(["--verbose", "run", str(artifact), "--random-inputs"])


def test_a_missing_artifact_folder_is_refused(tmp_path, capsys) -> None:
    assert run(str(tmp_path / "nothing"), "--random-inputs") == 1
    assert "nothing is not a bendc artifact (no such folder)" in error_line(capsys)


# ------------------------------------------------------------------ refusing wrong inputs
def saved(tmp_path: Path, **changes) -> str:
    inputs = {**mlp_inputs(), **changes}
    path = tmp_path / "in.npz"
    np.savez(path, **{name: value for name, value in inputs.items() if value is not None})
    return str(path)


WRONG_INPUTS = {
    "shape": ({"x": np.zeros((64, 65), np.float32)}, "input 'x' must be f32[64,64], got float32[64, 65]"),
    "dtype": ({"x": np.zeros((64, 64), np.float64)}, "input 'x' must be f32[64,64], got float64[64, 64]"),
    "index dtype": ({"y": np.zeros(64, np.int32)}, "input 'y' must be i64[64], got int32[64]"),
    "missing": ({"y": None, "b2": None}, "missing inputs y, b2; the artifact takes x, y, w1, b1, w2, b2"),
    "extra": ({"z": np.zeros(3, np.float32)}, "unknown input z; the artifact takes x, y, w1, b1, w2, b2"),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_INPUTS))
def test_wrong_inputs_are_refused(artifact, tmp_path, capsys, wrong) -> None:
    changes, message = WRONG_INPUTS[wrong]
    assert run(str(artifact), "--inputs", saved(tmp_path, **changes)) == 1
    assert error_line(capsys) == f"bendc: error: {message}"


def test_wrong_input_count_is_refused(compiled) -> None:
    manifest = read_manifest(str(compiled[0]))
    with pytest.raises(InputsInvalid, match=r"expected 6 inputs \(x, y, w1, b1, w2, b2\), got 5"):
        check_inputs(manifest, list(mlp_inputs().values())[:5])


def test_an_index_out_of_range_names_the_line(artifact, tmp_path, capsys) -> None:
    labels = np.zeros(mlp.BATCH, np.int64)
    labels[3] = mlp.CLASSES
    assert run(str(artifact), "--inputs", saved(tmp_path, y=labels)) == 1
    line = error_line(capsys)
    assert "mlp.py:" in line and "index 10 is out of range for a dimension of size 10" in line


def test_unreadable_input_files_are_refused(artifact, tmp_path, capsys) -> None:
    assert run(str(artifact), "--inputs", str(tmp_path / "absent.npz")) == 1
    assert "no such file" in error_line(capsys)
    np.save(tmp_path / "one.npy", np.zeros(3))
    assert run(str(artifact), "--inputs", str(tmp_path / "one.npy")) == 1
    assert "holds one array" in error_line(capsys)
    (tmp_path / "junk.npz").write_text("not a zip")
    assert run(str(artifact), "--inputs", str(tmp_path / "junk.npz")) == 1
    assert "cannot read" in error_line(capsys)


# ------------------------------------------------------------------ the command line
def exit_code(argv: list[str]) -> int:
    """The exit code of the ``bendc`` command, whether main returns it or argparse exits."""
    try:
        return cli.main(argv)
    except SystemExit as exit:
        return exit.code


# command -> words its --help must show
HELP_WORDS = {
    "": ["compile", "run", "ir", "report", "--verbose"],
    "compile": ["--target", "--shapes", "--static", "-o OUT", "--arch", "--donate"],
    "run": ["--inputs", "--random-inputs", "--seed", "--outputs", "--steps", "--feed-outputs"],
    "ir": ["--stage", "--dot", "--shapes"],
    "report": ["--shapes"],
    "profile": ["--shapes", "--runs", "--chrome"],
    "cache": ["list", "clear", "--dir"],
}


@pytest.mark.parametrize("command", sorted(HELP_WORDS))
def test_every_command_has_help(command, capsys) -> None:
    argv = [command, "--help"] if command else ["--help"]
    assert exit_code(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: bendc {command}".rstrip())
    for word in HELP_WORDS[command]:
        assert word in text, (command, word)


@pytest.mark.parametrize("argv, message", [
    (["compile", f"{MLP}:train_step", "-o", "x"], "the following arguments are required: --target"),
    (["compile", f"{MLP}:train_step", "--target", "tpu", "-o", "x"], "invalid choice: 'tpu'"),
    (["compile", f"{MLP}:train_step", "--target", "cpu", "--arch", "sm_90", "-o", "x"],
     "--arch applies to --target cuda only"),
    (["compile", f"{MLP}:train_step", "--target", "cpu", "-o", "x", "--static", "lr=fast"],
     "the value must be a Python int, float or bool"),
    (["compile", f"{MLP}:train_step", "--target", "cpu", "-o", "x", "--static", "momentum=0.9"],
     "has no parameter 'momentum'"),
    (["compile", f"{MLP}:nothing", "--target", "cpu", "-o", "x"], "has no function 'nothing'"),
    (["run", "x"], "one of the arguments --inputs --random-inputs is required"),
    (["run", "x", "--inputs", "a.npz", "--seed", "3"], "--seed applies to --random-inputs only"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_user_errors_exit_1_with_one_line(argv, message, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert exit_code(argv) == 1
    assert message in error_line(capsys)
    assert not (tmp_path / "x").exists()


def test_verbose_shows_the_traceback(tmp_path) -> None:
    with pytest.raises(bendc.UnsupportedError, match="--arch applies to --target cuda only"):
        cli.main(["--verbose", "compile", f"{MLP}:train_step", "--target", "cpu", "--arch", "sm_90",
                          "-o", str(tmp_path)])
    with pytest.raises(ArtifactInvalid):
        cli.main(["run", str(tmp_path), "--random-inputs", "--verbose"])


def test_python_m_bendc_run(compiled) -> None:
    result = subprocess.run([sys.executable, "-m", "bendc", "run", str(compiled[0]), "--random-inputs"],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert "returns (out0, out1, out2, out3, out4)" in result.stdout


def test_ir_writes_the_graph_in_dot(tmp_path, capsys) -> None:
    dot = tmp_path / "mlp.dot"
    assert cli.main(["ir", f"{MLP}:train_step", "--dot", str(dot)]) == 0
    final = capsys.readouterr().out
    graph = parse_graph(final)
    text = dot.read_text()
    assert text.startswith('digraph "train_step" {') and text.rstrip().endswith("}")
    lines = text.splitlines()
    nodes = [line for line in lines if line.startswith("  n") and "[label=" in line and "->" not in line]
    edges = [line for line in lines if "->" in line]
    assert len(nodes) == len(graph)
    assert len(edges) == sum(len(node.inputs) for node in graph.nodes()) + len(graph.outputs)
    matmul = next(node for node in graph.nodes() if node.op == "matmul")
    assert f'  n{matmul.id} [label="%{matmul.id}\\nmatmul\\n{matmul.type}", shape=box];' in lines
    for operand in matmul.inputs:
        assert f"  n{operand} -> n{matmul.id};" in lines
    assert '  n1 [label="%y\\nparam\\ni64[64]", shape=ellipse];' in lines


ZERO_DIMENSIONAL = '''
import bendc
import bendc.functional as F

@bendc.jit(leaves=("w",), dynamic=("lr",))
def train_step(x, w, lr, scale):
    loss = (F.linear(x, w) * scale).mean()
    loss.backward()
    return loss, w - lr * w.grad
'''


@pytest.mark.parametrize("example", ["small", pytest.param("transformer", marks=pytest.mark.long)])
def test_zero_dimensional_inputs_round_trip(tmp_path, example) -> None:
    """0-d inputs (a traced lr, a 0-d array) and a 0-d output stay 0-d through compile and run with
    random inputs; the transformer example takes its step count as a 0-d array (make test-long)."""
    if example == "small":
        source = tmp_path / "zero_dimensional.py"
        source.write_text(ZERO_DIMENSIONAL)
        target, shapes = f"{source}:train_step", ["--shapes", "x=f32[4,3] w=f32[2,3]:leaf lr=f32[] scale=f32[]"]
    else:
        target, shapes = str(ROOT / "examples" / "transformer.py") + ":train_step", []
    out = tmp_path / example
    assert cli.main(["compile", target, "--target", "cpu", "-o", str(out), *shapes]) == 0
    assert cli.main(["run", str(out), "--random-inputs", "--outputs", str(tmp_path / "out.npz")]) == 0
    assert np.load(tmp_path / "out.npz")["out0"].shape == ()
