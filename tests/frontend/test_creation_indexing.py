"""Tensors made inside a traced function, PyTorch's indexing, index assignment, in-place ops and integer
arithmetic (issue 22): values and gradients against torch eager, on the reference and cpu targets."""
from __future__ import annotations

import numpy as np
import pytest

import bendc

torch = pytest.importorskip("torch")
TF = torch.nn.functional
TARGETS = ["reference", "cpu"]


def made(x, w):
    """Creation functions with device= and dtype=, folded into arithmetic with a leaf."""
    t = x.shape[1]
    h = x * w
    pos = torch.arange(0, t, dtype=torch.long, device=x.device)
    constants = (torch.zeros(2, t, device=x.device) + torch.ones(t) * 2 + torch.full((t,), 0.5) + torch.eye(2, t)
                 + torch.linspace(-1, 3, t) + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])[:t] + pos.float()
                 + torch.arange(0.5, t, 1.0) + torch.zeros_like(h) + torch.ones_like(h) * 3 + torch.full_like(h, -2.0))
    onehot = TF.one_hot(torch.tensor([0, 3, 1]), t).float().sum(0)
    return (h * (constants + onehot)).sum() + (h * torch.eye(t)[:2]).sum()


def indexed(x, w, idx):
    """Lists, integer tensors (negative too), None, negative steps, masks into reductions, and
    integer arithmetic on the index."""
    h = x * w
    picked = (h[:, [-1], :].sum() + h[:, None, :, 1:].sum() + (h[::-1] * h).sum() + (h[:, ::-2] ** 2).sum()
              + h[idx].sum() + h[:, (idx + 1) * 2 - 2].sum() + h[0, idx // 2 % 2].sum()
              + h[[1, 0], [-1, 1]].sum() + h[idx, :, idx + 1].sum() + h[:, idx, [0, 1, 2]].sum()
              + h[[True, False]].sum())
    return picked + h[h > 0].sum() + h[h > 0.5].mean() + h[h[:, :, 0] > 0].mean(0).sum()


def written(x, w):
    """Index assignment: slices, ints, lists, None, masks; the written values and the kept ones both
    take gradients."""
    h = x * w
    y = h.clone()
    y[:, 0] = 3.0
    y[0] = y[1] * 2
    y[1, [2, 0]] = h[0, :2] * h[1, 1]
    y[y < -0.5] = 0.25
    z = torch.zeros(2, 3, 4)
    z[..., 1:3] = h[..., :2]
    return (y * y).sum() + (z * h).sum()


def _torch_run(program, *arrays):
    leaf = torch.tensor(arrays[1], requires_grad=True)
    tensors = [torch.tensor(a) for a in arrays]
    tensors[1] = leaf
    loss = program(*tensors)
    loss.backward()
    return loss.detach().numpy(), leaf.grad.numpy()


def _bendc_run(program, target, *arrays):
    def step(*args):
        loss = program(*args)
        loss.backward()
        return loss, args[1].grad

    names = ["x", "w", "idx"][:len(arrays)]
    namespace: dict = {}
    exec(f"def step({', '.join(names)}):\n    return inner({', '.join(names)})\n", {"inner": step}, namespace)
    return bendc.jit(namespace["step"], leaves=("w",), target=target)(*arrays)


def _inputs(shape=(2, 3, 4)):
    rng = np.random.default_rng(0)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("target", TARGETS)
def test_creation_functions_match_torch(target):
    x, w = _inputs((2, 4))
    loss, grad = _bendc_run(made, target, x, w)
    want_loss, want_grad = _torch_run(made, x, w)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_indexing_matches_torch(target):
    x, w = _inputs()
    idx = np.array([1, -1, 0], np.int64)
    loss, grad = _bendc_run(indexed, target, x, w, idx)

    def reference(x, w, idx):  # torch refuses negative steps: the same values through flip
        h = x * w
        flipped = (h.flip(0) * h).sum() + (h.flip(1)[:, ::2] ** 2).sum()
        return indexed_without_steps(x, w, idx) + flipped

    want_loss, want_grad = _torch_run(reference, x, w, idx)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


def indexed_without_steps(x, w, idx):
    h = x * w
    picked = (h[:, [-1], :].sum() + h[:, None, :, 1:].sum()
              + h[idx].sum() + h[:, (idx + 1) * 2 - 2].sum() + h[0, idx // 2 % 2].sum()
              + h[[1, 0], [-1, 1]].sum() + h[idx, :, idx + 1].sum() + h[:, idx, [0, 1, 2]].sum()
              + h[[True, False]].sum())
    return picked + h[h > 0].sum() + h[h > 0.5].mean() + h[h[:, :, 0] > 0].mean(0).sum()


@pytest.mark.parametrize("target", TARGETS)
def test_index_assignment_matches_torch(target):
    x, w = _inputs()
    loss, grad = _bendc_run(written, target, x, w)
    want_loss, want_grad = _torch_run(written, x, w)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-6)


def test_made_values_and_integer_results_are_torch_s_bit_for_bit():
    @bendc.jit(target="cpu")
    def values(i):
        positions = torch.arange(i.shape[0])
        return (torch.arange(2, 11, 3), torch.linspace(-2, 5, 7), torch.arange(1, 2.5, 0.25), torch.eye(3, 2),
                (i + 1) * 3 - positions, i // 3, i % 3, -i, torch.tensor([[1, 2], [3, 4]]), TF.one_hot(i % 3, 3),
                (i * 0.5).long(), i[::-1], torch.full((2,), 7), torch.empty(2, 3).shape == (2, 3) and torch.ones(1))

    i = np.array([4, -5, 0, 7], np.int64)
    got = values(i)
    ti = torch.tensor(i)
    want = (torch.arange(2, 11, 3), torch.linspace(-2, 5, 7), torch.arange(1, 2.5, 0.25), torch.eye(3, 2),
            (ti + 1) * 3 - torch.arange(4), ti // 3, ti % 3, -ti, torch.tensor([[1, 2], [3, 4]]), TF.one_hot(ti % 3, 3),
            (ti * 0.5).long(), ti.flip(0), torch.full((2,), 7), torch.ones(1))
    for position, (mine, theirs) in enumerate(zip(got, want)):
        assert mine.dtype == theirs.numpy().dtype and mine.shape == tuple(theirs.shape)
        if position == 1:  # linspace: PyTorch's vectorized loop rounds some values differently (1 ulp)
            np.testing.assert_allclose(mine, theirs.numpy(), rtol=2.5e-7, atol=0)
        else:
            np.testing.assert_array_equal(mine, theirs.numpy())


@pytest.mark.parametrize("target", TARGETS)
def test_integer_and_bool_sums_are_torch_s_int64(target):
    """x.sum() of a bool or integer tensor is an int64 count, as torch's: the accuracy line
    (logits.argmax(-1) == y).sum(), sums over some dims (keepdim too), an int32 operand, a zero-size
    dim, and lines long enough for several parallel chunks and cuda's block tree."""
    def counts(logits, y, big, small, empty):
        return ((logits.argmax(-1) == y).sum(), torch.sum(logits > 0, 1), (logits < 0).sum((0, 2), keepdim=True),
                y.sum(), (y * 3 - 7).sum(0), small.sum(-1), (big > 0.5).sum(), (big > 0).sum(1), empty.sum(1),
                (empty > 0).sum(0))

    rng = np.random.default_rng(3)
    arrays = (rng.standard_normal((6, 5, 4)).astype(np.float32), rng.integers(0, 4, (6, 5)).astype(np.int64),
              rng.random((3, 70_000)).astype(np.float32), rng.integers(-9, 9, (2, 3)).astype(np.int32),
              np.zeros((4, 0), np.int64))
    got = bendc.jit(counts, target=target)(*arrays)
    want = counts(*map(torch.from_numpy, arrays))
    for mine, theirs in zip(got, want):
        assert mine.dtype == np.int64 and mine.shape == tuple(theirs.shape)
        np.testing.assert_array_equal(mine, theirs.numpy())


@pytest.mark.parametrize("target", TARGETS)
def test_integer_where_and_clamp_keep_torch_s_integer_dtype(target):
    """torch.where and clamp of integer tensors and ints are integer (int64 where one is, else int32);
    a float operand makes them float32; an index clamped into range indexes."""
    def picks(i, j, x):
        return (i.clamp(0, 4), i.clamp(min=-2), i.clamp(max=3), torch.clamp(j, 1, 2), j.clamp(0, 2.5),
                torch.where(i > 0, i, 0), torch.where(i > 0, j, i), torch.where(j > 1, j, 7),
                torch.where(i > 0, i, 0.5), i.clip(0, 3) * 2 + 1, x[0, i[0].clamp(0, 2)])

    arrays = (np.array([[3, -4, 5], [0, 7, -1]], np.int64), np.array([1, 2, 3], np.int32), np.ones((2, 3), np.float32))
    for mine, theirs in zip(bendc.jit(picks, target=target)(*arrays), picks(*map(torch.from_numpy, arrays))):
        assert mine.dtype == theirs.numpy().dtype
        np.testing.assert_array_equal(mine, theirs.numpy())


def test_an_index_out_of_range_names_the_line():
    @bendc.jit(target="reference")
    def step(x, i):
        return x[[0, 5]].sum() + x[i].sum()

    with pytest.raises(bendc.ShapeError, match="index 5 is out of range for dimension 0 of size 3"):
        step(np.ones(3, np.float32), np.array([0], np.int64))

    @bendc.jit(target="cpu")
    def traced(x, i):
        return x[i, i].sum()

    with pytest.raises(bendc.BendcError, match="out of range"):
        traced(np.ones((3, 3), np.float32), np.array([0, 3], np.int64))
    assert float(traced(np.ones((3, 3), np.float32), np.array([0, -3], np.int64))) == 2.0


def test_refusals_name_the_line_and_the_reason():
    @bendc.jit(target="reference")
    def requires_grad(x):
        return x + torch.zeros(3, requires_grad=True)

    with pytest.raises(bendc.UnsupportedError, match="requires_grad=True"):
        requires_grad(np.ones(3, np.float32))

    @bendc.jit(target="reference")
    def float64(x):
        return x + torch.ones(3, dtype=torch.float64)

    with pytest.raises(bendc.UnsupportedError, match="float64"):
        float64(np.ones(3, np.float32))

    @bendc.jit(target="reference")
    def repeated(x):
        y = x * 1.0
        y[[0, 0]] = 1.0
        return y

    with pytest.raises(bendc.UnsupportedError, match="more than once"):
        repeated(np.ones(3, np.float32))

    @bendc.jit(leaves=("x",), target="reference")
    def leaf(x):
        x[0] = 1.0
        return x

    with pytest.raises(bendc.GradientError, match="leaf"):
        leaf(np.ones(3, np.float32))


@pytest.mark.parametrize("target", TARGETS)
def test_written_negative_zeros_keep_their_sign(target):
    """x[key] = value copies the value's bits, -0.0 included (the fuzzer found +0.0: the write had
    accumulated into +0.0 words; it now starts from -0.0, the identity of +)."""
    def step(x):
        y = torch.empty(2, 3)
        y[...] = x.relu() * -1.0
        z = x.clone()
        z[1, 1:] = -(x[0, :2] * 0.0)
        return y, z

    x = np.array([[-1.0, 2.0, 0.0], [3.0, -4.0, 5.0]], np.float32)
    for mine, theirs in zip(bendc.jit(step, target=target)(x), step(torch.from_numpy(x))):
        np.testing.assert_array_equal(np.signbit(mine), np.signbit(theirs.numpy()))
        np.testing.assert_array_equal(mine, theirs.numpy())


def in_place(x, w, i):
    """In-place ops as users write them: augmented assignment (every name of the tensor sees the write,
    as in PyTorch: ``r`` below), the methods' in-place forms chained, fill_ / zero_ / copy_ (casting),
    into a torch.empty, and on an integer index tensor."""
    h = x * w
    r = h
    h += w
    h *= x
    h -= 0.5
    h /= 3.0
    a = w.clone()
    a.add_(h).mul_(x).clamp_(-1.0, 1.0).masked_fill_(a > 0.75, -0.25)
    b = torch.empty(2, 3).fill_(0.25)
    b[0] = 2.0
    c = torch.zeros(2, 3)
    c.copy_(h[0])
    d = w.clone().zero_()
    j = i.clone()
    j += 2
    j //= 2
    k = torch.zeros(3)
    k.copy_(j)  # int64 into float32: copy_ casts
    loss = (r * w).sum() + (a * a).sum() + (b * c * w).sum() + d.sum() + (k * w).sum() + w[0, j].sum()
    loss.backward()
    return (loss, w.grad, r, a, b, c, d, j, k)


@pytest.mark.parametrize("target", TARGETS)
def test_in_place_ops_match_torch(target):
    x, w = _inputs((2, 3))
    i = np.array([3, -4, 1], np.int64)
    got = bendc.jit(in_place, leaves=("w",), target=target)(x, w, i)
    tw = torch.tensor(w, requires_grad=True)
    want = [t.detach().numpy() for t in in_place(torch.tensor(x), tw, torch.tensor(i))]
    for position, (mine, theirs) in enumerate(zip(got, want)):
        assert np.asarray(mine).dtype == theirs.dtype, position
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7, err_msg=f"output {position}")


