"""Train a small decoder-only language model with bendc: a token embedding
(index_select), LayerNorm, rotary embeddings, causal grouped-query attention,
a GELU MLP, cross-entropy and an Adam update of every parameter (bendc.optim.adam
over a dict of parameters, with a cosine learning-rate schedule), all in one
compiled step.

    python examples/transformer.py [--steps 300] [--target auto|reference|cpu|cuda]

The text is the Zen of Python, which ships with Python (the ``this`` module
keeps it rot13-encoded); the model learns it character by character.
"""
from __future__ import annotations

import argparse
import ast
import codecs
import importlib.util
import math
import sys
import time

import numpy as np

import bendc
import bendc.functional as F

BATCH, CONTEXT, MODEL, HEADS, KV_HEADS, FEED_FORWARD = 8, 32, 32, 4, 2, 64
HEAD_DIM = MODEL // HEADS
LR = 3e-3


def zen_of_python() -> str:
    """The Zen of Python, read from the ``this`` module's source without importing it (it prints)."""
    with open(importlib.util.find_spec("this").origin, encoding="utf-8") as stream:
        module = ast.parse(stream.read())
    encoded = next(node.value.value for node in module.body
                   if isinstance(node, ast.Assign) and node.targets[0].id == "s")
    return codecs.decode(encoded, "rot13")


TEXT = zen_of_python()
VOCAB = sorted(set(TEXT))


def param_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    return {
        "emb": (vocab, MODEL), "ln1_w": (MODEL,), "ln1_b": (MODEL,),
        "wq": (HEADS * HEAD_DIM, MODEL), "wk": (KV_HEADS * HEAD_DIM, MODEL), "wv": (KV_HEADS * HEAD_DIM, MODEL),
        "wo": (MODEL, HEADS * HEAD_DIM), "ln2_w": (MODEL,), "ln2_b": (MODEL,),
        "w1": (FEED_FORWARD, MODEL), "w2": (MODEL, FEED_FORWARD), "lnf_w": (MODEL,), "lnf_b": (MODEL,),
        "head": (vocab, MODEL),
    }


_SHAPES = param_shapes(len(VOCAB))


def _spec(prefix: str, shapes: dict[str, tuple[int, ...]], suffix: str = "") -> str:
    return " ".join(f"{prefix}.{name}=f32[{','.join(map(str, shape))}]{suffix}" for name, shape in shapes.items())


# Default shapes for `bendc compile examples/transformer.py:train_step` (no --shapes): the pytree
# parameters by dotted path (params.emb, opt_state.exp_avg.emb, batch.0, rope.1, ...).
EXAMPLE_SHAPES = " ".join([
    _spec("params", _SHAPES, ":leaf"),
    "opt_state.step=f32[]", _spec("opt_state.exp_avg", _SHAPES), _spec("opt_state.exp_avg_sq", _SHAPES),
    f"batch.0=i64[{BATCH},{CONTEXT}] batch.1=i64[{BATCH},{CONTEXT}]",
    f"rope.0=f32[{CONTEXT},{HEAD_DIM // 2}] rope.1=f32[{CONTEXT},{HEAD_DIM // 2}] lr=f32[]",
])


