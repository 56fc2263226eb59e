"""A process that compiles (or loads) one small training step into a cache folder and checks it.

    python tests/cache_worker.py CACHE_DIR [--wait-for FILE] [--verify] [--hold SECONDS]

Used by tests/test_cache_safety.py: several of these run at once on one cache folder, or one is
killed part-way through a cold compile. ``--wait-for`` spins until FILE exists (a start barrier)
so that processes start compiling together, after their imports. ``--verify`` compares the
results with the reference target. The last line printed is ``ok compiled|cache``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402

LEAVES = ("w1", "b1", "w2")


def step(x, y, w1, b1, w2):
    hidden = F.relu(F.linear(x, w1, b1))
    loss = F.mse_loss(hidden @ w2.T, y)
    loss.backward()
    return loss, F.sgd_step(w1, w1.grad, 0.1), F.sgd_step(b1, b1.grad, 0.1), w2.grad


def inputs(seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(16, 12), (16, 4), (24, 12), (24,), (4, 24)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def compile_and_check(cache_dir: str, verify: bool) -> str:
    compiled = bendc.jit(step, leaves=LEAVES, target="cpu", cache_dir=cache_dir)
    args = inputs()
    got = compiled(*args)
    if verify:
        want = bendc.jit(step, leaves=LEAVES, target="reference")(*args)
        for index, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"output {index}")
    return "cache" if "[cache] loaded" in compiled.report() else "compiled"


def main(argv: list[str]) -> None:
    cache_dirs = [a for a in argv if not a.startswith("--")]
    if "--wait-for" in argv:
        barrier = argv[argv.index("--wait-for") + 1]
        cache_dirs.remove(barrier)
        print("ready", flush=True)
        while not os.path.exists(barrier):
            time.sleep(0.002)
    for cache_dir in cache_dirs:
        print("ok", compile_and_check(cache_dir, "--verify" in argv), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
