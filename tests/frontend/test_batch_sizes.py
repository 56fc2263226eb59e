"""A new batch size reuses the compiled kernels of the old one: generated CPU kernels read their
loop extents and row counts from the arrays' shapes, so their source (and hence the kernel module,
named by its structural hash, and numba's machine code beside it) is the same for every batch
size. Counted through bendc.progress.CompileWatch (numba's compile events for bendc's kernel
modules), never timed.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as F
from bendc.progress import CompileWatch
from conftest import assert_close
from runtime.artifact import module_name

CONTEXT, MODEL, HEADS, VOCAB = 8, 16, 2, 11


def _logits(tokens, cos, sin, params):
    """Embedding, LayerNorm, rope, GELU MLP, log-softmax cross-entropy, Adam: every CPU row kernel
    (norm statistics, rope, log_softmax) and fused elementwise kernels with epilogue sums."""
    batch, context = tokens.shape
    x = F.index_select(params["emb"], 0, tokens.reshape(batch * context)).reshape(batch, context, MODEL)
    h = F.layer_norm(x, (MODEL,), params["ln_w"], params["ln_b"])
    q = F.linear(h, params["wq"]).reshape(batch, context, HEADS, MODEL // HEADS).transpose(1, 2)
    q = F.rope(q, cos, sin).transpose(1, 2).reshape(batch, context, MODEL)
    x = x + F.linear(F.gelu(F.linear(q, params["w1"])), params["w2"])
    return F.linear(x, params["head"]).reshape(batch * context, VOCAB)


@bendc.jit(leaves=("params",), target="cpu")
def sum_loss_step(tokens, targets, cos, sin, params, opt_state):
    # cross-entropy summed over the batch (a mean would inline 1/N, a constant of the batch size)
    logits = _logits(tokens, cos, sin, params)
    picked = F.gather(F.log_softmax(logits, 1), 1, targets.reshape(logits.shape[0], 1))
    loss = -picked.sum()
    loss.backward()
    grads = bendc.tree.map(lambda p: p.grad, params)
    params, opt_state = bendc.optim.adam(params, grads, opt_state, 1e-2)
    return loss, params, opt_state


def _params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {"emb": (VOCAB, MODEL), "ln_w": (MODEL,), "ln_b": (MODEL,), "wq": (MODEL, MODEL),
              "w1": (2 * MODEL, MODEL), "w2": (MODEL, 2 * MODEL), "head": (VOCAB, MODEL)}
    return {name: (0.3 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}


def _inputs(batch: int):
    rng = np.random.default_rng(batch)
    tokens = rng.integers(0, VOCAB, size=(batch, CONTEXT))
    targets = rng.integers(0, VOCAB, size=(batch, CONTEXT))
    angles = np.outer(np.arange(CONTEXT), 10000.0 ** (-np.arange(0, MODEL // HEADS, 2) / (MODEL // HEADS)))
    params = _params()
    return tokens, targets, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32), params, \
        bendc.optim.init_adam(params)


def _compiled_modules(kernels: dict[str, str]) -> dict[str, str]:
    """Kernel name -> module name of the kernels numba compiles (the numpy-only steps, views and
    matrix products, are imported, not compiled)."""
    return {name: module_name(source) for name, source in kernels.items() if "\n@njit(" in source}


def _without_float_literals(source: str) -> str:
    return re.sub(r"np\.float32\([^()]*\)", "np.float32(C)", source)


def _compile_twice(step, batches=(4, 8)):
    results, modules, sources, compiled = [], [], [], []
    for batch in batches:
        with CompileWatch() as watch:
            results.append(step(*_inputs(batch)))
        compiled.append(watch.functions)
        modules.append(_compiled_modules(step.kernels()))
        sources.append(step.kernels())
    return results, modules, sources, compiled


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One kernel cache for the module's tests (compiling is what takes time here)."""
    return str(tmp_path_factory.mktemp("kernels"))


def test_a_new_batch_size_compiles_no_kernel(cache):
    step = bendc.jit(sum_loss_step.fn, leaves=("params",), target="cpu", cache_dir=cache)
    _, modules, _, compiled = _compile_twice(step)
    assert len(step.signatures()) == 2  # it did recompile: a new plan, buffers of the new sizes
    assert modules[1] == modules[0], "every compiled kernel of batch 8 is the module of batch 4"
    assert compiled[1] == 0


