"""The mlp example as it was before it took pytrees: one positional parameter per array
(x, y, w1, b1, w2, b2) and a plain SGD update, on the example's data and initial parameters.
The ahead-of-time, profiler and tooling tests run it (flat parameters stay supported;
examples/mlp.py shows the pytree form).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import bendc
import bendc.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import mlp  # noqa: E402
from mlp import BATCH, CLASSES, FEATURES, HIDDEN, make_data  # noqa: E402,F401

# Default shapes for `bendc compile tests/flat_mlp.py:train_step` (no --shapes).
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


def init_params(seed: int = 1) -> list[np.ndarray]:
    """The example's initial parameters, in parameter order."""
    return list(mlp.init_params(seed).values())


def line_of(text: str) -> int:
    """The line number of this file's first line containing ``text`` (for tests of reported lines)."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if text in line)
