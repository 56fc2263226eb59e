"""Every user mistake raises a BendcError subclass naming the user's line.

The contract (API.md, "Errors"): the message names the user's own source
line (file:line of the offending call inside the traced function, or of the
call site for mistakes made when calling), the op, and the shapes or values
involved. The expected line is found by a marker comment ``# @name`` at the
end of the offending line in this file, so the tests do not depend on line
numbers and break loudly if a marker goes missing.
"""
from __future__ import annotations

import importlib
import os
import pathlib

import numpy as np
import pytest

import bendc
import bendc.functional as F

THIS_FILE = pathlib.Path(__file__).resolve()
_SOURCE = THIS_FILE.read_text(encoding="utf-8").splitlines()
jit_module = importlib.import_module("bendc.function")


# ------------------------------------------------------------------ helpers
def line_of(marker: str) -> int:
    """The 1-based line of this file that ends with ``# @marker``."""
    tag = f"# @{marker}"
    hits = [number for number, text in enumerate(_SOURCE, start=1) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {tag!r} found {len(hits)} times in {THIS_FILE.name}"
    return hits[0]


def expect(error: BaseException, marker: str, *, op: str | None, parts=()) -> str:
    """Check a raised error against the contract and return its message."""
    assert isinstance(error, bendc.BendcError), f"{type(error).__name__} is not a BendcError: {error}"
    message = str(error)
    line = line_of(marker)
    assert error.loc is not None, f"no location in {message!r}"
    assert pathlib.Path(error.loc.path).resolve() == THIS_FILE, f"{error.loc} is not in {THIS_FILE}"
    assert error.loc.line == line, f"error names line {error.loc.line}, the offending line is {line}: {message}"
    assert f"{THIS_FILE.name}:{line}" in message, message
    assert _SOURCE[line - 1].strip() in message, f"the source line text is missing from {message!r}"
    if op is not None:
        assert error.op == op, f"op {error.op!r} != {op!r}"
        assert f"{op}:" in message, message
    for part in parts:
        assert part in message, f"{part!r} missing from {message!r}"
    return message


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def run(fn, *arrays, leaves=()):
    """Trace and run ``fn`` on the reference target."""
    return bendc.jit(fn, leaves=leaves, target="reference")(*arrays)


def raised(kind, fn, *arrays, leaves=()) -> BaseException:
    with pytest.raises(kind) as info:
        run(fn, *arrays, leaves=leaves)
    return info.value


def test_error_hierarchy():
    for kind in (bendc.ShapeError, bendc.UnsupportedError, bendc.GradientError, bendc.SignatureError,
                 bendc.RuntimeCheckError, bendc.ArtifactError, bendc.InternalError):
        assert issubclass(kind, bendc.BendcError)
    assert not issubclass(bendc.BendcError, (TypeError, ValueError))


# ------------------------------------------------------------------ shapes
def test_add_broadcast_mismatch():
    def program(x, y):
        return x + y  # @add-broadcast

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(4, 3))
    expect(error, "add-broadcast", op="add", parts=("f32[2,3]", "f32[4,3]", "broadcast"))


def test_mul_broadcast_mismatch_with_scalar_on_the_left():
    def program(x, y):
        z = 2.0 * x
        return z * y  # @mul-broadcast

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(2, 4))
    expect(error, "mul-broadcast", op="mul", parts=("f32[2,3]", "f32[2,4]"))


def test_matmul_inner_dims():
    def program(x, w):
        return x @ w  # @matmul-inner

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(4, 5))
    expect(error, "matmul-inner", op="matmul", parts=("f32[2,3]", "f32[4,5]", "3", "4"))


def test_batched_matmul_batch_dims():
    def program(x, w):
        return x @ w  # @matmul-batch

    error = raised(bendc.ShapeError, program, f32(2, 3, 4), f32(5, 4, 2))
    expect(error, "matmul-batch", op="matmul", parts=("f32[2,3,4]", "f32[5,4,2]"))


def test_linear_weight_mismatch():
    def program(x, w, b):
        return F.linear(x, w, b)  # @linear-weight

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(4, 5), f32(4))
    expect(error, "linear-weight", op="linear", parts=("f32[2,3]", "f32[4,5]"))


