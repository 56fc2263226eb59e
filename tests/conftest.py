"""Shared test helpers: PyTorch references and comparison tolerances."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import strategies as st


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/golden/*.ir from the current compiler (read the diff before committing)")


@pytest.fixture
def regen_golden(request) -> bool:
    return request.config.getoption("--regen-golden")


@pytest.fixture(scope="session", autouse=True)
def signing_key(tmp_path_factory):
    """Artifacts and cache entries are signed (runtime/trust.py): with a key of the test run's own
    (BENDC_KEY_FILE, inherited by worker processes), never the user's ~/.config/bendc/key. Under
    pytest-xdist the workers share one (made by whichever gets there first), as they share caches;
    with BENDC_TEST_ROOT set (the Makefile), every pytest run of one `make test` shares it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    if os.environ.get("BENDC_TEST_ROOT"):
        # `make test`'s three pytest runs share one key and one kernel cache (a folder made fresh for
        # each `make test`): a kernel the ops run compiled loads in the others instead of compiling again.
        root = pathlib.Path(os.environ["BENDC_TEST_ROOT"])
    path = root / "bendc-key" / "key"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENDC_KEY_FILE", str(path))
        yield path


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory, signing_key):
    """The run's kernel cache: $BENDC_CACHE_DIR where the caller set one, else a folder of the run's
    own that the xdist workers share (one compiles, the other loads numba's machine code), never the
    user's ~/.cache/bendc: every run of the suite starts cold, as CI's does."""
    if os.environ.get("BENDC_CACHE_DIR"):
        yield os.environ["BENDC_CACHE_DIR"]
        return
    path = signing_key.parent.parent / "bendc-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENDC_CACHE_DIR", str(path))
        yield str(path)


@pytest.fixture(scope="session", autouse=True)
def compile_workers():
    """Kernels compile in the test's own process (BENDC_COMPILE_WORKERS=0, unless the caller set it):
    the suite already runs a worker per core (pytest-xdist), and a compile worker's start would cost
    more than most tests' few small kernels take. The pool's own tests set it
    (tests/codegen/test_compile_pool.py, tests/test_cache_safety.py)."""
    if os.environ.get("BENDC_COMPILE_WORKERS"):
        yield os.environ["BENDC_COMPILE_WORKERS"]
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENDC_COMPILE_WORKERS", "0")
        yield "0"


SIMULATOR_MAX_BLOCK = 64


@pytest.fixture(scope="module", autouse=True)
def simulator_block_size(request):
    """Under numba's CUDA simulator (tests/cuda/run_simulator.sh) kernels are generated with blocks
    of at most two warps (cuda_kit.MAX_BLOCK 64, not 256): a simulated thread costs ~170 us, and a sum
    over the batch takes a block of MAX_BLOCK threads per output element (x.sum(0) of a 3 x 70 array
    was 17,920 threads, 17 s). The tree, loop and shared-memory code is the same at any power of two
    from a warp up. The 256-thread kernels run on the simulator where a module says FULL_BLOCKS = True
    (tests/cuda/test_cubin_simulator.py: it runs what `bendc compile` built in another process) and in
    the device script's dry run (tests/cuda/test_sim_device_check.py), and are built for sm_90 by the
    PTX tests. Tests that lower it further (grid and block loops) monkeypatch it themselves."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or getattr(request.module, "FULL_BLOCKS", False):
        yield None
        return
    try:
        import bendc.kernels.cuda_kit as kit
    except ImportError:  # no numba-cuda: the simulator modules skip themselves
        yield None
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kit, "MAX_BLOCK", min(kit.MAX_BLOCK, SIMULATOR_MAX_BLOCK))
        yield kit.MAX_BLOCK


def child_report(code: str, *args: str, threads: str = "2", **env: str) -> dict:
    """Run ``code`` in a fresh Python (numba reads NUMBA_NUM_THREADS at import) at ``threads``
    threads on bendc's own pool (NUMBA_THREADING_LAYER unset unless given in ``env``), with
    ``args`` as argv; the JSON object its last stdout line prints."""
    child_env = {key: value for key, value in os.environ.items() if key != "NUMBA_THREADING_LAYER"}
    child_env.update(NUMBA_NUM_THREADS=threads, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]), **env)
    run = subprocess.run([sys.executable, "-c", code, *args], env=child_env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_bitwise(actual, expected, what: str = "") -> None:
    """Same float32 bits (so -0.0 and +0.0 differ; NaNs compare by pattern)."""
    actual = np.asarray(actual, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    same = actual.view(np.int32) == expected.view(np.int32)
    if not same.all():
        where = np.argwhere(~same)[:5]
        raise AssertionError(f"{what}: {int((~same).sum())} of {same.size} words differ, e.g. at "
                             f"{where.tolist()}: {actual[tuple(where[0])]!r} vs {expected[tuple(where[0])]!r}")


def ulp_distance(actual, expected) -> np.ndarray:
    """How many float32 values lie between each pair (0: the same bits; +0.0 and -0.0 are 1 apart)."""
    def ordered(x):
        bits = np.asarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # monotone in the float's value

    return np.abs(ordered(actual) - ordered(expected))


# Tolerances for results that are not bit-exact (transcendentals, reductions, products).
RTOL = 1e-5
ATOL = 1e-6


def assert_as_close_as_torch(name: str, mine: np.ndarray, single: np.ndarray, exact: np.ndarray,
                             atol: float = ATOL) -> None:
    """bendc's result ``mine`` within the usual tolerances of float32 PyTorch's ``single``, widened element
    by element by PyTorch's own error (its distance from float64 PyTorch's ``exact``), and no farther from
    float64 PyTorch than float32 PyTorch is (or the usual tolerance): for ops bendc computes in float64
    inside (group_norm, batch_norm), where torch's float32 is the less exact side."""
    mine64, single64 = mine.astype(np.float64), single.astype(np.float64)
    allowed = atol + RTOL * np.abs(single64) + np.abs(single64 - exact)
    bad = np.abs(mine64 - single64) > allowed
    assert not bad.any(), (f"{name}: {bad.sum()} elements off PyTorch beyond its own error, first at "
                           f"{np.argwhere(bad)[0].tolist()}: {mine[bad][0]!r} vs {single[bad][0]!r}")
    error, torch_error = np.abs(mine64 - exact).max(initial=0.0), np.abs(single64 - exact).max(initial=0.0)
    assert error <= max(torch_error, atol + RTOL * np.abs(exact).max(initial=0.0)), (name, error, torch_error)


