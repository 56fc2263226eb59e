"""Data-parallel training on two ranks of this machine (mpiexec from the venv, loopback only).

Each test runs tests/distributed/mpi_worker.py under ``mpiexec -n 2`` with a timeout: a hang fails
the test instead of stalling the suite. Skipped, with the reason, where the ``distributed`` extra
(mpi4py, mpich) is not installed.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from mpi_launch import ROOT, WORKER, run_ranks
import mpi_worker as worker

# Two ranks on batches of 4 against one process on the batch of 8: the same gradients up to the
# order of the float32 sums (each rank's mean over 4, then the ranks' mean, vs one mean over 8),
# after three SGD steps.
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("distributed-cache"))


def torch_sgd_steps(steps: int) -> list[np.ndarray]:
    """The worker's three SGD steps in torch eager, in one process on the whole batch."""
    x, y, params = worker.problem()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    tensors = [torch.from_numpy(p.copy()).requires_grad_() for p in params]
    for _ in range(steps):
        w1, b1, w2, b2 = tensors
        h = torch.relu(torch.nn.functional.linear(x, w1, b1))
        loss = torch.nn.functional.mse_loss(torch.nn.functional.linear(h, w2, b2), y)
        loss.backward()
        with torch.no_grad():
            tensors = [(t - 0.1 * t.grad).requires_grad_() for t in tensors]
    return [t.detach().numpy() for t in tensors]


@pytest.mark.parametrize("reduction", ["ordered", "native"])
def test_two_ranks_end_every_step_bit_identical_and_match_one_process(reduction, cache_dir, tmp_path):
    """``ordered`` (the default): gathered and summed in rank order; ``native``: MPI's Iallreduce."""
    result = run_ranks(2, [str(WORKER), "train", cache_dir, str(tmp_path)], env={"BENDC_ALLREDUCE": reduction})
    assert result.returncode == 0, result.stdout + result.stderr  # the worker checks bit-identity per step
    saved = np.load(tmp_path / "params.npz")
    params = [saved[f"arr_{k}"] for k in range(4)]
    for got, want in zip(params, torch_sgd_steps(worker.STEPS)):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    report = (tmp_path / "report.txt").read_text()
    assert "[bucket] bucket 1:" in report  # the tiny cap makes two buckets
    assert "collective all_reduce_b0:" in report and "between start and wait" in report


def test_a_rank_that_raises_on_step_3_stops_every_rank(cache_dir, tmp_path):
    result = run_ranks(2, [str(WORKER), "raise", cache_dir, str(tmp_path)], env={"BENDC_COLLECTIVE_TIMEOUT": "60"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "rank 1 fails on purpose at step 3" in output
    assert "rank 1 of 2 raised RuntimeError; aborting every rank" in output
    assert not (tmp_path / "params.npz").exists()


def test_a_rank_that_dies_on_step_3_stops_every_rank(cache_dir, tmp_path):
    """mpiexec ends the job when a rank exits (rank 0, waiting on the all-reduce, is killed) and
    returns a failing status; rank 0's own timeout (60 s here) is never reached. The status is the
    dead rank's 3, or 9 (SIGKILL) when hydra reaps the rank it killed first (seen once in a loaded
    full-suite run): which of the two hydra reports is its choice, not bendc's."""
    result = run_ranks(2, [str(WORKER), "dies", cache_dir, str(tmp_path)], env={"BENDC_COLLECTIVE_TIMEOUT": "60"})
    output = result.stdout + result.stderr
    assert result.returncode in (3, 9), output
    assert "got no answer" not in output and "DistributedError" not in output, output
    assert not (tmp_path / "params.npz").exists()


def test_a_rank_that_stops_answering_is_named_after_the_timeout(cache_dir, tmp_path):
    result = run_ranks(2, [str(WORKER), "stuck", cache_dir, str(tmp_path)], env={"BENDC_COLLECTIVE_TIMEOUT": "3"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "DistributedError" in output and "rank 0 of 2: the all_reduce of bucket" in output
    assert "got no answer from every rank within 3 s" in output


def test_ranks_tracing_different_shapes_are_named_at_the_first_step(cache_dir, tmp_path):
    result = run_ranks(2, [str(WORKER), "mismatch", cache_dir, str(tmp_path)])
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "DistributedError" in output and "the ranks run different programs" in output
    assert "rank 0: mlp_step(x f32[4,6], y f32[4,3]" in output
    assert "rank 1: mlp_step(x f32[3,6], y f32[3,3]" in output


def _losses(output: str) -> list[float]:
    return [float(line.split()[-1]) for line in output.splitlines() if line.startswith("step ")]


def test_transformer_example_trains_on_two_ranks_like_one_process(capsys):
    """examples/transformer.py --data-parallel: each rank on 4 of the 8 sequences of every batch,
    the printed loss (the ranks' mean) within 1e-3 of the one-process run at every printed step."""
    sys.path.insert(0, str(ROOT / "examples"))
    import transformer

    assert transformer.main(["--steps", "30", "--target", "cpu"]) == 0
    single = _losses(capsys.readouterr().out)
    result = run_ranks(2, [str(ROOT / "examples" / "transformer.py"), "--data-parallel", "--steps", "30",
                           "--target", "cpu"], timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "data parallel: 2 ranks, 4 sequences of every batch of 8 each" in result.stdout
    parallel = _losses(result.stdout)
    assert len(parallel) == len(single) == 3  # steps 0, 25, 29: printed by rank 0 only
    np.testing.assert_allclose(parallel, single, atol=1e-3)
    assert parallel[-1] < parallel[0]