def test_the_mean_constant_is_the_only_kernel_that_changes(cache):
    """With a mean over the batch, 1/N is a float32 constant inlined in fused kernels (the loss and
    its gradient): those kernels, differing only in that literal, and no other are compiled again."""
    @bendc.jit(leaves=("params",), target="cpu", cache_dir=cache)
    def mean_loss_step(tokens, targets, cos, sin, params, opt_state):
        logits = _logits(tokens, cos, sin, params)
        loss = (logits * logits).mean()
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        params, opt_state = bendc.optim.adam(params, grads, opt_state, 1e-2)
        return loss, params, opt_state

    _, modules, sources, compiled = _compile_twice(mean_loss_step)
    changed = sorted(name for name in modules[1] if modules[1][name] != modules[0].get(name))
    assert 1 <= len(changed) <= 2 and compiled[1] >= 1, changed
    for name in changed:
        assert _without_float_literals(sources[0][name]).split('"""')[-1] == \
            _without_float_literals(sources[1][name]).split('"""')[-1], name


def test_cross_entropys_mean_compiles_nothing_for_a_new_batch_size(cache):
    """cross_entropy's mean divides by the count of rows not ignored (ignore_index), a value computed
    at run time: no kernel holds the batch size, so batch 8 reuses every kernel of batch 4."""
    @bendc.jit(leaves=("params",), target="cpu", cache_dir=cache)
    def cross_entropy_step(tokens, targets, cos, sin, params, opt_state):
        logits = _logits(tokens, cos, sin, params)
        loss = F.cross_entropy(logits, targets.reshape(logits.shape[0]))
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        params, opt_state = bendc.optim.adam(params, grads, opt_state, 1e-2)
        return loss, params, opt_state

    _, modules, _, compiled = _compile_twice(cross_entropy_step)
    assert modules[1] == modules[0] and compiled[1] == 0


@pytest.mark.parametrize("batch", [4, 8])
def test_size_generic_kernels_match_torch(cache, batch):
    """The kernels compiled at batch 4 give torch's loss and updated parameters at batch 8 too."""
    step = bendc.jit(sum_loss_step.fn, leaves=("params",), target="cpu", cache_dir=cache)
    step(*_inputs(4))  # batch 8 then runs batch 4's kernels
    tokens, targets, cos, sin, params, state = _inputs(batch)
    loss, new_params, _ = step(tokens, targets, cos, sin, params, state)

    leaves = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
    tokens_t, targets_t = torch.tensor(tokens), torch.tensor(targets)
    x = leaves["emb"][tokens_t.reshape(-1)].reshape(batch, CONTEXT, MODEL)
    h = torch.nn.functional.layer_norm(x, (MODEL,), leaves["ln_w"], leaves["ln_b"])
    q = (h @ leaves["wq"].T).reshape(batch, CONTEXT, HEADS, MODEL // HEADS).transpose(1, 2)
    c, s, half = torch.tensor(cos), torch.tensor(sin), MODEL // HEADS // 2
    q = torch.cat([q[..., :half] * c - q[..., half:] * s, q[..., half:] * c + q[..., :half] * s], dim=-1)
    q = q.transpose(1, 2).reshape(batch, CONTEXT, MODEL)
    x = x + torch.nn.functional.gelu(q @ leaves["w1"].T) @ leaves["w2"].T
    logits = (x @ leaves["head"].T).reshape(batch * CONTEXT, VOCAB)
    torch_loss = torch.nn.functional.cross_entropy(logits, targets_t.reshape(-1), reduction="sum")
    torch_loss.backward()
    optimizer = torch.optim.Adam(list(leaves.values()), lr=1e-2)
    optimizer.step()
    assert_close(loss, torch_loss.detach().numpy(), "loss", rtol=1e-5)
    for name, value in new_params.items():
        assert_close(value, leaves[name].detach().numpy(), name, rtol=1e-4, atol=1e-6)


def test_loop_extents_come_from_shapes_except_a_tiny_inner_loop(cache):
    """Outer extents are read from an argument's shape; an innermost loop of at most
    UNROLLED_EXTENT iterations keeps its literal (LLVM unrolls it whole)."""
    from bendc.kernels.cpu_kit import UNROLLED_EXTENT

    @bendc.jit(target="cpu", cache_dir=cache)
    def scale(x, w):
        return (x * w + 1.0).relu()

    sources = {}
    for inner in (UNROLLED_EXTENT, 2 * UNROLLED_EXTENT):
        x, w = np.ones((6, inner), np.float32), np.full(inner, 2.0, np.float32)
        np.testing.assert_array_equal(scale(x, w), np.full((6, inner), 3.0, np.float32))
        (sources[inner],) = [s for s in scale.kernels().values() if "\n@njit(" in s]
    assert f"for i1 in range({UNROLLED_EXTENT}):" in sources[UNROLLED_EXTENT]
    assert "for i0 in range(out0.shape[0]):" in sources[UNROLLED_EXTENT]
    assert "for i1 in range(out0.shape[1]):" in sources[2 * UNROLLED_EXTENT]
    assert str(2 * UNROLLED_EXTENT) not in sources[2 * UNROLLED_EXTENT].split('"""')[-1]