def test_linear_bias_mismatch():
    def program(x, w, b):
        return F.linear(x, w, b)  # @linear-bias

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(4, 3), f32(3))
    expect(error, "linear-bias", op="linear", parts=("f32[2,4]", "f32[3]"))


def test_reshape_to_a_wrong_size():
    def program(x):
        return x.reshape(4, 2)  # @reshape

    error = raised(bendc.ShapeError, program, f32(2, 3))
    expect(error, "reshape", op="reshape", parts=("f32[2,3]", "(4, 2)", "6"))


def test_mse_loss_shape_mismatch():
    def program(a, b):
        return F.mse_loss(a, b)  # @mse

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(3, 2))
    expect(error, "mse", op="mse_loss", parts=("f32[2,3]", "f32[3,2]"))


def test_cross_entropy_wrong_shapes():
    def program(logits, target):
        return F.cross_entropy(logits, target)  # @ce-shapes

    error = raised(bendc.ShapeError, program, f32(2, 3), i64(0, 1, 2))
    expect(error, "ce-shapes", op="cross_entropy", parts=("f32[2,3]", "i64[3]"))


def test_cross_entropy_float_targets():
    def program(logits, target):
        return F.cross_entropy(logits, target)  # @ce-float

    error = raised(bendc.UnsupportedError, program, f32(2, 3), f32(2))
    expect(error, "ce-float", op="cross_entropy", parts=("f32[2]", "int64"))


def test_dim_out_of_range():
    def program(x):
        return x.sum(dim=2)  # @sum-dim

    error = raised(bendc.ShapeError, program, f32(2, 3))
    expect(error, "sum-dim", op="sum", parts=("dim 2", "2 dimensions"))


# ------------------------------------------------------------------ indexing
def test_index_out_of_range_at_trace_time():
    def program(x):
        return x[5]  # @index-range

    error = raised(bendc.ShapeError, program, f32(2, 3))
    expect(error, "index-range", op="index", parts=("5", "f32[2,3]"))


def test_index_out_of_range_in_a_later_dimension():
    def program(x):
        return x[:, -4]  # @index-range-1

    error = raised(bendc.ShapeError, program, f32(2, 3))
    expect(error, "index-range-1", op="index", parts=("-4", "dimension 1", "f32[2,3]"))


def test_too_many_indices():
    def program(x):
        return x[0, 1, 2]  # @index-many

    error = raised(bendc.ShapeError, program, f32(2, 3))
    expect(error, "index-many", op="index", parts=("f32[2,3]",))


def test_a_bool_mask_with_other_index_entries_is_unsupported():
    def program(x):
        return x[x > 0, 0]  # @index-mask-entries

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "index-mask-entries", op="index", parts=("bool tensor index", "whole key"))


def test_a_float_tensor_index_is_unsupported():
    def program(x):
        return x[x]  # @index-float

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "index-float", op="index", parts=("integer or bool", "f32[2,3]"))


def test_a_masked_selection_outside_a_reduction_is_unsupported():
    def program(x):
        return x[x > 0] * 2.0  # @index-mask-use

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "index-mask-use", op="mul", parts=("depends on the mask", "f32[2,3]", "x[mask].sum()"))


# ------------------------------------------------------------------ dtypes
def test_float64_input_names_the_parameter_and_the_call_site():
    def program(x, y):
        return x + y

    step = bendc.jit(program, target="reference")
    with pytest.raises(bendc.SignatureError) as info:
        step(f32(2), np.ones(2, dtype=np.float64))  # @call-float64
    expect(info.value, "call-float64", op="call", parts=("'y'", "float64", "float32"))


def test_int_leaf_is_refused_at_the_call_site():
    def program(w):
        return w

    step = bendc.jit(program, leaves=("w",), target="reference")
    with pytest.raises(bendc.SignatureError) as info:
        step(i64(1, 2))  # @call-int-leaf
    expect(info.value, "call-int-leaf", op="call", parts=("'w'", "int64"))


def test_int_tensor_floor_division_by_a_tensor_is_unsupported():
    def program(i, j):
        return i // j  # @int-floordiv

    error = raised(bendc.UnsupportedError, program, i64(1, 2), i64(3, 4))
    expect(error, "int-floordiv", op="floordiv", parts=("i64[2]", "positive Python int"))


