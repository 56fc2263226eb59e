"""Train a small GPT written the way public GPT code is written (nanoGPT's model.py, shrunk), unchanged,
inside ``bendc.jit``: nn.Modules, ``idx.device`` and ``torch.arange`` positions, the token embedding tied
to the output head, ``x[:, [-1], :]`` for the logits of generation, and AdamW with
``configure_optimizers``' decay groups (weight decay for the matrices, none for biases and norms).

    python examples/gpt.py [--steps 300] [--target auto|reference|cpu|cuda]

The corpus is the Zen of Python (the ``this`` module keeps it rot13-encoded); the model learns it
character by character, then writes a few lines from a prompt.
"""
from __future__ import annotations

import argparse
import ast
import codecs
import importlib.util
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

import bendc


# ------------------------------------------------------------------ the model, as nanoGPT writes it
class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # only the last position, for generation
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay):
        """nanoGPT's decay groups, as names: every 2-D parameter decays, biases and norms do not."""
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [pn for pn, p in param_dict.items() if p.dim() >= 2]
        nodecay = [pn for pn, p in param_dict.items() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]


# ------------------------------------------------------------------ data and training with bendc
def zen_of_python() -> str:
    """The Zen of Python, read from the ``this`` module's source without importing it (it prints)."""
    with open(importlib.util.find_spec("this").origin, encoding="utf-8") as stream:
        module = ast.parse(stream.read())
    encoded = next(node.value.value for node in module.body
                   if isinstance(node, ast.Assign) and node.targets[0].id == "s")
    return codecs.decode(encoded, "rot13")


TEXT = zen_of_python()
CHARS = sorted(set(TEXT))
DATA = np.array([CHARS.index(c) for c in TEXT], np.int64)
BATCH, LR, MIN_LR, WEIGHT_DECAY, WARMUP = 8, 1e-2, 1e-3, 0.1, 20
CONFIG = GPTConfig(vocab_size=len(CHARS))


def make_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CONFIG)


def get_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, len(DATA) - CONFIG.block_size - 1, size=BATCH)
    x = np.stack([DATA[s:s + CONFIG.block_size] for s in starts])
    y = np.stack([DATA[s + 1:s + 1 + CONFIG.block_size] for s in starts])
    return x, y


def learning_rate(step: int, steps: int) -> float:
    """nanoGPT's schedule: linear warmup, then cosine decay to MIN_LR."""
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = (step - WARMUP) / max(steps - WARMUP, 1)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


MODEL = make_model()
GROUPS = MODEL.configure_optimizers(WEIGHT_DECAY)


def init_state(params: dict) -> list[dict]:
    """AdamW's state per decay group."""
    return [bendc.optim.init_adam({name: params[name] for name in group["params"]}) for group in GROUPS]


@bendc.jit(leaves=("params",), dynamic=("lr",))
def train_step(params, opt_state, batch, lr):
    """One step: the model's own forward and loss, backward, AdamW per decay group."""
    idx, targets = batch
    logits, loss = bendc.functional_call(MODEL, params, idx, targets)
    loss.backward()
    new_params, new_state = dict(params), []
    for group, state in zip(GROUPS, opt_state):
        names = group["params"]
        updated, state = bendc.optim.adamw({n: params[n] for n in names}, {n: params[n].grad for n in names},
                                           state, lr, betas=(0.9, 0.99), weight_decay=group["weight_decay"])
        new_params.update(updated)
        new_state.append(state)
    return loss, new_params, new_state


@bendc.jit
def next_logits(params, idx):
    """The logits of the token after idx: the model's generation path (``x[:, [-1], :]``)."""
    logits, _ = bendc.functional_call(MODEL, params, idx)
    return logits[:, -1, :]


def generate(params: dict, prompt: str, count: int, target: str) -> str:
    """Greedy decoding over the last block_size characters (one signature: the window's length)."""
    logits_fn = next_logits if target == "auto" else bendc.jit(next_logits.fn, target=target)
    window = [CHARS.index(c) for c in prompt][-CONFIG.block_size:]
    out = list(prompt)
    for _ in range(count):
        logits = logits_fn(params, np.array([window], np.int64))
        token = int(np.argmax(logits[0]))
        out.append(CHARS[token])
        window = (window + [token])[-CONFIG.block_size:]
    return "".join(out)


def train(steps: int, target: str = "auto", seed: int = 0, log_every: int = 50) -> tuple[list[float], dict]:
    step_fn = train_step if target == "auto" else bendc.jit(train_step.fn, leaves=("params",), dynamic=("lr",),
                                                            target=target)
    params = bendc.params(MODEL)
    state = init_state(params)
    rng = np.random.default_rng(seed)
    losses = []
    for step in range(steps):
        loss, params, state = step_fn(params, state, get_batch(rng), learning_rate(step, steps))
        losses.append(float(loss))
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    return losses, params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", default="auto", choices=["auto", "reference", "cpu", "cuda"])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    losses, params = train(args.steps, args.target)
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(generate(params, TEXT[:CONFIG.block_size], 48, args.target))
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