def assert_close(actual, expected, what: str = "", rtol: float = RTOL, atol: float = ATOL) -> None:
    actual = np.asarray(actual, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def factor_shape(draw, numel: int) -> tuple[int, ...]:
    """A random shape of rank 0..3 with ``numel`` elements."""
    factors = []
    n, p = numel, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    rank = draw(st.integers(1 if numel > 1 else 0, 3))
    if rank == 0:
        return ()
    dims = [1] * rank
    for factor in factors:
        dims[draw(st.integers(0, rank - 1))] *= factor
    return tuple(dims)


# pytest-xdist (make test: --dist loadfile): each test file is one unit of work, except the MPI
# tests' two files (tests/distributed/test_distributed.py, test_sharded.py), one unit together: their
# jobs run one at a time (tests/distributed/mpi_launch.py holds a lock around each), and on two
# workers one waited for the other's (~25 s of an idle worker per run).
SHARED_UNITS = {"tests/distributed/test_distributed.py": "tests/distributed: MPI jobs",
                "tests/distributed/test_sharded.py": "tests/distributed: MPI jobs"}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (absent with -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduler(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_UNITS.get(path, path)

    return Scheduler(config, log)


# Resident memory per test (issue 21): BENDC_TEST_RSS=PREFIX appends "nodeid<TAB>VmRSS in kB after
# its teardown<TAB>time.time()" for every test to PREFIX.<worker> (gw0, gw1, ... under xdist; main
# without it; simulator-gw0, ... for the simulator's run). tests/rss_report.py sums it up per file.
def _resident_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    prefix = os.environ.get("BENDC_TEST_RSS")
    if prefix and os.path.exists("/proc/self/status"):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # the simulator's run, beside the suite's
            worker = f"simulator-{worker}"
        with open(f"{prefix}.{worker}", "a") as log:
            log.write(f"{item.nodeid}\t{_resident_kb()}\t{time.time():.3f}\n")


# Compile time per kernel (issue 24): BENDC_TEST_COMPILES=PREFIX appends "seconds<TAB>parallel<TAB>
# module.function<TAB>test" for every numba compile (its own time, nested compiles excluded) to
# PREFIX.<worker>. tests/rss_report.py --compiles sums it up.
if os.environ.get("BENDC_TEST_COMPILES"):
    from numba.core import event as _numba_event

    class _CompileLog(_numba_event.Listener):
        def __init__(self) -> None:
            self.stack: list[list[float]] = []

        def on_start(self, event) -> None:
            self.stack.append([time.perf_counter(), 0.0])

        def on_end(self, event) -> None:
            start, nested = self.stack.pop()
            spent = time.perf_counter() - start
            if self.stack:
                self.stack[-1][1] += spent
            dispatcher = event.data["dispatcher"]
            parallel = bool(getattr(dispatcher, "targetoptions", {}).get("parallel"))
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
            with open(f"{os.environ['BENDC_TEST_COMPILES']}.{worker}", "a") as log:
                log.write(f"{spent - nested:.4f}\t{int(parallel)}\t{dispatcher.py_func.__module__}."
                          f"{dispatcher.py_func.__name__}\t{test}\n")

    _numba_event.register("numba:compile", _CompileLog())
