"""Activations and losses against PyTorch eager (CPU, float32): values and gradients, on the
reference and cpu targets (tests/parity_harness.py).

silu, softplus, leaky_relu, elu, hardtanh, embedding (padding_idx), nll_loss, cross_entropy
(weight, ignore_index, label_smoothing, reductions), binary_cross_entropy_with_logits (weight,
pos_weight, reductions), mse / l1 / smooth_l1 / huber losses, binary_cross_entropy, kl_div and normalize. Elementwise ops built only of compares, selects and one
multiply (leaky_relu, hardtanh and their gradients) are compared bit for bit; ops with exp/log
within the conftest tolerances (torch's vectorized exp is not numpy's or bendc's), losses with
reductions within them too (another summation order).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from conftest import assert_close
from parity_harness import int_index, normal, parity, target, wide  # noqa: F401  (target: autouse fixture)


def boundary_values(*points: float) -> np.ndarray:
    """A (4, 6) tensor holding each boundary point, its float32 neighbours and -0.0, with random fill."""
    values = list(normal((24,), seed=5) * np.float32(3.0))
    specials = [np.float32(0.0), np.float32(-0.0)]
    for point in points:
        p = np.float32(point)
        specials += [p, np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(-np.inf))]
    values[:len(specials)] = specials
    return np.asarray(values, dtype=np.float32).reshape(4, 6)


# ------------------------------------------------------------------ activations
@pytest.mark.parametrize("slope", [0.01, 0.2, -0.5])
def test_leaky_relu_bitwise_with_the_gradient_at_zero(slope):
    """torch: x where x > 0 else x * slope; the gradient at exactly 0 is g * slope."""
    x = boundary_values(0.0, 1e-30)
    parity(lambda F, x: F.leaky_relu(x, slope), {"x": x}, ("x",), exact=True)


@pytest.mark.parametrize("low, high", [(-1.0, 1.0), (-0.5, 2.0), (0.0, 6.0)])
def test_hardtanh_bitwise_with_the_strict_gradient_at_the_bounds(low, high):
    """hardtanh_backward passes g only where min < x < max strictly: exactly at a bound it is 0."""
    x = boundary_values(low, high)
    parity(lambda F, x: F.hardtanh(x, low, high), {"x": x}, ("x",), exact=True)
    got = bendc.jit(lambda x: _grad_of(lambda: BF.hardtanh(x, low, high), x), leaves=("x",))(x)
    at_bound = (x == np.float32(low)) | (x == np.float32(high))
    assert np.all(np.asarray(got)[at_bound] == 0.0)


def _grad_of(make, x):
    out = make()
    out.sum().backward()
    return x.grad


def test_hardtanh_refuses_min_above_max():
    with pytest.raises(bendc.BendcError, match="min_val"):
        bendc.jit(lambda x: BF.hardtanh(x, 1.0, -1.0))(np.zeros(3, np.float32))


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_silu(scale):
    parity(lambda F, x: F.silu(x), {"x": normal((5, 7), seed=1, scale=scale)}, ("x",), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("beta, threshold", [(1.0, 20.0), (2.0, 1.0), (0.5, 3.0)])
def test_softplus(beta, threshold):
    """Past the threshold softplus is x (gradient g); large |x| stays finite (log1p(exp(x)))."""
    x = normal((4, 6), seed=2, scale=4.0)
    x[0, :4] = [threshold / beta, np.nextafter(np.float32(threshold / beta), np.float32(np.inf)), -80.0, 30.0]
    parity(lambda F, x: F.softplus(x, beta, threshold), {"x": x}, ("x",), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0])
def test_elu(alpha):
    """x > 0: x; else expm1(x) * alpha (so tiny negative x keeps its value); the gradient from the input."""
    x = boundary_values(0.0, -1e-8)
    parity(lambda F, x: F.elu(x, alpha), {"x": x}, ("x",), rtol=2e-5, atol=2e-6)


# ------------------------------------------------------------------ embedding
@pytest.mark.parametrize("padding_idx", [None, 0, 3, -1])
def test_embedding_padding_idx_takes_no_gradient(padding_idx):
    index = int_index([[0, 3, 2], [4, 0, 3]])
    parity(lambda F, index, table: F.embedding(index, table, padding_idx=padding_idx),
           {"index": index, "table": normal((5, 4), seed=3)}, ("table",), exact=True)


# ------------------------------------------------------------------ class losses
CLASS_TARGETS = {
    "plain": [0, 2, 1, 3, 2, 0],
    "ignored rows": [0, -100, 1, 3, -100, 2],
    "custom ignore": [1, 1, 0, 3, 2, 1],
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("targets", list(CLASS_TARGETS))
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, targets, weighted):
    ignore = 1 if targets == "custom ignore" else -100
    inputs = {"x": normal((6, 4), seed=4), "t": int_index(CLASS_TARGETS[targets])}
    if weighted:
        inputs["w"] = np.asarray([0.5, 2.0, 1.0, 0.25], dtype=np.float32)

    def body(F, x, t, w=None):
        return F.nll_loss(F.log_softmax(x, 1), t, w, ignore_index=ignore, reduction=reduction)

    parity(body, inputs, ("x",))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("targets", list(CLASS_TARGETS))
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy(reduction, targets, smoothing, weighted):
    ignore = 1 if targets == "custom ignore" else -100
    inputs = {"x": normal((6, 4), seed=6, scale=2.0), "t": int_index(CLASS_TARGETS[targets])}
    if weighted:
        inputs["w"] = np.asarray([0.5, 2.0, 1.0, 0.25], dtype=np.float32)

    def body(F, x, t, w=None):
        return F.cross_entropy(x, t, w, ignore_index=ignore, reduction=reduction, label_smoothing=smoothing)

    parity(body, inputs, ("x",))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_every_row_ignored_is_nan_as_torch(smoothing):
    inputs = {"x": normal((3, 4), seed=7), "t": int_index([-100, -100, -100])}
    body = lambda F, x, t: F.cross_entropy(x, t, label_smoothing=smoothing)  # noqa: E731
    ours = bendc.jit(lambda x, t: body(BF, x, t))(**inputs)
    theirs = torch.nn.functional.cross_entropy(torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["t"]),
                                               label_smoothing=smoothing)
    assert np.isnan(theirs.item()) and np.isnan(np.asarray(ours))


def test_cross_entropy_default_keeps_its_bits():
    """The default call (mean, ignore_index=-100, no weight) is -sum(picked) / N as before: bitwise the mean."""
    x, t = wide((8, 5), seed=8), int_index([0, 4, 3, 1, 2, 2, 0, 4])
    ours = bendc.jit(lambda x, t: BF.cross_entropy(x, t), target="reference")(x, t)
    log_probs = bendc.jit(lambda x: BF.log_softmax(x, 1), target="reference")(x)
    picked = log_probs[np.arange(8), t]
    assert np.asarray(ours).tobytes() == np.float32(-(np.sum(picked, dtype=np.float32) / np.float32(8))).tobytes()


def test_class_losses_refuse_bad_operands():
    x, t = normal((3, 4), seed=1), int_index([0, 1, 2])
    with pytest.raises(bendc.BendcError, match="reduction"):
        bendc.jit(lambda x, t: BF.nll_loss(x, t, reduction="avg"))(x, t)
    with pytest.raises(bendc.BendcError, match="weight"):
        bendc.jit(lambda x, t, w: BF.cross_entropy(x, t, w))(x, t, np.ones(3, np.float32))
    with pytest.raises(bendc.BendcError, match="label_smoothing"):
        bendc.jit(lambda x, t: BF.cross_entropy(x, t, label_smoothing=1.5))(x, t)


# ------------------------------------------------------------------ binary cross-entropy with logits
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("extras", ["none", "weight", "pos_weight", "both"])
def test_binary_cross_entropy_with_logits(reduction, extras):
    x = normal((4, 5), seed=9, scale=3.0)
    x[0, :4] = [80.0, -80.0, 30.0, -30.0]  # large |x|: torch's stable formula stays finite and exact
    inputs = {"x": x, "y": np.asarray(np.random.default_rng(10).uniform(0, 1, (4, 5)), dtype=np.float32)}
    inputs["y"][0, :4] = [1.0, 0.0, 0.0, 1.0]
    if extras in ("weight", "both"):
        inputs["w"] = np.asarray(np.random.default_rng(11).uniform(0.5, 2, (5,)), dtype=np.float32)
    if extras in ("pos_weight", "both"):
        inputs["pw"] = np.asarray(np.random.default_rng(12).uniform(0.5, 3, (5,)), dtype=np.float32)

    def body(F, x, y, w=None, pw=None):
        return F.binary_cross_entropy_with_logits(x, y, w, reduction=reduction, pos_weight=pw)

    parity(body, inputs, ("x", "y"), rtol=2e-5, atol=2e-6)


def test_bce_large_logits_gradient_keeps_tiny_values():
    """sigmoid(-30) - 0 = 9.4e-14: the gradient is not rounded away ((1 - t) - (1 - sigmoid) would be)."""
    x = np.asarray([-30.0, -60.0, 25.0], dtype=np.float32)
    y = np.asarray([0.0, 0.0, 1.0], dtype=np.float32)
    parity(lambda F, x, y: F.binary_cross_entropy_with_logits(x, y, reduction="sum"), {"x": x, "y": y}, ("x",),
           rtol=2e-5, atol=1e-30)


def test_bce_refuses_a_pos_weight_that_requires_grad():
    x = normal((2, 3), seed=1)
    with pytest.raises(bendc.BendcError, match="pos_weight"):
        bendc.jit(lambda x, pw: BF.binary_cross_entropy_with_logits(x, x.sigmoid(), pos_weight=pw),
                  leaves=("pw",))(x, np.ones(3, np.float32))


# ------------------------------------------------------------------ more activations (composites)
@pytest.mark.parametrize("name, kwargs, exact", [
    ("hardswish", {}, True), ("hardsigmoid", {}, True), ("relu6", {}, True), ("softsign", {}, True),
    ("hardshrink", {}, True), ("softshrink", {"lambd": 0.7}, False), ("threshold", {"threshold": 0.5, "value": -1.0}, True),
    ("mish", {}, False), ("logsigmoid", {}, False), ("selu", {}, False), ("celu", {"alpha": 0.5}, False),
    ("tanhshrink", {}, False), ("glu", {"dim": 1}, False)])
def test_more_activations(name, kwargs, exact):
    """Values bit for bit where torch's kernel is + - * / and selects (hardswish, hardsigmoid, relu6,
    softsign, hardshrink, threshold; softshrink's zeros take a sign by the position and the CPU in
    torch), at the branch points and their neighbours; gradients within
    tolerance, with torch's choices at the branch points (hardswish: 0 at -3 and g at 3; hardsigmoid:
    0 at both; logsigmoid: 0.5 at 0)."""
    x = boundary_values(-3.0, 3.0, 0.5, 0.7, -0.7)
    parity(lambda F, x: getattr(F, name)(x, **kwargs), {"x": x}, ("x",), exact=exact, exact_grads=False,
           rtol=2e-5, atol=2e-6)


def test_activations_in_place_write_their_input():
    """F.relu(x, inplace=True) / nn.ReLU(inplace=True) / x.relu_() write x as torch's (its other names
    see it), where they used to leave x and return a new tensor."""
    def step(x):
        h = x * 2.0
        alias = h
        torch.nn.functional.relu(h, inplace=True)
        g = x * 1.0
        torch.nn.ReLU6(inplace=True)(g)
        k = x - 0.5
        k.relu_()
        torch.nn.functional.hardtanh(k, 0.0, 0.25, inplace=True)
        m = x + 1.0
        torch.nn.functional.elu(m, 0.5, True)  # inplace given positionally, as torch takes it
        torch.nn.functional.hardswish(m, True)
        torch.nn.functional.threshold(m, 0.25, -1.0, True)
        return alias, h, g, k, m

    x = normal((3, 4), seed=29, scale=4.0)
    for mine, theirs in zip(bendc.jit(step, target="reference")(x), step(torch.from_numpy(x))):
        np.testing.assert_array_equal(mine, theirs.numpy())


# ------------------------------------------------------------------ regression and distribution losses
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "smooth_l1_loss", "smooth_l1_loss beta=0.5",
                                  "smooth_l1_loss beta=0", "huber_loss", "huber_loss delta=2"])
def test_pointwise_losses(loss, reduction):
    """|input - target| at exactly beta / delta (the branch boundary) and at 0 (l1's kink: torch's
    gradient 0) among the values; both operands take gradients."""
    name, _, option = loss.partition(" ")
    kwargs = {option.split("=")[0]: float(option.split("=")[1])} if option else {}
    x, y = normal((4, 5), seed=21, scale=2.0), normal((4, 5), seed=22, scale=2.0)
    x[0, :4] = y[0, :4] + np.asarray([0.0, 0.5, 1.0, 2.0], np.float32)
    y[0, :4] = x[0, :4] - np.asarray([0.0, 0.5, 1.0, 2.0], np.float32)  # exact differences
    parity(lambda F, x, y: getattr(F, name)(x, y, reduction=reduction, **kwargs), {"x": x, "y": y}, ("x", "y"),
           rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy_of_probabilities(reduction, weighted):
    """torch's formula with its log clamp at -100 (probabilities 0 and 1 among the targets)."""
    rng = np.random.default_rng(23)
    inputs = {"p": rng.uniform(0.02, 0.98, (4, 5)).astype(np.float32), "q": rng.uniform(0, 1, (4, 5)).astype(np.float32)}
    inputs["q"][0, :2] = [0.0, 1.0]
    if weighted:
        inputs["w"] = rng.uniform(0.5, 2, (5,)).astype(np.float32)
    parity(lambda F, p, q, w=None: F.binary_cross_entropy(p, q, w, reduction=reduction), inputs, ("p",),
           rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum", "none"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    """KL(target || input) of log-probabilities, a zero target among them (xlogy: 0 there)."""
    x = normal((3, 5), seed=24)
    t = np.asarray(np.random.default_rng(25).uniform(0, 1, (3, 5)), np.float32)
    t[0, 0] = 0.0

    def body(F, x, t):
        target = t.log_softmax(-1) if log_target else t / t.sum(-1, keepdim=True)
        return F.kl_div(x.log_softmax(-1), target, reduction=reduction, log_target=log_target)

    parity(body, {"x": x, "t": t}, ("x",), rtol=2e-5, atol=2e-6)


def test_loss_modules_and_refusals():
    """nn.L1Loss, SmoothL1Loss, HuberLoss, BCELoss, KLDivLoss and MSELoss(reduction="sum") through
    their torch spellings; a negative beta and reduction="batchmean" outside kl_div name the line."""
    x, y = normal((3, 4), seed=26), normal((3, 4), seed=27)
    p = np.asarray(np.random.default_rng(28).uniform(0.1, 0.9, (3, 4)), np.float32)
    modules = [torch.nn.L1Loss(), torch.nn.SmoothL1Loss(beta=0.25), torch.nn.HuberLoss(delta=0.5),
               torch.nn.MSELoss(reduction="sum")]

    def step(x, y, p):
        return tuple(m(x, y) for m in modules) + (torch.nn.BCELoss()(p, p * 0.5),
                                                 torch.nn.KLDivLoss(reduction="batchmean")(x.log_softmax(1), p))

    got = bendc.jit(step, target="reference")(x, y, p)
    want = step(*map(torch.from_numpy, (x, y, p)))
    for mine, theirs in zip(got, want):
        assert_close(np.asarray(mine), theirs.numpy(), "loss", rtol=2e-5, atol=2e-6)
    with pytest.raises(bendc.BendcError, match="beta must be non-negative") as caught:
        bendc.jit(lambda x, y: torch.nn.functional.smooth_l1_loss(x, y, beta=-1.0), target="reference")(x, y)
    assert "test_ops_activations.py:" in str(caught.value)
    with pytest.raises(bendc.BendcError, match="reduction must be"):
        bendc.jit(lambda x, y: torch.nn.functional.l1_loss(x, y, reduction="batchmean"), target="reference")(x, y)


# ------------------------------------------------------------------ normalize
@pytest.mark.parametrize("dim", [1, 0, -1])
def test_normalize(dim):
    parity(lambda F, x: F.normalize(x, dim=dim), {"x": normal((3, 4, 5), seed=13)}, ("x",), rtol=2e-5, atol=2e-6)


def test_normalize_zero_rows_and_eps():
    """A zero row gives 0 and a zero gradient (no nan); rows below eps are divided by eps."""
    x = normal((4, 3), seed=14)
    x[1] = 0.0
    x[2] = [1e-7, -2e-7, 0.0]
    parity(lambda F, x: F.normalize(x, dim=1, eps=1e-6), {"x": x}, ("x",), rtol=2e-5, atol=2e-6)


def test_normalize_refuses_other_p():
    with pytest.raises(bendc.BendcError, match="p=2"):
        bendc.jit(lambda x: BF.normalize(x, p=1.0))(np.ones((2, 3), np.float32))


# ------------------------------------------------------------------ torch spellings
def test_torch_modules_and_functions_trace():
    """nn.SiLU/Softplus/LeakyReLU/ELU/Hardtanh/Embedding/CrossEntropyLoss/BCEWithLogitsLoss and the
    torch.nn.functional spellings trace through __torch_function__ with torch's numbers."""
    import torch.nn as nn
    import torch.nn.functional as TF

    model = nn.Sequential(nn.Linear(4, 6), nn.SiLU(), nn.Softplus(2.0, 1.0), nn.LeakyReLU(0.1), nn.ELU(0.5),
                          nn.Hardtanh(-0.5, 0.5), nn.Linear(6, 3))
    embed = nn.Embedding(5, 4, padding_idx=0)
    ce = nn.CrossEntropyLoss(ignore_index=2, label_smoothing=0.1)
    bce = nn.BCEWithLogitsLoss()
    params = {**{f"m.{k}": v for k, v in bendc.params(model).items()},
              **{f"e.{k}": v for k, v in bendc.params(embed).items()}}
    index, labels = int_index([[0, 1], [3, 0], [4, 4]]), int_index([0, 2, 1, 1, 2, 0])
    holder = nn.ModuleDict({"m": model, "e": embed})

    def loss_fn(run, p, index, labels):
        hidden = run(holder["e"], p, "e", index).reshape(6, 4)
        logits = run(holder["m"], p, "m", hidden)
        return (ce(logits, labels) + bce(logits, TF.normalize(logits).sigmoid())
                + TF.nll_loss(TF.log_softmax(logits, 1), labels, reduction="sum"))

    def bendc_run(module, p, prefix, x):
        return bendc.functional_call(module, {k[len(prefix) + 1:]: v for k, v in p.items() if k.startswith(prefix)},
                                     x)

    @bendc.jit(leaves=("p",))
    def step(p, index, labels):
        loss = loss_fn(bendc_run, p, index, labels)
        loss.backward()
        return loss, {k: v.grad for k, v in p.items()}

    loss, grads = step(params, index, labels)
    torch_loss = loss_fn(lambda module, p, prefix, x: module(x), None, torch.from_numpy(index),
                         torch.from_numpy(labels))
    torch_loss.backward()
    assert_close(loss, torch_loss.detach().numpy(), "loss", rtol=2e-5, atol=2e-6)
    for name, parameter in holder.named_parameters():
        assert_close(grads[name], parameter.grad.numpy(), f"grad of {name}", rtol=5e-5, atol=5e-6)
