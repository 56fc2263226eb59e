"""Guards (issue 22, silent wrong numbers): a trace through bendc.functional_call is reused only while
the module state it read holds (training flags, attributes read in forward, ties, buffers), and one
array object under two names (tied weights) is one leaf with torch's tied gradient."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import pytest

import bendc
from dropout_masks import bendc_masks

torch = pytest.importorskip("torch")
nn = torch.nn
TF = torch.nn.functional

TARGETS = ["reference", "cpu"]


def torch_loss_and_grads(model, x, seed=0):
    """torch eager's loss and parameter gradients (named_parameters: tied ones once)."""
    model.zero_grad(set_to_none=True)
    with bendc_masks(seed):  # train-mode dropout: bendc's masks
        loss = model(torch.from_numpy(x)).sum()
    loss.backward()
    return loss.item(), {name: p.grad.numpy().copy() for name, p in model.named_parameters()}


def _step(model, target, traces=None):
    @bendc.jit(target=target, leaves=("params",))
    def step(params, x, seed):
        if traces is not None:
            traces.append(1)
        bendc.functional.dropout_seed(seed)
        loss = bendc.functional_call(model, params, x).sum()
        loss.backward()
        return loss, bendc.tree.map(lambda p: p.grad, params)
    return step


def _check(result, expected, names=None):
    loss, grads = result
    np.testing.assert_allclose(loss, expected[0], rtol=1e-5, atol=1e-5)
    for name in names or expected[1]:
        np.testing.assert_allclose(grads[name], expected[1][name], rtol=1e-5, atol=1e-5, err_msg=name)


def _matches_torch_after_each(model, target, changes, rng_seed):
    """The step of ``model`` against torch eager, first as it is, then after each change in turn."""
    step = _step(model, target)
    params, x = bendc.params(model), np.random.default_rng(rng_seed).standard_normal((3, 4), np.float32)
    _check(step(params, x, np.array(0)), torch_loss_and_grads(model, x))
    for change in changes:
        change()
        _check(step(params, x, np.array(0)), torch_loss_and_grads(model, x))
    return step


# ------------------------------------------------------------------ case 1: eval() after the first call
@pytest.mark.parametrize("target", TARGETS)
def test_eval_after_a_train_mode_call_matches_torch(target):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    traces: list = []
    step = _step(model, target, traces)
    params, x, seed = bendc.params(model), np.random.default_rng(0).standard_normal((4, 8), np.float32), np.array(0)
    for mode in (True, False, True, False, False, True):
        model.train(mode)
        _check(step(params, x, seed), torch_loss_and_grads(model, x))
    assert len(traces) == 2, "switching back reuses the first trace"
    assert [s["model.1.training"] for s in step.signatures()] == ["True", "False"]


@pytest.mark.parametrize("target", TARGETS)
def test_one_submodule_switched_to_eval(target):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.3), nn.Linear(6, 6), nn.Dropout(0.3))
    step = _step(model, target)
    params, x = bendc.params(model), np.random.default_rng(1).standard_normal((5, 6), np.float32)
    model.train()
    _check(step(params, x, np.array(3)), torch_loss_and_grads(model, x, 3))
    model[3].eval()
    _check(step(params, x, np.array(3)), torch_loss_and_grads(model, x, 3))
    assert step.signatures()[-1]["model.3.training"] == "False"