def test_in_place_refusals_name_the_line_and_the_reason():
    """A view of the written tensor (PyTorch would show the write), a leaf, a result of another shape,
    and a float result into an integer tensor are BendcErrors naming the line, never other numbers."""
    def stale_view(x):
        h = x * 2
        v = h[0]
        h += 1
        return v.sum()

    def leaf(w):
        w.add_(1.0)
        return w.sum()

    def broadcast(x):
        h = x[0] * 1.0
        h += x
        return h

    def integer(x):
        i = torch.arange(3)
        i += 0.5
        return i

    x = np.ones((2, 3), np.float32)
    cases = [(stale_view, (), bendc.UnsupportedError, "shares storage with the tensor written by \\+="),
             (leaf, ("w",), bendc.GradientError, "add_ on a leaf"),
             (broadcast, (), bendc.ShapeError, "doesn't match the broadcast shape"),
             (integer, (), bendc.UnsupportedError, "can't be cast to i64")]
    for fn, leaves, error, message in cases:
        with pytest.raises(error, match=message) as caught:
            bendc.jit(fn, leaves=leaves, target="reference")(x)
        assert "test_creation_indexing.py:" in str(caught.value), fn.__name__


def test_device_is_the_targets_and_cuda_devices_are_taken_back():
    """x.device is torch.device("cpu") on the reference target (the cuda target's torch.device("cuda", 0):
    tests/cuda/test_sim_lifted_constants.py); a cuda device given to a creation function or to() and
    x.cuda() are accepted anywhere: the target places the data."""
    seen = []

    def step(x):
        seen.append((x.device, x.is_cuda))
        cuda = torch.device("cuda", 0)
        return torch.arange(x.shape[0], device=cuda) * 1.0 + x.cuda() + torch.ones(x.shape, device="cuda:0").to(cuda)

    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(bendc.jit(step, target="reference")(x), np.arange(3) + x + 1)
    assert seen == [(torch.device("cpu"), False)]
