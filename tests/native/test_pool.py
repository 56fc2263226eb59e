"""bendc's thread pool (runtime/native/pool.py): native prange loops at 2 threads.

Each test runs a child process with NUMBA_NUM_THREADS=2 (numba reads it at import): a module of
prange kernels is loaded as kernel modules are, and the child checks every result against numpy
and prints the pool's counters. No test reads a clock.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import child_report

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the pool is Linux's (futex); elsewhere numba's")

CHILD = textwrap.dedent('''
    import json, os, sys, threading
    import numpy as np
    from runtime.artifact import load_module, module_name
    from runtime.native import pool

    SOURCE = """
    import numpy as np
    from numba import njit, prange


    @njit(parallel=True, cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def rows(a, out):
        for r in prange(a.shape[0]):
            for c in range(a.shape[1]):
                out[r, c] = a[r, c] * np.float32(2.0) + np.float32(r)


    @njit(parallel=True, cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def offset(a, out, first):
        for r in prange(first, a.shape[0]):
            out[r] = a[r] + np.float32(1.0)
    """
    folder = sys.argv[1]
    name = module_name(SOURCE)
    path = os.path.join(folder, name + ".py")
    with open(path, "w") as stream:
        stream.write(SOURCE)
    module = load_module(path, name)
    rng = np.random.default_rng(0)


    def check(count, columns=33):
        a = rng.standard_normal((count, columns)).astype(np.float32)
        out = np.full_like(a, np.nan)
        module.rows(a, out)
        expected = a * np.float32(2.0) + np.arange(count, dtype=np.float32)[:, None]
        return bool((out == expected).all())


    report = {"shapes": all(check(n) for n in (0, 1, 2, 3, 7, 8, 9, 64, 1000, 4097))}


    def claims(chunks, helpers):
        """The chunks each side took in a sequence of claims (helper 0: the caller), by the pool's
        own claim function over the word as the claims' adds leave it."""
        word, taken = chunks << pool.CHUNKS_SHIFT, {0: [], 1: []}
        for helper in helpers:
            index = pool.claimed(word, helper)
            word += (1 << pool.BACK_SHIFT) if helper else 1
            if index >= 0:
                taken[helper].append(index)
        return taken


    good = pool.uses_own_pool()  # (numba's layer, where the user chose one, has no claim word)
    for chunks in (1, 2, 7, 16, 1024) if good else ():
        for _ in range(20):
            helpers = rng.integers(0, 2, chunks + 5)  # claims past the last chunk find none
            taken = claims(chunks, helpers)
            front, back = taken[0], taken[1]
            good &= front == list(range(len(front))) and back == list(range(chunks - 1, chunks - 1 - len(back), -1))
            good &= sorted(front + back) == list(range(chunks))
    report["claims"] = good
    a = rng.standard_normal(100).astype(np.float32)
    out = np.zeros_like(a)
    module.offset(a, out, 37)  # a range that starts past 0
    report["offset"] = bool((out[37:] == a[37:] + np.float32(1.0)).all() and (out[:37] == 0).all())
    report["native"] = all(r.native for f in (module.rows, module.offset) for r in f.compiles.values())
    big = rng.standard_normal((4096, 64)).astype(np.float32)
    target = np.empty_like(big)
    for _ in range(2000):  # until a worker has taken a chunk (it spins between these launches)
        module.rows(big, target)
        if pool.counts()["helped"]:
            break
    mode = sys.argv[2]
    if mode == "threads":  # two Python threads launching at once: one runs, the other runs serially
        results = []

        def work():
            results.append(all(check(n, 17) for n in (500, 3, 2000) * 30))

        threads = [threading.Thread(target=work) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report["threads"] = results == [True, True]
    if mode == "fork":  # a forked child starts its own workers
        before = pool.counts()["helped"]  # the child's counters start from the parent's
        child = os.fork()
        if child == 0:
            good = check(4097) and check(9)
            for _ in range(2000):
                module.rows(big, target)
                if pool.counts()["helped"] > before:
                    break
            os._exit(0 if good and pool.counts()["helped"] > before else 3)
        report["fork"] = os.waitpid(child, 0)[1]
    report.update(pool.counts())
    report["own_pool"] = pool.uses_own_pool()
    print(json.dumps(report))
''')


def _child(tmp_path, mode: str = "plain", **extra: str) -> dict:
    return child_report(CHILD, str(tmp_path), mode, **extra)


def test_prange_runs_on_the_pool_with_the_callers_help(tmp_path):
    """Every cut of a prange range (counts 0 to 4097, a range that starts past 0) gives numpy's
    values; the loops launch on the pool, and a worker takes chunks beside the caller."""
    report = _child(tmp_path)
    assert report["own_pool"] and report["native"]
    assert report["shapes"] and report["offset"]
    assert report["launches"] > 0 and report["helped"] > 0
    assert report["serial"] == 0


def test_the_caller_claims_chunks_from_the_first_and_workers_from_the_last(tmp_path):
    """Interleaved claims of the caller and a worker (random orders, 1 to 1024 chunks, more claims
    than chunks), through the pool's own claim function: every chunk taken once, the caller's
    from the first chunk up, the worker's from the last down (so at 2 threads each thread runs the
    same rows of every loop), none after the last."""
    report = _child(tmp_path)
    assert report["claims"]


def test_two_python_threads_launching_at_once_both_finish(tmp_path):
    """One launch at a time: a launch that finds the pool busy runs its loop in its own thread."""
    report = _child(tmp_path, "threads")
    assert report["threads"] and report["shapes"]


def test_a_forked_child_starts_its_own_workers(tmp_path):
    report = _child(tmp_path, "fork")
    assert report["fork"] == 0


def test_a_threading_layer_the_user_chose_runs_the_loops(tmp_path):
    """NUMBA_THREADING_LAYER set: prange loops run on numba's layer, with the same values."""
    report = _child(tmp_path, NUMBA_THREADING_LAYER="workqueue")
    assert not report["own_pool"] and report["native"]
    assert report["shapes"] and report["offset"]
    assert report["launches"] == 0


def test_workers_that_sleep_between_launches_are_woken(tmp_path):
    """BENDC_POOL_SPIN_US=0: a worker sleeps on the futex right after its chunks, so every launch
    that finds it asleep wakes it; it still takes chunks (a lost wake-up would leave helped at 0)."""
    report = _child(tmp_path, BENDC_POOL_SPIN_US="0")
    assert report["shapes"] and report["offset"]
    assert report["launches"] > 0 and report["helped"] > 0


def test_a_spin_that_is_not_a_number_is_refused():
    env = dict(os.environ, BENDC_POOL_SPIN_US="fast", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", "from runtime.native import pool; pool.ir()"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "BENDC_POOL_SPIN_US must be a whole number of microseconds" in run.stderr
