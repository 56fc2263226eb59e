"""Decoder-only language models for bench/run.py, written once for bendc and for torch.

`decoder_forward` uses only names that bendc.functional and the `TorchOps` shim both have,
and tensor methods the two share, so the same model runs on either. `decoder_program`
builds a bendc training step (forward, cross-entropy, backward, Adam on every parameter)
with one named parameter per array (bendc.jit binds named parameters only).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DecoderConfig:
    layers: int
    batch: int
    context: int
    model: int
    heads: int
    kv_heads: int
    feed_forward: int
    vocab: int
    fused_qkv: bool  # one (q, k, v) projection split by slicing, as a user's GPT often writes it
    rope: bool

    @property
    def head_dim(self) -> int:
        return self.model // self.heads

    def describe(self) -> str:
        return (f"{self.layers} layers B={self.batch} T={self.context} D={self.model} H={self.heads} "
                f"Hkv={self.kv_heads} FF={self.feed_forward} vocab={self.vocab}"
                f"{' fused qkv' if self.fused_qkv else ''}{' rope' if self.rope else ''}")


TRANSFORMER = DecoderConfig(layers=4, batch=4, context=64, model=64, heads=4, kv_heads=2, feed_forward=128,
                            vocab=50, fused_qkv=False, rope=True)
GPT = DecoderConfig(layers=2, batch=16, context=64, model=128, heads=4, kv_heads=4, feed_forward=512,
                    vocab=65, fused_qkv=True, rope=False)


def param_shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    d, dh = config.model, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"emb": (config.vocab, d)}
    for layer in range(config.layers):
        p = f"l{layer}_"
        shapes[p + "ln1_w"], shapes[p + "ln1_b"] = (d,), (d,)
        if config.fused_qkv:
            shapes[p + "wqkv"] = ((config.heads + 2 * config.kv_heads) * dh, d)
        else:
            shapes[p + "wq"] = (config.heads * dh, d)
            shapes[p + "wk"] = (config.kv_heads * dh, d)
            shapes[p + "wv"] = (config.kv_heads * dh, d)
        shapes[p + "wo"] = (d, config.heads * dh)
        shapes[p + "ln2_w"], shapes[p + "ln2_b"] = (d,), (d,)
        shapes[p + "w1"], shapes[p + "w2"] = (config.feed_forward, d), (d, config.feed_forward)
    shapes["lnf_w"], shapes["lnf_b"], shapes["head"] = (d,), (d,), (config.vocab, d)
    return shapes


def decoder_forward(ops, config: DecoderConfig, tokens, cos, sin, params: dict):
    """Logits (batch * context, vocab) of a pre-norm decoder (LayerNorm, causal attention, GELU MLP)."""
    batch, context = tokens.shape
    d, dh, heads, kv_heads = config.model, config.head_dim, config.heads, config.kv_heads
    x = ops.index_select(params["emb"], 0, tokens.reshape(batch * context)).reshape(batch, context, d)
    for layer in range(config.layers):
        p = f"l{layer}_"
        h = ops.layer_norm(x, (d,), params[p + "ln1_w"], params[p + "ln1_b"])
        if config.fused_qkv:
            qkv = ops.linear(h, params[p + "wqkv"])
            q = qkv[:, :, :heads * dh]
            k = qkv[:, :, heads * dh:(heads + kv_heads) * dh]
            v = qkv[:, :, (heads + kv_heads) * dh:]
        else:
            q, k, v = (ops.linear(h, params[p + name]) for name in ("wq", "wk", "wv"))
        q = q.reshape(batch, context, heads, dh).transpose(1, 2)
        k = k.reshape(batch, context, kv_heads, dh).transpose(1, 2)
        v = v.reshape(batch, context, kv_heads, dh).transpose(1, 2)
        if config.rope:
            q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
        attended = ops.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
        x = x + ops.linear(attended.transpose(1, 2).reshape(batch, context, heads * dh), params[p + "wo"])
        h = ops.layer_norm(x, (d,), params[p + "ln2_w"], params[p + "ln2_b"])
        x = x + ops.linear(ops.gelu(ops.linear(h, params[p + "w1"])), params[p + "w2"])
    h = ops.layer_norm(x, (d,), params["lnf_w"], params["lnf_b"])
    return ops.linear(h, params["head"]).reshape(batch * context, config.vocab)


class TorchOps:
    """The few functional names decoder_forward uses, on torch tensors."""

    def __init__(self) -> None:
        import torch
        import torch.nn.functional as TF
        self.torch = torch
        self.linear, self.layer_norm, self.gelu = TF.linear, TF.layer_norm, TF.gelu
        self.scaled_dot_product_attention = TF.scaled_dot_product_attention
        self.index_select = torch.index_select

    def rope(self, x, cos, sin):
        """bendc's F.rope: cat(x1*cos - x2*sin, x2*cos + x1*sin) over the halves of the last dim."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def decoder_program(config: DecoderConfig, lr: float = 3e-3):
    """(step function for bendc.jit, parameter names). The step takes tokens, targets, cos, sin,
    step, the parameters, their first and second moments, and returns the loss, then
    (param, m, v) for each parameter."""
    import bendc.functional as F

    names = list(param_shapes(config))
    arguments = ["tokens", "targets", "cos", "sin", "step", *names, *(f"m_{n}" for n in names),
                 *(f"v_{n}" for n in names)]
    source = (f"def decoder_step({', '.join(arguments)}, lr={lr!r}):\n"
              f"    return _body(locals())\n")

    def body(values: dict):
        params = {name: values[name] for name in names}
        logits = decoder_forward(F, config, values["tokens"], values["cos"], values["sin"], params)
        targets = values["targets"]
        loss = F.cross_entropy(logits, targets.reshape(targets.shape[0] * targets.shape[1]))
        loss.backward()
        results = [loss]
        for name in names:
            results.extend(F.adam_step(params[name], params[name].grad, values[f"m_{name}"],
                                       values[f"v_{name}"], values["step"], values["lr"]))
        return tuple(results)

    namespace: dict = {"_body": body}
    exec(compile(source, __file__, "exec"), namespace)  # named parameters: bendc binds no *args
    return namespace["decoder_step"], names


def rope_tables(context: int, head_dim: int, base: float = 10000.0):
    frequencies = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(np.arange(context), frequencies)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def decoder_inputs(config: DecoderConfig, seed: int = 0) -> dict:
    """tokens, targets, cos, sin and Normal(0, 0.02) parameters (LayerNorm weights one, biases zero)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(config).items():
        if name.endswith("_w"):
            params[name] = np.ones(shape, np.float32)
        elif name.endswith("_b"):
            params[name] = np.zeros(shape, np.float32)
        else:
            params[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    tokens = rng.integers(0, config.vocab, (config.batch, config.context))
    targets = rng.integers(0, config.vocab, (config.batch, config.context))
    cos, sin = rope_tables(config.context, config.head_dim)
    return {"tokens": tokens, "targets": targets, "cos": cos, "sin": sin, "params": params}