class Flagged(nn.Module):
    """A user's module whose forward reads plain attributes and a list."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.residual = True
        self.scale = 2.0
        self.gains = [1.0, 1.0, 1.0, 1.0]
        self.table = np.array([1.0, 2.0])

    def forward(self, x):
        y = self.linear(x) * self.scale * torch.tensor(self.gains[0]) * float(self.table[1])
        return y + x if self.residual else y


@pytest.mark.parametrize("target", TARGETS)
def test_attributes_read_in_forward_are_guarded(target):
    torch.manual_seed(2)
    model = Flagged()
    step = _matches_torch_after_each(model, target, (
        lambda: setattr(model, "residual", False), lambda: setattr(model, "scale", 0.5),
        lambda: model.gains.__setitem__(0, 3.0),  # a list changed in place: by value
        lambda: model.table.__setitem__(1, -1.0)), 2)  # a numpy array too
    assert len(step.signatures()) == 5
    assert step.signatures()[-1]["model.gains"] == "[3.0, 1.0, 1.0, 1.0]"
    assert step.signatures()[-1]["model.table"] == "ndarray float64[2]"


@pytest.mark.parametrize("target", TARGETS)
def test_dropout_p_and_norm_eps_are_guarded(target):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Dropout(0.5))
    step = _matches_torch_after_each(model, target, (
        lambda: setattr(model[2], "p", 0.25), lambda: setattr(model[1], "eps", 0.5)), 3)
    assert step.signatures()[-1]["model.1.eps"] == "0.5"


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("factor", torch.tensor(2.0))

    def forward(self, x):
        return self.linear(x) * self.factor


@pytest.mark.parametrize("target", TARGETS)
def test_a_buffer_not_given_is_guarded_by_identity_and_version(target):
    torch.manual_seed(4)
    model = Scaled()
    step = _matches_torch_after_each(model, target, (
        lambda: model.factor.fill_(3.0),  # in place: the tensor's version moves
        lambda: setattr(model, "factor", torch.tensor(-1.0))), 4)  # a new buffer
    assert len(step.signatures()) == 3


def test_a_replaced_submodule_retraces():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    _matches_torch_after_each(model, "reference", (lambda: model.__setitem__(1, nn.Tanh()),), 5)


def test_a_hook_registered_after_the_first_call_retraces():
    torch.manual_seed(12)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    handles = []
    step = _matches_torch_after_each(model, "reference", (
        lambda: handles.append(model[0].register_forward_hook(lambda module, inputs, output: output * 3.0)),
        lambda: handles[0].remove()), 12)
    assert len(step.signatures()) == 2


@pytest.mark.parametrize("target", TARGETS)
def test_two_forwards_of_one_model_in_a_step_share_one_guard(target):
    """Gradient accumulation: two functional_calls on the model in one trace, one guard to check."""
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))

    @bendc.jit(target=target, leaves=("params",))
    def step(params, x, seed):
        bendc.functional.dropout_seed(seed)
        loss = bendc.functional_call(model, params, x[:2]).sum() + bendc.functional_call(model, params, x[2:]).sum()
        loss.backward()
        return loss, bendc.tree.map(lambda p: p.grad, params)

    def expected(x):
        model.zero_grad(set_to_none=True)
        with bendc_masks(0):
            loss = model(torch.from_numpy(x[:2])).sum() + model(torch.from_numpy(x[2:])).sum()
        loss.backward()
        return loss.item(), {name: p.grad.numpy().copy() for name, p in model.named_parameters()}

    params, x = bendc.params(model), np.random.default_rng(13).standard_normal((4, 4), np.float32)
    for mode in (True, False, True):
        model.train(mode)
        _check(step(params, x, np.array(0)), expected(x))
    assert len(step._last.guards) == 1 and len(step.signatures()) == 2


def test_the_recompile_log_names_the_module_change(monkeypatch, caplog):
    monkeypatch.setenv("BENDC_LOG", "recompiles")
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    step = _step(model, "reference")
    params, x = bendc.params(model), np.ones((4, 8), np.float32)
    with caplog.at_level(logging.INFO, logger="bendc"):
        step(params, x, np.array(0))
        model[1].eval()
        step(params, x, np.array(0))
        model[1].p = 0.1
        model[1].train()
        step(params, x, np.array(0))
    messages = [r.getMessage() for r in caplog.records if r.name == "bendc"]
    assert len(messages) == 2
    assert "model.1.training: True -> False" in messages[0]
    assert "model.1.p: 0.5 -> 0.1" in messages[1]


class Opaque:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 1.0


class ReadsOpaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.thing = Opaque()
        self.unread = Opaque()  # never read in forward: no refusal

    def forward(self, x):
        return self.linear(x) * self.thing.value


def test_an_attribute_that_cannot_be_guarded_is_refused():
    model = ReadsOpaque()
    step = _step(model, "reference")
    with pytest.raises(bendc.BendcError, match=r"model\.thing.*Opaque.*cannot guard") as error:
        step(bendc.params(model), np.ones((1, 2), np.float32), np.array(0))
    assert "test_guards.py" in str(error.value)


@dataclass
class Config:
    act: str = "relu"
    width: int = 4


class Configured(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.linear = nn.Linear(config.width, config.width)

    def forward(self, x):
        y = self.linear(x)
        return y.relu() if self.config.act == "relu" else y.tanh()


def test_a_config_dataclass_read_in_forward_is_guarded_by_value():
    torch.manual_seed(6)
    model = Configured(Config())
    step = _matches_torch_after_each(model, "reference", (
        lambda: setattr(model.config, "act", "tanh"),), 6)  # the same object, changed
    assert len(step.signatures()) == 2


# ------------------------------------------------------------------ case 2: tied weights under both names
VOCAB, DIM, T = 11, 8, 5


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.ln = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Dropout(0.0), nn.Linear(2 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, idx, targets):
        x = self.wte(idx)
        x = x + self.mlp(self.ln(x))
        return TF.cross_entropy(self.head(x).reshape(-1, VOCAB), targets.reshape(-1))


def _tokens(seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (2, T)), rng.integers(0, VOCAB, (2, T))


def _gpt_step(model, target, optimizer=False):
    @bendc.jit(target=target, leaves=("params",))
    def step(params, state, idx, targets):
        loss = bendc.functional_call(model, params, idx, targets)
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        if not optimizer:
            return loss, grads
        params, state = bendc.optim.adamw(params, grads, state, lr=1e-2)
        return loss, params, state
    return step


def _torch_gpt(model, idx, targets):
    model.zero_grad(set_to_none=True)
    loss = model(torch.from_numpy(idx), torch.from_numpy(targets))
    loss.backward()
    return loss.item(), {name: p.grad.numpy().copy() for name, p in model.named_parameters()}


def _both_names(model):
    """A state-dict-style dict: the tied array under both names (one object), as dict(state_dict())."""
    arrays = {id(p): p.detach().numpy().copy() for p in model.parameters()}
    return {name: arrays[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("target", TARGETS)
def test_tied_weights_under_both_names_are_one_leaf(target):
    torch.manual_seed(7)
    model = TinyGPT()
    idx, targets = _tokens(7)
    expected = _torch_gpt(model, idx, targets)
    step = _gpt_step(model, target)
    params = _both_names(model)
    assert params["wte.weight"] is params["head.weight"]
    loss, grads = step(params, {}, idx, targets)
    _check((loss, grads), expected)
    np.testing.assert_allclose(grads["head.weight"], expected[1]["wte.weight"], rtol=1e-5, atol=1e-5)
    assert step.signatures()[0]["params['head.weight']"] == "the array of params['wte.weight']"
    # bendc.params gives the tied one once: the same numbers
    _check(step(bendc.params(model), {}, idx, targets), expected)


def test_tied_weights_as_torch_parameters_named_twice():
    torch.manual_seed(8)
    model = TinyGPT()
    idx, targets = _tokens(8)
    expected = _torch_gpt(model, idx, targets)
    named = dict(model.named_parameters(remove_duplicate=False))  # torch tensors: the bound path
    assert named["wte.weight"] is named["head.weight"]
    _check(_gpt_step(model, "reference")(named, {}, idx, targets), expected)


def test_a_state_dict_names_tied_weights_with_two_tensors_refused_like_torch():
    """state_dict() detaches each name on its own: two tensor objects, which torch's functional_call
    refuses for tied names; so does bendc, saying what to pass instead."""
    model = TinyGPT()
    idx, targets = _tokens(8)
    state = dict(model.state_dict())
    assert state["wte.weight"] is not state["head.weight"]
    with pytest.raises(ValueError, match="tied"):
        torch.func.functional_call(model, state, (torch.from_numpy(idx), torch.from_numpy(targets)))
    with pytest.raises(bendc.BendcError, match="same array object.*bendc.params"):
        _gpt_step(model, "reference")(state, {}, idx, targets)


def test_different_arrays_for_tied_names_are_refused_like_torch():
    torch.manual_seed(9)
    model = TinyGPT()
    idx, targets = _tokens(9)
    step = _gpt_step(model, "reference")
    params = _both_names(model)
    step(params, {}, idx, targets)
    params = dict(params, **{"head.weight": params["head.weight"].copy()})
    with pytest.raises(bendc.BendcError, match=r"different values for \['wte.weight', 'head.weight'\].*ties"):
        step(params, {}, idx, targets)
    with pytest.raises(ValueError):  # torch refuses the same way
        torch.func.functional_call(model, {k: torch.from_numpy(v) for k, v in params.items()},
                                   (torch.from_numpy(idx), torch.from_numpy(targets)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("names", ["both", "once"])
def test_a_tied_gpt_trains_like_torch_with_adamw(target, names):
    torch.manual_seed(10)
    model = TinyGPT()
    reference = TinyGPT()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    step = _gpt_step(model, target, optimizer=True)
    params = _both_names(model) if names == "both" else bendc.params(model)
    state = bendc.optim.init_adam(params)
    for number in range(5):
        idx, targets = _tokens(100 + number)
        loss, params, state = step(params, state, idx, targets)
        optimizer.zero_grad()
        expected = reference(torch.from_numpy(idx), torch.from_numpy(targets))
        expected.backward()
        optimizer.step()
        np.testing.assert_allclose(loss, expected.item(), rtol=1e-5, atol=1e-5)
        if names == "both":
            assert params["head.weight"] is params["wte.weight"], "the step keeps the tie"
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(params[name], p.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    assert len(step.signatures()) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_one_array_under_two_parameters_is_one_input(target):
    @bendc.jit(target=target, leaves=("a", "b"))
    def product(a, b):
        loss = (a * b).sum()
        loss.backward()
        return loss, a.grad, b.grad

    x, y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    loss, ga, gb = product(x, x)  # torch: the same leaf twice, its gradient 2x
    np.testing.assert_allclose(ga, 2 * x)
    np.testing.assert_allclose(gb, 2 * x)
    loss, ga, gb = product(x, y)
    np.testing.assert_allclose(ga, y)
    np.testing.assert_allclose(gb, x)
    assert len(product.signatures()) == 2


# ------------------------------------------------------------------ the on-disk cache
def test_the_disk_cache_never_hands_back_the_other_mode(tmp_path):
    """The program cache is keyed by the traced IR: a fresh process (here: a fresh jit, empty
    in-process cache) in eval mode traces eval mode, and finds the train-mode entry only in train mode."""
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    params, x = bendc.params(model), np.random.default_rng(11).standard_normal((4, 8), np.float32)

    def fresh():
        @bendc.jit(target="cpu", leaves=("params",), cache_dir=str(tmp_path))
        def step(params, x, seed):
            bendc.functional.dropout_seed(seed)
            loss = bendc.functional_call(model, params, x).sum()
            loss.backward()
            return loss, bendc.tree.map(lambda p: p.grad, params)
        return step

    model.train()
    first = fresh()
    _check(first(params, x, np.array(0)), torch_loss_and_grads(model, x))
    assert os.listdir(tmp_path / "programs")
    model.eval()
    warm = fresh()
    _check(warm(params, x, np.array(0)), torch_loss_and_grads(model, x))
    assert "loaded from the on-disk cache" not in warm.report()
    model.train()
    again = fresh()
    _check(again(params, x, np.array(0)), torch_loss_and_grads(model, x))
    assert "loaded from the on-disk cache" in again.report()
