"""The cuda renderer as text (no numba-cuda needed): strided views against numpy,
launch configurations, and what the generated source must and must not say."""
from __future__ import annotations

import ast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bendc
import bendc.functional as F
from bendc.codegen.cuda import MAX_BLOCK, MAX_GRID, grid_stride_launch, matmul_tile, render_cuda_plan, tree_block
from bendc.codegen.plan import build_plan
from bendc.codegen.strides import dense, expanded, indexed, permuted, reshaped


def numpy_elements(array: np.ndarray) -> list[int]:
    """The element offsets (in elements) of a view into its base, in row-major order."""
    base = array.base if array.base is not None else array
    start = (array.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // array.itemsize
    strides = [s // array.itemsize for s in array.strides]
    return [start + sum(i * s for i, s in zip(index, strides)) for index in np.ndindex(*array.shape)]


def access_elements(access, shape) -> list[int]:
    return [access.offset + sum(i * s for i, s in zip(index, access.strides)) for index in np.ndindex(*shape)]


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


@settings(max_examples=80, deadline=None)
@given(shapes, st.data())
def test_permute_and_reshape_views_match_numpy(shape, data) -> None:
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    view = permuted(dense(0, shape), perm)
    array = base.transpose(perm)
    assert access_elements(view, array.shape) == numpy_elements(array)
    sizes = data.draw(st.sampled_from(_factorizations(array.size)))
    one_at = data.draw(st.integers(-1, len(sizes)))
    if one_at >= 0:
        sizes = sizes[:one_at] + (1,) + sizes[one_at:]
    moved = reshaped(view, array.shape, sizes)
    try:
        reshaped_view = array.view()
        reshaped_view.shape = sizes  # numpy refuses where a copy would be needed
    except AttributeError:
        assert moved is None
        return
    assert moved is not None
    assert access_elements(moved, sizes) == numpy_elements(reshaped_view)


def _factorizations(count: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of count into factors > 1 (a size-1 axis is inserted separately)."""
    if count == 1:
        return [()]
    result = []
    for first in range(2, count + 1):
        if count % first == 0:
            result += [(first,) + rest for rest in _factorizations(count // first) if len(rest) < 3]
    return result


def test_index_and_expand_views_match_numpy() -> None:
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    view = indexed(dense(0, (3, 4, 5)), (1, (0, 4, 2), (1, 5, 3)))
    assert access_elements(view, (2, 2)) == numpy_elements(base[1, 0:4:2, 1:5:3])
    broadcast = expanded(dense(0, (4, 1)), (4, 1), (2, 4, 3))
    assert access_elements(broadcast, (2, 4, 3)) == [i for _ in range(2) for i in range(4) for _ in range(3)]


def test_launch_configurations() -> None:
    assert grid_stride_launch("kernel", 20).block == (32, 1, 1)
    assert grid_stride_launch("kernel", 10**9).block == (MAX_BLOCK, 1, 1)
    assert grid_stride_launch("kernel", 10**9).grid == (MAX_GRID, 1, 1)
    assert [tree_block(n) for n in (1, 10, 33, 1000)] == [32, 32, 64, 256]
    assert [matmul_tile(m, n) for m, n in ((4, 3), (8, 8), (64, 10), (1, 1))] == [4, 8, 16, 2]


def render(fn, shapes: str, leaves=(), **static):
    graph = bendc.jit(fn, leaves=leaves, target="reference").lower(shapes, **static).graph
    plan = build_plan(graph)
    decisions = render_cuda_plan(plan, graph)
    return plan, decisions


def test_generated_source_is_typed_readable_python() -> None:
    def f(x, w, b):
        y = F.softmax(F.linear(x, w, b).tanh() * 0.5, 1)
        y.sum().backward()
        return y, w.grad

    plan, _ = render(f, "x=f32[8,6] w=f32[4,6]:leaf b=f32[4]:leaf", leaves=("w", "b"))
    for step in plan.steps:
        ast.parse(step.source)  # valid Python
        assert "fastmath" not in step.source
        assert step.launches or step.convention == "view", step.name
        if step.kind == "elementwise":
            assert "cuda.grid(1)" in step.source
            for node in step.nodes:  # a comment names each IR node
                assert f"# %{node} = " in step.source, (node, step.source)
    assert any("v2 = (v1 * np.float32(0.5))  # %8 = mul" in s.source for s in plan.steps)  # a typed constant
    kinds = {s.kind for s in plan.steps}
    assert {"matmul", "row", "elementwise"} <= kinds
    (row,) = [s for s in plan.steps if s.kind == "row"]
    assert "cuda.syncthreads()" in row.source and "shfl" not in row.source
    assert row.launches[0]["shared_bytes"] == 4 * row.launches[0]["block"][0]


def test_transposed_operands_are_read_in_place() -> None:
    def f(x, w):
        return F.linear(x, w)

    plan, decisions = render(f, "x=f32[8,6] w=f32[4,6]")
    assert not decisions  # no copies
    (matmul,) = [s for s in plan.steps if s.kind == "matmul"]
    assert "b strides (1, 6) (column-major loads)" in matmul.source


def test_views_returned_or_not_strided_are_copied() -> None:
    def f(x):
        return x.permute(1, 0, 2), x.permute(2, 1, 0).reshape(4, 6) * 2.0

    plan, decisions = render(f, "x=f32[2,3,4]")
    copied = [s for s in plan.steps if s.kind == "layout" and s.convention == "write"]
    assert len(copied) == 2 and len(decisions) == 2
    assert any("returned to the caller" in d for d in decisions)
    assert any("no strides describe it" in d for d in decisions)


def test_epilogues_and_scatters_clear_their_outputs_first() -> None:
    def f(x, b, i):
        y = (x + b).tanh()
        z = F.index_select(y, 0, i)
        (z * z).sum().backward()
        return b.grad

    plan, _ = render(f, "x=f32[5,3] b=f32[3]:leaf i=i64[4]", leaves=("b",))
    with_zero = [s for s in plan.steps if [l["kernel"] for l in s.launches] == ["zero", "kernel"]]
    assert any("cuda.atomic.add" in s.source for s in with_zero)
    (gather,) = [s for s in plan.steps if s.kind == "gather"]
    assert gather.check == "index_select: index {index} is out of range for a dimension of size 5"
    assert "err[0] = 1" in gather.source


@pytest.mark.parametrize("fastmath", [False, True])
def test_fastmath_is_opt_in(fastmath: bool) -> None:
    from bendc.codegen.cuda import CudaOptions

    def f(x):
        return x * 2.0 + 1.0

    graph = bendc.jit(f, target="reference").lower("x=f32[4]").graph
    plan = build_plan(graph)
    render_cuda_plan(plan, graph, CudaOptions(fastmath=fastmath))
    assert ("@cuda.jit(fastmath=True)" in plan.steps[0].source) == fastmath
