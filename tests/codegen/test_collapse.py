"""Collapsed loop axes in fused elementwise CPU kernels (bendc/codegen/collapse.py): adjacent
axes that every array indexes densely (or none does) run as one loop; values stay bit for bit."""
from __future__ import annotations

import importlib.util
import re

import numpy as np
import torch
import pytest

import bendc
import bendc.functional as F
from bendc.codegen import cpu
from conftest import assert_bitwise, assert_close

rng = np.random.default_rng(11)
SHAPE = (256, 16, 8, 8)  # 2^18 cells: parallel (past parallel_from("elementwise"))


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def elementwise_sources(step):
    """The elementwise kernels' sources, by step name."""
    kernels = step._executable().kernels
    return {name: text for name, text in kernels.items() if "fused elementwise" in text}


def is_collapsed(text):
    """Whether a kernel's source runs over a collapsed domain (reshaped in the kernel or wrapped)."""
    return "_full.reshape(" in text or "def body(" in text


def loop_counts(text):
    """The number of ``for`` loops of the njit function over cells (the wrapper's body or kernel); an
    innermost loop whose sums go through row blocks counts once (its ``_cell`` loop)."""
    njit = text[text.index("@njit"):]
    njit = njit[:njit.index("\n\n\ndef kernel(")] if "\n\n\ndef kernel(" in njit else njit
    return len(re.findall(r"^\s+for i\d+(?:_cell)? in", njit, re.M))


def kernel_over(step, domain):
    """The source of the one elementwise kernel over ``domain`` (as its summary names it)."""
    found = [t for t in elementwise_sources(step).values() if f"over [{','.join(map(str, domain))}]" in t]
    assert len(found) == 1, list(elementwise_sources(step))
    return found[0]


def run_both(fn, args, leaves=()):
    cpu = bendc.jit(fn, leaves=leaves, target="cpu")
    reference = bendc.jit(fn, leaves=leaves, target="reference")
    return cpu(*args), reference(*args), cpu


def uncollapsed(fn, args, leaves, monkeypatch, cache_dir):
    """The results of the cpu target with collapsing off (every kernel keeps one loop per axis)."""
    with monkeypatch.context() as patch:
        patch.setattr(cpu, "collapse_domain", lambda step, graph, domain: None)
        step = bendc.jit(fn, leaves=leaves, target="cpu", cache_dir=str(cache_dir))
        results = step(*args)
        assert not any(is_collapsed(t) for t in elementwise_sources(step).values())
    return results


def test_same_shape_chain_is_one_loop_nest_of_two_and_bitwise():
    def chain(x, y, z):
        return ((x * y + z) * x - y) / (z * z + 1.0)

    args = (rand(*SHAPE), rand(*SHAPE), rand(*SHAPE))
    got, want, step = run_both(chain, args)
    assert_bitwise(got, want, "chain")
    text = kernel_over(step, SHAPE)
    # the parallel batch axis, then one loop over the 16*8*8 cells of a sample
    assert loop_counts(text) == 2, text
    # numba reshapes the C-contiguous arguments inside the kernel: no Python wrapper
    assert "prange(" in text and "_full.reshape(" in text and "def body(" not in text


def test_serial_chain_is_one_loop():
    def chain(x, y):
        return (x - y) * (x + y) / (y * y + 2.0)

    args = (rand(4, 16, 8, 8), rand(4, 16, 8, 8))  # 8192 cells: serial, collapsed whole
    got, want, step = run_both(chain, args)
    assert_bitwise(got, want, "chain")
    text = kernel_over(step, (4, 16, 8, 8))
    assert loop_counts(text) == 1 and "prange(" not in text, text


def test_small_kernels_collapse_in_the_kernel_but_are_not_wrapped():
    def chain(x, y):
        return x * y + x

    got, want, step = run_both(chain, (rand(4, 8, 8), rand(4, 8, 8)))
    assert_bitwise(got, want, "small")
    assert loop_counts(kernel_over(step, (4, 8, 8))) == 1

    def sliced(x, y):
        return x[:, 2:6] * y + y

    got, want, step = run_both(sliced, (rand(4, 8, 8), rand(4, 4, 8)))  # a strided view, 128 cells
    assert_bitwise(got, want, "small sliced")
    text = kernel_over(step, (4, 4, 8))
    assert loop_counts(text) == 3 and not is_collapsed(text), text


