"""Packaging: the dependency ranges, the lock, the lowest bounds, and the wheel as a user installs it.

The fast tests check that requirements/lock.txt pins every dependency pyproject.toml names inside
its range, and that scipy ships the BLAS thread setter the tiled attention kernels call. The
``long`` ones (make test-long) build virtual environments:

- ``test_lowest_bounds`` (make test-bounds): .venv-bounds, from Python 3.11, with the lowest numba,
  llvmlite, numpy, scipy and networkx that pyproject.toml allows, running BOUNDS_TESTS in it;
- ``test_wheel_installs_and_runs``: the wheel ``python -m build`` makes, installed (not editable)
  into a fresh venv per Python (3.11, 3.12, 3.13, where installed), running ``bendc compile``,
  ``bendc run`` and a jitted step from a temporary folder, outside the source tree.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements" / "lock.txt"
BOUNDS_VENV = ROOT / ".venv-bounds"
PYTHONS = ("3.11", "3.12", "3.13")
# The dependencies whose lower bounds test_lowest_bounds installs (torch: only 2.13.0 is on this disk).
LOWEST = ("numba", "llvmlite", "numpy", "scipy", "networkx")
# What runs against the lowest bounds: an mlp and a transformer step against torch and against the
# reference interpreter, the cpu kernel cache round trip (in one process and a second one), an AOT
# artifact's round trip and its machine code read in place (numba's cache index), the tiled
# attention at the benchmark's shape and scipy's BLAS thread setter.
BOUNDS_TESTS = (
    "tests/test_examples.py::test_mlp_cpu_equals_reference",
    "tests/test_examples.py::test_mlp_train_step_matches_torch",
    "tests/test_examples.py::test_transformer_train_step_matches_torch",
    "tests/codegen/test_cpu_target.py::test_cache_is_reused_and_a_corrupt_entry_is_rebuilt",
    "tests/codegen/test_cpu_target.py::test_second_process_reuses_the_cache",
    "tests/aot/test_aot.py::test_round_trip_equals_jit_bit_for_bit",
    "tests/aot/test_machine_code.py::test_read_only_transformer_runs_twice_without_compiling",
    "tests/ops/test_attention_tiled.py::test_benchmark_shape",
    "tests/test_packaging.py::test_scipy_ships_the_blas_thread_setter",
)


# ------------------------------------------------------------------ ranges and the lock
def declared_requirements() -> list[Requirement]:
    """Every requirement of pyproject.toml: the dependencies and every extra's."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    texts = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        texts.extend(extra)
    return [Requirement(text) for text in texts]


def lock_pins() -> dict[str, str]:
    """canonical name -> pinned version of requirements/lock.txt."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, separator, version = line.partition("==")
        assert separator, f"requirements/lock.txt: {line!r} is not an exact pin"
        pins[canonicalize_name(name)] = version.strip()
    return pins


def lowest_allowed(name: str) -> str:
    """The version of a ``>=`` lower bound that pyproject.toml gives ``name``."""
    for requirement in declared_requirements():
        if canonicalize_name(requirement.name) == name:
            lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
            assert len(lower) == 1, f"{requirement}: expected one >= bound"
            return lower[0]
    raise AssertionError(f"{name} is not a dependency in pyproject.toml")


def test_lock_pins_every_dependency_inside_its_range() -> None:
    pins = lock_pins()
    for requirement in declared_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} has no pin in requirements/lock.txt (regenerate it: requirements/compile.sh)"
        assert requirement.specifier.contains(pins[name], prereleases=True), \
            f"requirements/lock.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"


def test_scipy_ships_the_blas_thread_setter() -> None:
    """The tiled attention template (bendc/ops/attention/templates/tiled.py) gives scipy's OpenBLAS
    one thread through scipy_openblas_set_num_threads: the reason for scipy's lower bound."""
    import ctypes

    import scipy

    libraries = glob.glob(os.path.join(os.path.dirname(scipy.__file__) + ".libs", "libscipy_openblas*.so"))
    assert libraries, f"scipy {scipy.__version__} ships no scipy.libs/libscipy_openblas*.so"
    assert any(hasattr(ctypes.CDLL(path), "scipy_openblas_set_num_threads") for path in libraries)


