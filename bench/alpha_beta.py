"""Loopback latency and bandwidth (the alpha-beta model) between two MPI ranks of this machine.

    mpiexec -n 2 python bench/alpha_beta.py [RUNS]

Rank 0 and rank 1 ping-pong float32 messages of 4 bytes to 16 MiB (``Send``/``Recv``, mpi4py);
the one-way time of a message is half the median round trip. ``alpha`` (seconds per message) is
the median one-way time of the messages up to 1 KiB; ``beta`` (seconds per byte; 1 / beta is the
bandwidth) the least-squares slope of the messages of 256 KiB and more through that intercept
(a plain line through every size lets the large messages' noise set the intercept). Rank 0 prints one JSON line with
both, the fitted bandwidth in GB/s, and every size's measured time. bench/scaling.py uses them.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np


def one_way_seconds(comm, nbytes: int, runs: int) -> float:
    """Half the median round trip of a ``nbytes`` message between ranks 0 and 1."""
    message = np.zeros(max(1, nbytes // 4), np.float32)
    rank = comm.Get_rank()
    times = []
    for run in range(runs + 2):  # two warm-up round trips
        comm.Barrier()
        start = time.perf_counter()
        if rank == 0:
            comm.Send(message, dest=1)
            comm.Recv(message, source=1)
        elif rank == 1:
            comm.Recv(message, source=0)
            comm.Send(message, dest=0)
        if run >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) / 2


def fit(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """``alpha`` and ``beta`` of ``seconds ~ alpha + beta * bytes``: alpha from the small
    messages, beta from the large ones (least squares through alpha)."""
    alpha = statistics.median(t for b, t in zip(sizes, seconds) if b <= 1024)
    large = [(b, t - alpha) for b, t in zip(sizes, seconds) if b >= 256 * 1024]
    beta = sum(b * t for b, t in large) / sum(b * b for b, _ in large)
    return alpha, beta


def main() -> int:
    from mpi4py import MPI

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("bench/alpha_beta.py runs on exactly 2 ranks: mpiexec -n 2")
    sizes = [4 << (2 * k) for k in range(12)]  # 4 B .. 16 MiB
    seconds = [one_way_seconds(comm, size, runs if size < 1 << 22 else max(5, runs // 4)) for size in sizes]
    alpha, beta = fit(sizes, seconds)
    small = seconds[0]  # the latency a 4-byte message sees, beside the fit's intercept
    if comm.Get_rank() == 0:
        print(json.dumps({"alpha_s": alpha, "beta_s_per_byte": beta, "bandwidth_gb_s": 1e-9 / beta,
                          "latency_4_bytes_s": small, "sizes": sizes, "one_way_s": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
