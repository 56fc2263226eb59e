"""The cuda renderer as text (no numba-cuda needed): strided views against numpy,
launch configurations, and what the generated source must and must not say."""
from __future__ import annotations

import ast
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bendc
import bendc.functional as F
from bendc.codegen.cuda import render_cuda_plan
from bendc.kernels.cuda_kit import MAX_BLOCK, MAX_GRID, grid_stride_launch, tree_block
from bendc.ops.matmul import matmul_tile
from bendc.codegen.plan import build_plan
from bendc.codegen.views import window
from bendc.kernels.access import Access, dense, expanded, indexed, permuted, reshaped


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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.booleans()), min_size=1, max_size=3),
       st.integers(0, 3))
def test_an_arguments_window_holds_exactly_the_elements_a_view_reads(axes, lead) -> None:
    """StepReads passes a view as the window of its root from the lowest to the highest element it
    reads, reversed axes (negative strides) included: every element read falls inside, both ends
    are read, and the rebased offset reads the same elements from the window's start."""
    shape = tuple(lead + size * step for size, step, _ in axes)
    spec = tuple((lead + size * step - 1, lead - 1 if lead else None, -step) if reverse else (lead, None, step)
                 for size, step, reverse in axes)
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    array = base[tuple(slice(*entry) for entry in spec)]
    view = indexed(dense(0, shape), tuple((start, stop, step) for start, stop, step in spec))
    read = access_elements(view, array.shape)
    assert read == [int(v) for v in array.reshape(-1)]
    first, cells = window(view, array.shape)
    assert (first, first + cells - 1) == (min(read), max(read))
    rebased = access_elements(Access(0, view.offset - first, view.strides), array.shape)
    assert rebased == [element - first for element in read] and 0 <= min(rebased) <= max(rebased) < cells
    assert window(dense(0, (3, 0)), (3, 0)) == (0, 0)


def test_launch_configurations() -> None:
    assert grid_stride_launch("kernel", 20).block == (32, 1, 1)
    assert grid_stride_launch("kernel", 10**9).block == (MAX_BLOCK, 1, 1)
    assert grid_stride_launch("kernel", 10**9).grid == (MAX_GRID, 1, 1)
    assert [tree_block(n) for n in (1, 10, 33, 1000)] == [32, 32, 64, 256]
    assert [matmul_tile(m, n) for m, n in ((4, 3), (8, 8), (64, 10), (1, 1))] == [4, 8, 16, 2]


def render(fn, shapes: str, leaves=(), passes=None, **static):
    graph = bendc.jit(fn, leaves=leaves, target="reference", passes=passes).lower(shapes, **static).graph
    plan = build_plan(graph)
    decisions = render_cuda_plan(plan, graph).decisions
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
    assert gather.check == "index {index} is out of range for a dimension of size 5"  # the op is the step's
    assert "err[0] = 1" in gather.source


@pytest.mark.parametrize("fastmath", [False, True])
def test_fastmath_is_opt_in(fastmath: bool) -> None:
    from bendc.codegen.cuda import CudaOptions

    def f(x):
        return x * 2.0 + 1.0

    graph = bendc.jit(f, target="reference").lower("x=f32[4]").graph
    plan = build_plan(graph)
    render_cuda_plan(plan, graph, CudaOptions(fastmath=fastmath))
    assert ("@functools.partial(jit, fastmath=True)" in plan.steps[0].source) == fastmath
    assert "functools.partial(cuda.jit, lto=False)" in plan.steps[0].source  # no LTO: FFMA, see test_sass.py


# ------------------------------------------------------------------ ops with their own cuda kernels
FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+)")


def bare_floats(source: str) -> list[str]:
    """Float literals of the kernel code that are not np.float32(...) constants."""
    code = source.split('SIGNATURE = ', 1)[1]  # past the docstring header
    lines = [line.split("  #", 1)[0] for line in code.splitlines() if not line.strip().startswith(('"""', "#"))]
    text = re.sub(r"np\.float32\([^()]*\)", "", "\n".join(lines))
    return FLOAT_LITERAL.findall(text)


def norm_rope_attention(x, w, cos, sin, q, k, v):
    y = F.layer_norm(x, (8,), w) * 2.0
    r = F.rope(q, cos, sin)
    o = F.scaled_dot_product_attention(r, k, v, is_causal=True, enable_gqa=True)
    u = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    (y.sum() + (o * u).sum()).backward()
    return w.grad, q.grad, k.grad, v.grad


def test_norm_rope_and_attention_kernels() -> None:
    """Typed constants (float64 only in layer norm's rows, on purpose), one block per row or
    work item, the triangular deal in pairs of rows, and dk/dv summed over each group in a loop."""
    plan, _ = render(norm_rope_attention,
                     "x=f32[3,8] w=f32[8]:leaf cos=f32[5,2] sin=f32[5,2] q=f32[2,4,5,4]:leaf "
                     "k=f32[2,2,5,4]:leaf v=f32[2,2,5,3]:leaf", leaves=("w", "q", "k", "v"))
    ops = {s.op for s in plan.steps}
    assert {"layer_norm_grad", "rope", "attention", "attention_probs", "attention_score_grad",
            "attention_vjp"} <= ops
    for step in plan.steps:
        if step.op not in ("layer_norm", "layer_norm_grad", "rope") and not step.op.startswith("attention"):
            continue
        ast.parse(step.source)
        assert "cuda.atomic" not in step.source, step.name
        if step.op.startswith("layer_norm"):
            assert "cuda.shared.array(BLOCK, numba.float64)" in step.source
            # x takes no gradient: dweight only, one block a channel
            assert [launch["grid"] for launch in step.launches] == [(8, 1, 1)], step.launches
        else:
            assert not bare_floats(step.source), (step.name, bare_floats(step.source))
    # (the loss never reads y: the forward layer_norm is dead, its backward recomputes the statistics)
    (norm,) = [s for s in plan.steps if s.op == "layer_norm_grad"]
    assert "rstd = 1.0 / math.sqrt(squares / 8 + 1e-05)" in norm.source  # float64, as the CPU kernel
    rope_step = next(s for s in plan.steps if s.op == "rope")
    assert "partner = " in rope_step.source
    causal, full = (next(s for s in plan.steps if s.op == "attention" and schedule in s.source)
                    for schedule in ("(triangular)", "(dense)"))
    # 2 x 4 heads: 3 work items each (rows (0, 4), (1, 3) and the middle row 2) or 5 rows.
    assert causal.launches[0]["grid"] == (24, 1, 1) and full.launches[0]["grid"] == (40, 1, 1)
    assert "row1 = 4 - item" in causal.source and "row1" not in full.source
    columns = [s for s in plan.steps if s.op == "attention_vjp" and "the gradient of k" in s.source]
    assert columns and all("for member in range(2):" in s.source for s in columns)
    assert {s.launches[0]["grid"][0] for s in columns} == {2 * 2 * 3, 2 * 2 * 5}


def test_attention_longer_than_shared_memory_is_a_users_error() -> None:
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with pytest.raises(bendc.BendcError) as caught:
        # the triangular schedule forced: the reference target's own rule would tile t=13000
        render(f, "q=f32[1,1,13000,4] k=f32[1,1,13000,4] v=f32[1,1,13000,4]",
               passes=["dce", "canonicalize", "cse", "attention_schedule_triangular", "fuse"])
    assert "shared memory" in str(caught.value) and caught.value.op == "attention"
    assert "test_cuda_source.py" in str(caught.value)
