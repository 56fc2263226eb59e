"""Train a small convolutional classifier with bendc: two blocks of conv -> GroupNorm -> SiLU ->
max pool, dropout, a linear head, cross-entropy and an AdamW update of every parameter (a pytree), all in
one compiled step.

    python examples/cnn.py [--steps 150] [--target auto|reference|cpu|cuda]

The digits are drawn here: seven-segment glyphs of random stroke width, shifted about a 16x16
image, with noise. The test digits are drawn the same way from another seed.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import bendc
import bendc.functional as F
import bendc.optim

BATCH, SIZE, CLASSES = 64, 16, 10
CHANNELS = (8, 16)   # the two conv blocks' output channels
GROUPS = (2, 4)      # GroupNorm groups of each block
HIDDEN = CHANNELS[1] * (SIZE // 4) ** 2  # features after two 2x2 pools
DROPOUT = 0.1        # on the head's input while training


def param_shapes() -> dict[str, tuple[int, ...]]:
    return {
        "conv1_w": (CHANNELS[0], 1, 3, 3), "conv1_b": (CHANNELS[0],),
        "norm1_w": (CHANNELS[0],), "norm1_b": (CHANNELS[0],),
        "conv2_w": (CHANNELS[1], CHANNELS[0], 3, 3), "conv2_b": (CHANNELS[1],),
        "norm2_w": (CHANNELS[1],), "norm2_b": (CHANNELS[1],),
        "head_w": (CLASSES, HIDDEN), "head_b": (CLASSES,),
    }


def _types(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    return {name: f"f32[{','.join(map(str, shape))}]" for name, shape in shapes.items()}


# Default shapes for `bendc compile examples/cnn.py:train_step` (no --shapes): pytrees of types.
EXAMPLE_SHAPES = {
    "params": _types(param_shapes()),
    "opt_state": {"step": "f32[]", "exp_avg": _types(param_shapes()), "exp_avg_sq": _types(param_shapes())},
    "x": f"f32[{BATCH},1,{SIZE},{SIZE}]",
    "y": f"i64[{BATCH}]",
    "seed": "i64[]",
}


def block(x, params, number: int):
    """conv 3x3 (same size) -> GroupNorm -> SiLU -> 2x2 max pool."""
    h = F.conv2d(x, params[f"conv{number}_w"], params[f"conv{number}_b"], padding=1)
    h = F.group_norm(h, GROUPS[number - 1], params[f"norm{number}_w"], params[f"norm{number}_b"])
    return F.max_pool2d(F.silu(h), 2)


def forward(params, x, seed=None, p=DROPOUT):
    """Logits (batch, classes). Given a seed (training), dropout on the head's input: the mask comes
    from the seed (a 0-d int64 input of the step) and the backward recomputes it."""
    h = block(block(x, params, 1), params, 2)
    h = h.reshape(h.shape[0], HIDDEN)
    if seed is not None:
        h = F.dropout(h, p, seed=seed)
    return F.linear(h, params["head_w"], params["head_b"])


@bendc.jit(leaves=("params",))
def train_step(params, opt_state, x, y, seed=None, lr=1e-2, p=DROPOUT):
    """One training step: the loss, the updated parameters and the optimizer state. ``seed`` (a new
    0-d int64 array each step) turns dropout on; without one the step has none."""
    loss = F.cross_entropy(forward(params, x, seed, p), y)
    loss.backward()
    grads = bendc.tree.map(lambda p: p.grad, params)
    params, opt_state = bendc.optim.adamw(params, grads, opt_state, lr)
    return loss, params, opt_state


@bendc.jit
def predict(params, x):
    return forward(params, x)


# ------------------------------------------------------------------ data and set-up
# Seven segments (a..g) as boxes on a 9 (rows) x 5 (columns) grid, and the segments of each digit.
SEGMENTS = {"a": (0, 0, 1, 5), "b": (0, 4, 5, 5), "c": (4, 4, 9, 5), "d": (8, 0, 9, 5),
            "e": (4, 0, 9, 1), "f": (0, 0, 5, 1), "g": (4, 0, 5, 5)}
DIGITS = ("abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg")


def glyph(digit: int, rng: np.random.Generator) -> np.ndarray:
    """A (SIZE, SIZE) image of one digit: scaled segments, shifted, with noise."""
    scale = rng.uniform(1.0, 1.4)
    thick = rng.uniform(0.8, 1.6)
    top = rng.uniform(0.0, SIZE - 9 * scale)
    left = rng.uniform(0.0, SIZE - 5 * scale)
    rows, columns = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5
    image = np.zeros((SIZE, SIZE), np.float32)
    for segment in DIGITS[digit]:
        r0, c0, r1, c1 = SEGMENTS[segment]
        # a segment is a box widened to the stroke thickness
        r0, r1 = top + r0 * scale, top + r1 * scale
        c0, c1 = left + c0 * scale, left + c1 * scale
        inside = ((rows >= r0 - thick / 2 + 0.5) & (rows <= r1 + thick / 2 - 0.5)
                  & (columns >= c0 - thick / 2 + 0.5) & (columns <= c1 + thick / 2 - 0.5))
        image = np.maximum(image, inside.astype(np.float32))
    return image + rng.normal(0.0, 0.3, size=(SIZE, SIZE)).astype(np.float32)


def make_data(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=count)
    images = np.stack([glyph(int(label), rng) for label in labels])[:, None]
    return images.astype(np.float32), labels.astype(np.int64)


def init_params(seed: int = 1) -> dict[str, np.ndarray]:
    """PyTorch's Conv2d / Linear initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)); GroupNorm ones and zeros."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes().items():
        if name.startswith("norm"):
            params[name] = (np.ones if name.endswith("_w") else np.zeros)(shape, np.float32)
            continue
        weight = param_shapes()[name[:-1] + "w"]
        bound = 1.0 / np.sqrt(np.prod(weight[1:]))
        params[name] = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return params


