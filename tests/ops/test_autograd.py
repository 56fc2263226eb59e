"""Autograd semantics against PyTorch: frozen constants, gradient slots,
accumulation across backward() calls, seeds, what a jitted function may
return, static arguments and the in-process signature cache.

Programs here are elementwise wherever the point is an exact comparison, so
gradients are compared bit for bit (sum's backward is a seed of ones).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as F
from conftest import assert_bitwise, assert_close



def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(shape, seed: int) -> np.ndarray:
    return np.asarray(_rng(seed).standard_normal(shape), dtype=np.float32)


def positive(shape, seed: int) -> np.ndarray:
    return np.asarray(_rng(seed).uniform(0.5, 2.0, shape), dtype=np.float32)


def leaf(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.copy()).requires_grad_(True)


def const(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.copy())


def ir_lines(text: str) -> list[str]:
    """The body lines of printed IR (no header, no return, no closing brace)."""
    return [line.strip() for line in text.splitlines()
            if line.startswith("  %")]


def node_id(lines: list[str], pattern: str) -> str:
    """The %id of the single line whose text matches ``pattern``."""
    found = [line.split(" = ", 1)[0] for line in lines if re.search(pattern, line)]
    assert len(found) == 1, f"expected one line matching {pattern!r}, got {found}"
    return found[0]


def op_of(line: str) -> str:
    return line.split(" = ", 1)[1].split()[0].split("[", 1)[0]


# ------------------------------------------------------------------ constant freezing
def test_constant_operand_of_matmul_gets_no_product():
    """x @ W.T with x a constant: the backward computes dW only (one product), never dx."""
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        loss = (x @ w.T).sum()
        loss.backward()
        return loss, w.grad

    x, w = normal((3, 4), 1), normal((5, 4), 2)
    loss, grad = step(x, w)
    lines = ir_lines(step.ir("autodiff"))
    matmuls = [line for line in lines if op_of(line) == "matmul"]
    assert len(matmuls) == 2, "\n".join(matmuls)  # the forward and dW
    w_t = node_id(lines, r"= permute\[perm=\(1,0\)\] %w\b")
    assert not any(re.search(rf"= permute\[[^\]]*\] {w_t}\b", line) for line in lines), \
        "a transpose of W.T is the operand of a dx product"
    assert not any(op_of(line) == "matmul" and w_t in line.split("=", 1)[1] and "vjp of" in line
                   for line in lines), "a backward product uses W.T"

    w_torch = leaf(w)
    expected = (const(x) @ w_torch.T).sum()
    expected.backward()
    assert_close(loss, expected.detach().numpy(), "loss")
    assert_close(grad, w_torch.grad.numpy(), "dW")


def test_both_operands_leaves_get_both_products():
    """The same program with x a leaf too: three products (the counting above is meaningful)."""
    @bendc.jit(leaves=("x", "w"), target="reference")
    def step(x, w):
        loss = (x @ w.T).sum()
        loss.backward()
        return x.grad, w.grad

    step(normal((3, 4), 3), normal((5, 4), 4))
    matmuls = [line for line in ir_lines(step.ir("autodiff")) if op_of(line) == "matmul"]
    assert len(matmuls) == 3


def test_all_constant_op_does_no_backward_work():
    """c = exp(x * y) from constants only is a constant: no VJP is built for it."""
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, y, w):
        c = (x * y).exp()
        loss = (c * w).sum()
        loss.backward()
        return loss, w.grad

    x, y, w = normal((2, 3), 5), normal((2, 3), 6), normal((2, 3), 7)
    loss, grad = step(x, y, w)
    lines = ir_lines(step.ir("autodiff"))
    product = node_id(lines, r"= mul %x, %y\b")
    exp = node_id(lines, rf"= exp {product}\b")
    vjps = [line for line in lines if "vjp of" in line]
    assert vjps, "the backward of the loss is missing"
    for frozen in (product, exp):
        assert not any(f"vjp of {frozen} " in line for line in vjps), f"backward work for constant {frozen}"
    tape = step.tape().splitlines()
    for frozen in (product, exp):
        entry = [line for line in tape if re.search(rf"\s{frozen} = ", line)]
        assert len(entry) == 1 and entry[0].startswith("constant"), entry

    w_torch = leaf(w)
    expected = ((const(x) * const(y)).exp() * w_torch).sum()
    expected.backward()
    assert_close(loss, expected.detach().numpy(), "loss")
    assert_close(grad, w_torch.grad.numpy(), "dw")  # dw = c = exp(x*y): exp is not bit-exact


# ------------------------------------------------------------------ gradient slots
def test_grad_before_backward_is_none():
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        early = w.grad
        loss = (x * w).sum()
        return loss, early

    loss, early = step(normal((3,), 8), normal((3,), 9))
    assert early is None


def test_grad_of_leaf_not_reached_is_none():
    @bendc.jit(leaves=("w", "b"), target="reference")
    def step(x, w, b):
        loss = (x * w).sum()
        loss.backward()
        return w.grad, b.grad

    grad_w, grad_b = step(normal((3,), 10), normal((3,), 11), normal((3,), 12))
    assert grad_w is not None and grad_b is None


def test_backward_calls_accumulate_in_order():
    """Three losses, overlapping graphs: slots add contributions in backward() call order.

    A .grad read in between is a snapshot of the slot at that point. (In torch
    the tensor read is the slot itself and later accumulation changes it in
    place, so torch's side clones it to compare values.)
    """
    @bendc.jit(leaves=("w", "b"), target="reference")
    def step(x, y, w, b):
        h = x * w + b
        l1 = (h * y).sum()
        l2 = (h * h).sum()
        l3 = (w / y - b * b).sum()
        l1.backward()
        g1 = w.grad
        l2.backward()
        g2 = w.grad
        l3.backward()
        return g1, g2, w.grad, b.grad

    x, y, w, b = normal((3, 4), 13), positive((3, 4), 14), normal((3, 4), 15), normal((3, 4), 16)
    g1, g2, g3, gb = step(x, y, w, b)

    wt, bt = leaf(w), leaf(b)
    h = const(x) * wt + bt
    (h * const(y)).sum().backward(retain_graph=True)  # l2 reuses h's graph
    e1 = wt.grad.clone()
    (h * h).sum().backward()
    e2 = wt.grad.clone()
    (wt / const(y) - bt * bt).sum().backward()
    assert_bitwise(g1, e1.numpy(), "w.grad after one backward")
    assert_bitwise(g2, e2.numpy(), "w.grad after two")
    assert_bitwise(g3, wt.grad.numpy(), "w.grad after three")
    assert_bitwise(gb, bt.grad.numpy(), "b.grad after three")
    assert not np.array_equal(g1, g2) and not np.array_equal(g2, g3)


def test_backward_twice_on_one_loss_doubles():
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        loss = (x * w * w).sum()
        loss.backward()
        loss.backward()
        return w.grad

    x, w = normal((5,), 17), normal((5,), 18)
    wt = leaf(w)
    loss = (const(x) * wt * wt).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert_bitwise(step(x, w), wt.grad.numpy(), "w.grad")


def test_zero_grad_between_backward_calls():
    """zero_grad empties the slot: None until the next backward, then only the new contribution."""
    @bendc.jit(leaves=("w", "b"), target="reference")
    def step(x, w, b):
        (x * w + b).sum().backward()
        bendc.zero_grad(w)
        emptied, kept = w.grad, b.grad
        (w * w * x).sum().backward()
        return emptied, kept, w.grad, b.grad

    x, w, b = normal((4,), 19), normal((4,), 20), normal((4,), 21)
    emptied, kept, grad_w, grad_b = step(x, w, b)
    assert emptied is None

    wt, bt = leaf(w), leaf(b)
    (const(x) * wt + bt).sum().backward()
    wt.grad = None  # zero_grad(set_to_none=True)
    kept_t = bt.grad.clone()
    (wt * wt * const(x)).sum().backward()
    assert_bitwise(kept, kept_t.numpy(), "b.grad untouched by zero_grad(w)")
    assert_bitwise(grad_w, wt.grad.numpy(), "w.grad: the second contribution only")
    assert_bitwise(grad_b, bt.grad.numpy(), "b.grad: the first backward only")


def test_zero_grad_of_several_leaves_then_read():
    @bendc.jit(leaves=("w", "b"), target="reference")
    def step(x, w, b):
        (x * w * b).sum().backward()
        bendc.zero_grad(w, b)
        return w.grad, b.grad

    assert step(normal((3,), 22), normal((3,), 23), normal((3,), 24)) == (None, None)


@pytest.mark.parametrize("shape", [(3, 4), (5,), ()], ids=str)
def test_backward_with_seed_bitwise(shape):
    """y.backward(seed) on a non-scalar elementwise program equals torch bit for bit."""
    @bendc.jit(leaves=("a", "b"), target="reference")
    def step(a, b, c, seed):
        y = (a * b - c) / (b + 3.0) - 2.0 / a
        y.backward(seed)
        return y, a.grad, b.grad

    a, b, c = positive(shape, 25), normal(shape, 26), normal(shape, 27)
    seed = normal(shape, 28)
    y, ga, gb = step(a, b, c, seed)
    at, bt = leaf(a), leaf(b)
    yt = (at * bt - const(c)) / (bt + 3.0) - 2.0 / at
    yt.backward(const(seed))
    assert_bitwise(y, yt.detach().numpy(), "y")
    assert_bitwise(ga, at.grad.numpy(), "a.grad")
    assert_bitwise(gb, bt.grad.numpy(), "b.grad")


def test_backward_of_a_leaf_itself():
    """w.backward(seed) on a leaf gives w.grad == seed exactly (-0.0 included); 0-d: backward()."""
    @bendc.jit(leaves=("w", "s"), target="reference")
    def step(w, s, seed):
        w.backward(seed)
        s.backward()
        return w.grad, s.grad

    seed = np.array([3.0, -0.0, 0.0, -1.5], np.float32)
    grad_w, grad_s = step(normal((4,), 72), np.array(2.0, np.float32), seed)
    assert_bitwise(grad_w, seed, "w.grad")
    assert_bitwise(grad_s, np.float32(1.0), "s.grad")


def test_backward_of_one_element_tensor():
    """torch allows backward() without a seed on any one-element tensor, e.g. shape (1,) or (1, 1)."""
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        (x * w).reshape(-1).sum(0, keepdim=True).backward()
        (w * w).sum(dim=(0, 1), keepdim=True).backward()
        return w.grad

    x, w = normal((2, 3), 73), normal((2, 3), 74)
    wt = leaf(w)
    (const(x) * wt).reshape(-1).sum(0, keepdim=True).backward()
    (wt * wt).sum(dim=(0, 1), keepdim=True).backward()
    assert_bitwise(step(x, w), wt.grad.numpy(), "w.grad")


def test_python_scalar_seed_for_a_0d_output():
    @bendc.jit(leaves=("w",), target="reference")
    def step(w):
        (w * w * 2.0).sum().backward(1.5)
        return w.grad

    w = normal((3,), 75)
    wt = leaf(w)
    (wt * wt * 2.0).sum().backward(torch.tensor(1.5))
    assert_bitwise(step(w), wt.grad.numpy(), "w.grad")


def test_grad_used_in_further_computation():
    """Read w.grad and compute with it (an SGD step); gradients are constants (no create_graph)."""
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, y, w):
        loss = ((x * w - y) * (x * w - y)).sum()
        loss.backward()
        new_w = w - 0.1 * w.grad
        loss2 = ((x * new_w - y) * (x * new_w - y)).sum()
        loss2.backward()  # through new_w back to w; w.grad inside new_w is a constant
        return new_w, F.sgd_step(w, w.grad, 0.05), loss2, w.grad

    x, y, w = normal((2, 3), 29), normal((2, 3), 30), normal((2, 3), 31)
    new_w, sgd_w, loss2, grad = step(x, y, w)

    wt = leaf(w)
    xt, yt = const(x), const(y)
    ((xt * wt - yt) * (xt * wt - yt)).sum().backward()
    first = wt.grad.clone()
    new_wt = wt - 0.1 * first
    loss2_t = ((xt * new_wt - yt) * (xt * new_wt - yt)).sum()
    loss2_t.backward()
    assert_bitwise(new_w, new_wt.detach().numpy(), "w - 0.1 * w.grad")
    assert_bitwise(sgd_w, (wt.detach() - np.float32(0.05) * wt.grad).numpy(), "sgd_step on the accumulated grad")
    assert_close(loss2, loss2_t.detach().numpy(), "loss after the step")
    assert_bitwise(grad, wt.grad.numpy(), "w.grad after both backward calls")


def test_grad_of_constant_is_an_error():
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        (x * w).sum().backward()
        return x.grad

    with pytest.raises(bendc.GradientError):
        step(normal((3,), 32), normal((3,), 33))


# ------------------------------------------------------------------ what a jitted function returns
def test_returning_the_same_tensor_twice():
    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        loss = (x * w).sum()
        loss.backward()
        return loss, loss, w.grad, w.grad

    x, w = normal((4,), 34), normal((4,), 35)
    loss_a, loss_b, grad_a, grad_b = step(x, w)
    assert_bitwise(loss_a, loss_b)
    assert_bitwise(grad_a, grad_b)
    assert_bitwise(grad_a, x)  # d sum(x * w) / dw = 1 * x


def test_returning_a_parameter_does_not_alias_the_input():
    step = bendc.jit(lambda x, w: (x, w.T, w * 1.0), target="reference")
    x, w = normal((2, 3), 36), normal((2, 3), 37)
    out_x, out_wt, out_w = step(x, w)
    assert_bitwise(out_x, x)
    assert_bitwise(out_wt, w.T)
    assert not np.shares_memory(out_x, x) and not np.shares_memory(out_wt, w)


def test_returning_nested_structures_and_none():
    @bendc.jit(leaves=("w", "b"), target="reference")
    def step(x, w, b):
        loss = (x * w + b).sum()
        loss.backward()
        return {"loss": loss, "grads": [w.grad, (b.grad, None)], "k": 3, "none": None}, None, [x * 2.0]

    x, w, b = normal((3,), 38), normal((3,), 39), normal((3,), 40)
    out, nothing, doubled = step(x, w, b)
    assert nothing is None
    assert isinstance(out, dict) and set(out) == {"loss", "grads", "k", "none"}
    assert out["k"] == 3 and out["none"] is None
    grads = out["grads"]
    assert isinstance(grads, list) and isinstance(grads[1], tuple) and grads[1][1] is None
    assert_bitwise(grads[0], x)
    assert_bitwise(grads[1][0], np.ones(3, np.float32))
    assert isinstance(doubled, list) and len(doubled) == 1
    assert_bitwise(doubled[0], x * np.float32(2.0))
    assert_close(out["loss"], (const(x) * const(w) + const(b)).sum().numpy())


def test_returning_none_only():
    step = bendc.jit(lambda x: None, target="reference")
    assert step(normal((2,), 41)) is None


def test_returning_a_single_tensor():
    step = bendc.jit(lambda x: x * x, target="reference")
    x = normal((2, 2), 42)
    out = step(x)
    assert isinstance(out, np.ndarray)
    assert_bitwise(out, x * x)


# ------------------------------------------------------------------ static scalars and the cache
def test_static_scalars_retrace_per_value():
    calls = []

    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w, scale, squash):
        calls.append((scale, squash))
        y = x * w * scale
        if squash:
            y = y.tanh()
        loss = y.sum()
        loss.backward()
        return loss, w.grad

    x, w = normal((3, 2), 43), normal((3, 2), 44)

    def torch_step(scale, squash):
        wt = leaf(w)
        y = const(x) * wt * scale
        if squash:
            y = y.tanh()
        y.sum().backward()
        return wt.grad.numpy()

    _, grad_2 = step(x, w, 2.0, False)
    ir_2 = step.ir()
    assert len(calls) == 1 and len(step._cache) == 1
    _, again = step(x, w, 2.0, False)
    assert len(calls) == 1 and len(step._cache) == 1, "same signature: no retrace"
    assert_bitwise(again, grad_2)

    _, grad_3 = step(x, w, 3.0, False)
    ir_3 = step.ir()
    assert len(calls) == 2 and len(step._cache) == 2
    assert ir_2 != ir_3 and "value=3.0" in ir_3 and "value=3.0" not in ir_2
    assert_bitwise(grad_2, torch_step(2.0, False), "scale 2.0")
    assert_bitwise(grad_3, torch_step(3.0, False), "scale 3.0")

    _, grad_tanh = step(x, w, 3.0, True)
    assert len(calls) == 3 and "tanh" in step.ir() and "tanh" not in ir_3
    assert_close(grad_tanh, torch_step(3.0, True), "tanh branch")

    step(x, w, 2.0, False)  # an earlier signature is still cached
    assert len(calls) == 3
    assert step.ir() == ir_2, "introspection follows the last signature called"


def test_cache_keys_on_shapes_and_dtypes():
    calls = []

    @bendc.jit(leaves=("x",), target="reference")
    def step(x, i):
        calls.append(x.shape)
        y = F.index_select(x, 0, i)
        loss = (y * y).sum()
        loss.backward()
        return loss, x.grad

    x = normal((4, 3), 45)
    step(x, np.array([0, 2, 2], np.int64))
    step(normal((4, 3), 46), np.array([1, 1, 3], np.int64))  # same shapes and dtypes
    assert len(calls) == 1 and len(step._cache) == 1
    step(x, np.array([0, 2, 2], np.int32))  # index dtype changes
    assert len(calls) == 2
    step(normal((5, 3), 47), np.array([0, 2, 2], np.int64))  # shape changes
    assert len(calls) == 3
    step(x, np.array([0, 2], np.int64))
    assert len(calls) == 4 and len(step._cache) == 4


def test_cached_call_uses_new_values():
    """A cache hit runs the compiled program on the new inputs (no stale results)."""
    calls = []

    @bendc.jit(leaves=("w",), target="reference")
    def step(x, w):
        calls.append(1)
        loss = (x * w * w).sum()
        loss.backward()
        return loss, w.grad

    for seed in range(3):
        x, w = normal((4,), 50 + seed), normal((4,), 60 + seed)
        _, grad = step(x, w)
        wt = leaf(w)
        (const(x) * wt * wt).sum().backward()
        assert_bitwise(grad, wt.grad.numpy(), f"call {seed}")
    assert len(calls) == 1


def test_torch_tensor_inputs():
    """Inputs may be torch tensors (even requires_grad ones): read as arrays."""
    step = bendc.jit(lambda x, w: (x * w, w.sum()), target="reference", leaves=())
    x, w = normal((2, 3), 70), normal((2, 3), 71)
    product, total = step(torch.from_numpy(x), leaf(w))
    assert_bitwise(product, x * w)
    assert_close(total, w.sum())


@pytest.mark.parametrize("target", ["reference", "cpu"])
@pytest.mark.parametrize("dim, shape", [(0, (65, 48)), (1, (3, 7, 5)), (2, (2, 3, 9)), (0, (65, 1100))])
def test_index_select_gradient_adds_repeats_in_index_order(target, dim, shape):
    """index_select's gradient (index_add) sums each position's repeats in index order, as torch's
    CPU index_add_ does: the same bits, with summands of mixed magnitudes (where the order shows)."""
    rng = _rng(48 + dim)
    x = normal(shape, 49)
    index = rng.integers(0, shape[dim], 3 * shape[dim])
    index[:4] = 1  # a position summed at least four times
    grad_shape = list(shape)
    grad_shape[dim] = index.size
    g = (normal(grad_shape, 50) * 10.0 ** rng.uniform(-4, 4, grad_shape)).astype(np.float32)

    @bendc.jit(leaves=("x",), target=target)
    def step(x, index, g):
        (F.index_select(x, dim, index) * g).sum().backward()
        return x.grad

    tx = leaf(x)
    (torch.index_select(tx, dim, torch.from_numpy(index)) * const(g)).sum().backward()
    assert_bitwise(step(x, index, g), tx.grad.numpy(), f"d index_select dim {dim} ({target})")


@pytest.mark.parametrize("target", ["reference", "cpu"])
@pytest.mark.parametrize("dim, shape, index_shape", [(1, (64, 65), (64, 1)), (0, (5, 7), (12, 7)),
                                                     (1, (3, 6, 4), (3, 9, 4)), (2, (2, 3, 9), (2, 3, 20)),
                                                     (1, (4, 5), (3, 2)), (0, (300, 260), (310, 260))])
def test_gather_gradient_adds_repeats_in_index_order(target, dim, shape, index_shape):
    """gather reads its lines, and its gradient (scatter_add) sums each position's repeats in C order
    over the index, as torch's CPU scatter_add_ does: the same bits, with summands of mixed magnitudes.
    The (4, 5) case's index is smaller than the source across dim (torch allows it); the last case's
    kernels are parallel (over the policy's threshold)."""
    rng = _rng(60 + dim)
    x = normal(shape, 61)
    index = rng.integers(0, shape[dim], index_shape)
    index.reshape(-1)[:4] = 1  # repeats (a position summed several times where lines share it)
    g = (normal(index_shape, 62) * 10.0 ** rng.uniform(-4, 4, index_shape)).astype(np.float32)

    @bendc.jit(leaves=("x",), target=target)
    def step(x, index, g):
        y = F.gather(x, dim, index)
        (y * g).sum().backward()
        return y, x.grad

    tx = leaf(x)
    ty = torch.gather(tx, dim, torch.from_numpy(index))
    (ty * const(g)).sum().backward()
    y, dx = step(x, index, g)
    assert_bitwise(y, ty.detach().numpy(), f"gather dim {dim} ({target})")
    assert_bitwise(dx, tx.grad.numpy(), f"d gather dim {dim} ({target})")


@pytest.mark.parametrize("op", ["gather", "gather_window", "index_select"])
def test_cpu_index_kernels_name_the_first_index_outside_in_c_order(op):
    """The CPU kernels check every index before reading: the first one outside [0, size) in C order
    is the one named (torch's message), negative ones included. gather_window's index has fewer rows
    than the source (numpy's path, with the same check)."""
    def program(x, index):
        return F.index_select(x, 1, index.reshape(-1)) if op == "index_select" else F.gather(x, 1, index)

    step = bendc.jit(program, target="cpu")
    x = normal((3 if op == "gather_window" else 2, 4), 63)
    good = np.array([[0, 3], [1, 2]], dtype=np.int64)
    expected = np.take(x, good.reshape(-1), 1) if op == "index_select" else np.take_along_axis(x[:2], good, 1)
    assert_bitwise(step(x, good), expected)
    for bad, named in (([[0, 7], [-1, 9]], "7"), ([[0, 1], [-2, 9]], "-2")):
        with pytest.raises(bendc.RuntimeCheckError, match=f"index {named} is out of range for a dimension of size 4"):
            step(x, np.array(bad, dtype=np.int64))
