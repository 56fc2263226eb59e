"""Issue 22 on the cuda target under numba's CUDA simulator: a lifted constant (a captured torch tensor of
more values than a literal holds) passed after the caller's inputs, against the reference interpreter;
``x.device`` is ``torch.device("cuda", 0)`` there and creation functions take it back. Runs in its own
process (tests/cuda/run_simulator.sh); skipped elsewhere."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import torch  # noqa: E402

import bendc  # noqa: E402
from conftest import assert_bitwise  # noqa: E402
from test_simulator import host  # noqa: E402

MASK = torch.tril(torch.ones(65, 64))  # 4160 values: a lifted constant


def masked(x):
    positions = torch.arange(x.shape[1], device=x.device) * 1.0  # x.device is cuda's: taken back
    return x.masked_fill(MASK == 0, 0.0) * positions + MASK


def test_lifted_constant_and_device_on_cuda(tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((65, 64)).astype(np.float32)
    step = bendc.jit(masked, target="cuda", cache_dir=str(tmp_path))
    assert_bitwise(host(step(x)), bendc.jit(masked, target="reference")(x), "masked")
    assert step.ir("traced").count(" const=") == 2

    seen = []

    def device_of(x):
        seen.append((x.device, x.is_cuda))
        return torch.zeros(x.shape, device=x.device) + x.cuda()

    assert_bitwise(host(bendc.jit(device_of, target="cuda", cache_dir=str(tmp_path))(x[:2, :3])), x[:2, :3])
    assert seen == [(torch.device("cuda", 0), True)]