def test_index_assignment_with_a_tensor_index_is_unsupported():
    def program(x, i):
        y = x * 1.0
        y[i] = 0.0  # @index-put-tensor
        return y

    error = raised(bendc.UnsupportedError, program, f32(2), i64(1, 0))
    expect(error, "index-put-tensor", op="index_put", parts=("i64[2]", "unspecified"))


def test_a_view_used_after_an_index_assignment_is_unsupported():
    def program(x):
        y = x * 1.0
        row = y[0]
        y[0, 1] = 5.0  # @index-put
        return row * 2.0  # @stale-view

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    message = expect(error, "stale-view", op="mul", parts=("shares storage",))
    assert f"{THIS_FILE.name}:{line_of('index-put')}" in message


# ------------------------------------------------------------------ autograd
def test_backward_of_a_non_scalar_needs_a_seed():
    def program(x, w):
        y = x * w
        y.backward()  # @backward-nonscalar
        return w.grad

    error = raised(bendc.GradientError, program, f32(2, 3), f32(2, 3), leaves=("w",))
    expect(error, "backward-nonscalar", op="backward", parts=("f32[2,3]", "seed"))


def test_backward_seed_of_the_wrong_shape():
    def program(x, w, seed):
        y = x * w
        y.backward(seed)  # @backward-seed
        return w.grad

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(2, 3), f32(3), leaves=("w",))
    expect(error, "backward-seed", op="backward", parts=("f32[2,3]", "f32[3]"))


def test_backward_of_a_tensor_that_does_not_require_grad():
    def program(x):
        loss = (x * 2.0).sum()
        loss.backward()  # @backward-constant
        return loss

    error = raised(bendc.GradientError, program, f32(2, 3))
    expect(error, "backward-constant", op="backward", parts=("f32[]", "leaves"))


def test_grad_of_a_constant():
    def program(x, w):
        loss = (x * w).sum()
        loss.backward()
        return x.grad  # @grad-constant

    error = raised(bendc.GradientError, program, f32(2, 3), f32(2, 3), leaves=("w",))
    expect(error, "grad-constant", op="grad", parts=("constant", "f32[2,3]"))


def test_grad_of_a_non_leaf():
    def program(x, w):
        h = x * w
        loss = h.sum()
        loss.backward()
        return h.grad  # @grad-nonleaf

    error = raised(bendc.GradientError, program, f32(2, 3), f32(2, 3), leaves=("w",))
    expect(error, "grad-nonleaf", op="grad", parts=("non-leaf", "f32[2,3]"))


def test_zero_grad_of_a_non_leaf():
    def program(x, w):
        h = x * w
        bendc.zero_grad(w, h)  # @zero-grad-nonleaf
        return h

    error = raised(bendc.GradientError, program, f32(2, 3), f32(2, 3), leaves=("w",))
    expect(error, "zero-grad-nonleaf", op="zero_grad", parts=("f32[2,3]", "leaves"))


# ------------------------------------------------------------------ calling and decorating
def test_too_few_arguments_names_the_call_site():
    def program(x, y):
        return x + y

    step = bendc.jit(program, target="reference")
    with pytest.raises(bendc.SignatureError) as info:
        step(f32(2))  # @call-few
    expect(info.value, "call-few", op="call", parts=("program", "y"))


def test_too_many_arguments_names_the_call_site():
    def program(x):
        return x

    step = bendc.jit(program, target="reference")
    with pytest.raises(bendc.SignatureError) as info:
        step(f32(2), f32(2))  # @call-many
    expect(info.value, "call-many", op="call", parts=("program", "argument"))


def test_wrong_shape_at_call_time_is_a_shape_error_in_the_program():
    def program(x, w):
        return x @ w  # @call-shape

    step = bendc.jit(program, target="reference")
    step(f32(2, 3), f32(3, 4))
    with pytest.raises(bendc.ShapeError) as info:
        step(f32(2, 3), f32(4, 4))
    expect(info.value, "call-shape", op="matmul", parts=("f32[2,3]", "f32[4,4]"))


def test_leaves_naming_a_missing_parameter_fail_at_decoration():
    with pytest.raises(bendc.SignatureError) as info:
        @bendc.jit(leaves=("w", "z"), target="reference")  # @leaves-missing
        def program(x, w):
            return x * w
    expect(info.value, "leaves-missing", op="jit", parts=("'z'", "program"))
    assert "'w'" not in info.value.detail.split("are not")[0]