def host(value) -> np.ndarray:
    return np.asarray(value.copy_to_host() if hasattr(value, "copy_to_host") else value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args(argv)

    if args.target == "auto":
        step_fn, predict_fn = train_step, predict
    else:
        step_fn = bendc.jit(train_step.fn, leaves=("params",), target=args.target)
        predict_fn = bendc.jit(predict.fn, target=args.target)
    x_all, y_all = make_data(4096)
    x_test, y_test = make_data(512, seed=7)
    params = init_params()
    opt_state = bendc.optim.init_adam(params)
    print(f"bendc {bendc.__version__}: a CNN ({CHANNELS[0]} and {CHANNELS[1]} channels, GroupNorm, SiLU, max pool) "
          f"on {SIZE}x{SIZE} seven-segment digits, batch {BATCH}, target {step_fn.resolved_target}")
    rng = np.random.default_rng(2)
    start = time.perf_counter()
    losses = []
    for index in range(args.steps):
        batch = rng.integers(0, len(x_all), size=BATCH)
        seed = np.array(index, np.int64)  # a new dropout mask each step
        loss, params, opt_state = step_fn(params, opt_state, x_all[batch], y_all[batch], seed, lr=args.lr)
        losses.append(float(host(loss)))
        if index % 25 == 0 or index == args.steps - 1:
            print(f"step {index:4d}  loss {losses[-1]:.4f}")
    elapsed = time.perf_counter() - start
    predicted = host(predict_fn(params, x_test)).argmax(axis=1)
    return summary(args.steps, elapsed, losses, float((predicted == y_test).mean()))


def summary(steps: int, elapsed: float, losses: list[float], accuracy: float, what: str = "test accuracy") -> int:
    """Print the run's numbers; the exit status: 0 when the loss fell."""
    print(f"{steps} steps in {elapsed:.2f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f}; {what} {accuracy:.3f}")
    fell = losses[-1] < losses[0]
    if not fell:
        print("the loss did not fall", file=sys.stderr)
    return 0 if fell else 1

if __name__ == "__main__":
    sys.exit(main())
