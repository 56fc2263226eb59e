"""The on-disk program cache under concurrent compiles, SIGKILL and damaged files.

Real processes (tests/cache_worker.py) compile one small training step into a
shared cache folder: started together behind a barrier file, or killed part-way
through a cold compile. Afterwards the cache holds at most one entry per
signature, every entry there is valid, and a fresh process gets the reference
target's results (from the entry or by rebuilding).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import bendc
from runtime.artifact import read_manifest

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "cache_worker.py")
sys.path.insert(0, str(ROOT / "tests"))
import cache_worker  # noqa: E402


def start(*args: str, pool: bool = False, native: bool = True) -> subprocess.Popen:
    """A cache worker; ``pool``: its cold compile runs on the compile pool (bendc/codegen/compile_pool.py),
    whose worker processes write into the same cache (the concurrent compiles and the kills use it);
    ``native=False``: every kernel compiled by numba (BENDC_NATIVE=0), whose cache files are pickles."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENDC_COMPILE_WORKERS": "1" if pool else "0",
           "BENDC_NATIVE": "1" if native else "0"}
    return subprocess.Popen([sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def finish(process: subprocess.Popen, timeout: float = 120) -> list[str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"worker failed ({process.returncode}):\n{out}\n{err}"
    assert "discarded" not in out, out  # nothing valid was thrown away
    return [line for line in out.splitlines() if line.startswith("ok ")]


def wait_ready(process: subprocess.Popen) -> None:
    line = process.stdout.readline()
    assert line.strip() == "ready", (line, process.stderr.read() if process.poll() is not None else "")


def entries(cache: Path) -> list[Path]:
    folder = cache / "programs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def assert_one_valid_entry(cache: Path, killed_writers: bool = False) -> None:
    """One valid entry; no temporary folder left, except (``killed_writers``) the staging folders of
    writers killed mid-write, which no reader opens (they are swept once an hour old)."""
    found = entries(cache)
    visible = [p for p in found if not p.name.startswith(".")]
    assert len(visible) == 1, found
    read_manifest(str(visible[0]))  # raises ArtifactInvalid on anything damaged
    if killed_writers:
        assert all(".tmp-" in p.name for p in found if p not in visible), found
    else:
        assert visible == found, f"temporaries left behind: {found}"


# Three processes (each with its compile pool's worker) race to compile one step into an empty cache:
# one round in make test (~8 s), three in make test-long.
@pytest.mark.parametrize("rounds", [1, pytest.param(3, marks=pytest.mark.long)])
def test_concurrent_compiles_leave_one_valid_entry(tmp_path, rounds):
    for round in range(rounds):
        cache = tmp_path / f"cache{round}"
        barrier = tmp_path / f"go{round}"
        workers = [start(str(cache), "--wait-for", str(barrier), "--verify", pool=True) for _ in range(3)]
        for worker in workers:
            wait_ready(worker)
        barrier.touch()
        results = [finish(worker) for worker in workers]
        assert all(r == ["ok compiled"] or r == ["ok cache"] for r in results), results
        assert_one_valid_entry(cache)
        assert finish(start(str(cache), "--verify")) == ["ok cache"]


def test_concurrent_loads_of_one_entry(tmp_path):
    """Processes loading the entry that another is compiling never discard or break it."""
    cache = tmp_path / "cache"
    barrier = tmp_path / "go"
    workers = [start(str(cache), str(cache), str(cache), "--wait-for", str(barrier), "--verify")
               for _ in range(3)]
    for worker in workers:
        wait_ready(worker)
    barrier.touch()
    for worker in workers:
        lines = finish(worker)
        assert len(lines) == 3 and lines[1:] == ["ok cache", "ok cache"], lines
    assert_one_valid_entry(cache)


def cold_compile_seconds(tmp_path) -> float:
    barrier = tmp_path / "go-measure"
    worker = start(str(tmp_path / "measure"), "--wait-for", str(barrier), pool=True)
    wait_ready(worker)
    began = time.monotonic()
    barrier.touch()
    assert finish(worker) == ["ok compiled"]
    return time.monotonic() - began


# make test kills at 4 points of the cold compile (its start, two inside, after its end), make test-long at 10.
@pytest.mark.parametrize("points", [4, pytest.param(10, marks=pytest.mark.long)])
def test_sigkill_during_a_cold_compile_leaves_nothing_trusted(tmp_path, points):
    seconds = cold_compile_seconds(tmp_path)
    caches = []
    for number, delay in enumerate(np.linspace(0.0, seconds * 1.1, points)):
        cache = tmp_path / f"killed{number}"
        barrier = tmp_path / f"go{number}"
        worker = start(str(cache), "--wait-for", str(barrier), pool=True)
        wait_ready(worker)
        barrier.touch()
        time.sleep(delay)
        worker.send_signal(signal.SIGKILL)
        worker.communicate()
        caches.append(cache)
    # One fresh process loads or rebuilds every one of them and checks against the reference target.
    lines = finish(start(*map(str, caches), "--verify"), timeout=300)
    assert len(lines) == len(caches), lines
    for cache in caches:
        assert_one_valid_entry(cache, killed_writers=True)


def compile_here(cache: Path):
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(cache))
    return step, step(*cache_worker.inputs())


def reference():
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="reference")
    return step(*cache_worker.inputs())


def assert_matches_reference(got) -> None:
    for a, b in zip(got, reference()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("keep", [0.0, 0.9])  # an empty module; one cut at a line end
def test_a_truncated_shared_kernel_file_is_never_imported(tmp_path, keep):
    cache = tmp_path / "cache"
    assert finish(start(str(cache))) == ["ok compiled"]
    for kernel in (cache / "kernels").glob("k_*.py"):
        # Cut at a line end too: a shorter module can still import and do something else.
        text = kernel.read_text()
        cut = text[: int(len(text) * keep)]
        kernel.write_text(cut[: cut.rfind("\n") + 1] if "\n" in cut else cut)
    # A process loading the cached entry, and one building another program over the same kernel files.
    assert finish(start(str(cache), "--verify")) in (["ok cache"], ["ok compiled"])
    (entry,) = entries(cache)


    shutil.rmtree(entry)
    assert finish(start(str(cache), "--verify")) == ["ok compiled"]
    assert finish(start(str(cache), "--verify")) == ["ok cache"]


# .nbc in make test-long (10 s): numba's data file goes through the same signature check as its index.
@pytest.mark.parametrize("suffix", [".nbi", pytest.param(".nbc", marks=pytest.mark.long), ".native.o"])
def test_a_truncated_machine_code_file_is_not_trusted(tmp_path, suffix):
    """numba's index and data files (BENDC_NATIVE=0) and native object files, cut in half: each is
    compiled again (and rewritten), never read."""
    native = suffix == ".native.o"
    cache = tmp_path / "cache"
    assert finish(start(str(cache), native=native)) == ["ok compiled"]
    damaged = sorted((cache / "kernels" / "__pycache__").glob(f"*{suffix}"))
    assert damaged
    for path in damaged:
        truncate(path, 0.5)
    assert finish(start(str(cache), "--verify", native=native)) == ["ok cache"]
    assert finish(start(str(cache), "--verify", native=native)) == ["ok cache"]


def test_stale_temporaries_are_not_trusted_and_old_ones_are_removed(tmp_path):
    cache = tmp_path / "cache"
    assert finish(start(str(cache))) == ["ok compiled"]
    (entry,) = entries(cache)
    programs = cache / "programs"
    # What a killed writer leaves: a staging folder (complete or not) beside the entry.
    stale = programs / f".{entry.name}.tmp-abcd1234"
    fresh = programs / f".{entry.name}.tmp-efgh5678"
    for folder in (stale, fresh):
        shutil.copytree(entry, folder)
        (folder / "plan.json").write_text("{")
    old = time.time() - 2 * 86400
    os.utime(stale, (old, old))
    kernel_tmp = cache / "kernels" / ".tmp-deadbeef"
    kernel_tmp.write_text("def kernel(")
    os.utime(kernel_tmp, (old, old))


    shutil.rmtree(entry)
    assert finish(start(str(cache), "--verify")) == ["ok compiled"]
    assert not stale.exists() and not kernel_tmp.exists()  # old: removed
    assert fresh.exists()  # recent: perhaps another process's, left alone


@pytest.mark.parametrize("replace", [True, False])
def test_writers_and_readers_of_one_entry_race_safely(tmp_path, monkeypatch, capsys, replace):
    """Many writers of one entry (as concurrent compiles of one signature are) and readers of it
    at once: no writer fails, no reader discards the entry or gets a damaged one."""
    import threading

    import bendc.artifact
    from bendc.compile import load_cached

    recorded = {}
    original = bendc.artifact.write_artifact

    def record(folder, **kwargs):
        recorded.update(kwargs)
        return original(folder, **kwargs)

    for name, module in list(sys.modules.items()):  # wherever the compiler imported it (jit, compile)
        if name.startswith("bendc") and getattr(module, "write_artifact", None) is original:
            monkeypatch.setattr(module, "write_artifact", record)
    cache = tmp_path / "cache"
    _, want = compile_here(cache)
    monkeypatch.undo()
    (entry,) = entries(cache)
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        try:
            for number in range(15):
                if replace:  # bendc compile over the same artifact: identical, kept
                    original(str(entry), **{**recorded, "replace": True})
                else:  # cache entries that differ (in their report): the first valid one is kept
                    original(str(entry), **{**recorded, "report": f"{number}", "replace": False})
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    def read() -> None:
        try:
            while not stop.is_set():
                cached = load_cached(str(entry), str(cache))
                if cached is not None:
                    for a, b in zip(cached.run(cache_worker.inputs()), want):
                        np.testing.assert_array_equal(a, b)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    writers = [threading.Thread(target=write) for _ in range(4)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in writers + readers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()
    assert not errors, errors
    assert "discarded" not in capsys.readouterr().out
    assert_one_valid_entry(cache)