def test_unknown_target():
    def program(x):
        return x

    with pytest.raises(bendc.UnsupportedError) as info:
        bendc.jit(program, target="tpu")  # @target-unknown
    expect(info.value, "target-unknown", op="jit", parts=("'tpu'", "reference"))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_target_not_built_yet(target):
    if target in jit_module.IMPLEMENTED_TARGETS:
        pytest.skip(f"target {target!r} is built")

    def program(x):
        return x

    with pytest.raises(bendc.UnsupportedError) as info:
        bendc.jit(program, target=target)  # @target-unbuilt
    # cuda needs numba-cuda and a GPU (or the simulator): the message says what to install.
    expect(info.value, "target-unbuilt", op="jit",
           parts=(repr(target), "numba-cuda" if target == "cuda" else "reference"))


# ------------------------------------------------------------------ outside a trace, host conversions
def test_functional_outside_a_jit_function():
    with pytest.raises(bendc.UnsupportedError) as info:
        F.relu(f32(3))  # @outside-relu
    expect(info.value, "outside-relu", op="relu", parts=("bendc.jit",))


def test_functional_linear_outside_a_jit_function():
    with pytest.raises(bendc.UnsupportedError) as info:
        F.linear(f32(2, 3), f32(4, 3))  # @outside-linear
    expect(info.value, "outside-linear", op="linear", parts=("bendc.jit",))


def test_bool_of_a_traced_tensor():
    def program(x):
        if x.sum():  # @bool
            return x
        return -x

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "bool", op="bool", parts=("f32[]", "control flow"))


def test_comparison_of_a_traced_tensor():
    def program(x):
        if x.sum() > 0:  # @compare
            return x
        return -x

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "compare", op="bool", parts=("f32[]", ">", "control flow"))


def test_iterating_a_0d_traced_tensor():
    def program(x):
        return [row for row in x.sum()]  # @iter-0d

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "iter-0d", op="iter", parts=("0-d",))


def test_iterating_and_unpacking_a_traced_tensor_works_as_in_pytorch():
    def program(x):
        first, second = x
        return first - second, [row * 2.0 for row in x]

    x = f32(2, 3)
    difference, doubled = run(program, x)
    np.testing.assert_array_equal(difference, x[0] - x[1])
    assert len(doubled) == 2
    np.testing.assert_array_equal(doubled[1], x[1] * np.float32(2.0))


def test_np_asarray_of_a_traced_tensor():
    def program(x):
        return np.asarray(x)  # @asarray

    error = raised(bendc.UnsupportedError, program, f32(2, 3))
    expect(error, "asarray", op="__array__", parts=("f32[2,3]",))


def test_returning_an_unsupported_object():
    def program(x):
        return x, object()

    step = bendc.jit(program, target="reference")
    with pytest.raises(bendc.UnsupportedError) as info:
        step(f32(2))  # @return-object
    expect(info.value, "return-object", op="return", parts=("object",))


def test_a_tensor_leaking_into_another_trace():
    leaked = []

    def first(x):
        leaked.append(x)
        return x

    def second(x):
        return x + leaked[0]  # @leak

    run(first, f32(2))
    error = raised(bendc.UnsupportedError, second, f32(2))
    expect(error, "leak", op="add", parts=("another trace",))


# ------------------------------------------------------------------ run-time checks
def test_gather_index_out_of_range_at_run_time():
    def program(x, index):
        return F.gather(x, 1, index)  # @gather-run

    step = bendc.jit(program, target="reference")
    x = f32(2, 3)
    good = np.array([[0, 2], [1, 1]], dtype=np.int64)
    np.testing.assert_array_equal(step(x, good), np.take_along_axis(x, good, axis=1))
    bad = np.array([[0, 2], [3, 1]], dtype=np.int64)  # same signature: the cached executable checks too
    with pytest.raises(bendc.RuntimeCheckError) as info:
        step(x, bad)
    expect(info.value, "gather-run", op="gather", parts=("3", "size 3"))


def test_gather_negative_index_is_out_of_range_as_in_pytorch():
    def program(x, index):
        return F.gather(x, 1, index)  # @gather-negative

    with pytest.raises(bendc.RuntimeCheckError) as info:
        run(program, f32(2, 3), np.array([[0], [-1]], dtype=np.int64))
    expect(info.value, "gather-negative", op="gather", parts=("-1", "size 3"))


