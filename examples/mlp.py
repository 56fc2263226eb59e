"""Train a small MLP classifier with bendc: forward, cross-entropy, backward
and an SGD update, all in one compiled step.

    python examples/mlp.py [--steps 300] [--target auto|reference|cpu|cuda]

The data are made here: points around ten random centres in 64 dimensions,
pushed through a fixed random tanh layer so that the classes are not
linearly separable.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import bendc
import bendc.functional as F

# Default shapes for `bendc compile examples/mlp.py:train_step` (no --shapes).
BATCH, FEATURES, HIDDEN, CLASSES = 64, 64, 128, 10
EXAMPLE_SHAPES = (
    f"x=f32[{BATCH},{FEATURES}] y=i64[{BATCH}] "
    f"w1=f32[{HIDDEN},{FEATURES}]:leaf b1=f32[{HIDDEN}]:leaf "
    f"w2=f32[{CLASSES},{HIDDEN}]:leaf b2=f32[{CLASSES}]:leaf"
)
LEAVES = ("w1", "b1", "w2", "b2")


@bendc.jit(leaves=LEAVES)
def train_step(x, y, w1, b1, w2, b2, lr=0.1):
    """One training step; returns the loss and the updated parameters."""
    hidden = F.relu(F.linear(x, w1, b1))
    logits = F.linear(hidden, w2, b2)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    return (
        loss,
        F.sgd_step(w1, w1.grad, lr),
        F.sgd_step(b1, b1.grad, lr),
        F.sgd_step(w2, w2.grad, lr),
        F.sgd_step(b2, b2.grad, lr),
    )


def make_data(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten noisy clusters, warped by a fixed random tanh layer."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    warp = rng.standard_normal((FEATURES, FEATURES)).astype(np.float32) / np.sqrt(FEATURES)
    labels = rng.integers(0, CLASSES, size=count)
    points = centres[labels] + 1.5 * rng.standard_normal((count, FEATURES)).astype(np.float32)
    return np.tanh(points @ warp).astype(np.float32), labels.astype(np.int64)


def init_params(seed: int = 1) -> list[np.ndarray]:
    """PyTorch's nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)

    def uniform(shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    return [uniform((HIDDEN, FEATURES), FEATURES), uniform((HIDDEN,), FEATURES),
            uniform((CLASSES, HIDDEN), HIDDEN), uniform((CLASSES,), HIDDEN)]


def accuracy(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    w1, b1, w2, b2 = (np.asarray(p) for p in params)  # device arrays (target cuda) come to the host
    logits = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    return float((logits.argmax(axis=1) == y).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args(argv)

    step = train_step if args.target == "auto" else bendc.jit(train_step.fn, leaves=LEAVES, target=args.target)
    x_all, y_all = make_data(5120)
    x_all, y_all, x_test, y_test = x_all[:4096], y_all[:4096], x_all[4096:], y_all[4096:]
    params = init_params()
    print(f"bendc {bendc.__version__}: training a {FEATURES}-{HIDDEN}-{CLASSES} MLP, "
          f"batch {BATCH}, target {step.resolved_target}")
    rng = np.random.default_rng(2)
    start = time.perf_counter()
    first_loss = None
    for index in range(args.steps):
        batch = rng.integers(0, len(x_all), size=BATCH)
        loss, *params = step(x_all[batch], y_all[batch], *params, lr=args.lr)
        loss = float(np.asarray(loss))
        first_loss = loss if first_loss is None else first_loss
        if index % 25 == 0 or index == args.steps - 1:
            print(f"step {index:4d}  loss {loss:.4f}")
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s; loss {first_loss:.4f} -> {loss:.4f}; "
          f"test accuracy {accuracy(params, x_test, y_test):.3f}")
    if not loss < first_loss:
        print("the loss did not fall", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
