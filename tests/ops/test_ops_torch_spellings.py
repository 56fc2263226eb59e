"""torch spellings of existing ops (issue 22) against PyTorch eager (CPU, float32), values and gradients
on the reference and cpu targets: ``torch.batch_norm`` in aten's positional order (input, weight, bias,
running_mean, running_var, training, momentum, eps, cudnn_enabled) in training mode (the running
statistics updated in place, as torch's) and evaluation mode; ``x.unflatten(dim, sizes)``,
``torch.unflatten`` and ``nn.Unflatten`` through ``functional_call``.

One program holds every spelling, so each target compiles once. Tolerances: unflatten moves values, bit
for bit; batch statistics, the loss and the gradients add in bendc's order, within 2e-5 relative and
absolute.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import bendc
from conftest import assert_bitwise


def _model() -> nn.Module:
    torch.manual_seed(22)
    return nn.Sequential(nn.Linear(12, 12), nn.Unflatten(1, (3, 4)), nn.Tanh(), nn.Flatten(1), nn.Linear(12, 5))


def program(model, call, x, g, b, rm, rv, h):
    """(exact values, rounded values, loss) of every spelling, on torch tensors or traced ones."""
    mean, var = rm * 1.0, rv * 1.0  # updated in place by the training call
    trained = torch.batch_norm(x, g, b, mean, var, True, 0.2, 1e-3, False)
    evaluated = torch.batch_norm(x, g, None, rm, rv, False, 0.1, 1e-5, True)
    exact = [h.unflatten(1, (3, -1)), torch.unflatten(h, -1, [2, 2, 3]), h.unflatten(0, (1, 2))]
    rounded = [trained, mean, var, evaluated, call(model, h)]
    loss = sum((value * value).sum() * (position + 1) for position, value in enumerate(exact + rounded))
    return exact, rounded, loss


def _inputs():
    rng = np.random.default_rng(22)
    arrays = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in dict(x=(4, 3, 5), g=(3,), b=(3,), rm=(3,), h=(2, 12)).items()}
    arrays["rv"] = (rng.random(3) + 0.5).astype(np.float32)
    return {name: arrays[name] for name in ("x", "g", "b", "rm", "rv", "h")}  # program's order


LEAVES = ("x", "g", "b", "h")


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_torch_spellings_match_torch(target):
    model = _model()
    arrays = _inputs()

    @bendc.jit(target=target, leaves=LEAVES + ("params",))
    def step(params, x, g, b, rm, rv, h):
        exact, rounded, loss = program(model, lambda m, v: bendc.functional_call(m, params, v), x, g, b, rm, rv, h)
        loss.backward()
        return exact, rounded, loss, [x.grad, g.grad, b.grad, h.grad], bendc.tree.map(lambda p: p.grad, params)

    exact, rounded, loss, grads, param_grads = step(bendc.params(model), *arrays.values())
    tensors = {name: torch.tensor(value, requires_grad=name in LEAVES) for name, value in arrays.items()}
    want_exact, want_rounded, want_loss = program(model, lambda m, v: m(v), **tensors)
    want_loss.backward()
    for position, (mine, theirs) in enumerate(zip(exact, want_exact)):
        assert mine.shape == tuple(theirs.shape)
        assert_bitwise(mine, theirs.detach().numpy(), f"unflatten {position}")
    for position, (mine, theirs) in enumerate(zip(rounded, want_rounded)):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=2e-5, atol=2e-5, err_msg=f"value {position}")
    np.testing.assert_allclose(loss, want_loss.item(), rtol=2e-5)
    for name, mine in zip(LEAVES, grads):
        np.testing.assert_allclose(mine, tensors[name].grad.numpy(), rtol=2e-5, atol=2e-5, err_msg=f"grad {name}")
    for name, parameter in model.named_parameters():
        np.testing.assert_allclose(param_grads[name], parameter.grad.numpy(), rtol=2e-5, atol=2e-5, err_msg=name)


# Each body on its own line: the message quotes the user's line (the body's), not the pattern's.
REFUSALS = {
    "product": (lambda x: x.unflatten(1, (5, 2)),
                r"unflatten: sizes \(5, 2\) do not split dim 1 of size 12 of f32\[2,12\]"),
    "two -1": (lambda x: x.unflatten(1, (-1, -1)),
               r"unflatten: sizes \(-1, -1\) do not split"),
    "empty": (lambda x: x.unflatten(1, ()),
              "named dimensions are not supported"),
    "dim": (lambda x: x.unflatten(2, (3, 4)),
            "dim 2 is out of range for a tensor of 2 dimensions"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_unflatten_refusals_name_the_line(case):
    body, message = REFUSALS[case]
    step = bendc.jit(lambda x: body(x), target="reference")
    with pytest.raises(bendc.BendcError, match=message) as raised:
        step(np.zeros((2, 12), np.float32))
    assert f"{__file__}:" in str(raised.value)