def test_per_channel_weights_merge_only_the_spatial_axes():
    def affine(x, w, b):
        return (x * w + b) / (w * w + 1.0)

    args = (rand(*SHAPE), rand(16, 1, 1), rand(16, 1, 1))
    got, want, step = run_both(affine, args)
    assert_bitwise(got, want, "affine")
    text = kernel_over(step, SHAPE)
    assert loop_counts(text) == 3, text  # batch (parallel), channel, 8*8 pixels
    assert re.search(r"in\d = in\d_full\.reshape\(\(in\d_full\.shape\[0\], in\d_full\.shape\[1\] \* in\d_full\.shape\[2\],\)\)",
                     text), text


def test_per_row_statistics_merge_the_trailing_axes():
    def normalize(x, m, r):
        return (x - m) * r

    args = (rand(*SHAPE), rand(SHAPE[0], 1, 1, 1), rand(SHAPE[0], 1, 1, 1))
    got, want, step = run_both(normalize, args)
    assert_bitwise(got, want, "normalize")
    assert loop_counts(kernel_over(step, SHAPE)) == 2


def test_a_row_broadcast_over_the_leading_axes_merges_them():
    def shift(x, b):
        return x * b - b

    args = (rand(8, 16, 64), rand(64))  # serial: the leading (8,16) collapse; b indexes neither
    got, want, step = run_both(shift, args)
    assert_bitwise(got, want, "shift")
    assert loop_counts(kernel_over(step, (8, 16, 64))) == 2


def test_a_transposed_view_keeps_the_axes_it_strides():
    def mixed(x, y):
        return x.permute(1, 0, 2, 3) * y + y

    args = (rand(16, SHAPE[0], 8, 8), rand(*SHAPE))
    got, want, step = run_both(mixed, args)
    assert_bitwise(got, want, "mixed")
    text = kernel_over(step, SHAPE)
    # the permuted operand's (channel, row) strides are not dense: only the pixels merge
    assert loop_counts(text) == 3, text

    def swapped(x, y):
        return x.transpose(2, 3) * y - x.transpose(2, 3)

    args = (rand(*SHAPE), rand(*SHAPE))
    got, want, step = run_both(swapped, args)
    assert_bitwise(got, want, "swapped")
    assert loop_counts(kernel_over(step, SHAPE)) == 4  # nothing merges with a swapped inner pair


def test_a_sliced_view_merges_where_its_strides_allow():
    def sliced(x, y):
        return x[:, 4:20] * y - y

    args = (rand(SHAPE[0], 32, 8, 8), rand(*SHAPE))
    got, want, step = run_both(sliced, args)
    assert_bitwise(got, want, "sliced")
    # channels 4..20 of 32: not contiguous, but each sample's 16*8*8 cells are one stride apart;
    # numba reshapes only C-contiguous arrays: numpy does, in a Python wrapper
    text = kernel_over(step, SHAPE)
    assert loop_counts(text) == 2 and "def body(" in text, text


def test_a_size1_dim_does_not_hide_a_gap_in_the_strides():
    def gap(x, y):
        return x[..., 1:] * y + y

    # x[..., 1:] of (128, 1, 65): dims (128, 1, 64) of strides (65, 65, 1); axes (0,1) and (1,2)
    # each merge freely, all three do not (a gap of one element per row)
    args = (rand(128, 1, 65), rand(128, 1, 64))
    got, want, step = run_both(gap, args)
    assert_bitwise(got, want, "gap")
    text = kernel_over(step, (128, 1, 64))
    assert loop_counts(text) == 2 and "def body(" in text, text


