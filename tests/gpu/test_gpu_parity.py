"""The cuda target on a real GPU, at real sizes: the mlp example and a few ops
against the reference interpreter and PyTorch. Skipped without a usable GPU
(and under the CUDA simulator, which is not one).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from bendc.compile import cuda_status

if cuda_status() != "gpu":
    pytest.skip("needs numba-cuda and a usable GPU", allow_module_level=True)

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402
from bendc.errors import RuntimeCheckError  # noqa: E402
from conftest import assert_bitwise, assert_close  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
from cuda_programs import PROGRAMS, jitted, mlp_example, tiled_attention_program, transformer_example  # noqa: E402

rng = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def host(value) -> np.ndarray:
    return value.copy_to_host()


def both(fn, args, leaves=(), cache_dir=None):
    cuda_fn = bendc.jit(fn, leaves=leaves, target="cuda", cache_dir=cache_dir)
    got = cuda_fn(*args)
    want = bendc.jit(fn, leaves=leaves, target="reference")(*args)
    return got, want, cuda_fn


def test_auto_picks_cuda() -> None:
    assert bendc.jit(lambda x: x * 2.0).resolved_target == "cuda"


def test_mlp_example_at_its_shapes_matches_reference_for_several_steps(tmp_path) -> None:
    program = mlp_example()
    x, y, *params = program.make_inputs(np.random.default_rng(3))
    step = jitted(program, "cuda", str(tmp_path))
    reference = jitted(program, "reference")
    device_params = params
    for _ in range(5):
        loss, *device_params = step(x, y, *device_params, lr=0.1)
        want_loss, *params = reference(x, y, *params, lr=0.1)
        assert_close(host(loss), want_loss, "loss", rtol=1e-5, atol=1e-6)
        for name, mine, theirs in zip(program.leaves, device_params, params):
            assert_close(host(mine), theirs, name, rtol=1e-4, atol=1e-6)


def test_mlp_example_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import flat_mlp as mlp  # the mlp example with one parameter per array

    x, y = mlp.make_data(mlp.BATCH)
    params = mlp.init_params()
    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cuda")
    loss, *new_params = step(x, y, *params, lr=0.1)
    leaves = [torch.tensor(p, requires_grad=True) for p in params]
    w1, b1, w2, b2 = leaves
    logits = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(torch.tensor(x), w1, b1)), w2, b2)
    torch_loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y))
    torch_loss.backward()
    torch.optim.SGD(leaves, lr=0.1).step()
    assert_close(host(loss), torch_loss.detach().numpy(), "loss", rtol=1e-5, atol=1e-6)
    for name, mine, theirs in zip(mlp.LEAVES, new_params, leaves):
        assert_close(host(mine), theirs.detach().numpy(), name, rtol=1e-4, atol=1e-6)


def test_elementwise_is_bitwise_without_fma() -> None:
    def chain(x, w, b):
        return ((x * w + b) * x - b) / (w * w + 1.0)

    got, want, _ = both(chain, (rand(1000, 333), rand(1000, 333), rand(333)))
    assert_bitwise(host(got), want, "elementwise chain")


@pytest.mark.parametrize("shape", [(512, 1000), (3, 70000)])
def test_softmax_and_log_softmax(shape) -> None:
    def f(x):
        return F.softmax(x, 1), F.log_softmax(x, 0)

    got, want, _ = both(f, (rand(*shape),))
    for mine, theirs in zip(got, want):
        assert_close(host(mine), theirs, rtol=1e-4, atol=1e-6)


def test_matmuls_with_transposed_and_broadcast_operands() -> None:
    def f(a, b, c):
        return a @ b.T, (a @ c).sum(0), c.transpose(1, 2) @ a.T

    a, b, c = rand(256, 384), rand(512, 384), rand(3, 384, 200)
    got, want, _ = both(f, (a, b, c))
    for mine, theirs in zip(got, want):
        assert_close(host(mine), theirs, rtol=1e-4, atol=1e-4)


def test_large_sums() -> None:
    def f(x):
        return x.sum(), x.sum(0), x.sum(1, keepdim=True)

    got, want, _ = both(f, (rand(2000, 3000),))
    for mine, theirs in zip(got, want):
        assert_close(host(mine), theirs, rtol=1e-4, atol=1e-3)


def test_gathers_and_scatters_at_size() -> None:
    def f(x, i, j):
        y = F.index_select(x, 0, i).sum() + (F.gather(x, 1, j) * x[:, :64]).sum()
        y.backward()
        return x.grad

    x = rand(4096, 256)
    i = rng.integers(0, 4096, size=10000).astype(np.int64)
    j = rng.integers(0, 256, size=(4096, 64)).astype(np.int64)
    got, want, step = both(f, (x, i, j), leaves=("x",))
    assert_close(host(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeCheckError, match="index 4096 is out of range"):
        step(x, np.full(3, 4096, np.int64), j)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_kernel_kinds_at_test_sizes(program) -> None:
    inputs = program.make_inputs(np.random.default_rng(0))
    got = jitted(program, "cuda")(*inputs, **program.static)
    want = jitted(program, "reference")(*inputs, **program.static)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for index, (mine, theirs) in enumerate(zip(got, want)):
        if index in program.bitwise:
            assert_bitwise(host(mine), theirs, f"{program.name} {index}")
        else:
            assert_close(host(mine), theirs, f"{program.name} {index}")


def test_norm_rope_and_attention_at_size() -> None:
    """layer_norm over 512 columns, rope and GQA attention at t 256, D 64 (causal: the triangular
    schedule; not causal: dense), forward and backward, against the reference."""
    program = transformer_example()
    inputs = program.make_inputs(np.random.default_rng(5))
    got = jitted(program, "cuda")(*inputs)
    want = jitted(program, "reference")(*inputs)
    for name, mine, theirs in zip(("y", "dw", "dq", "dk", "dv"), got, want):
        assert_close(host(mine), theirs, name, rtol=1e-4, atol=1e-5)


def test_tiled_attention_at_size() -> None:
    """The tiled schedule's cuda kernels (bendc/ops/attention/cuda_tiled.py) at t 512, D 64, causal GQA,
    forward and backward, against the reference (the tiled op's numpy semantics)."""
    program = tiled_attention_program("tiled_causal_d64", True, 2, 8, 2, 512, 64, 64)
    inputs = program.make_inputs(np.random.default_rng(6))
    step = jitted(program, "cuda")
    got = step(*inputs)
    assert "attention_tiled_grad" in step.ir("final")
    want = jitted(program, "reference")(*inputs)
    for name, mine, theirs in zip(("o", "dq", "dk", "dv"), got, want):
        assert_close(host(mine), theirs, name, rtol=1e-4, atol=1e-5)


def test_torch_cuda_tensors_are_read_in_place() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from runtime.cuda import to_device_flat

    x = torch.randn(64, 32, device="cuda")
    w = torch.randn(16, 32, device="cuda", requires_grad=True)
    assert to_device_flat(x).device_ctypes_pointer.value == x.data_ptr()

    def f(x, w):
        loss = (F.linear(x, w) * 0.5).sum()
        loss.backward()
        return loss, w.grad

    step = bendc.jit(f, leaves=("w",), target="cuda")
    loss, grad = step(x, w)
    want_loss, want_grad = bendc.jit(f, leaves=("w",), target="reference")(x.cpu().numpy(),
                                                                             w.detach().cpu().numpy())
    assert_close(host(loss), want_loss, rtol=1e-4, atol=1e-4)
    assert_close(host(grad), want_grad, rtol=1e-4, atol=1e-4)
    as_torch = torch.as_tensor(grad, device="cuda")  # outputs expose __cuda_array_interface__
    assert as_torch.shape == (16, 32)
