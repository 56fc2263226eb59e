"""Dropout, the activations and the losses on the cuda target under numba's CUDA simulator.

Runs in its own pytest process (``tests/cuda/run_simulator.sh``); skipped elsewhere. Tiny shapes:
a simulated thread costs ~170 us. The dropout mask drawn on cuda is the cpu kernels' and the
reference's, bit for bit (one Philox-4x32-10 template inlined on both targets).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402
from conftest import assert_bitwise, assert_close  # noqa: E402
from cuda_programs import OPS_RANDOM_PROGRAMS, Program, jitted, report_kinds  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


def host(value) -> np.ndarray:
    assert hasattr(value, "copy_to_host"), f"cuda outputs are device arrays, got {type(value).__name__}"
    return value.copy_to_host()


def as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("program", OPS_RANDOM_PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program: Program, cache_dir: str) -> None:
    inputs = program.make_inputs(np.random.default_rng(0))
    step = jitted(program, "cuda", cache_dir)
    got = as_tuple(step(*inputs))
    want = as_tuple(jitted(program, "reference")(*inputs))
    assert len(got) == len(want)
    for index, (mine, theirs) in enumerate(zip(got, want)):
        what = f"{program.name} output {index}"
        if index in program.bitwise:
            assert_bitwise(host(mine), theirs, what)
        else:
            assert_close(host(mine), theirs, what, rtol=2e-5, atol=2e-6)
    assert program.kinds <= report_kinds(step.report()), step.report()


@pytest.mark.parametrize("p", [0.2, 0.5, 1.0])
def test_cuda_draws_the_cpu_mask(p: float, cache_dir: str) -> None:
    """The same program on cuda and cpu: the same dropped elements and the same kept values."""
    x = np.random.default_rng(1).uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)

    def program(x, s):
        return F.dropout(x, p, seed=s), F.dropout(x, p, seed=s) * 2.0  # one offset per call

    seed = np.array(-987654321, np.int64)
    on_cuda = [host(v) for v in bendc.jit(program, target="cuda", cache_dir=cache_dir)(x, seed)]
    on_cpu = [np.asarray(v) for v in bendc.jit(program, target="cpu", cache_dir=cache_dir)(x, seed)]
    for got, want in zip(on_cuda, on_cpu):
        assert_bitwise(got, want, f"dropout p={p}: cuda vs cpu")
    if p < 1.0:
        assert not np.array_equal(on_cuda[0] != 0, on_cuda[1] != 0), "two calls draw two masks"
