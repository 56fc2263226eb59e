"""Issue 22's composite ops against PyTorch eager (float32): any/all, roll, repeat_interleave,
einsum and sum/mean(dtype=), values and gradients on the reference and cpu targets.

Each is written with existing ops (bendc/tensor_math.py), so one program holds them all and compiles
once per target. Tolerances: roll, repeat_interleave, any/all and the sums of integer and bool
tensors move or count values, bit for bit; einsum contracts by batched matmuls in an order of its
own (torch's bmm/opt_einsum order may differ) and float sums add in bendc's order, within 2e-6
(relative and absolute), as are the loss and the gradients (through the einsums).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bendc
from conftest import assert_bitwise

EINSUMS = ("bij,bjk->bik", "bij,bjk", "bij,bkj->", "ij,jk,kl->il", "bij->jb", "bij,bij->bi", "i,j->ij", "bij,k->bk",
           "bij->")


def program(a, b, c, v, counts, marks):
    """Every composite, on torch tensors or traced ones; returns the values and a scalar loss."""
    mask = marks > 0
    values = [torch.einsum(equation, *operands) for equation, operands in zip(EINSUMS, (
        (a, b), (a, b), (a, a), (c, c, c), (a,), (a, a), (v, v), (a, v), (a,)))]
    values += [a.roll(1, 2), torch.roll(a, (1, -5), (0, 1)), a.roll(-2), b.repeat_interleave(2, dim=1),
               torch.repeat_interleave(v, 3), a.repeat_interleave(1, -1),
               a.sum(dtype=torch.float32), a.mean((0, 2), dtype=torch.float32), torch.sum(a, 1, dtype=torch.float32),
               counts.sum(dtype=torch.float32), mask.sum(1, dtype=torch.float32), counts.mean(0, dtype=torch.float32),
               # the float results of any/all, to weight the loss: rows with a zero are summed twice
               a.relu().all(2).float()]
    flags = [a.any(), (a > 0).all(1), counts.any(0), torch.all(counts, 1, keepdim=True), mask.any(), mask.all(0),
             a.relu().all(dim=(0, 2)), torch.any(a.relu(), -1), counts[:0].any(), counts[:0].all(0)]
    loss = sum(((value * value).sum() for value in values), torch.zeros(()) if isinstance(a, torch.Tensor) else 0.0)
    return values, flags, loss


def _inputs():
    rng = np.random.default_rng(22)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    a[1, 2, 3] = 0.0  # any/all over a row with a zero, relu's zeros too
    return dict(a=a, b=rng.standard_normal((2, 4, 5)).astype(np.float32),
                c=rng.standard_normal((3, 3)).astype(np.float32), v=rng.standard_normal(4).astype(np.float32),
                counts=np.array([[0, 1, 2], [0, 0, 0]], np.int64),
                marks=np.array([[1, 0], [1, 1]], np.int64))


LEAVES = ("a", "b", "c", "v")


def _bendc(target):
    def step(a, b, c, v, counts, marks):
        values, flags, loss = program(a, b, c, v, counts, marks)
        loss.backward()
        return (*values, *flags, loss, a.grad, b.grad, c.grad, v.grad)

    return bendc.jit(step, leaves=LEAVES, target=target)(*_inputs().values())


def _torch():
    tensors = {name: torch.tensor(array, requires_grad=name in LEAVES) for name, array in _inputs().items()}
    values, flags, loss = program(**tensors)
    loss.backward()
    return [t.detach().numpy() for t in (*values, *flags, loss)] + [tensors[n].grad.numpy() for n in LEAVES]


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_composites_match_torch(target):
    got, want = [np.asarray(g) for g in _bendc(target)], _torch()
    assert len(got) == len(want)
    count = len(EINSUMS)
    # einsums, the float sums and means (torch sums in an order of its own), the loss and the gradients
    rounded = set(range(count)) | set(range(count + 6, count + 9)) | set(range(len(got) - 5, len(got)))
    for position, (mine, theirs) in enumerate(zip(got, want)):
        what = f"output {position}"
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, (what, mine.shape, theirs.shape, mine.dtype)
        if position in rounded:
            np.testing.assert_allclose(mine, theirs, rtol=2e-6, atol=2e-6, err_msg=what)
        elif mine.dtype == np.bool_:
            np.testing.assert_array_equal(mine, theirs, err_msg=what)
        else:
            assert_bitwise(mine, theirs, what)


def test_roll_and_repeat_interleave_gradients_are_exact():
    """Gradients through roll and repeat_interleave alone (no einsum) are torch's bit for bit."""
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    weight = np.random.default_rng(4).standard_normal((6, 4)).astype(np.float32)

    def loss(x, weight):
        return (x.roll((1, 2), (0, 1)).repeat_interleave(2, 0) * weight).sum()

    @bendc.jit(leaves=("x",), target="reference")
    def step(x, weight):
        loss(x, weight).backward()
        return x.grad

    tx = torch.tensor(x, requires_grad=True)
    loss(tx, torch.tensor(weight)).backward()
    assert_bitwise(np.asarray(step(x, weight)), tx.grad.numpy(), "gradient")


@pytest.mark.parametrize("body, message", [
    ("x.repeat_interleave(x)", "repeats must be a Python int"),
    ("x.sum(dtype=torch.float64)", "sum(dtype=float64)"),
    ("x.mean(dtype=torch.int64)", "mean(dtype=int64)"),
    ("torch.einsum('...ij->ij', x)", "ellipsis"),
    ("torch.einsum('ii->i', x)", "repeated"),
    ("torch.einsum('ij,jk->ik', x, x.T[:2])", "'j' is 3 and 2"),
    ("x.roll((1, 2), 0)", "one shift a dim"),
])
def test_refusals_name_the_line(body, message):
    namespace = {"torch": torch}
    exec(f"def step(x):\n    return {body}\n", namespace)
    with pytest.raises(bendc.BendcError) as raised:
        bendc.jit(namespace["step"], target="reference")(np.ones((3, 3), np.float32))
    assert message in str(raised.value)
    assert "line 2" in str(raised.value) or ":2" in str(raised.value)