def test_index_select_index_out_of_range_at_run_time():
    def program(x, index):
        return F.index_select(x, 0, index)  # @index-select-run

    with pytest.raises(bendc.RuntimeCheckError) as info:
        run(program, f32(2, 3), i64(0, 2, 1))
    expect(info.value, "index-select-run", op="index_select", parts=("2", "size 2"))


def test_index_select_negative_index_is_out_of_range_as_in_pytorch():
    def program(x, index):
        return F.index_select(x, 0, index)  # @index-select-negative

    with pytest.raises(bendc.RuntimeCheckError) as info:
        run(program, f32(2, 3), i64(-1))
    expect(info.value, "index-select-negative", op="index_select", parts=("-1", "size 2"))


def test_cross_entropy_target_out_of_range_names_the_cross_entropy_line():
    def program(logits, target, w):
        loss = F.cross_entropy(logits * w, target)  # @ce-run
        loss.backward()
        return loss, w.grad

    with pytest.raises(bendc.RuntimeCheckError) as info:
        run(program, f32(2, 3), i64(0, 3), f32(2, 3), leaves=("w",))
    expect(info.value, "ce-run", op=None, parts=("3",))


# ------------------------------------------------------------------ introspection
def test_ir_before_the_first_call():
    def program(x):
        return x

    step = bendc.jit(program, target="reference")
    with pytest.raises(bendc.BendcError) as info:
        step.ir()  # @ir-early
    expect(info.value, "ir-early", op=None, parts=("program", "call"))
    with pytest.raises(bendc.BendcError):
        step.report()
    with pytest.raises(bendc.BendcError):
        step.kernels()


def test_unknown_stage_name():
    def program(x):
        return x * 2.0

    step = bendc.jit(program, target="reference")
    step(f32(2))
    with pytest.raises(bendc.BendcError) as info:
        step.ir("optimized")  # @ir-stage
    message = expect(info.value, "ir-stage", op="ir", parts=("'optimized'",))
    for stage in ("traced", "autodiff", "final"):
        assert stage in message


def test_messages_are_for_people_not_tracebacks():
    """The first line reads ``file:line: op: what``; the second is the source line."""
    def program(x, y):
        return x - y  # @format

    error = raised(bendc.ShapeError, program, f32(2, 3), f32(3, 2))
    first, second = str(error).splitlines()
    assert first.startswith(f"{error.loc}: sub: ")
    assert second.strip() == _SOURCE[line_of("format") - 1].strip()
    assert os.path.basename(error.loc.path) == THIS_FILE.name


def test_tensor_equality_power_and_unknown_methods():
    def equal(x, y):
        if x == y:  # @eq
            return x
        return y

    with pytest.raises(bendc.UnsupportedError) as info:  # x == y is a bool tensor; `if` on it is refused
        bendc.jit(equal, target="reference")(np.ones(2, np.float32), np.ones(2, np.float32))
    expect(info.value, "eq", op="bool", parts=("truth value", "bool[2]"))

    def kth(x):  # (x.max() is supported since the reductions landed, x.cumprod(0) since issue 22's sorts)
        return x.kthvalue(1)  # @kthvalue

    with pytest.raises(bendc.UnsupportedError) as info:
        bendc.jit(kth, target="reference")(np.ones(2, np.float32))
    expect(info.value, "kthvalue", op="kthvalue", parts=("Tensor.kthvalue",))
    assert isinstance(info.value, AttributeError)

    def power(x):
        return x ** "1.5"  # @pow

    with pytest.raises(bendc.UnsupportedError) as info:
        bendc.jit(power, target="reference")(np.ones(2, np.float32))
    expect(info.value, "pow", op="pow", parts=("str", "f32[2]"))


def test_supported_powers_match_torch():
    import torch

    x = np.array([0.5, 1.5, 2.25, 3.0], np.float32)

    def powers(x):
        return x ** 2, x ** 3, x ** 0.5, x ** -1, x ** 1, x.sum(np.int64(0))

    got = bendc.jit(powers, target="reference")(x)
    t = torch.tensor(x)
    for mine, theirs in zip(got, (t ** 2, t ** 3, t ** 0.5, t ** -1, t ** 1, t.sum(0))):
        np.testing.assert_array_equal(mine, theirs.numpy())
