"""Train a small CNN written as torch modules, with nn.BatchNorm2d, through bendc.jit unchanged: the
module's forward runs in bendc.functional_call with its parameters and its buffers (running_mean,
running_var, num_batches_tracked), which a train-mode step updates as torch does and returns for the
next step; model.eval() switches the evaluation to the running statistics (the training flag is
guarded: the step traces again). AdamW updates every parameter, in the same compiled step.

    python examples/cnn_bn.py [--steps 100] [--target auto|reference|cpu|cuda]

The data are examples/cnn.py's seven-segment digits.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as TF

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bendc  # noqa: E402
import bendc.optim  # noqa: E402
from cnn import CLASSES, SIZE, host, make_data, summary  # noqa: E402

BATCH, LR = 32, 3e-3


class Net(nn.Module):
    """conv -> BatchNorm2d -> ReLU -> max pool, twice, then a linear head: plain torch code. The convs have
    no bias, as usual before a BatchNorm (which subtracts the mean: a bias's gradient there is 0 but for
    rounding, which Adam would turn into updates of about lr)."""

    def __init__(self, channels: tuple[int, int] = (8, 16)) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels[0], 3, padding=1, bias=False), nn.BatchNorm2d(channels[0]), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels[0], channels[1], 3, padding=1, bias=False), nn.BatchNorm2d(channels[1]), nn.ReLU(),
            nn.MaxPool2d(2))
        self.head = nn.Linear(channels[1] * (SIZE // 4) ** 2, CLASSES)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def make_model() -> Net:
    torch.manual_seed(0)
    return Net()


def make_steps(model: Net, target: str = "auto"):
    def train_step(params, buffers, opt_state, x, y):
        state = {**params, **buffers}  # a train-mode forward updates the traced buffers in place
        loss = TF.cross_entropy(bendc.functional_call(model, state, x), y)
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        params, opt_state = bendc.optim.adamw(params, grads, opt_state, LR)
        return loss, params, {name: state[name] for name in buffers}, opt_state

    def predict(params, buffers, x):
        return bendc.functional_call(model, {**params, **buffers}, x)

    options = {} if target == "auto" else {"target": target}
    return bendc.jit(train_step, leaves=("params",), **options), bendc.jit(predict, **options)


def train(steps: int, target: str = "auto", log_every: int = 25, model: Net | None = None):
    """Train from make_model(); returns the losses, parameters and buffers."""
    model = model if model is not None else make_model()
    train_step, _ = make_steps(model, target)
    params, buffers = bendc.params(model), bendc.buffers(model)
    opt_state = bendc.optim.init_adam(params)
    x_all, y_all = make_data(2048)
    rng = np.random.default_rng(2)
    model.train()
    losses = []
    for index in range(steps):
        batch = rng.integers(0, len(x_all), size=BATCH)
        loss, params, buffers, opt_state = train_step(params, buffers, opt_state, x_all[batch], y_all[batch])
        losses.append(float(host(loss)))
        if log_every and (index % log_every == 0 or index == steps - 1):
            print(f"step {index:4d}  loss {losses[-1]:.4f}")
    return losses, params, buffers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    args = parser.parse_args(argv)
    model = make_model()
    print(f"bendc {bendc.__version__}: a torch CNN with BatchNorm2d on {SIZE}x{SIZE} seven-segment digits, "
          f"batch {BATCH}")
    start = time.perf_counter()
    losses, params, buffers = train(args.steps, args.target, model=model)
    elapsed = time.perf_counter() - start
    _, predict = make_steps(model, args.target)
    model.eval()  # the running statistics from here on
    x_test, y_test = make_data(256, seed=7)
    predicted = host(predict(params, buffers, x_test)).argmax(axis=1)
    return summary(args.steps, elapsed, losses, float((predicted == y_test).mean()), "test accuracy (eval mode)")


if __name__ == "__main__":
    sys.exit(main())
