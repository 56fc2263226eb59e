"""Train a small decoder-only language model with bendc: a token embedding
(index_select), LayerNorm, rotary embeddings, causal grouped-query attention,
a GELU MLP, cross-entropy and an Adam update of every parameter, all in one
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
import sys
import time

import numpy as np

import bendc
import bendc.functional as F

BATCH, CONTEXT, MODEL, HEADS, KV_HEADS, FEED_FORWARD = 8, 32, 32, 4, 2, 64
HEAD_DIM = MODEL // HEADS
PARAMS = ("emb", "ln1_w", "ln1_b", "wq", "wk", "wv", "wo", "ln2_w", "ln2_b", "w1", "w2", "lnf_w", "lnf_b",
          "head")


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


def _spec(shapes: dict[str, tuple[int, ...]], suffix: str = "") -> str:
    return " ".join(f"{name}=f32[{','.join(map(str, shape))}]{suffix}" for name, shape in shapes.items())


_SHAPES = param_shapes(len(VOCAB))
# Default shapes for `bendc compile examples/transformer.py:train_step` (no --shapes).
EXAMPLE_SHAPES = " ".join([
    f"tokens=i64[{BATCH},{CONTEXT}] targets=i64[{BATCH},{CONTEXT}]",
    f"cos=f32[{CONTEXT},{HEAD_DIM // 2}] sin=f32[{CONTEXT},{HEAD_DIM // 2}] step=i64[]",
    _spec(_SHAPES, ":leaf"),
    _spec({f"m_{name}": shape for name, shape in _SHAPES.items()}),
    _spec({f"v_{name}": shape for name, shape in _SHAPES.items()}),
])


def forward(tokens, cos, sin, emb, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2, lnf_w, lnf_b, head):
    """Logits (batch * context, vocab) of one pre-norm decoder block."""
    batch, context = tokens.shape
    x = F.index_select(emb, 0, tokens.reshape(batch * context)).reshape(batch, context, MODEL)
    h = F.layer_norm(x, (MODEL,), ln1_w, ln1_b)
    q = F.linear(h, wq).reshape(batch, context, HEADS, HEAD_DIM).transpose(1, 2)
    k = F.linear(h, wk).reshape(batch, context, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = F.linear(h, wv).reshape(batch, context, KV_HEADS, HEAD_DIM).transpose(1, 2)
    q, k = F.rope(q, cos, sin), F.rope(k, cos, sin)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(attended.transpose(1, 2).reshape(batch, context, HEADS * HEAD_DIM), wo)
    h = F.layer_norm(x, (MODEL,), ln2_w, ln2_b)
    x = x + F.linear(F.gelu(F.linear(h, w1)), w2)
    h = F.layer_norm(x, (MODEL,), lnf_w, lnf_b)
    return F.linear(h, head).reshape(batch * context, head.shape[0])


@bendc.jit(leaves=PARAMS)
def train_step(tokens, targets, cos, sin, step,
               emb, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2, lnf_w, lnf_b, head,
               m_emb, m_ln1_w, m_ln1_b, m_wq, m_wk, m_wv, m_wo, m_ln2_w, m_ln2_b, m_w1, m_w2, m_lnf_w,
               m_lnf_b, m_head,
               v_emb, v_ln1_w, v_ln1_b, v_wq, v_wk, v_wv, v_wo, v_ln2_w, v_ln2_b, v_w1, v_w2, v_lnf_w,
               v_lnf_b, v_head, lr=3e-3):
    """One training step: the loss, then (param, m, v) for every parameter in PARAMS order."""
    params = (emb, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2, lnf_w, lnf_b, head)
    firsts = (m_emb, m_ln1_w, m_ln1_b, m_wq, m_wk, m_wv, m_wo, m_ln2_w, m_ln2_b, m_w1, m_w2, m_lnf_w,
              m_lnf_b, m_head)
    seconds = (v_emb, v_ln1_w, v_ln1_b, v_wq, v_wk, v_wv, v_wo, v_ln2_w, v_ln2_b, v_w1, v_w2, v_lnf_w,
               v_lnf_b, v_head)
    logits = forward(tokens, cos, sin, *params)
    loss = F.cross_entropy(logits, targets.reshape(targets.shape[0] * targets.shape[1]))
    loss.backward()
    updates = [F.adam_step(p, p.grad, m, v, step, lr) for p, m, v in zip(params, firsts, seconds)]
    return (loss, *(value for update in updates for value in update))


# ------------------------------------------------------------------ data and set-up
def encode(text: str) -> np.ndarray:
    index = {char: position for position, char in enumerate(VOCAB)}
    return np.array([index[char] for char in text], dtype=np.int64)


def rope_tables(context: int = CONTEXT, head_dim: int = HEAD_DIM, base: float = 10000.0):
    """cos and sin (context, head_dim / 2) of the rotary embedding."""
    frequencies = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(np.arange(context), frequencies)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def init_params(seed: int = 0) -> list[np.ndarray]:
    """Normal(0, 0.02) matrices, LayerNorm weights of one and biases of zero."""
    rng = np.random.default_rng(seed)
    params = []
    for name, shape in _SHAPES.items():
        if name.endswith("_w"):
            params.append(np.ones(shape, np.float32))
        elif name.endswith("_b"):
            params.append(np.zeros(shape, np.float32))
        else:
            params.append((0.02 * rng.standard_normal(shape)).astype(np.float32))
    return params


def batches(data: np.ndarray, seed: int = 1):
    """Random windows of CONTEXT + 1 characters: inputs and next-character targets."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - CONTEXT - 1, size=BATCH)
        windows = np.stack([data[s:s + CONTEXT + 1] for s in starts])
        yield windows[:, :-1], windows[:, 1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    # data parallel (bendc.distributed): mpiexec -n 2 .venv/bin/python examples/transformer.py --data-parallel
    parser.add_argument("--data-parallel", action="store_true",
                        help="under mpiexec -n N: each rank takes 1/N of every batch, gradients averaged")
    args = parser.parse_args(argv)

    step_fn = train_step if args.target == "auto" else bendc.jit(train_step.fn, leaves=PARAMS, target=args.target)
    rank, ranks = bendc.distributed.init() if args.data_parallel else (0, 1)
    if args.data_parallel:
        step_fn = bendc.jit(train_step.fn, leaves=PARAMS, target=args.target, data_parallel=True)
        if rank != 0:  # rank 0 prints
            import os

            sys.stdout = open(os.devnull, "w")
        print(f"data parallel: {ranks} ranks, {BATCH // ranks} sequences of every batch of {BATCH} each")
    shard = slice(rank * BATCH // ranks, (rank + 1) * BATCH // ranks)
    data = encode(TEXT)
    cos, sin = rope_tables()
    params = init_params()
    firsts = [np.zeros_like(p) for p in params]
    seconds = [np.zeros_like(p) for p in params]
    print(f"bendc {bendc.__version__}: a {MODEL}-wide decoder block ({HEADS} heads, {KV_HEADS} key/value heads) "
          f"on the Zen of Python ({len(TEXT)} characters, {len(VOCAB)} symbols), target {step_fn.resolved_target}")
    start = time.perf_counter()
    first_loss = loss = None
    stream = batches(data)
    for index in range(args.steps):
        tokens, targets = next(stream)
        tokens, targets = tokens[shard], targets[shard]
        loss, *updates = step_fn(tokens, targets, cos, sin, np.array(index + 1, np.int64),
                                 *params, *firsts, *seconds)
        params, firsts, seconds = updates[0::3], updates[1::3], updates[2::3]
        loss = float(np.asarray(loss.copy_to_host() if hasattr(loss, "copy_to_host") else loss))
        if args.data_parallel:  # the whole batch's loss: the mean of the ranks' (equal shares)
            loss = float(bendc.distributed.average(loss))
        first_loss = loss if first_loss is None else first_loss
        if index % 25 == 0 or index == args.steps - 1:
            print(f"step {index:4d}  loss {loss:.4f}")
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s; loss {first_loss:.4f} -> {loss:.4f}")
    if not loss < first_loss:
        print("the loss did not fall", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
