"""The reductions beyond sum on the cuda target under numba's CUDA simulator, against the reference
interpreter and PyTorch (tests/cuda/reduce_programs.py; tiny shapes: a simulated thread costs
~170 us). Runs in its own process (tests/cuda/run_simulator.sh); skipped elsewhere."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import torch  # noqa: E402

from conftest import assert_close  # noqa: E402
from cuda_programs import jitted  # noqa: E402
from reduce_programs import PROGRAMS  # noqa: E402
from test_simulator import check_program, host  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-reduce-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program, cache_dir: str) -> None:
    check_program(program, cache_dir)


@pytest.mark.parametrize("name", ["ties_and_nans", "long_lines"])
def test_ties_and_nans_match_torch(name: str, cache_dir: str) -> None:
    (program,) = [p for p in PROGRAMS if p.name == name]
    (x,) = program.make_inputs(np.random.default_rng(0))
    got = [host(v) for v in jitted(program, "cuda", cache_dir)(x)]
    t = torch.from_numpy(x)
    values, indices = t.max(1)
    if name == "ties_and_nans":
        want = [values, indices, t.amin(1), t.argmin(1), t.max(), t.argmax(0, keepdim=True)]
    else:
        want = [values, indices, t.amin(1), t.argmin(1), t.max(), t.argmax(), t.amax(0, keepdim=True),
                t.logsumexp(1)]
    for position, (mine, theirs) in enumerate(zip(got, want)):
        theirs = theirs.numpy()
        if theirs.dtype == np.int64:
            assert mine.dtype == np.int64
            np.testing.assert_array_equal(mine, theirs, err_msg=f"output {position}")
        else:
            assert_close(mine, theirs, f"output {position}")


def test_gradients_match_torch(cache_dir: str) -> None:
    (program,) = [p for p in PROGRAMS if p.name == "moments"]
    x, w = program.make_inputs(np.random.default_rng(0))
    loss, grad, _, _ = (host(v) for v in jitted(program, "cuda", cache_dir)(x, w))
    tx, tw = torch.from_numpy(x), torch.from_numpy(w.copy()).requires_grad_()
    y = tx * tw
    want = (y.var(1) + y.std(0, correction=0).sum() + y.logsumexp(1) + y.logsumexp((0, 1))).sum() \
        + (y.cumsum(1) * tx).sum() + (y.cumsum(0) * tw).sum()
    want.backward()
    assert_close(loss, want.detach().numpy(), "loss", rtol=1e-5, atol=1e-5)
    assert_close(grad, tw.grad.numpy(), "grad", rtol=1e-5, atol=1e-5)
