"""Train a small MLP classifier with bendc: forward, cross-entropy, backward
and an SGD-with-momentum update (bendc.optim.sgd over a dict of parameters),
all in one compiled step.

    python examples/mlp.py [--steps 300] [--target auto|reference|cpu|cuda] [--lr 0.05]

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

BATCH, FEATURES, HIDDEN, CLASSES = 64, 64, 128, 10
LR, MOMENTUM = 0.05, 0.9
# Default shapes for `bendc compile examples/mlp.py:train_step` (no --shapes): the pytree
# parameters by dotted path.
EXAMPLE_SHAPES = (
    f"params.w1=f32[{HIDDEN},{FEATURES}]:leaf params.b1=f32[{HIDDEN}]:leaf "
    f"params.w2=f32[{CLASSES},{HIDDEN}]:leaf params.b2=f32[{CLASSES}]:leaf "
    f"opt_state.step=f32[] opt_state.momentum_buffer.w1=f32[{HIDDEN},{FEATURES}] "
    f"opt_state.momentum_buffer.b1=f32[{HIDDEN}] opt_state.momentum_buffer.w2=f32[{CLASSES},{HIDDEN}] "
    f"opt_state.momentum_buffer.b2=f32[{CLASSES}] "
    f"batch.0=f32[{BATCH},{FEATURES}] batch.1=i64[{BATCH}]"
)
LEAVES = ("params",)


@bendc.jit(leaves=LEAVES)
def train_step(params, opt_state, batch, lr=LR):
    """One training step: (loss, new params, new optimizer state); params and the SGD state are dicts."""
    x, y = batch
    hidden = F.relu(F.linear(x, params["w1"], params["b1"]))
    logits = F.linear(hidden, params["w2"], params["b2"])
    loss = F.cross_entropy(logits, y)
    loss.backward()
    grads = bendc.tree.map(lambda p: p.grad, params)
    params, opt_state = bendc.optim.sgd(params, grads, opt_state, lr, momentum=MOMENTUM)
    return loss, params, opt_state


def make_data(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten noisy clusters, warped by a fixed random tanh layer."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    warp = rng.standard_normal((FEATURES, FEATURES)).astype(np.float32) / np.sqrt(FEATURES)
    labels = rng.integers(0, CLASSES, size=count)
    points = centres[labels] + 1.5 * rng.standard_normal((count, FEATURES)).astype(np.float32)
    return np.tanh(points @ warp).astype(np.float32), labels.astype(np.int64)


def init_params(seed: int = 1) -> dict[str, np.ndarray]:
    """PyTorch's nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)

    def uniform(shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    return {"w1": uniform((HIDDEN, FEATURES), FEATURES), "b1": uniform((HIDDEN,), FEATURES),
            "w2": uniform((CLASSES, HIDDEN), HIDDEN), "b2": uniform((CLASSES,), HIDDEN)}


def init_state(params: dict[str, np.ndarray]) -> dict:
    """SGD with momentum's state: the step count and a zero momentum buffer per parameter."""
    return bendc.optim.init_sgd(params, momentum=MOMENTUM)


def accuracy(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    w1, b1, w2, b2 = (np.asarray(params[name]) for name in ("w1", "b1", "w2", "b2"))  # device arrays come home
    logits = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    return float((logits.argmax(axis=1) == y).mean())


def train(step, steps: int, lr: float) -> int:
    """The training loop around ``step`` (a train_step): prints the loss every 25 steps."""
    x_all, y_all = make_data(5120)
    x_all, y_all, x_test, y_test = x_all[:4096], y_all[:4096], x_all[4096:], y_all[4096:]
    params = init_params()
    opt_state = init_state(params)
    print(f"bendc {bendc.__version__}: training a {FEATURES}-{HIDDEN}-{CLASSES} MLP, "
          f"batch {BATCH}, target {step.resolved_target}")
    rng = np.random.default_rng(2)
    start = time.perf_counter()
    first_loss = None
    for index in range(steps):
        batch = rng.integers(0, len(x_all), size=BATCH)
        loss, params, opt_state = step(params, opt_state, (x_all[batch], y_all[batch]), lr=lr)
        loss = float(np.asarray(loss))
        first_loss = loss if first_loss is None else first_loss
        if index % 25 == 0 or index == steps - 1:
            print(f"step {index:4d}  loss {loss:.4f}")
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.2f} s; loss {first_loss:.4f} -> {loss:.4f}; "
          f"test accuracy {accuracy(params, x_test, y_test):.3f}")
    if not loss < first_loss:
        print("the loss did not fall", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    parser.add_argument("--lr", type=float, default=LR)
    args = parser.parse_args(argv)

    step = train_step if args.target == "auto" else bendc.jit(train_step.fn, leaves=LEAVES, target=args.target)
    return train(step, args.steps, args.lr)


if __name__ == "__main__":
    sys.exit(main())
