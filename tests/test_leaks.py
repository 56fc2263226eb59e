"""Calling a compiled step many times keeps resident memory flat (bounded growth, never timed)."""
from __future__ import annotations

import ctypes
import gc
import os
import sys
from pathlib import Path

import pytest

import bendc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_worker  # noqa: E402  (a small MLP-ish step with backward and an SGD update)

PAGE = os.sysconf("SC_PAGE_SIZE")
try:  # glibc: give free heap pages back first, so that memory freed by earlier tests (reused
    # without growing the resident set) cannot hide a leak
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:
    _LIBC = None


def resident_bytes() -> int:
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * PAGE


def growth(step, args, warmup: int, calls: int, keep_results: bool) -> int:
    """Resident bytes after ``calls`` more calls minus after ``warmup`` calls."""
    kept = None
    for _ in range(warmup):
        kept = step(*args)
    before = resident_bytes()
    for _ in range(calls):
        result = step(*args)
        if keep_results:
            kept = result  # the previous results are dropped as the next ones arrive
    after = resident_bytes()
    assert kept is not None
    return after - before


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
@pytest.mark.parametrize("keep_results", [False, True])
def test_ten_thousand_cpu_calls_keep_memory_flat(tmp_path, keep_results):
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(tmp_path))
    args = cache_worker.inputs()
    grown = growth(step, args, warmup=1000, calls=10_000, keep_results=keep_results)
    assert grown < 2 * 2**20, f"resident memory grew by {grown / 2**20:.2f} MiB over 10,000 calls"


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
def test_reference_calls_keep_memory_flat():
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="reference")
    args = cache_worker.inputs()
    grown = growth(step, args, warmup=1000, calls=10_000, keep_results=True)
    assert grown < 2 * 2**20, f"resident memory grew by {grown / 2**20:.2f} MiB over 10,000 calls"


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
def test_the_growth_check_sees_a_leak(tmp_path):
    """The measure is sharp enough: keeping every result (about 1.2 KiB a call) is seen."""
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(tmp_path))
    args = cache_worker.inputs()
    leak = []

    def leaking(*a):
        out = step(*a)
        leak.append(out)
        return out

    assert growth(leaking, args, warmup=100, calls=5000, keep_results=True) > 4 * 2**20
