"""torch.*, torch.nn.functional.* and torch.Tensor methods on traced tensors (__torch_function__),
functional_call and params; bendc.functional without torch."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import bendc

torch = pytest.importorskip("torch")
TF = torch.nn.functional
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_torch_functions_on_mixed_traced_and_constant_operands():
    @bendc.jit(leaves=("w",), target="cpu")
    def step(x, w, c):
        h = TF.gelu(TF.linear(x, w)) * torch.tensor(0.5)      # traced * 0-d torch constant
        h = torch.tensor(2.0) * h + c                          # torch constant on the left, constant array
        h = torch.add(h, c, alpha=3.0) - torch.exp(c)
        h = torch.tensor(-1.0).add(torch.sigmoid(h)).square()  # a torch.Tensor method with a traced operand
        loss = torch.mean(TF.log_softmax(h, dim=-1).sum(dim=1) / 2)
        loss.backward()
        return loss, w.grad

    rng = np.random.default_rng(0)
    x, w, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 5), (3, 5), (3,)))
    loss, grad = step(x, w, c)

    tw = torch.tensor(w, requires_grad=True)
    tx, tc = torch.tensor(x), torch.tensor(c)
    h = TF.gelu(TF.linear(tx, tw)) * torch.tensor(0.5)
    h = torch.tensor(2.0) * h + tc
    h = torch.add(h, tc, alpha=3.0) - torch.exp(tc)
    h = torch.tensor(-1.0).add(torch.sigmoid(h)).square()
    want = torch.mean(TF.log_softmax(h, dim=-1).sum(dim=1) / 2)
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    np.testing.assert_allclose(grad, tw.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_an_unsupported_torch_function_names_itself_the_line_and_close_names():
    @bendc.jit(target="reference")
    def step(x):
        return TF.softmin(x, 0)

    with pytest.raises(bendc.UnsupportedError) as error:
        step(np.ones(3, np.float32))
    text = str(error.value)
    assert "torch function torch.nn.functional.softmin is not supported" in text
    assert f"{__file__}:" in text and "TF.softmin(x, 0)" in text  # the user line
    close = text.split("close supported names: ", 1)[1]  # the names nearest the one called, some of many
    assert "torch.nn.functional.softmax" in close.split(" (docs/ops.md")[0]


def test_a_torch_constant_bendc_does_not_trace_is_refused_naming_the_line_that_made_it():
    @bendc.jit(target="reference")
    def step(x):
        noise = torch.randn(3)  # made here
        return TF.relu(x) + noise

    with pytest.raises(bendc.UnsupportedError, match="pass it as an array parameter") as error:
        step(np.ones(3, np.float32))
    made = step.fn.__code__.co_firstlineno + 2
    assert f"made by torch.randn at {__file__}:{made}" in str(error.value)


def test_functional_call_with_modules_and_params():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8),
                                torch.nn.Dropout(0.1), torch.nn.Linear(8, 2))
    model.eval()
    params = bendc.params(model)
    assert list(params) == [name for name, _ in model.named_parameters()]
    assert all(v.dtype == np.float32 for v in params.values())

    @bendc.jit(leaves=("params",), target="reference")
    def step(params, x):
        loss = bendc.functional_call(model, params, x).sum()
        loss.backward()
        return loss, bendc.tree.map(lambda p: p.grad, params)

    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    loss, grads = step(params, x)
    want = model(torch.tensor(x)).sum()
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert isinstance(model[0].weight, torch.nn.Parameter)  # restored

    @bendc.jit(leaves=("params",), target="reference")
    def partial(params, x):
        return bendc.functional_call(model, params, x)

    with pytest.raises(bendc.UnsupportedError, match=r"no value for the parameters \['4.bias'"):
        partial({k: v for k, v in params.items() if k != "4.bias"}, x)


def test_bendc_functional_works_without_torch():
    code = ("import sys, numpy as np, bendc, bendc.functional as F\n"
            "step = bendc.jit(lambda x: F.relu(x) * 2.0, target='reference')\n"
            "assert float(step(np.ones(2, np.float32)).sum()) == 4.0\n"
            "assert bendc.tree.map(lambda a: a, [1]) == [1]\n"
            "import bendc.optim\n"
            "assert 'torch' not in sys.modules, 'bendc imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