# ------------------------------------------------------------------ virtual environments
def find_python(version: str) -> str | None:
    """An interpreter of ``version`` ("3.12") that runs: one of pyenv's, else one on PATH (a pyenv
    shim on PATH answers only for the versions pyenv has selected)."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", f"python{version}")),
                        reverse=True)
    on_path = shutil.which(f"python{version}")
    for candidate in candidates + ([on_path] if on_path else []):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, env=clean_env())
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a venv's commands: none of this process's Python paths or venv."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def check_run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a command; on failure the assertion shows its output."""
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def make_venv(python: str, folder: Path) -> Path:
    """A fresh venv at ``folder`` (its python)."""
    shutil.rmtree(folder, ignore_errors=True)
    check_run([python, "-m", "venv", str(folder)])
    return folder / "bin" / "python"


def installed_versions(python: Path) -> dict[str, str]:
    freeze = check_run([str(python), "-m", "pip", "freeze", "--all"], env=clean_env()).stdout
    versions = {}
    for line in freeze.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            versions[canonicalize_name(name)] = version
    return versions


# ------------------------------------------------------------------ the lowest bounds
def bounds_constraints() -> str:
    """The lock with numba, llvmlite, numpy, scipy and networkx at pyproject.toml's lower bounds."""
    lowest = {name: lowest_allowed(name) for name in LOWEST}
    lines = [f"{name}=={version}" for name, version in sorted(lock_pins().items()) if name not in lowest]
    return "\n".join(lines + [f"{name}=={version}" for name, version in sorted(lowest.items())]) + "\n"


