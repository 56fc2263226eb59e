"""Done-when: a GPT written with nn.Modules trains through bendc.jit + bendc.functional_call +
bendc.optim.adamw with torch eager's losses over 20 steps, a cosine lr schedule and one compile;
the same model written with bendc.functional over a params pytree gives the same numbers."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import bendc
import bendc.functional as F

torch = pytest.importorskip("torch")
nn = torch.nn
TF = torch.nn.functional

VOCAB, DIM, HEADS, LAYERS, T, B, STEPS = 13, 16, 2, 2, 8, 2, 20
LR, MIN_LR, WEIGHT_DECAY = 3e-2, 3e-3, 0.01


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(self.ln1(x))
        q, k, v = (qkv[:, :, i * c:(i + 1) * c].reshape(b, t, HEADS, c // HEADS).transpose(1, 2) for i in range(3))
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(T, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe.weight[:idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return TF.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def gpt_functional(params, idx, targets):
    """The same model with bendc.functional over the params dict (named as named_parameters())."""
    p = params
    x = F.index_select(p["wte.weight"], 0, idx.reshape(-1)).reshape(B, T, DIM) + p["wpe.weight"][:T]
    for layer in range(LAYERS):
        w = {k.split(".", 2)[2]: v for k, v in p.items() if k.startswith(f"blocks.{layer}.")}
        h = F.layer_norm(x, (DIM,), w["ln1.weight"], w["ln1.bias"])
        qkv = F.linear(h, w["qkv.weight"], w["qkv.bias"])
        q, k, v = (qkv[:, :, i * DIM:(i + 1) * DIM].reshape(B, T, HEADS, DIM // HEADS).transpose(1, 2)
                   for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, DIM), w["proj.weight"], w["proj.bias"])
        h = F.layer_norm(x, (DIM,), w["ln2.weight"], w["ln2.bias"])
        h = F.linear(F.gelu(F.linear(h, w["mlp.0.weight"], w["mlp.0.bias"])), w["mlp.2.weight"], w["mlp.2.bias"])
        x = x + h
    x = F.layer_norm(x, (DIM,), p["ln_f.weight"], p["ln_f.bias"])
    logits = F.linear(x, p["wte.weight"])
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def cosine_lr(step: int) -> float:
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * step / STEPS))


def batches():
    rng = np.random.default_rng(0)
    data = rng.integers(0, VOCAB, size=(STEPS, B, T + 1))
    return [(d[:, :-1].astype(np.int64), d[:, 1:].astype(np.int64)) for d in data]


def torch_losses(model) -> list[float]:
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for step, (idx, targets) in enumerate(batches()):
        optimizer.param_groups[0]["lr"] = cosine_lr(step)
        optimizer.zero_grad()
        loss = model(torch.tensor(idx), torch.tensor(targets))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def bendc_losses(loss_fn, params, target: str):
    @bendc.jit(leaves=("params",), dynamic=("lr",), target=target)
    def train_step(params, opt_state, batch, lr):
        loss = loss_fn(params, *batch)
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        params, opt_state = bendc.optim.adamw(params, grads, opt_state, lr, weight_decay=WEIGHT_DECAY)
        return loss, params, opt_state

    opt_state = bendc.optim.init_adam(params)
    losses = []
    for step, batch in enumerate(batches()):
        loss, params, opt_state = train_step(params, opt_state, batch, cosine_lr(step))
        losses.append(float(loss))
    return losses, train_step, params


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT()


@pytest.fixture(scope="module")
def eager(model):
    return torch_losses(model)


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_gpt_modules_train_like_torch_with_one_compile(model, eager, target):
    module = copy.deepcopy(model)
    losses, step, trained = bendc_losses(lambda p, idx, tgt: bendc.functional_call(module, p, idx, tgt),
                                         bendc.params(module), target)
    assert len(step.signatures()) == 1
    np.testing.assert_allclose(losses, eager, rtol=1e-5, atol=1e-5)
    assert losses[-1] < losses[0]
    assert len(bendc.params(module)) == len(list(module.parameters()))  # the module is left as it was
    module.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in trained.items()}, strict=False)
    assert module.head.weight is module.wte.weight  # still tied
    idx, targets = batches()[0]
    with torch.no_grad():
        reloaded = module(torch.tensor(idx), torch.tensor(targets)).item()
    assert reloaded < losses[0]


def test_gpt_functional_gives_the_same_numbers(model, eager):
    params = bendc.params(copy.deepcopy(model))
    losses, step, _ = bendc_losses(gpt_functional, params, "reference")
    assert len(step.signatures()) == 1
    np.testing.assert_allclose(losses, eager, rtol=1e-5, atol=1e-5)
