"""One rank of the data_parallel benchmark (bench/run.py --only data_parallel runs it under mpiexec).

    mpiexec -n N python bench/data_parallel.py RUNS BUCKET_MB [GLOBAL_BATCH]

The bench's MLP step (784-512-512-10, Adam) on a global batch of 256 (or GLOBAL_BATCH rows of
it) split across the ranks,
``data_parallel=True``. Prints one JSON line from rank 0: the median step time, beside the same
step on the same shard without the all-reduce (timed in alternating rounds), the standalone time
of the exchanges (each bucket started and waited on at once, no compute between), the time the
waits blocked, the share of the communication hidden behind compute:
1 - (step - step without all-reduce) / standalone exchange, within [0, 1], and the bytes rank 0
sent and received per step beside the gradient bytes (bendc.distributed.traffic; the ``ordered``
default moves 2 (N-1)/N times the gradients, ``allgather`` N-1 times, ``native`` is MPI's choice).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bendc  # noqa: E402
import bendc.distributed  # noqa: E402
from runtime import collective  # noqa: E402
from run import BATCH, LEAVES, interleaved_medians, median_time, mlp_inputs, mlp_step  # noqa: E402


def exchange_time(runs: int) -> float:
    """Median seconds of every bucket's exchange with nothing to overlap (start, then wait at once)."""
    buckets = list(collective._BUCKETS.values())
    arrays = [[np.zeros(shape, np.float32) for shape in b.shapes] for b in buckets]

    def exchange():
        for bucket, tensors in zip(buckets, arrays):
            bucket.start(*tensors)
            bucket.wait(*tensors)

    return median_time(exchange, runs)


def main() -> int:
    runs, bucket_mb = int(sys.argv[1]), float(sys.argv[2])
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else BATCH
    rank, size = bendc.distributed.init()
    x, y, *state = mlp_inputs()
    shard = slice(rank * rows // size, (rank + 1) * rows // size)
    x, y = x[shard], y[shard]
    step = bendc.jit(mlp_step, leaves=LEAVES, target="cpu", data_parallel=True, bucket_mb=bucket_mb)
    plain = bendc.jit(mlp_step, leaves=LEAVES, target="cpu")
    blocked = []

    def run(function, record):
        def train_step():
            out = function(x, y, *state)
            for index in range(6):
                state[index] = out[1 + 3 * index]
                state[6 + 2 * index] = out[2 + 3 * index]
                state[7 + 2 * index] = out[3 + 3 * index]
            if record:
                blocked.append(bendc.distributed.overlap()["blocked_s"])

        return train_step

    times = interleaved_medians({"parallel": run(step, True), "plain": run(plain, False)}, runs)
    waits = statistics.median(blocked[-runs:])
    communication = exchange_time(runs) if size > 1 else 0.0
    exposed = max(0.0, times["parallel"] - times["plain"])
    hidden = min(1.0, max(0.0, 1.0 - exposed / communication)) if communication > 0 else 0.0
    buckets = sum(1 for line in step.report().splitlines() if line.startswith("[bucket] bucket "))
    traffic = bendc.distributed.traffic()
    sent = traffic["bytes_sent"]
    if rank == 0:
        print(json.dumps({"ranks": size, "rows_per_rank": rows // size, "bucket_mb": bucket_mb, "buckets": buckets,
                          "step_ms": 1e3 * times["parallel"], "step_ms_without_all_reduce": 1e3 * times["plain"],
                          "blocked_ms": 1e3 * waits, "communication_ms": 1e3 * communication,
                          "hidden": hidden, "reduction": collective.reduction_mode(),
                          "gradient_bytes": traffic["gradient_bytes"], "bytes_sent_per_rank": sent,
                          "bytes_received_per_rank": traffic["bytes_received"],
                          "bytes_per_gradient_byte": None if sent is None else sent / traffic["gradient_bytes"]}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