def forward(params, tokens, cos, sin):
    """Logits (batch * context, vocab) of one pre-norm decoder block."""
    p = params
    batch, context = tokens.shape
    x = F.index_select(p["emb"], 0, tokens.reshape(batch * context)).reshape(batch, context, MODEL)
    h = F.layer_norm(x, (MODEL,), p["ln1_w"], p["ln1_b"])
    q = F.linear(h, p["wq"]).reshape(batch, context, HEADS, HEAD_DIM).transpose(1, 2)
    k = F.linear(h, p["wk"]).reshape(batch, context, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = F.linear(h, p["wv"]).reshape(batch, context, KV_HEADS, HEAD_DIM).transpose(1, 2)
    q, k = F.rope(q, cos, sin), F.rope(k, cos, sin)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(attended.transpose(1, 2).reshape(batch, context, HEADS * HEAD_DIM), p["wo"])
    h = F.layer_norm(x, (MODEL,), p["ln2_w"], p["ln2_b"])
    x = x + F.linear(F.gelu(F.linear(h, p["w1"])), p["w2"])
    h = F.layer_norm(x, (MODEL,), p["lnf_w"], p["lnf_b"])
    return F.linear(h, p["head"]).reshape(batch * context, p["head"].shape[0])


@bendc.jit(leaves=("params",), dynamic=("lr",))
def train_step(params, opt_state, batch, rope, lr=LR):
    """One training step: (loss, new params, new optimizer state). ``params`` and ``opt_state``
    are dicts (bendc.optim.init_adam's), ``batch`` (tokens, targets), ``rope`` (cos, sin); ``lr``
    is traced (dynamic), so the learning-rate schedule never recompiles."""
    tokens, targets = batch
    cos, sin = rope
    logits = forward(params, tokens, cos, sin)
    loss = F.cross_entropy(logits, targets.reshape(targets.shape[0] * targets.shape[1]))
    loss.backward()
    grads = bendc.tree.map(lambda p: p.grad, params)
    params, opt_state = bendc.optim.adam(params, grads, opt_state, lr)
    return loss, params, opt_state


def learning_rate(index: int, steps: int) -> float:
    """A cosine decay from LR to LR / 10 over the run (each value a traced lr: one compile)."""
    return LR * (0.55 + 0.45 * math.cos(math.pi * index / max(steps - 1, 1)))


# ------------------------------------------------------------------ data and set-up
def encode(text: str) -> np.ndarray:
    index = {char: position for position, char in enumerate(VOCAB)}
    return np.array([index[char] for char in text], dtype=np.int64)


def rope_tables(context: int = CONTEXT, head_dim: int = HEAD_DIM, base: float = 10000.0):
    """cos and sin (context, head_dim / 2) of the rotary embedding."""
    frequencies = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(np.arange(context), frequencies)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Normal(0, 0.02) matrices, LayerNorm weights of one and biases of zero, by name."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in _SHAPES.items():
        if name.endswith("_w"):
            params[name] = np.ones(shape, np.float32)
        elif name.endswith("_b"):
            params[name] = np.zeros(shape, np.float32)
        else:
            params[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return params


def batches(data: np.ndarray, seed: int = 1):
    """Random windows of CONTEXT + 1 characters: inputs and next-character targets."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - CONTEXT - 1, size=BATCH)
        windows = np.stack([data[s:s + CONTEXT + 1] for s in starts])
        yield windows[:, :-1], windows[:, 1:]


def train(step_fn, steps: int, target: str, rank: int = 0, ranks: int = 1) -> int:
    """The training loop around ``step_fn`` (a train_step): prints the loss every 25 steps. With
    ``ranks`` > 1 (data parallel) this rank takes its 1/ranks share of every batch."""
    shard = slice(rank * BATCH // ranks, (rank + 1) * BATCH // ranks)
    data = encode(TEXT)
    rope = rope_tables()
    params = init_params()
    opt_state = bendc.optim.init_adam(params)
    print(f"bendc {bendc.__version__}: a {MODEL}-wide decoder block ({HEADS} heads, {KV_HEADS} key/value heads) "
          f"on the Zen of Python ({len(TEXT)} characters, {len(VOCAB)} symbols), target {target}")
    start = time.perf_counter()
    first_loss = loss = None
    stream = batches(data)
    for index in range(steps):
        tokens, targets = next(stream)
        batch = (tokens[shard], targets[shard])
        loss, params, opt_state = step_fn(params, opt_state, batch, rope, learning_rate(index, steps))
        loss = float(np.asarray(loss.copy_to_host() if hasattr(loss, "copy_to_host") else loss))
        if ranks > 1:  # the whole batch's loss: the mean of the ranks' (equal shares)
            loss = float(bendc.distributed.average(loss))
        first_loss = loss if first_loss is None else first_loss
        if index % 25 == 0 or index == steps - 1:
            print(f"step {index:4d}  loss {loss:.4f}")
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.2f} s; loss {first_loss:.4f} -> {loss:.4f}")
    if not loss < first_loss:
        print("the loss did not fall", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    # data parallel (bendc.distributed): mpiexec -n 2 .venv/bin/python examples/transformer.py --data-parallel
    parser.add_argument("--data-parallel", action="store_true",
                        help="under mpiexec -n N: each rank takes 1/N of every batch, gradients averaged")
    args = parser.parse_args(argv)

    step_fn = train_step if args.target == "auto" else bendc.jit(train_step.fn, leaves=("params",),
                                                                 dynamic=("lr",), target=args.target)
    rank, ranks = bendc.distributed.init() if args.data_parallel else (0, 1)
    if args.data_parallel:
        step_fn = bendc.jit(train_step.fn, leaves=("params",), dynamic=("lr",), target=args.target,
                            data_parallel=True)
        if rank != 0:  # rank 0 prints
            import os

            sys.stdout = open(os.devnull, "w")
        print(f"data parallel: {ranks} ranks, {BATCH // ranks} sequences of every batch of {BATCH} each")
    return train(step_fn, args.steps, step_fn.resolved_target, rank, ranks)


if __name__ == "__main__":
    sys.exit(main())
