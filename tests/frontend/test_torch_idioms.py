"""Idioms of public model code inside a traced function (issue 22): x.dtype as torch's dtype (compared
with torch.float32, passed back as dtype=, to(), torch.finfo), type_as / view_as / reshape_as, the
new_* creation methods, mT / movedim / swapaxes, torch.outer, count_nonzero, and vector norms (x.norm, torch.norm,
torch.linalg.vector_norm / norm) with torch's zero gradients at a zero norm: values and gradients
against torch eager on the reference and cpu targets."""
from __future__ import annotations

import numpy as np
import pytest

import bendc

torch = pytest.importorskip("torch")


def idioms(x, y, i):
    outputs = [x.norm(), x.norm(dim=-1), x.norm(p=1, dim=(0, 2), keepdim=True), torch.norm(x, dim=1),
               torch.linalg.vector_norm(x, dim=-1), torch.linalg.vector_norm(x, float("inf"), dim=-1),
               torch.linalg.vector_norm(x, 3, dim=-1), torch.linalg.norm(x[0]), torch.linalg.norm(x, dim=-1),
               torch.linalg.vector_norm(x, -float("inf"), dim=-1),
               torch.outer(x[0, 0], y[0, 0]), x[0, 0].outer(y[0, 1]), x.movedim(0, -1), x.movedim((0, 1), (2, 0)),
               x.swapaxes(0, 1), torch.swapaxes(x, 1, 2), x.mT, y.reshape(-1).view_as(x), y.reshape(-1).reshape_as(x),
               i.type_as(x), x.new_zeros((2, 3)), x.new_ones(3), x.new_full((2,), 2.5), i.new_tensor([1, 2]),
               torch.zeros(2, dtype=x.dtype), i.to(x.dtype), x.masked_fill(x > 0, torch.finfo(x.dtype).min),
               x * (1.0 if x.dtype == torch.float32 and x.is_floating_point() and i.dtype == torch.int64 else 2.0),
               torch.count_nonzero(x), x.count_nonzero(dim=(0, 2)), torch.count_nonzero(i, 1), (x > 0).count_nonzero()]
    loss = sum((value * value).sum() for value in outputs[:14])
    return outputs, loss


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_idioms_match_torch(target):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x[1, 2] = 0.0  # a zero row: its norms' gradients are 0, as torch's (not NaN)
    y = rng.standard_normal((2, 3, 4)).astype(np.float32)
    i = np.array([[0, 2, 1], [1, 1, 0]], np.int64)

    def step(x, y, i):
        outputs, loss = idioms(x, y, i)
        loss.backward()
        return (*outputs, loss, x.grad)

    got = bendc.jit(step, leaves=("x",), target=target)(x, y, i)
    leaf = torch.tensor(x, requires_grad=True)
    outputs, loss = idioms(leaf, torch.tensor(y), torch.tensor(i))
    loss.backward()
    want = [value.detach().numpy() for value in outputs] + [loss.detach().numpy(), leaf.grad.numpy()]
    assert len(got) == len(want)
    assert np.isfinite(want[-1]).all()
    for position, (mine, theirs) in enumerate(zip(got, want)):
        mine = np.asarray(mine)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, position
        np.testing.assert_allclose(mine, theirs, rtol=2e-6, atol=1e-6, err_msg=f"output {position}")


def test_dtype_is_torch_s_and_refusals_name_the_line():
    seen = []

    @bendc.jit(target="reference")
    def step(x, i):
        seen.append((x.dtype, i.dtype, (x > 0).dtype, i.int().dtype))
        return x.norm(p=2)

    step(np.ones(3, np.float32), np.zeros(2, np.int64))
    assert seen == [(torch.float32, torch.int64, torch.bool, torch.int32)]

    @bendc.jit(target="reference")
    def matrix_norm(x):
        return torch.linalg.norm(x, ord=2)

    with pytest.raises(bendc.UnsupportedError, match="Frobenius") as caught:
        matrix_norm(np.ones((2, 2), np.float32))
    assert "test_torch_idioms.py:" in str(caught.value)

    @bendc.jit(target="reference")
    def zero_norm(x):
        return x.norm(p=0)

    with pytest.raises(bendc.UnsupportedError, match="ord 0"):
        zero_norm(np.ones(2, np.float32))

    @bendc.jit(target="reference")
    def frobenius_of_three_dims(x):
        return torch.norm(x, dim=(0, 1, 2))

    x = np.ones((1, 2, 3), np.float32)
    with pytest.raises(RuntimeError, match="2-tuple"):  # torch's own refusal
        torch.norm(torch.tensor(x), dim=(0, 1, 2))
    with pytest.raises(bendc.ShapeError, match="at most 2 dims") as caught:
        frobenius_of_three_dims(x)
    assert "test_torch_idioms.py:" in str(caught.value)
