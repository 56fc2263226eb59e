"""A scaling model of data-parallel training (alpha-beta), checked against loopback runs here.

    python bench/scaling.py [--runs N] [--json]

Measures, on this machine: the loopback latency and bandwidth between two ranks
(bench/alpha_beta.py), the rate of the rank-ordered float64 sum (``gamma``, seconds per element
and rank summed), and bench/data_parallel.py (the bench's MLP: 784-512-512-10, Adam, 669,706
parameters, one 25 MB bucket) on 1, 2, 4 and 8 ranks with the global batch of 256 split, and on
one rank with 32 rows (the per-rank compute of the weak-scaling table). Then prints two tables:

1. the loopback runs, each beside the model's prediction for it: the exchange alone
   (communication_ms) against ``t_comm`` with the loopback alpha and beta, and the step against
   the step without the all-reduce plus ``t_comm`` (the bucket waits before the optimizer, so
   nothing overlaps the exchange for this model);
2. predicted step time and efficiency (compute / step) at 8, 64 and 1,024 ranks of 32 rows each
   on a stated network (100 Gb/s, 5 us a message), for the three schemes of BENDC_ALLREDUCE.

Cost of one exchange of a bucket of B bytes on N ranks (alpha: seconds a message, beta: seconds
a byte, gamma: seconds per float32 element summed):

- ``native`` (MPICH's Iallreduce for large messages: reduce-scatter by recursive halving, then
  all-gather by recursive doubling, Rabenseifner): 2 log2(N) alpha + 2 (N-1)/N B beta + (N-1)/N (B/4) gamma
- ``allgather`` (a ring Iallgather of every message, then every rank sums N rows):
  (N-1) alpha + (N-1) B beta + N (B/4) gamma
- ``ordered`` (a pairwise Ialltoallv to the shards' owners, the owner sums N copies of its shard,
  a ring Iallgatherv): 2 (N-1) alpha + 2 (N-1)/N B beta + (B/4) gamma

A model, not a measurement: it leaves out contention (every rank's messages share a switch),
the library's choice of algorithm by size, and the host's staging copies.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NETWORK = {"name": "100 Gb/s, 5 us a message", "alpha_s": 5e-6, "beta_s_per_byte": 8 / 100e9}
MLP_PARAMETERS = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
SCHEMES = ("native", "allgather", "ordered")
ROWS_PER_RANK = 32  # the weak-scaling table: every rank keeps 32 rows whatever N


def exchange_seconds(scheme: str, nbytes: int, ranks: int, alpha: float, beta: float, gamma: float) -> float:
    """The model's seconds for one exchange of ``nbytes`` on ``ranks`` ranks (see the module doc)."""
    if ranks == 1:
        return 0.0
    elements = nbytes / 4
    if scheme == "native":
        return 2 * math.log2(ranks) * alpha + 2 * (ranks - 1) / ranks * nbytes * beta + \
            (ranks - 1) / ranks * elements * gamma
    if scheme == "allgather":
        return (ranks - 1) * alpha + (ranks - 1) * nbytes * beta + ranks * elements * gamma
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes * beta + elements * gamma


def bytes_per_rank(scheme: str, nbytes: int, ranks: int) -> float:
    """What one rank sends per exchange (as runtime/collective.py counts it; native as the model)."""
    return (ranks - 1) * nbytes if scheme == "allgather" else 2 * (ranks - 1) / ranks * nbytes


def measure_gamma(elements: int = 1 << 20, ranks: int = 8) -> float:
    """Seconds per element and rank of runtime.collective.ordered_reduce (float64 sum, one rounding)."""
    from runtime.collective import ordered_reduce

    gathered = np.ones((ranks, elements), np.float32)
    out = np.empty(elements, np.float32)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        ordered_reduce(gathered, "mean", ranks, out)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / (ranks * elements)


def run_ranks(ranks: int, arguments: list[str]) -> dict:
    """Rank 0's JSON line of ``mpiexec -n ranks python arguments...`` (loopback, one thread a rank)."""
    from bendc.distributed import LOOPBACK_ENV, loopback_command

    env = {**os.environ, **LOOPBACK_ENV, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    output = subprocess.run(loopback_command(ranks, arguments), capture_output=True, text=True, env=env,
                            timeout=1800, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(runs: int) -> dict:
    link = run_ranks(2, [str(ROOT / "bench" / "alpha_beta.py"), str(max(runs, 10))])
    data_parallel = str(ROOT / "bench" / "data_parallel.py")
    loopback = {ranks: run_ranks(ranks, [data_parallel, str(runs), "25"]) for ranks in (1, 2, 4, 8)}
    weak = run_ranks(1, [data_parallel, str(runs), "25", str(ROWS_PER_RANK)])
    return {"link": link, "gamma_s": measure_gamma(), "loopback": loopback, "compute_32_rows_ms": weak["step_ms"]}


def tables(measured: dict) -> str:
    link, gamma = measured["link"], measured["gamma_s"]
    alpha, beta = link["alpha_s"], link["beta_s_per_byte"]
    nbytes = 4 * MLP_PARAMETERS
    lines = [f"Loopback (this machine): alpha {1e6 * alpha:.1f} us, beta {1e9 * beta:.3f} ns/B "
             f"({link['bandwidth_gb_s']:.2f} GB/s), gamma {1e9 * gamma:.2f} ns per element and rank; "
             f"the bench MLP, {MLP_PARAMETERS:,} parameters ({nbytes / 2 ** 20:.2f} MiB of gradients), "
             "global batch 256 split, `ordered`.", "",
             "| ranks | bytes sent / gradient bytes | exchange measured | exchange predicted | "
             "step measured | step predicted (step without all-reduce + exchange) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for ranks, run in sorted(measured["loopback"].items(), key=lambda item: int(item[0])):
        ranks = int(ranks)
        comm = 1e3 * exchange_seconds("ordered", nbytes, ranks, alpha, beta, gamma)
        ratio = run["bytes_per_gradient_byte"]
        lines.append(f"| {ranks} | {ratio:.3f} | {run['communication_ms']:.2f} ms | {comm:.2f} ms | "
                     f"{run['step_ms']:.1f} ms | {run['step_ms_without_all_reduce'] + comm:.1f} ms |")
    compute = measured["compute_32_rows_ms"]
    network = NETWORK
    lines += ["", f"Predicted on {network['name']}: {ROWS_PER_RANK} rows a rank (compute {compute:.1f} ms, "
              "measured here on one rank), the exchange after the backward (nothing overlaps it); "
              "step time and efficiency (compute / step):", "",
              "| ranks | " + " | ".join(f"{s} step | {s} eff. | {s} bytes/rank" for s in SCHEMES) + " |",
              "| --- |" + " --- | --- | --- |" * len(SCHEMES)]
    for ranks in (8, 64, 1024):
        cells = []
        for scheme in SCHEMES:
            comm = 1e3 * exchange_seconds(scheme, nbytes, ranks, network["alpha_s"], network["beta_s_per_byte"],
                                          gamma)
            cells.append(f"{compute + comm:.1f} ms | {compute / (compute + comm):.0%} | "
                         f"{bytes_per_rank(scheme, nbytes, ranks) / 2 ** 20:.1f} MiB")
        lines.append(f"| {ranks} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed steps per measurement")
    parser.add_argument("--json", action="store_true", help="end with the measurements as one JSON line")
    args = parser.parse_args(argv)
    measured = measure(args.runs)
    print(tables(measured))
    if args.json:
        print(json.dumps(measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