@pytest.mark.parametrize("parallel", [False, True])
def test_epilogue_sums_collapse_and_add_in_the_same_order(parallel, monkeypatch, tmp_path):
    def bias_grad(x, w, b):
        y = x * w + b
        (y * x).sum().backward()
        return y, w.grad, b.grad

    batch = 256 if parallel else 8
    args = (rand(batch, 16, 8, 8), rand(16, 1, 1), rand(16, 1, 1))
    got, want, step = run_both(bias_grad, args, leaves=("w", "b"))
    assert_bitwise(got[0], want[0], "y")
    assert_close(got[1], want[1], "w.grad")
    assert_close(got[2], want[2], "b.grad")
    collapsed = [t for t in elementwise_sources(step).values() if is_collapsed(t) and "sum_to_size" in t]
    assert collapsed, list(elementwise_sources(step))
    # the same float64 sums in the same cell order as one loop per axis: bit for bit
    for a, b in zip(got, uncollapsed(bias_grad, args, ("w", "b"), monkeypatch, tmp_path)):
        assert_bitwise(a, b, "collapsed vs not")


def test_sums_over_dims_merge_only_axes_every_sum_treats_alike(monkeypatch, tmp_path):
    def sums(x, y):
        z = x * y - y
        return z, z.sum(dim=(2, 3)), z.sum(dim=(0,)), (z * x).sum(dim=(1,), keepdim=True)

    args = (rand(*SHAPE), rand(*SHAPE))
    got, want, step = run_both(sums, args)
    assert_bitwise(got[0], want[0], "z")
    for name, a, b in zip(("sum(2,3)", "sum(0)", "sum(1, keepdim)"), got[1:], want[1:]):
        assert_close(a, b, name)
    text = kernel_over(step, SHAPE)
    assert loop_counts(text) == 3, text  # (2,3) merge: both reduced by one sum, both kept by the others
    for a, b in zip(got, uncollapsed(sums, args, (), monkeypatch, tmp_path)):
        assert_bitwise(a, b, "collapsed vs not")


def test_dropout_gives_the_same_mask():
    def drop(x, s):
        return F.dropout(x * 2.0, 0.3, seed=s)

    args = (rand(*SHAPE), np.array(5, np.int64))
    got, want, step = run_both(drop, args)
    assert_bitwise(got, want, "dropout")
    assert loop_counts(kernel_over(step, SHAPE)) == 2

    args = (rand(4, 16, 8, 8), np.array(-3, np.int64))
    got, want, step = run_both(drop, args)
    assert_bitwise(got, want, "dropout serial")
    assert loop_counts(kernel_over(step, (4, 16, 8, 8))) == 1


def test_the_wrapper_never_copies(tmp_path):
    def chain(x, y):
        return x[:, 4:20] * y + y

    step = bendc.jit(chain, target="cpu")
    x, y = rand(4, 32, 8, 8)[:, 4:20], rand(4, 16, 8, 8)
    step(rand(4, 32, 8, 8), y)
    kernels = step._executable().kernels
    (name,) = [n for n, t in kernels.items() if "def body(" in t]
    path = tmp_path / "collapsed_kernel.py"
    path.write_text(kernels[name])
    spec = importlib.util.spec_from_file_location("collapsed_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = np.empty((4, 16, 8, 8), np.float32)
    module.kernel(x, y, out)
    assert_bitwise(out, x * y + y, "wrapper")
    with pytest.raises(AttributeError):  # a view whose merge would copy is refused, never copied
        module.kernel(np.swapaxes(x, 2, 3), y, out)


@pytest.mark.parametrize("shapes", [((2, 1, 4), (1, 1, 4)), ((3, 1, 1, 5), (1, 1, 2, 5)), ((2, 1, 4), (2, 1, 1))])
def test_a_broadcast_and_an_indexed_axis_joined_through_a_size1_axis_stay_apart(shapes):
    """y of (1,1,4) over a (2,1,4) domain broadcasts axis 0 and indexes axis 2: merging the three
    axes through the size-1 axis 1 read y at 8 cells (found by the long cpu fuzz run, through an
    expand in adam's backward). Bitwise against the reference."""
    def step(x, y):
        return x * y + y

    x, y = rand(*shapes[0]), rand(*shapes[1])
    got, want, _ = run_both(step, (x, y))
    assert_bitwise(got, want, "broadcast")
    assert_bitwise(got, (torch.from_numpy(x) * torch.from_numpy(y) + torch.from_numpy(y)).numpy(), "torch")
