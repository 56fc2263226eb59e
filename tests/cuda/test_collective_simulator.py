"""The all-reduce on the cuda target under numba's CUDA simulator (tests/cuda/run_simulator.sh).

A two-rank mirror world (every rank sends the same gradients) runs both ways the cuda runtime
hands device buffers to a backend: staged through host memory, and as device arrays (the
CUDA-aware path, where the rank-ordered sum runs as a kernel). Not verified on a GPU.
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
from runtime import collective  # noqa: E402


class Mirror(collective.Backend):
    """Rank 0 of two ranks that send the same message; ``device_buffers``: takes device arrays."""

    name = "mirror"
    rank, size = 0, 2

    def __init__(self, device_buffers: bool) -> None:
        self.device_buffers = device_buffers

    def start_allgather(self, send, receive):
        for row in range(self.size):
            if isinstance(receive, np.ndarray):
                receive[row] = send
            else:
                receive[row].copy_to_device(send)
        return None

    def start_alltoallv(self, send, send_counts, receive, receive_counts):
        """The reduce-scatter's exchange: every rank sends this message, so run k of ``receive``
        (rank k's run for rank 0) is the message's first run."""
        self.message = send
        receive = receive.reshape(-1)
        for k, low in enumerate(collective.displacements(receive_counts)):
            _copy(receive[low:low + receive_counts[k]], send[:send_counts[0]])
        return None

    def start_allgatherv(self, send, receive, counts):
        """Rank k's reduced shard: this rank's own where k is 0, else shard k of the message, which is
        what the mean of two equal messages gives (exactly: float64 sum and halving of equal values)."""
        for k, low in enumerate(collective.displacements(counts)):
            _copy(receive[low:low + counts[k]], send if k == self.rank else self.message[low:low + counts[k]])
        return None

    def test(self, handle):
        return True


def _copy(destination, source) -> None:
    """destination[:] = source for host arrays and (simulated) device arrays alike."""
    if isinstance(destination, np.ndarray):
        destination[:] = source if isinstance(source, np.ndarray) else source.copy_to_host()
    else:
        destination.copy_to_device(source)


def step(x, w, b):
    loss = ((x * w + b) * (x * w + b)).sum()
    loss.backward()
    return loss, w - 0.5 * w.grad, b - 0.5 * b.grad


@pytest.fixture(params=[False, True], ids=["staged", "device-buffers"])
def mirror(request):
    collective.use_world(Mirror(request.param))
    yield request.param
    collective.use_world(collective.LocalBackend())


def test_data_parallel_step_on_device_arrays_matches_the_reference(mirror, tmp_path):
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    cuda_step = bendc.jit(step, leaves=("w", "b"), target="cuda", cache_dir=str(tmp_path), data_parallel=True)
    got = [np.asarray(v.copy_to_host()).reshape(np.shape(want)) for v, want in zip(cuda_step(x, w, b), (0, w, b))]
    collective.use_world(collective.LocalBackend())  # the mean of two equal gradients is the gradient
    want = bendc.jit(step, leaves=("w", "b"), target="reference")(x, w, b)
    np.testing.assert_allclose(got[0].reshape(()), want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    transport = "directly" if mirror else "staged through host memory"
    assert f"collective: " in cuda_step.report() and "all_reduce_b0_start" in cuda_step.report()
    assert transport in cuda_step.report()
