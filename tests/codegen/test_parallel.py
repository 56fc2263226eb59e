"""Every generated CPU kernel over at least PARALLEL_CELLS cells (a fused elementwise kernel: over
PARALLEL_ELEMENTWISE_CELLS) runs on all threads
(``parallel=True`` with a prange loop): kernels whose epilogue sums over their first axis (a bias
gradient fused into GELU's backward, a full sum) split that axis into chunks with partial sums."""
from __future__ import annotations

import re

import numpy as np
import pytest

import bendc
import bendc.functional as F
from bendc.kernels.cpu_policy import parallel_from
from conftest import assert_close

PARALLEL_CELLS, PARALLEL_ELEMENTWISE_CELLS = parallel_from("rows"), parallel_from("elementwise")

_LAUNCH = re.compile(r"^\[cpu\] (\w+): \w+, (\d+) cells", re.M)


def serial_large_kernels(step) -> list[str]:
    """Names of numba kernels over >= PARALLEL_CELLS cells that are not parallel."""
    cells = {name: int(count) for name, count in _LAUNCH.findall(step.report())}
    serial = []
    for name, source in step.kernels().items():
        fused = "fused elementwise ops" in source.split("Generated from", 1)[0]
        if "@njit" not in source or cells.get(name, 0) < (PARALLEL_ELEMENTWISE_CELLS if fused else PARALLEL_CELLS):
            continue
        if "parallel=True" not in source or "prange(" not in source:
            serial.append(f"{name} ({cells[name]} cells)")
    return serial


def mlp_block(x, w1, b1, w2, b2, y):
    """A GELU MLP with biases and a loss: GELU's backward carries b1's gradient as an epilogue sum."""
    h = F.gelu(F.linear(x, w1, b1))
    loss = F.mse_loss(F.linear(h, w2, b2), y)
    loss.backward()
    return loss, w1.grad, b1.grad, w2.grad, b2.grad


def decoder_block(x, ln_w, ln_b, wqkv, bqkv, wo, y):
    """LayerNorm, a fused q/k/v projection split by slices, causal attention, a loss."""
    batch, context, model = x.shape
    h = F.layer_norm(x, (model,), ln_w, ln_b)
    qkv = F.linear(h, wqkv, bqkv)
    q, k, v = (qkv[:, :, i * model:(i + 1) * model].reshape(batch, context, 4, model // 4).transpose(1, 2)
               for i in range(3))
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = F.linear(attended.transpose(1, 2).reshape(batch, context, model), wo)
    loss = F.mse_loss(x + out, y)
    loss.backward()
    return loss, ln_w.grad, ln_b.grad, wqkv.grad, bqkv.grad, wo.grad


def full_sum(x, w):
    loss = (x * w).tanh().sum()
    loss.backward()
    return loss, w.grad


def _normal(rng, *shape):
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)


PROGRAMS = {
    "mlp_block": (mlp_block, ("w1", "b1", "w2", "b2"),
                  lambda rng: [_normal(rng, 1024, 64), _normal(rng, 256, 64), _normal(rng, 256), _normal(rng, 64, 256),
                               _normal(rng, 64), _normal(rng, 1024, 64)]),
    "decoder_block": (decoder_block, ("ln_w", "ln_b", "wqkv", "bqkv", "wo"),
                      lambda rng: [_normal(rng, 8, 128, 64), 1 + _normal(rng, 64), _normal(rng, 64),
                                   _normal(rng, 192, 64), _normal(rng, 192), _normal(rng, 64, 64),
                                   _normal(rng, 8, 128, 64)]),
    "full_sum": (full_sum, ("w",), lambda rng: [_normal(rng, 300, 1000), _normal(rng, 300, 1000)]),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_large_kernel_is_parallel_and_matches_the_reference(name):
    fn, leaves, make = PROGRAMS[name]
    args = make(np.random.default_rng(0))
    step = bendc.jit(fn, leaves=leaves, target="cpu")
    got = step(*args)
    assert serial_large_kernels(step) == []
    want = bendc.jit(fn, leaves=leaves, target="reference")(*args)
    for a, b in zip(got, want):
        assert_close(a, b, f"{name}", rtol=1e-4, atol=1e-6)
