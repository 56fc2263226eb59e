"""One rank of a multi-rank test (tests/distributed/test_distributed.py runs it under mpiexec).

    mpi_worker.py SCENARIO CACHE_DIR OUT_DIR

``train``: three SGD steps of a tiny MLP, data-parallel, each rank on its shard of a fixed global
batch; after every step the ranks' parameters are gathered and must be bit-identical; rank 0
writes the final parameters, the compile report, and every rank's traffic and shard sizes
(traffic.json). ``raise``: rank 1 raises on step 3. ``dies``: rank 1 exits at step 3 without a
word. ``killed``: rank 1 is killed (SIGKILL) on step 3 in the middle of an exchange, its
reduce-scatter done and its all-gather not started. ``stuck``: rank 1 sleeps at step 3.
``mismatch``: rank 1 traces a batch of another shape.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import bendc
import bendc.distributed
import bendc.functional as F

GLOBAL_BATCH, FEATURES, HIDDEN, OUTPUTS, STEPS = 24, 6, 16, 3, 3  # 24 rows: 1, 2, 3, 4 or 8 ranks


def mlp_step(x, y, w1, b1, w2, b2):
    h = F.relu(F.linear(x, w1, b1))
    loss = F.mse_loss(F.linear(h, w2, b2), y)
    loss.backward()
    return loss, w1 - 0.1 * w1.grad, b1 - 0.1 * b1.grad, w2 - 0.1 * w2.grad, b2 - 0.1 * b2.grad


def problem(seed: int = 0):
    """The global batch and the initial parameters (every rank draws the same)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((GLOBAL_BATCH, FEATURES)).astype(np.float32)
    y = rng.standard_normal((GLOBAL_BATCH, OUTPUTS)).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) * 0.5
              for s in ((HIDDEN, FEATURES), (HIDDEN,), (OUTPUTS, HIDDEN), (OUTPUTS,))]
    return x, y, params


def main() -> int:
    scenario, cache_dir, out_dir = sys.argv[1:4]
    target = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    rank, size = bendc.distributed.init()
    from mpi4py import MPI
    from runtime import collective

    # bucket_mb small enough that the tiny model's gradients make two buckets (overlap is reported)
    step = bendc.jit(mlp_step, leaves=("w1", "b1", "w2", "b2"), target=target, cache_dir=cache_dir,
                     data_parallel=True, bucket_mb=0.0005)
    x, y, params = problem()
    shard = GLOBAL_BATCH // size
    if scenario == "mismatch" and rank == 1:
        shard -= 1
    xs, ys = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
    for number in range(1, STEPS + 1):
        if scenario == "raise" and rank == 1 and number == 3:
            raise RuntimeError("rank 1 fails on purpose at step 3")
        if scenario == "dies" and rank == 1 and number == 3:
            os._exit(3)  # no excepthook, no MPI_Abort: the launcher sees the rank go
        if scenario == "killed" and rank == 1 and number == 3:
            def killed(self, current):
                os.kill(os.getpid(), signal.SIGKILL)

            collective.Bucket._reduce_shard_and_gather = killed
        if scenario == "stuck" and rank == 1 and number == 3:
            time.sleep(600)  # alive but silent: rank 0's wait times out
        loss, *params = step(xs, ys, *params)
        gathered = MPI.COMM_WORLD.allgather(b"".join(np.ascontiguousarray(p).tobytes() for p in params))
        if any(other != gathered[0] for other in gathered):
            raise AssertionError(f"step {number}: the ranks' parameters differ")
    traffic = {**bendc.distributed.traffic(), "shards": [b.shards for b in collective._BUCKETS.values()]}
    traffics = MPI.COMM_WORLD.allgather(traffic)
    if rank == 0:
        with open(os.path.join(out_dir, "traffic.json"), "w") as stream:
            json.dump(traffics, stream)
        np.savez(os.path.join(out_dir, "params.npz"), *params)
        with open(os.path.join(out_dir, "report.txt"), "w") as stream:
            stream.write(step.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
