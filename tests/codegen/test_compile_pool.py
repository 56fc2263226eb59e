"""Kernels compiled before the first call, here and in worker processes (bendc/codegen/compile_pool.py).

The dry run of the launch list must find the exact types of the first call (else the first call
compiles again), worker-compiled kernels give the bits of serially compiled ones, a worker that
fails leaves its jobs to this process, and BENDC_LOG=compile logs the profile.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
from numba.core import event

import bendc
import bendc.functional as F
from bendc.codegen import compile_pool
from conftest import assert_bitwise

LEAVES = ("w1", "b1", "w2", "g")


def step(x, y, w1, b1, w2, g):
    """Products, a GELU (the kit's float32 erf), a LayerNorm (row kernels), sums in lanes and
    the views between them: kernels of several kinds, each a compile job."""
    hidden = F.gelu(F.linear(x, w1, b1))
    normed = F.layer_norm(hidden, (hidden.shape[-1],), g, None)
    loss = F.mse_loss(F.tanh(normed) @ w2.T, y)
    loss.backward()
    return loss, w1.grad, b1.grad, w2.grad, g.grad


def inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(16, 12), (16, 4), (24, 12), (24,), (4, 24), (24,)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


class _Count(event.Listener):
    def __init__(self) -> None:
        self.compiles = 0

    def on_start(self, data) -> None:
        self.compiles += 1

    def on_end(self, data) -> None:
        pass


def _compile(cache, monkeypatch, workers: str, native: bool = False):
    """The step compiled with ``workers`` pool processes; by numba unless ``native`` (the pool compiles
    what the native translator does not cover: BENDC_NATIVE=0 makes every kernel such a job)."""
    monkeypatch.setenv("BENDC_COMPILE_WORKERS", workers)
    monkeypatch.setenv("BENDC_NATIVE", "1" if native else "0")
    compiled = bendc.jit(step, leaves=LEAVES, target="cpu", cache_dir=str(cache))
    return compiled, compiled(*inputs())


def test_native_kernels_compile_in_this_process_and_give_numbas_bits(tmp_path, monkeypatch, caplog):
    """Native compiles take milliseconds: never sent to a worker, whatever BENDC_COMPILE_WORKERS says."""
    monkeypatch.setenv("BENDC_LOG", "compile")
    with caplog.at_level(logging.INFO, logger="bendc"):
        native, got = _compile(tmp_path / "native", monkeypatch, "1", native=True)
    kernels = [r.getMessage() for r in caplog.records if "s  k_" in r.getMessage()]
    assert kernels and all("[main, native]" in line for line in kernels), kernels
    assert all("LLVM" in line for line in kernels), kernels  # the native phases: translate, LLVM, load
    _, expected = _compile(tmp_path / "numba", monkeypatch, "0")
    for a, b, name in zip(got, expected, ["loss", "w1", "b1", "w2", "g"]):
        assert_bitwise(a, b, name)


def test_native_kernels_compiled_by_workers_give_the_bits_of_serial_ones(tmp_path, monkeypatch, caplog):
    """From NATIVE_POOL_FROM_JOBS jobs (here: any) the native compiles are shared with a worker, which
    writes its signed objects into the cache this process loads them from."""
    monkeypatch.setattr(compile_pool, "NATIVE_POOL_FROM_JOBS", 1)
    monkeypatch.setenv("BENDC_LOG", "compile")
    with caplog.at_level(logging.INFO, logger="bendc"):
        pooled, got = _compile(tmp_path / "pooled", monkeypatch, "1", native=True)
    kernels = [r.getMessage() for r in caplog.records if "s  k_" in r.getMessage()]
    assert any("[worker 1, native]" in line for line in kernels), kernels
    serial, expected = _compile(tmp_path / "serial", monkeypatch, "0", native=True)
    for a, b, name in zip(got, expected, ["loss", "w1", "b1", "w2", "g"]):
        assert_bitwise(a, b, name)
    for a, b in zip(pooled(*inputs(1)), serial(*inputs(1))):
        assert_bitwise(a, b, "second inputs")


def test_worker_compiled_kernels_give_the_bits_of_serial_ones(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("BENDC_LOG", "compile")
    with caplog.at_level(logging.INFO, logger="bendc"):
        pooled, got = _compile(tmp_path / "pooled", monkeypatch, "1")
    profile = [r.getMessage() for r in caplog.records if "compile profile" in r.getMessage() or "s  k_" in r.getMessage()]
    assert profile and profile[0].startswith("compile profile of step: ") and "on 2 processes" in profile[0], profile
    kernels = profile[1:]
    assert any("[worker 1]" in line for line in kernels), kernels  # the pool was used
    assert any("[main]" in line for line in kernels), kernels      # and this process took jobs too
    seconds = [float(line.split()[0]) for line in kernels]
    assert seconds == sorted(seconds, reverse=True)  # slowest first
    # numba's phases, from the worker too (a phase under 5 ms is left out of a line)
    assert all("typing" in line or "lowering" in line for line in kernels), kernels
    serial, expected = _compile(tmp_path / "serial", monkeypatch, "0")
    for a, b, name in zip(got, expected, ["loss", "w1", "b1", "w2", "g"]):
        assert_bitwise(a, b, name)
    for a, b in zip(pooled(*inputs(1)), serial(*inputs(1))):
        assert_bitwise(a, b, "second inputs")


def test_the_dry_run_types_every_kernel_of_the_first_call(tmp_path, monkeypatch):
    """After the build, the first call compiles nothing: the recorded types are the call's."""
    monkeypatch.setenv("BENDC_COMPILE_WORKERS", "0")
    monkeypatch.setenv("BENDC_NATIVE", "0")  # numba's compile events: what is counted here
    count = _Count()
    compiled = bendc.jit(step, leaves=LEAVES, target="cpu", cache_dir=str(tmp_path))
    original = compile_pool.precompile
    calls = []

    def watched(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(True)
        event.register("numba:compile", count)  # from here on: the bind and the first call

    monkeypatch.setattr("bendc.compile.precompile", watched)
    try:
        compiled(*inputs())
    finally:
        if calls:
            event.unregister("numba:compile", count)
    assert calls and count.compiles == 0, f"{count.compiles} functions compiled at the first call"


def test_a_failing_worker_leaves_its_jobs_to_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_pool, "worker_command", lambda: ["python3", "-c", "import sys; sys.exit(3)"])
    _, got = _compile(tmp_path / "failing", monkeypatch, "1")
    monkeypatch.setenv("BENDC_COMPILE_WORKERS", "0")
    reference = bendc.jit(step, leaves=LEAVES, target="reference")(*inputs())
    for a, b in zip(got, reference):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_few_jobs_stay_in_this_process(monkeypatch):
    started = []
    monkeypatch.setattr(compile_pool.subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("started"))
    jobs = [compile_pool.Job("/nonexistent.py", "k_0", "kernel", (), 1)] * (compile_pool.POOL_FROM_JOBS - 1)
    outcomes, workers = compile_pool.compile_all(jobs, workers=8)
    assert workers == 0 and not started
    assert all(o.where == "main" and o.error for o in outcomes)  # the missing file: left to the first call


@pytest.mark.parametrize("value, expected", [("0", 0), ("3", 3), ("", None)])
def test_worker_count_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("BENDC_COMPILE_WORKERS", value)
    count = compile_pool.worker_count()
    assert count == expected if expected is not None else count >= 0
