"""The examples against PyTorch, the mlp training loop, and the CLI."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_close

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import mlp  # noqa: E402


def torch_mlp_step(x, y, params, lr):
    leaves = [torch.tensor(p, requires_grad=True) for p in params]
    w1, b1, w2, b2 = leaves
    hidden = torch.relu(torch.nn.functional.linear(torch.tensor(x), w1, b1))
    logits = torch.nn.functional.linear(hidden, w2, b2)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y))
    loss.backward()
    optimizer = torch.optim.SGD(leaves, lr=lr)
    optimizer.step()
    return loss.detach().numpy(), [p.detach().numpy() for p in leaves]


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_mlp_train_step_matches_torch(target: str) -> None:
    x, y = mlp.make_data(mlp.BATCH)
    params = mlp.init_params()
    step = mlp.bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target=target)
    for _ in range(3):  # a few steps, so that updated parameters are compared too
        loss, *new_params = step(x, y, *params, lr=0.1)
        torch_loss, torch_params = torch_mlp_step(x, y, params, 0.1)
        assert_close(loss, torch_loss, "loss")
        for name, mine, theirs in zip(mlp.LEAVES, new_params, torch_params):
            assert_close(mine, theirs, name)
        params = torch_params


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_mlp_loss_falls(target: str) -> None:
    assert mlp.main(["--steps", "80", "--target", target]) == 0


def test_mlp_cpu_equals_reference() -> None:
    """The generated kernels against the spec (exp/log and sums: within the stated tolerances)."""
    x, y = mlp.make_data(mlp.BATCH)
    params = mlp.init_params()
    cpu = mlp.bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu")(x, y, *params)
    reference = mlp.bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="reference")(x, y, *params)
    for mine, spec in zip(cpu, reference):
        assert_close(mine, spec, "loss and parameters")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bendc", *args], cwd=ROOT, capture_output=True, text=True)


def test_cli_ir_equals_golden() -> None:
    result = run_cli("ir", "examples/mlp.py:train_step", "--stage", "autodiff")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / "tests/golden/mlp/autodiff.ir").read_text()


def test_cli_report_and_errors() -> None:
    result = run_cli("report", "examples/mlp.py:train_step")
    assert result.returncode == 0 and "[cse] merged" in result.stdout
    bad = run_cli("ir", "examples/mlp.py:train_step", "--stage", "nope")
    assert bad.returncode == 1
    assert "no stage 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("ir", "examples/mlp.py:train_step", "--shapes", "x=f32[64,65] y=i64[64] w1=f32[128,64]:leaf "
                  "b1=f32[128]:leaf w2=f32[10,128]:leaf b2=f32[10]:leaf")
    assert bad.returncode == 1
    assert "mlp.py:34" in bad.stderr and "linear" in bad.stderr and "f32[64,65]" in bad.stderr