@pytest.mark.long
def test_lowest_bounds() -> None:
    """BOUNDS_TESTS pass in .venv-bounds (Python 3.11) with the lowest numba, llvmlite, numpy, scipy
    and networkx allowed (the venv is kept between runs and rebuilt when the bounds change)."""
    python = find_python("3.11")
    if python is None:
        pytest.skip("no python3.11 on PATH or in pyenv: the bounds venv takes torch 2.13.0 for Python 3.11")
    constraints = bounds_constraints()
    stamp = BOUNDS_VENV / ".installed"
    venv_python = BOUNDS_VENV / "bin" / "python"
    started = time.monotonic()
    if not stamp.exists() or stamp.read_text() != constraints:
        venv_python = make_venv(python, BOUNDS_VENV)
        (BOUNDS_VENV / "constraints.txt").write_text(constraints)
        lowest = [f"{name}=={lowest_allowed(name)}" for name in LOWEST]
        # The test tools and torch at the lock's versions: torch 2.13.0 is the CPU wheel on disk.
        check_run([str(venv_python), "-m", "pip", "install", "--quiet", "-c", str(BOUNDS_VENV / "constraints.txt"),
                   *lowest, "torch", "pytest", "hypothesis", "packaging"], env=clean_env())
        stamp.write_text(constraints)
    print(f"bounds venv ready in {time.monotonic() - started:.0f} s")
    versions = installed_versions(venv_python)
    for name in LOWEST:
        assert versions[name] == lowest_allowed(name), f"{name} {versions[name]} in .venv-bounds, not the lowest"
    started = time.monotonic()
    # bendc from this checkout (PYTHONPATH): the dependencies under test are the venv's.
    done = subprocess.run([str(venv_python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *BOUNDS_TESTS],
                          cwd=ROOT, capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=str(ROOT), BENDC_CACHE_DIR=str(BOUNDS_VENV / "bendc-cache")))
    print(f"bounds tests ran in {time.monotonic() - started:.0f} s:", done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, f"with {', '.join(f'{n}=={lowest_allowed(n)}' for n in LOWEST)}:\n" \
                                 f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= len(BOUNDS_TESTS) and "skipped" not in summary, summary


# ------------------------------------------------------------------ the wheel
USER_PROGRAM = '''
"""A user's training step, outside bendc's source tree: attention (the templates read as text),
cross_entropy and tanh-gelu (the kit's float32 transcendentals), an SGD update."""
import sys

import numpy as np

import bendc
import bendc.functional as F

EXAMPLE_SHAPES = "x=f32[1,2,8,16] w=f32[16,16]:leaf y=i64[16]"


@bendc.jit(leaves=("w",), target="cpu")
def step(x, w, y):
    q = F.gelu(F.linear(x, w), approximate="tanh")
    attended = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    loss = F.cross_entropy(attended.reshape(16, 16), y)
    loss.backward()
    return loss, F.sgd_step(w, w.grad, 0.1)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 8, 16)).astype(np.float32)
    w = (rng.standard_normal((16, 16)) * 0.1).astype(np.float32)
    y = rng.integers(0, 16, 16)
    loss, updated = step(x, w, y)
    reference = bendc.jit(step.fn, leaves=("w",), target="reference")
    spec_loss, spec_updated = reference(x, w, y)
    np.testing.assert_allclose(loss, spec_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(updated, spec_updated, rtol=1e-5, atol=1e-6)
    assert np.isfinite(loss) and not np.array_equal(updated, w)
    print("bendc from", bendc.__file__)
    print("loss", float(loss))
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``python -m build`` makes (from the sdist it makes first, as pip would from PyPI)."""
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    check_run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], env=clean_env())
    print(f"python -m build: {time.monotonic() - started:.0f} s")
    wheels = list(out.glob("bendc-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.long
def test_wheel_holds_every_source_file_of_the_packages(wheel) -> None:
    """Every file under bendc/ and runtime/ but bytecode is in the wheel: kernel templates and
    the kit's helpers are read as text at run time, and bendc/ir is a namespace package."""
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if not name.startswith("bendc-")}
    sources = {path.relative_to(ROOT).as_posix() for package in ("bendc", "runtime")
               for path in (ROOT / package).rglob("*") if path.is_file()
               and "__pycache__" not in path.parts and path.suffix != ".pyc"}
    assert sources - shipped == set(), "files missing from the wheel"



@pytest.mark.long
@pytest.mark.parametrize("version", PYTHONS)
def test_wheel_installs_and_runs(version, wheel, tmp_path) -> None:
    """The wheel, not editable, in a fresh venv with the lock's versions (no torch): bendc compile,
    bendc run and a jitted step against the reference, from a folder outside the source tree."""
    python = find_python(version)
    if python is None:
        pytest.skip(f"no python{version} on PATH or in pyenv")
    started = time.monotonic()
    venv_python = make_venv(python, tmp_path / "venv")
    check_run([str(venv_python), "-m", "pip", "install", "--quiet", "-c", str(LOCK), str(wheel)], env=clean_env())
    installed = time.monotonic() - started
    versions = installed_versions(venv_python)
    pins = lock_pins()
    for name in LOWEST:
        assert versions[name] == pins[name], f"{name} {versions[name]} installed, the lock pins {pins[name]}"
    assert "torch" not in versions, "the core install pulled in torch"

    work = tmp_path / "work"
    work.mkdir()
    (work / "user_step.py").write_text(textwrap.dedent(USER_PROGRAM))
    env = clean_env(BENDC_CACHE_DIR=str(tmp_path / "cache"))
    bendc = str(tmp_path / "venv" / "bin" / "bendc")
    ran = check_run([str(venv_python), "user_step.py"], cwd=work, env=env).stdout
    site = re.search(r"bendc from (\S+)", ran).group(1)
    assert site.startswith(str(tmp_path / "venv")) and not site.startswith(str(ROOT)), site
    compiled = check_run([bendc, "compile", "user_step.py:step", "--target", "cpu", "-o", "built"], cwd=work, env=env)
    assert (work / "built" / "manifest.json").is_file(), compiled.stdout
    result = check_run([bendc, "run", "built", "--random-inputs", "--outputs", "out.npz"], cwd=work, env=env)
    assert "out0" in result.stdout and (work / "out.npz").is_file(), result.stdout
    print(f"python {version}: venv and install {installed:.0f} s, all {time.monotonic() - started:.0f} s")
