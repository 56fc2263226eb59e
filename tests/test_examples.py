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

import cnn  # noqa: E402
import mlp  # noqa: E402
import transformer  # noqa: E402


def torch_mlp_steps(batch, params, lr, steps):
    """The example's steps in PyTorch: torch.optim.SGD with the example's momentum."""
    leaves = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    optimizer = torch.optim.SGD(list(leaves.values()), lr=lr, momentum=mlp.MOMENTUM)
    x, y = (torch.tensor(a) for a in batch)
    losses = []
    for _ in range(steps):
        hidden = torch.relu(torch.nn.functional.linear(x, leaves["w1"], leaves["b1"]))
        loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, leaves["w2"], leaves["b2"]), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().numpy())
    return losses, {name: p.detach().numpy() for name, p in leaves.items()}


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_mlp_train_step_matches_torch(target: str) -> None:
    batch = mlp.make_data(mlp.BATCH)
    params = mlp.init_params()
    step = mlp.bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target=target)
    state = (params, mlp.init_state(params))
    losses = []
    for _ in range(3):  # a few steps, so that updated parameters and momentum buffers are compared too
        loss, *state = step(*state, batch, lr=0.1)
        losses.append(loss)
    torch_losses, torch_params = torch_mlp_steps(batch, params, 0.1, 3)
    for mine, theirs in zip(losses, torch_losses):
        assert_close(mine, theirs, "loss")
    for name, theirs in torch_params.items():
        assert_close(state[0][name], theirs, name)
    assert float(state[1]["step"]) == 3.0


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_mlp_loss_falls(target: str) -> None:
    assert mlp.main(["--steps", "80", "--target", target]) == 0


def test_mlp_cpu_equals_reference() -> None:
    """The generated kernels against the spec (exp/log and sums: within the stated tolerances)."""
    batch = mlp.make_data(mlp.BATCH)
    params = mlp.init_params()
    state = mlp.init_state(params)
    cpu = mlp.bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu")(params, state, batch)
    reference = mlp.bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="reference")(params, state, batch)
    for mine, spec in zip(mlp.bendc.tree.leaves(cpu), mlp.bendc.tree.leaves(reference)):
        assert_close(mine, spec, "loss, parameters and state")


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
    bad = run_cli("ir", "examples/mlp.py:train_step", "--shapes", mlp.EXAMPLE_SHAPES.replace(
        f"batch.0=f32[{mlp.BATCH},{mlp.FEATURES}]", f"batch.0=f32[{mlp.BATCH},65]"))
    assert bad.returncode == 1
    line = next(number for number, text in enumerate(Path(mlp.__file__).read_text().splitlines(), start=1)
                if "hidden = F.relu(F.linear(x" in text)
    assert f"mlp.py:{line}" in bad.stderr and "linear" in bad.stderr and "f32[64,65]" in bad.stderr


# ------------------------------------------------------------------ the transformer example
def torch_rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def torch_transformer_step(tokens, targets, cos, sin, params, rates):
    """The example's step in PyTorch: forward, cross-entropy, backward, torch.optim.Adam at each
    step's learning rate (the example's schedule)."""
    leaves = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    optimizer = torch.optim.Adam(list(leaves.values()), lr=rates[0])
    cos, sin = torch.tensor(cos), torch.tensor(sin)
    losses = []
    for rate in rates:
        for group in optimizer.param_groups:
            group["lr"] = rate
        p = leaves
        batch, context = tokens.shape
        x = p["emb"][torch.tensor(tokens).reshape(-1)].reshape(batch, context, -1)
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), p["ln1_w"], p["ln1_b"])
        heads, kv_heads, dim = transformer.HEADS, transformer.KV_HEADS, transformer.HEAD_DIM
        q = (h @ p["wq"].T).reshape(batch, context, heads, dim).transpose(1, 2)
        k = (h @ p["wk"].T).reshape(batch, context, kv_heads, dim).transpose(1, 2)
        v = (h @ p["wv"].T).reshape(batch, context, kv_heads, dim).transpose(1, 2)
        q, k = torch_rope(q, cos, sin), torch_rope(k, cos, sin)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + a.transpose(1, 2).reshape(batch, context, heads * dim) @ p["wo"].T
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), p["ln2_w"], p["ln2_b"])
        x = x + torch.nn.functional.gelu(h @ p["w1"].T) @ p["w2"].T
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), p["lnf_w"], p["lnf_b"])
        logits = (h @ p["head"].T).reshape(batch * context, -1)
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach().numpy() for name, p in leaves.items()}


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_transformer_train_step_matches_torch(target: str) -> None:
    stream = transformer.batches(transformer.encode(transformer.TEXT), seed=3)
    batch = next(stream)
    rope = transformer.rope_tables()
    params = transformer.init_params(seed=4)
    step = transformer.bendc.jit(transformer.train_step.fn, leaves=("params",), dynamic=("lr",), target=target)
    state = (params, transformer.bendc.optim.init_adam(params))
    rates = [transformer.learning_rate(index, 3) for index in range(3)]
    losses = []
    for rate in rates:  # three steps at three learning rates: updated parameters, moments and lr each time
        loss, *state = step(*state, batch, rope, rate)
        losses.append(float(loss))
    assert len(step.signatures()) == 1  # the schedule's lr is traced: one compile
    torch_losses, torch_params = torch_transformer_step(*batch, *rope, params, rates)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5)
    assert float(state[1]["step"]) == 3.0
    for name, theirs in torch_params.items():
        # Adam divides by sqrt(v) + eps: where a gradient is tiny the update's relative error grows,
        # so parameters are compared with an absolute tolerance of a thousandth of the step size.
        assert_close(state[0][name], theirs, name, rtol=1e-4, atol=3e-6)


