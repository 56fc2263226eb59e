"""Calling a compiled step many times keeps resident memory flat (bounded growth, never timed)."""
from __future__ import annotations

import ctypes
import gc
import itertools
import os
import sys
import weakref
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


# ------------------------------------------------------------------ many steps, each compiled and dropped
STEP_SOURCE = """
def step_{number}(x, y, w1, b1, w2):
    hidden_{number} = F.relu(F.linear(x, w1, b1)) * {scale}
    loss = F.mse_loss(hidden_{number} @ w2.T, y)
    loss.backward()
    return loss, F.sgd_step(w1, w1.grad, 0.1), b1.grad, w2.grad
"""


def new_step(number: int, cache_dir: str, scale: float = 1.0):
    """A jitted step of a function of its own (its own source, trace, graph, plan and program)."""
    namespace = {"F": bendc.functional}
    exec(STEP_SOURCE.format(number=number, scale=repr(scale)), namespace)
    return bendc.jit(namespace[f"step_{number}"], leaves=cache_worker.LEAVES, target="cpu", cache_dir=cache_dir)


def compile_and_drop(count: int, cache_dir: str, scales) -> tuple[int, list]:
    """(resident growth, weak references to each step) over ``count`` steps compiled, run, dropped."""
    args = cache_worker.inputs()
    new_step(0, cache_dir)(*args)  # the kernels a scale of 1.0 shares, compiled before measuring
    before = resident_bytes()
    dropped = []
    for number in range(1, count + 1):
        step = new_step(number, cache_dir, next(scales))
        step(*args)
        dropped.append(weakref.ref(step))
        del step
    return resident_bytes() - before, dropped


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
def test_fifty_steps_compiled_and_dropped_leave_nothing_behind(tmp_path):
    """50 different functions, each traced, lowered, planned and run once, then dropped: each step and
    everything it held is freed (measured: 0.0 MiB for 50 dropped, 3.7 MiB for 50 kept, 75 KiB a step;
    the kernels are shared, so no numba machine code is added)."""
    grown, dropped = compile_and_drop(50, str(tmp_path), itertools.repeat(1.0))
    assert all(ref() is None for ref in dropped), "a dropped jitted step is still referenced"
    assert grown < 2 * 2**20, f"resident memory grew by {grown / 2**20:.2f} MiB over 50 dropped steps"


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
def test_fifty_steps_with_new_kernels_grow_only_by_their_machine_code(tmp_path):
    """50 steps whose constant makes two kernels of their own each (100 native compiles, ~10 s):
    each kernel's object code stays loaded (one MCJIT engine, as numba's never frees its machine
    code either: numba issues #5976 and #7831), measured at ~160 KiB a kernel (numba's own: ~1.2 MiB,
    BENDC_NATIVE=0); bendc must add nothing of its own on top."""
    grown, dropped = compile_and_drop(50, str(tmp_path), (float(n) for n in itertools.count(2)))
    assert all(ref() is None for ref in dropped), "a dropped jitted step is still referenced"
    assert grown < 100 * 512 * 2**10, f"resident memory grew by {grown / 2**20:.1f} MiB over 100 kernels"
