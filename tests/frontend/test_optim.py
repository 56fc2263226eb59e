"""bendc.optim against torch.optim: SGD (momentum, dampening, nesterov, weight decay), Adam, AdamW,
with the learning rate static, dynamic (jit(dynamic=...)) and a 0-d array, and traced betas."""
from __future__ import annotations

import numpy as np
import pytest

import bendc

torch = pytest.importorskip("torch")

SHAPES = {"w": (3, 4), "b": (3,)}


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    x = rng.standard_normal((5, 4)).astype(np.float32)
    return params, x


def _torch_losses(params, x, make_optimizer, lrs):
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    optimizer = make_optimizer(list(tparams.values()))
    for lr in lrs:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        loss = ((torch.tensor(x) @ tparams["w"].T + tparams["b"]) ** 2).mean()
        loss.backward()
        optimizer.step()
    return {k: v.detach().numpy() for k, v in tparams.items()}


def _loss(params, x):
    y = x @ params["w"].T + params["b"]
    return (y * y).mean()


def _run(update, init, lrs, lr_kind, target="cpu", **hyper):
    params, x = _data()
    dynamic = ("lr",) if lr_kind == "dynamic" else ()

    @bendc.jit(leaves=("params",), dynamic=dynamic, target=target)
    def step(params, state, x, lr):
        loss = _loss(params, x)
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        return update(params, grads, state, lr, **hyper)

    state = init(params)
    for lr in lrs:
        lr_value = np.array(lr, np.float32) if lr_kind == "array" else lr
        params, state = step(params, state, x, lr_value)
    return params, step


SGD_CASES = [dict(momentum=0.0), dict(momentum=0.9), dict(momentum=0.9, dampening=0.1),
             dict(momentum=0.9, nesterov=True, weight_decay=0.01), dict(weight_decay=0.1)]


@pytest.mark.parametrize("hyper", SGD_CASES, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()))
def test_sgd_matches_torch(hyper):
    lrs = [0.1, 0.05, 0.02]
    params, _ = _data()
    want = _torch_losses(params, _data()[1], lambda ps: torch.optim.SGD(ps, lr=0.1, **hyper), lrs)
    got, step = _run(bendc.optim.sgd, lambda p: bendc.optim.init_sgd(p, hyper.get("momentum", 0.0)), lrs,
                     "static", **hyper)
    for name in SHAPES:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("lr_kind", ["static", "dynamic", "array"])
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_matches_torch(name, lr_kind):
    lrs = [0.01, 0.008, 0.005, 0.002]
    hyper = dict(weight_decay=0.05)
    params, x = _data()
    torch_class = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    want = _torch_losses(params, x, lambda ps: torch_class(ps, lr=0.01, **hyper), lrs)
    got, step = _run(getattr(bendc.optim, name), bendc.optim.init_adam, lrs, lr_kind, **hyper)
    for key in SHAPES:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
    assert len(step.signatures()) == (len(lrs) if lr_kind == "static" else 1)


def test_traced_betas_match_torch():
    params, x = _data()
    lrs = [0.01, 0.01, 0.01]
    want = _torch_losses(params, x, lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.99)), lrs)

    @bendc.jit(leaves=("params",), target="reference")
    def step(params, state, x, lr, beta1, beta2):
        loss = _loss(params, x)
        loss.backward()
        return bendc.optim.adamw(params, bendc.tree.map(lambda p: p.grad, params), state, lr, (beta1, beta2))

    state = bendc.optim.init_adam(params)
    for lr in lrs:
        params, state = step(params, state, x, np.array(lr, np.float32), np.array(0.8, np.float32),
                             np.array(0.99, np.float32))
    for key in SHAPES:
        np.testing.assert_allclose(params[key], want[key], rtol=1e-5, atol=1e-6)
    assert float(state["step"]) == 3.0


def test_a_none_gradient_leaves_the_parameter_alone():
    params, x = _data()
    params["unused"] = np.ones(2, np.float32)

    @bendc.jit(leaves=("params",), target="reference")
    def step(params, state, x):
        loss = _loss(params, x)
        loss.backward()
        return bendc.optim.adam(params, bendc.tree.map(lambda p: p.grad, params), state, 0.1)

    new, state = step(params, bendc.optim.init_adam(params), x)
    np.testing.assert_array_equal(new["unused"], params["unused"])
    assert not np.array_equal(new["w"], params["w"])