def test_transformer_loss_falls() -> None:
    assert transformer.main(["--steps", "60", "--target", "cpu"]) == 0


# ------------------------------------------------------------------ the cnn example (op-coverage issue)
def torch_cnn_steps(x, y, params, steps, lr):
    """The example's step in PyTorch: forward, cross-entropy, backward, torch.optim.AdamW."""
    leaves = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    optimizer = torch.optim.AdamW(list(leaves.values()), lr=lr)
    losses = []
    for _ in range(steps):
        h = torch.tensor(x)
        for number in (1, 2):
            h = torch.nn.functional.conv2d(h, leaves[f"conv{number}_w"], leaves[f"conv{number}_b"], padding=1)
            h = torch.nn.functional.group_norm(h, cnn.GROUPS[number - 1], leaves[f"norm{number}_w"],
                                               leaves[f"norm{number}_b"])
            h = torch.nn.functional.max_pool2d(torch.nn.functional.silu(h), 2)
        logits = torch.nn.functional.linear(h.reshape(h.shape[0], -1), leaves["head_w"], leaves["head_b"])
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach().numpy() for name, p in leaves.items()}


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_cnn_train_step_matches_torch(target: str) -> None:
    x, y = cnn.make_data(8, seed=5)
    params = cnn.init_params(seed=6)
    step = cnn.bendc.jit(cnn.train_step.fn, leaves=("params",), target=target)
    state, mine, losses = cnn.bendc.optim.init_adam(params), params, []
    for _ in range(2):  # two steps: the second starts from updated parameters and moments
        loss, mine, state = step(mine, state, x, y, lr=1e-2)
        losses.append(float(loss))
    torch_losses, theirs = torch_cnn_steps(x, y, params, 2, 1e-2)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5)
    for name in params:
        # AdamW divides by sqrt(v) + eps: where a gradient is tiny the update's relative error grows,
        # so parameters are compared with an absolute tolerance of a thousandth of the step size.
        assert_close(mine[name], theirs[name], name, rtol=1e-4, atol=1e-5)


@pytest.mark.long  # 40 steps, ~22 s; test_cnn_train_step_matches_torch checks the step in make test
def test_cnn_loss_falls() -> None:
    assert cnn.main(["--steps", "40", "--target", "cpu"]) == 0


def test_gpt_example_trains_like_torch_unchanged() -> None:
    """examples/gpt.py: nanoGPT's model code inside bendc.jit, its losses and parameters against torch's
    AdamW with the same decay groups and schedule over a few steps, and its loss falling over 60."""
    import copy

    import gpt

    steps = 4
    losses, params = gpt.train(steps, target="reference", log_every=0)
    model = copy.deepcopy(gpt.make_model())
    named = dict(model.named_parameters())
    groups = [{"params": [named[n] for n in g["params"]], "weight_decay": g["weight_decay"]}
              for g in model.configure_optimizers(gpt.WEIGHT_DECAY)]
    optimizer = torch.optim.AdamW(groups, lr=gpt.LR, betas=(0.9, 0.99))
    rng = np.random.default_rng(0)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = gpt.learning_rate(step, steps)
        idx, targets = (torch.tensor(a) for a in gpt.get_batch(rng))
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert_close(losses[step], loss.item(), "loss")
    for name, value in model.named_parameters():  # Adam turns a gradient's rounding noise near 0 into
        assert_close(params[name], value.detach().numpy(), name, atol=1e-5)  # an update of up to ~lr (5e-4 here)
    assert model.lm_head.weight is model.transformer.wte.weight
    falling, _ = gpt.train(60, target="reference", log_every=0)
    assert falling[-1] < falling[0] - 0.3
    text = gpt.generate(params, gpt.TEXT[:gpt.CONFIG.block_size], 4, "reference")
    assert text.startswith(gpt.TEXT[:gpt.CONFIG.block_size]) and len(text) == gpt.CONFIG.block_size + 4


def test_cnn_bn_example_trains_like_torch_unchanged() -> None:
    """examples/cnn_bn.py: a torch CNN with nn.BatchNorm2d inside bendc.jit; three train steps' losses,
    parameters and buffers (running statistics, num_batches_tracked) against torch's AdamW, then the eval
    mode prediction (the running statistics) against torch's."""
    import copy

    import cnn_bn

    steps = 3
    losses, params, buffers = cnn_bn.train(steps, target="reference", log_every=0)
    model = copy.deepcopy(cnn_bn.make_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=cnn_bn.LR)
    x_all, y_all = cnn_bn.make_data(2048)
    rng = np.random.default_rng(2)
    model.train()
    for step in range(steps):
        batch = rng.integers(0, len(x_all), size=cnn_bn.BATCH)
        loss = torch.nn.functional.cross_entropy(model(torch.tensor(x_all[batch])), torch.tensor(y_all[batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert_close(losses[step], loss.item(), "loss")
    for name, value in model.named_parameters():  # Adam: a gradient's rounding noise near 0 moves up to ~lr
        assert_close(params[name], value.detach().numpy(), name, atol=2e-5)
    for name, value in model.named_buffers():
        assert_close(np.asarray(buffers[name]), value.numpy(), name, atol=1e-5)
    evaluated = cnn_bn.make_model()
    _, predict = cnn_bn.make_steps(evaluated, "reference")
    evaluated.eval()  # as a user switches it: the running statistics from here on
    model.eval()
    x_test = cnn_bn.make_data(16, seed=7)[0]
    with torch.no_grad():
        want = model(torch.tensor(x_test)).numpy()
    assert_close(np.asarray(predict({k: np.asarray(v) for k, v in params.items()}, buffers, x_test)), want,
                 "eval logits", atol=1e-4)
