"""bendc.optim.rmsprop, adagrad, adadelta and clip_grad_norm against torch.optim and
torch.nn.utils.clip_grad_norm_ over several steps (a linear model's squared loss), on the reference
and cpu targets.

Tolerance: rtol 2e-6, atol 1e-7 on the parameters after four steps (and the norm). torch's CPU
kernels fuse some of the update's products and sums (``add(alpha=)``, ``addcmul``, ``lerp`` are
``fmadd`` in its vectorized loops), which bendc computes with two roundings unless the user opts into
FMA; ``addcdiv`` is (value * t1) / t2 in both.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import bendc

SHAPES = {"w": (3, 4), "b": (3,)}
RTOL, ATOL = 2e-6, 1e-7
LRS = [0.05, 0.04, 0.02, 0.01]


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    return params, rng.standard_normal((5, 4)).astype(np.float32)


def _torch_params(params, x, make_optimizer, lrs, clip=None):
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    optimizer = make_optimizer(list(tparams.values()))
    norms = []
    for lr in lrs:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        loss = ((torch.tensor(x) @ tparams["w"].T + tparams["b"]) ** 2).mean()
        loss.backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(list(tparams.values()), *clip).numpy())
        optimizer.step()
    return {k: v.detach().numpy() for k, v in tparams.items()}, norms


def _bendc_params(update, state, lrs, target, dynamic=False, clip=None, **hyper):
    params, x = _data()

    @bendc.jit(leaves=("params",), dynamic=("lr",) if dynamic else (), target=target)
    def step(params, state, x, lr):
        loss = ((x @ params["w"].T + params["b"]) ** 2).mean()
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        norm = 0.0
        if clip is not None:
            grads, norm = bendc.optim.clip_grad_norm(grads, *clip)
        params, state = update(params, grads, state, lr, **hyper)
        return params, state, norm

    norms = []
    for lr in lrs:
        params, state, norm = step(params, state, x, lr)
        norms.append(np.asarray(norm))
    return params, norms


def _check(got, want):
    for name in SHAPES:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


def _cases(cases, on_cpu):
    """(hyperparameters, target) pairs: every case on reference, case ``on_cpu`` on cpu too."""
    return [pytest.param(h, "reference", id=",".join(f"{k}={v}" for k, v in h.items()) or "defaults")
            for h in cases] + [pytest.param(cases[on_cpu], "cpu", id="cpu")]


RMSPROP_CASES = [dict(), dict(alpha=0.9, weight_decay=0.05), dict(momentum=0.8), dict(centered=True),
                 dict(centered=True, momentum=0.5, alpha=0.3, eps=1e-4, weight_decay=0.01)]


@pytest.mark.parametrize("hyper, target", _cases(RMSPROP_CASES, 4))
def test_rmsprop_matches_torch(hyper, target):
    params, x = _data()
    want, _ = _torch_params(params, x, lambda ps: torch.optim.RMSprop(ps, **hyper), LRS)
    state = bendc.optim.init_rmsprop(params, hyper.get("momentum", 0.0), hyper.get("centered", False))
    got, _ = _bendc_params(bendc.optim.rmsprop, state, LRS, target, **hyper)
    _check(got, want)


ADAGRAD_CASES = [dict(), dict(lr_decay=0.1, weight_decay=0.05), dict(initial_accumulator_value=0.5, eps=1e-3)]


@pytest.mark.parametrize("hyper, target", _cases(ADAGRAD_CASES, 1))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static lr", "dynamic lr"])
def test_adagrad_matches_torch(hyper, target, dynamic):
    params, x = _data()
    want, _ = _torch_params(params, x, lambda ps: torch.optim.Adagrad(ps, **hyper), LRS)
    state = bendc.optim.init_adagrad(params, hyper.get("initial_accumulator_value", 0.0))
    update_hyper = {k: v for k, v in hyper.items() if k != "initial_accumulator_value"}
    got, _ = _bendc_params(bendc.optim.adagrad, state, LRS, target, dynamic=dynamic, **update_hyper)
    _check(got, want)


ADADELTA_CASES = [dict(), dict(rho=0.5, eps=1e-4, weight_decay=0.1)]


@pytest.mark.parametrize("hyper, target", _cases(ADADELTA_CASES, 1))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static lr", "dynamic lr"])
def test_adadelta_matches_torch(hyper, target, dynamic):
    lrs = [1.0, 0.9, 0.5, 0.5]
    params, x = _data()
    want, _ = _torch_params(params, x, lambda ps: torch.optim.Adadelta(ps, **hyper), lrs)
    got, _ = _bendc_params(bendc.optim.adadelta, bendc.optim.init_adadelta(params), lrs, target, dynamic=dynamic,
                           **hyper)
    _check(got, want)


@pytest.mark.parametrize("max_norm, norm_type, target", [(0.5, 2.0, "reference"), (100.0, 2.0, "reference"),
                                                          (0.3, math.inf, "reference"), (0.7, 1.0, "reference"),
                                                          (0.4, 3.0, "reference"), (0.5, 2.0, "cpu")])
def test_clip_grad_norm_matches_torch(max_norm, norm_type, target):
    """Clipped (max_norm below the norm) and untouched (coefficient clamped at 1) steps, with SGD."""
    params, x = _data()
    want, want_norms = _torch_params(params, x, lambda ps: torch.optim.SGD(ps, lr=0.1), LRS,
                                     clip=(max_norm, norm_type))
    got, got_norms = _bendc_params(bendc.optim.sgd, bendc.optim.init_sgd(params), LRS, target,
                                   clip=(max_norm, norm_type))
    np.testing.assert_allclose(np.array(got_norms), np.array(want_norms), rtol=RTOL, atol=ATOL)
    _check(got, want)


def test_init_keeps_tied_arrays_tied():
    shared = np.ones((2, 2), np.float32)
    state = bendc.optim.init_adagrad({"a": shared, "b": shared}, 0.25)
    assert state["sum"]["a"] is state["sum"]["b"] and float(state["sum"]["a"][0, 0]) == 0.25
    state = bendc.optim.init_rmsprop({"a": shared, "b": shared}, momentum=0.9, centered=True)
    assert state["momentum_buffer"]["a"] is state["momentum_buffer"]["b"]
    assert set(state) == {"step", "square_avg", "momentum_buffer", "grad_avg"}


def test_bad_state_and_traced_hyperparameters_are_bendc_errors():
    params, x = _data()

    def run(update, state, **hyper):
        @bendc.jit(leaves=("params",), target="reference")
        def step(params, state, x):
            ((x @ params["w"].T + params["b"]) ** 2).mean().backward()
            return update(params, bendc.tree.map(lambda p: p.grad, params), state, **hyper)

        return step(params, state, x)

    with pytest.raises(bendc.BendcError, match=r"init_adadelta"):
        run(bendc.optim.adadelta, bendc.optim.init_adagrad(params))
    with pytest.raises(bendc.BendcError, match=r"alpha must be a Python number"):
        run(lambda p, g, s: bendc.optim.rmsprop(p, g, s, alpha=p["b"].sum() * 0.0 + 0.9),
            bendc.optim.init_rmsprop(params))
    with pytest.raises(bendc.BendcError, match=r"norm_type must be positive"):
        run(lambda p, g, s: bendc.optim.sgd(p, bendc.optim.clip_grad_norm(g, 1.0, 0.0)[0], s), {})
