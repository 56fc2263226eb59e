"""The op registry: every op is defined once, with every part (DESIGN.md principle 1).

Walks ``bendc.ops.OPS`` and fails for an op that lacks a part: name, arity,
inference, numpy reference, exactly one of vjp / no_vjp, a lowering kind, a
``scalar`` renderer for elementwise ops, a ``cuda`` renderer for row and
attention ops that bendc/codegen/cuda.py has no template for, a doc showing the printed form, and a
docstring on its VJP rule. Every op has a sample here (operand types and
attributes) on which inference, the reference and the VJP rule run, the VJP
checked against central differences of the reference; and every op appears in
the IR of a traced test program.

Adding an op: add a ``SAMPLES`` entry below, and a use in ``COVERAGE_PROGRAMS``
when users can reach it.
"""
from __future__ import annotations

import functools
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

import bendc
import bendc.functional as F
from bendc.builder import Builder
from bendc.ir.graph import Graph
from bendc.ir.interp import interpret
from bendc.ir.parser import parse_graph
from bendc.ir.types import TensorType
from bendc.ir.verify import verify
from bendc.ops import OPS
from bendc.ops.base import LOWERING_KINDS, METHODS, REQUIRED_RENDERERS, InferError


def T(text: str) -> TensorType:
    return TensorType.parse(text)


@dataclass(frozen=True)
class Sample:
    """Operand types and attributes for one op, and how to draw valid operand values."""

    types: tuple[TensorType, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    positive: tuple[int, ...] = ()     # float operands drawn in [0.5, 2] (log, sqrt, divisors)
    index_limit: int | None = None     # integer operands drawn in [0, index_limit)
    unit: tuple[int, ...] = ()         # float operands drawn in [-0.9, 0.9] (asin, acos; tan away from pi/2)


SAMPLES: dict[str, Sample] = {
    "param": Sample((), {"name": "x", "leaf": True, "dtype": "f32", "shape": (2, 3)}),
    "const": Sample((), {"value": -0.5}),
    "grad": Sample((T("f32[2,3]"), T("f32[]"), T("f32[]"))),
    "add": Sample((T("f32[2,3]"), T("f32[3]"))),
    "sub": Sample((T("f32[2,1]"), T("f32[2,3]"))),
    "mul": Sample((T("f32[2,3]"), T("f32[]"))),
    "div": Sample((T("f32[2,3]"), T("f32[2,3]")), positive=(1,)),
    "neg": Sample((T("f32[2,3]"),)),
    "exp": Sample((T("f32[2,3]"),)),
    "log": Sample((T("f32[2,3]"),), positive=(0,)),
    "tanh": Sample((T("f32[2,3]"),)),
    "sigmoid": Sample((T("f32[2,3]"),)),
    "sqrt": Sample((T("f32[2,3]"),), positive=(0,)),
    "square": Sample((T("f32[2,3]"),)),
    "reciprocal": Sample((T("f32[2,3]"),), positive=(0,)),
    "adam_step_size": Sample((T("f32[]"),), {"lr": 0.001, "beta1": 0.9}, positive=(0,)),
    "adam_bias_root": Sample((T("f32[]"),), {"beta2": 0.999}, positive=(0,)),
    "adam_lr_step_size": Sample((T("f32[]"), T("f32[]")), {"beta1": 0.9}, positive=(0, 1)),
    "bias_correction": Sample((T("f32[]"), T("f32[]")), positive=(0, 1)),
    "relu": Sample((T("f32[2,3]"),)),
    "gelu": Sample((T("f32[2,3]"),), {"approximate": "tanh"}),
    "gelu_vjp": Sample((T("f32[2,3]"), T("f32[2,3]")), {"approximate": "none"}),
    "le": Sample((T("f32[2,3]"), T("f32[3]"))),
    "where": Sample((T("bool[2,3]"), T("f32[2,3]"), T("f32[3]"))),
    "index_select": Sample((T("f32[3,4]"), T("i64[5]")), {"dim": 0}, index_limit=3),
    "index_add": Sample((T("f32[5,4]"), T("i64[5]")), {"dim": 0, "shape": (3, 4), "unique": False}, index_limit=3),
    "gather": Sample((T("f32[3,4]"), T("i64[3,6]")), {"dim": 1}, index_limit=4),
    "scatter_add": Sample((T("f32[3,6]"), T("i64[3,6]")), {"dim": 1, "shape": (3, 4)}, index_limit=4),
    "reshape": Sample((T("f32[2,3]"),), {"shape": (3, 1, 2)}),
    "permute": Sample((T("f32[2,3,4]"),), {"perm": (2, 0, 1)}),
    "expand": Sample((T("f32[3,1]"),), {"shape": (2, 3, 4)}),
    "index": Sample((T("f32[3,5]"),), {"spec": (1, (0, 5, 2))}),
    "index_scatter": Sample((T("f32[3]"),), {"spec": (1, (0, 5, 2)), "shape": (3, 5)}),
    "concat": Sample((T("f32[2,3]"), T("f32[2,1]"), T("f32[2,2]")), {"axis": 1}),
    "matmul": Sample((T("f32[2,1,3,4]"), T("f32[3,4,2]"))),
    "sum": Sample((T("f32[2,3,4]"),), {"dims": (0, 2), "keepdim": False}),
    "sum_to_size": Sample((T("f32[2,3,4]"),), {"shape": (3, 1)}),
    "softmax": Sample((T("f32[2,3]"),), {"dim": 1}),
    "log_softmax": Sample((T("f32[2,3]"),), {"dim": 0}),
    "rope": Sample((T("f32[2,3,4]"), T("f32[3,2]"), T("f32[3,2]")), {"inverse": False}),
    "attention": Sample((T("f32[1,2,3,4]"), T("f32[1,1,3,4]"), T("f32[1,1,3,2]")),
                        {"causal": True, "scale": 0.5, "schedule": "triangular"}),
    "all_reduce": Sample((T("f32[2,3]"),), {"op": "mean", "group": "world"}),
    "reduce_scatter": Sample((T("f32[2,3]"),), {"op": "mean", "group": "world", "ranks": 1}),
    "all_gather": Sample((T("f32[6]"),), {"op": "concat", "group": "world", "ranks": 1, "shape": (2, 3)}),
    "attention_probs": Sample((T("f32[1,2,3,4]"), T("f32[1,1,3,4]")),
                              {"causal": False, "scale": 0.5, "schedule": "dense"}),
    "attention_score_grad": Sample((T("f32[1,2,6]"), T("f32[1,1,3,2]"), T("f32[1,2,3,2]")),
                                   {"causal": True, "scale": 0.5, "schedule": "triangular"}),
    "attention_vjp": Sample((T("f32[1,2,6]"), T("f32[1,2,3,4]")),
                            {"causal": True, "heads": 1, "schedule": "auto", "wrt": "k"}),
    # dropout, activations, losses (op-coverage issue)
    "dropout": Sample((T("f32[2,3]"), T("i64[]")), {"p": 0.5, "offset": 1}, index_limit=1000),
    "causal_fill": Sample((T("f32[2,3,3]"),), {"value": -5.0, "size": 3}),
    "silu": Sample((T("f32[2,3]"),)),
    "silu_vjp": Sample((T("f32[2,3]"), T("f32[2,3]"))),
    "softplus": Sample((T("f32[2,3]"),), {"beta": 2.0, "threshold": 1.0}),
    "softplus_vjp": Sample((T("f32[2,3]"), T("f32[2,3]")), {"beta": 2.0, "threshold": 1.0}),
    "leaky_relu": Sample((T("f32[2,3]"),), {"negative_slope": 0.1}),
    "leaky_relu_vjp": Sample((T("f32[2,3]"), T("f32[2,3]")), {"negative_slope": 0.1}),
    "elu": Sample((T("f32[2,3]"),), {"alpha": 1.5}),
    "elu_vjp": Sample((T("f32[2,3]"), T("f32[2,3]")), {"alpha": 1.5}),
    "hardtanh": Sample((T("f32[2,3]"),), {"min_val": -1.0, "max_val": 1.5}),
    "hardtanh_vjp": Sample((T("f32[2,3]"), T("f32[2,3]")), {"min_val": -1.0, "max_val": 1.5}),
    "class_valid": Sample((T("i64[4]"),), {"ignore_index": 1}, index_limit=3),
    "class_safe": Sample((T("i64[4]"),), {"classes": 3, "ignore_index": 1}, index_limit=3),
    "bce_logits": Sample((T("f32[2,3]"), T("f32[2,3]"))),  # pos_weight takes no gradient (as torch)
    "bce_logits_vjp": Sample((T("f32[2,3]"), T("f32[2,3]"), T("f32[3]")), {"wrt": "target"}),
    # padding_idx outside the drawn indices: by design (torch's) a padding row's gradient is 0, not
    # the derivative of the identity it is (tests/ops/test_ops_activations.py checks that branch)
    "padding_rows": Sample((T("f32[4,3]"), T("i64[4,1]")), {"padding_idx": 3}, index_limit=3),
    "zero_padding": Sample((T("f32[4,3]"), T("i64[4,1]")), {"padding_idx": 1}, index_limit=3),
    "norm_clamp": Sample((T("f32[2,3]"),), {"eps": 0.9}, positive=(0,)),
    "norm_clamp_vjp": Sample((T("f32[2,3]"), T("f32[2,3]")), {"eps": 0.9}, positive=(1,)),
    # ---- reductions beyond sum (bendc/ops/extrema.py, bendc/ops/scan.py)
    "amax": Sample((T("f32[2,3,4]"),), {"dims": (0, 2), "keepdim": False}),
    "amin": Sample((T("f32[2,3,4]"),), {"dims": (1,), "keepdim": True}),
    "max": Sample((T("f32[2,3]"),)),
    "min": Sample((T("f32[3,2]"),)),
    "argmax": Sample((T("f32[2,3,4]"),), {"dim": 1, "keepdim": False}),
    "argmin": Sample((T("f32[2,3]"),), {"dim": 0, "keepdim": True}),
    "extremum_mask": Sample((T("f32[2,3]"), T("f32[2,1]")), {"nan_equal": True}),
    "cumsum": Sample((T("f32[2,3,4]"),), {"dim": 1, "reverse": False}),
    "logsumexp": Sample((T("f32[2,3,4]"),), {"dims": (0, 2), "keepdim": True}),
    # comparisons, casts, clamp, powers, tril/triu (issue 14: bendc/ops/pointwise.py)
    **{name: Sample((T("f32[2,3]"), T("f32[3]"))) for name in ("lt", "gt", "ge", "eq", "ne")},
    "to_float": Sample((T("bool[2,3]"),)),
    "detach": Sample((T("f32[2,3]"),)),
    "abs": Sample((T("f32[2,3]"),)),
    "sign": Sample((T("f32[2,3]"),)),
    "clamp": Sample((T("f32[2,3]"), T("f32[3]"), T("f32[2,1]")), {"lower": True, "upper": True}),
    "rsqrt": Sample((T("f32[2,3]"),), positive=(0,)),
    "pow_scalar": Sample((T("f32[2,3]"),), {"exponent": 1.5}, positive=(0,)),
    "pow": Sample((T("f32[2,3]"), T("f32[3]")), positive=(0,)),
    "triangle": Sample((T("f32[2,3,4]"),), {"diagonal": 0, "upper": False}),
    # the tiled attention schedule (made by the attention_schedule pass)
    "attention_tiled": Sample((T("f32[1,2,3,4]"), T("f32[1,1,3,4]"), T("f32[1,1,3,2]")),
                              {"causal": True, "scale": 0.5}),
    "attention_tiled_grad": Sample((T("f32[1,2,3,4]"), T("f32[1,1,3,4]"), T("f32[1,1,3,2]"), T("f32[1,2,5,2]"),
                                    T("f32[1,2,3,2]")), {"causal": False, "scale": 0.5}),
    # convolution and pooling (op-coverage issue)
    "conv2d": Sample((T("f32[2,4,5,4]"), T("f32[6,2,3,2]"), T("f32[6]")),
                     {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2}),
    "conv2d_grad_input": Sample((T("f32[2,6,2,5]"), T("f32[6,2,3,2]")),
                                {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2,
                                 "input_size": (5, 4)}),
    "conv2d_grad_weight": Sample((T("f32[2,4,5,4]"), T("f32[2,6,2,5]")),
                                 {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2,
                                  "kernel_size": (3, 2)}),
    "max_pool2d": Sample((T("f32[2,3,5,6]"),), {"kernel_size": (3, 2), "stride": (2, 2), "padding": (1, 1),
                                                "dilation": (1, 2), "ceil_mode": True}),
    "max_pool2d_grad": Sample((T("f32[2,3,5,6]"), T("f32[2,3,3,4]")),
                              {"kernel_size": (3, 2), "stride": (2, 2), "padding": (1, 1), "dilation": (1, 2),
                               "ceil_mode": True}),
    "avg_pool2d": Sample((T("f32[2,3,5,6]"),), {"kernel_size": (3, 2), "stride": (2, 2), "padding": (1, 1),
                                                "ceil_mode": True, "count_include_pad": False}),
    "avg_pool2d_grad": Sample((T("f32[2,3,3,4]"),), {"kernel_size": (3, 2), "stride": (2, 2), "padding": (1, 1),
                                                     "ceil_mode": True, "count_include_pad": False,
                                                     "input_size": (5, 6)}),
    "adaptive_avg_pool2d": Sample((T("f32[2,3,5,7]"),), {"output_size": (3, 2)}),
    "adaptive_avg_pool2d_grad": Sample((T("f32[2,3,3,2]"),), {"output_size": (3, 2), "input_size": (5, 7)}),
    # tensor creation and index arithmetic (issue 22: bendc/ops/creation.py, bendc/ops/integer.py)
    "iota": Sample((), {"shape": (2, 5), "dim": 1, "start": 3, "step": -2, "dtype": "i64"}),
    "literal": Sample((), {"shape": (2, 2), "dtype": "f32", "values": (0.5, -1.0, 2.0, 3.0)}),
    "int_add": Sample((T("i64[2,3]"), T("i32[3]")), index_limit=7),
    "int_sub": Sample((T("i32[2,3]"), T("i32[]")), index_limit=7),
    "int_mul": Sample((T("i64[2,1]"), T("i64[2,3]")), index_limit=7),
    "int_floordiv": Sample((T("i64[2,3]"),), {"divisor": 3}, index_limit=11),
    "int_remainder": Sample((T("i64[2,3]"),), {"divisor": 4}, index_limit=11),
    "to_int": Sample((T("f32[2,3]"),), {"dtype": "i64"}),
    "wrap_index": Sample((T("i64[2,3]"),), {"size": 5}, index_limit=4),
    "int_sum": Sample((T("bool[2,3,4]"),), {"dims": (0, 2), "keepdim": True}),
    # everyday elementwise math (bendc/ops/math_ops.py, issue 22)
    **{name: Sample((T("f32[2,3]"), T("f32[3]"))) for name in ("maximum", "minimum", "fmax", "fmin", "atan2")},
    **{name: Sample((T("f32[2,3]"),)) for name in ("isnan", "isinf", "isfinite", "floor", "ceil", "round", "trunc",
                                                  "frac", "sin", "cos", "atan", "sinh", "cosh", "erf",
                                                  "erfc", "exp2", "expm1")},
    **{name: Sample((T("f32[2,3]"),), positive=(0,)) for name in ("log2", "log10", "log1p")},
    **{name: Sample((T("f32[2,3]"),), unit=(0,)) for name in ("asin", "acos", "tan")},
    "nan_to_num": Sample((T("f32[2,3]"),), {"nan": 0.0, "posinf": 1.0, "neginf": -1.0}),
    "lerp": Sample((T("f32[2,3]"), T("f32[2,3]"), T("f32[3]"))),
    "adagrad_lr": Sample((T("f32[]"),), {"lr": 0.01, "lr_decay": 0.1}, positive=(0,)),
    # products, sorts, scatters and float // % (issue 22: bendc/ops/scan.py, sort.py, scatter.py, math_ops.py)
    "cumprod": Sample((T("f32[2,3,4]"),), {"dim": 1, "reverse": False}),
    "argsort": Sample((T("f32[2,5]"),), {"dim": 1, "descending": True}),
    "scatter_reduce": Sample((T("f32[3,4]"), T("f32[2,4]"), T("i64[2,4]")),
                             {"dim": 0, "reduce": "prod", "include_self": True}, index_limit=3),
    "floor_divide": Sample((T("f32[2,3]"), T("f32[3]")), positive=(1,)),
    "remainder": Sample((T("f32[2,3]"), T("f32[3]")), positive=(1,)),
    # group norm as fused ops (bendc/ops/group_norm.py)
    "group_norm": Sample((T("f32[2,4,3]"), T("f32[4]"), T("f32[4]")),
                         {"groups": 2, "eps": 1e-5, "weight": True, "bias": True}),
    "group_norm_grad": Sample((T("f32[2,4,3]"), T("f32[2,4,3]"), T("f32[4]")),
                              {"groups": 2, "eps": 1e-5, "weight": True, "grad_input": True, "grad_affine": True}),
    # layer norm as fused ops (bendc/ops/layer_norm.py)
    "layer_norm": Sample((T("f32[3,4]"), T("f32[4]"), T("f32[4]")), {"eps": 1e-5, "weight": True, "bias": True}),
    "layer_norm_grad": Sample((T("f32[3,4]"), T("f32[3,4]"), T("f32[4]")),
                              {"eps": 1e-5, "weight": True, "grad_input": True, "grad_affine": True}),
    # training batch norm as fused ops (bendc/ops/batch_norm.py)
    "batch_norm": Sample((T("f32[3,4,5]"), T("f32[4]"), T("f32[4]")), {"eps": 1e-5, "weight": True, "bias": True}),
    "batch_norm_grad": Sample((T("f32[3,4,5]"), T("f32[3,4,5]"), T("f32[4]")),
                              {"eps": 1e-5, "weight": True, "grad_input": True, "grad_affine": True}),
    "batch_norm_stats": Sample((T("f32[3,4,5]"),)),
}


def op_names() -> list[str]:
    return sorted(OPS)


def draw(sample: Sample, rng: np.random.Generator) -> list[np.ndarray]:
    values = []
    for position, type in enumerate(sample.types):
        if type.dtype == "bool":
            values.append(rng.random(type.shape) < 0.5)
        elif type.is_index:
            values.append(rng.integers(0, sample.index_limit, size=type.shape).astype(type.np_dtype))
        elif position in sample.positive:
            values.append(rng.uniform(0.5, 2.0, size=type.shape).astype(np.float32))
        elif position in sample.unit:
            values.append(rng.uniform(-0.9, 0.9, size=type.shape).astype(np.float32))
        else:
            # Away from 0 so relu's kink is never within a finite-difference step.
            magnitude = rng.uniform(0.25, 2.0, size=type.shape)
            values.append((magnitude * rng.choice([-1.0, 1.0], size=type.shape)).astype(np.float32))
    return values


# ------------------------------------------------------------------ every op has every part
def test_every_op_has_a_sample_and_every_sample_an_op():
    missing = sorted(set(OPS) - set(SAMPLES))
    stale = sorted(set(SAMPLES) - set(OPS))
    assert not missing, f"ops without a sample in tests/ops/test_registry.py: {missing}"
    assert not stale, f"samples for ops that do not exist: {stale}"


@pytest.mark.parametrize("name", op_names())
def test_op_has_every_part(name):
    opdef = OPS[name]
    problems = []
    if opdef.name != name or not name.isidentifier():
        problems.append(f"registered as {name!r} but named {opdef.name!r}")
    if not (opdef.arity is None or (isinstance(opdef.arity, int) and opdef.arity >= 0)):
        problems.append(f"arity {opdef.arity!r} is neither a count nor None (variadic)")
    if not callable(opdef.infer):
        problems.append("no infer")
    if not callable(opdef.reference):
        problems.append("no reference")
    if (opdef.vjp is None) == (opdef.no_vjp is None):
        problems.append("needs exactly one of vjp / no_vjp")
    if opdef.vjp is not None and not callable(opdef.vjp):
        problems.append("vjp is not callable")
    if opdef.no_vjp is not None and not (isinstance(opdef.no_vjp, str) and opdef.no_vjp.strip()):
        problems.append("no_vjp needs a reason")
    if opdef.vjp is not None and not (opdef.vjp.__doc__ or "").strip():
        problems.append(f"the VJP rule {opdef.vjp.__name__} has no docstring")
    if opdef.lowering.kind not in LOWERING_KINDS:
        problems.append(f"lowering kind {opdef.lowering.kind!r} is not one of {LOWERING_KINDS}")
    if opdef.lowering.kind == "elementwise" and not callable(opdef.lowering.scalar):
        problems.append("an elementwise op needs a scalar renderer")
    for renderer in REQUIRED_RENDERERS.get(opdef.lowering.kind, ()):
        if not callable(getattr(opdef.lowering, renderer)):
            problems.append(f"a {opdef.lowering.kind} op needs its own {renderer} renderer (Lowering.{renderer}); "
                            "codegen writes only the generic kernels (REQUIRED_RENDERERS in bendc/ops/base.py)")
    if not (isinstance(opdef.doc, str) and name in opdef.doc and "`" in opdef.doc):
        problems.append(f"doc {opdef.doc!r} should show the printed form (in backticks, naming the op)")
    sample = SAMPLES.get(name)
    if sample is not None and set(sample.attrs) != set(opdef.attr_names):
        problems.append(f"attr_names {opdef.attr_names} do not match the attributes {sorted(sample.attrs)}")
    if sample is not None and opdef.arity is not None and len(sample.types) != opdef.arity:
        problems.append(f"arity {opdef.arity} but the sample has {len(sample.types)} operands")
    assert not problems, f"op {name}: " + "; ".join(problems)


# ------------------------------------------------------------------ inference, reference, renderers
@pytest.mark.parametrize("name", op_names())
def test_inference_and_reference_agree(name):
    opdef, sample = OPS[name], SAMPLES[name]
    result = opdef.infer(list(sample.types), dict(sample.attrs))
    assert isinstance(result, TensorType)
    if opdef.lowering.kind in ("source", "placeholder") and name != "const":
        return  # parameters are bound and grad slots resolved, never evaluated
    values = draw(sample, np.random.default_rng(0))
    with np.errstate(all="ignore"):
        output = np.asarray(opdef.reference(values, dict(sample.attrs)))
    assert output.shape == result.shape, f"{name}: reference {output.shape} vs inferred {result}"
    assert output.dtype == result.np_dtype, f"{name}: reference {output.dtype} vs inferred {result}"


@pytest.mark.parametrize("name", [n for n in op_names() if OPS[n].arity is not None])
def test_wrong_operand_count_is_a_bendc_error_through_the_builder(name):
    """A bad operand list is a BendcError naming the op and the operand types, never a crash."""
    opdef, sample = OPS[name], SAMPLES[name]
    graph = Graph("bad")
    types = list(sample.types) + [T("f32[7]")]
    operands = [graph.add("param", (), {"name": f"a{i}", "leaf": False, "dtype": t.dtype, "shape": t.shape}, t).id
                for i, t in enumerate(types)]
    with pytest.raises(bendc.BendcError) as info:
        Builder(graph).emit(name, operands, **sample.attrs)
    assert info.value.op == name and f"{opdef.arity} operands" in str(info.value) and "f32[7]" in str(info.value)


def _scalar_args(name: str, sample: Sample) -> list[str]:
    return [f"v{position}" for position in range(len(sample.types))]


@functools.lru_cache(maxsize=1)
def _helper_scope() -> dict[str, Any]:
    """The helper functions generated kernels may call (bendc/kernels/templates), for eval."""
    from bendc.kernels.templates import HELPERS

    return {name: getattr(importlib.import_module(f"bendc.kernels.templates.{file[:-3]}"), name)
            for name, file in HELPERS.items()}


@pytest.mark.parametrize("name", [n for n in op_names() if OPS[n].lowering.scalar is not None
                                  or OPS[n].lowering.kind == "elementwise"])
def test_scalar_renderer_returns_an_expression_that_matches_the_reference(name):
    opdef, sample = OPS[name], SAMPLES[name]
    names = _scalar_args(name, sample)
    extra = {"index": "cell_index"} if opdef.lowering.cell_index else {}
    expression = opdef.lowering.scalar(*names, **extra, **sample.attrs)
    assert isinstance(expression, str) and expression.strip(), f"{name}: renderer returned {expression!r}"
    for operand in names:
        assert operand in expression, f"{name}: {expression!r} does not use {operand}"
    values = draw(sample, np.random.default_rng(1))
    with np.errstate(all="ignore"):
        expected = np.asarray(opdef.reference(values, dict(sample.attrs)))
    shape = expected.shape
    broadcast = [np.broadcast_to(v, shape) for v in values]
    helpers = _helper_scope()
    for position in np.ndindex(*shape):
        scope = {"math": math, "np": np, **helpers, **{n: v[position] for n, v in zip(names, broadcast)}}
        if extra:
            scope["cell_index"] = int(np.ravel_multi_index(position, shape)) if shape else 0
        try:
            got = eval(expression, scope)  # noqa: S307 (our own renderer's output)
        except NameError as error:  # a helper codegen provides (e.g. gelu_vjp_none)
            assert "(" in expression, f"{name}: {error}"
            return
        want = expected[position]
        if expected.dtype == np.bool_:
            assert bool(got) == bool(want), f"{name} at {position}: {expression} gives {got}, reference {want}"
        else:
            assert math.isclose(float(got), float(want), rel_tol=1e-5, abs_tol=1e-6), \
                f"{name} at {position}: {expression} gives {got}, reference {want}"


# ------------------------------------------------------------------ VJP rules, built directly
def _vjp_graph(name: str):
    """A graph with the sample op, a cotangent parameter and the VJP rule's contributions."""
    sample = SAMPLES[name]
    graph = Graph(f"vjp_{name}")
    operands = [graph.add("param", (), {"name": f"a{i}", "leaf": False, "dtype": t.dtype, "shape": t.shape}, t).id
                for i, t in enumerate(sample.types)]
    builder = Builder(graph)
    out = builder.emit(name, operands, **sample.attrs)
    out_type = graph.node(out).type
    cotangent = graph.add("param", (), {"name": "g", "leaf": False, "dtype": "f32", "shape": out_type.shape},
                          out_type).id
    needs = tuple(t.is_float for t in sample.types)
    contributions = OPS[name].vjp(builder, graph.node(out), cotangent, needs)
    assert len(contributions) == len(operands), f"{name}: {len(contributions)} contributions"
    reduced = []
    for operand, need, contribution in zip(operands, needs, contributions):
        if not need:
            assert contribution is None, f"{name}: a contribution for a non-float operand"
            reduced.append(None)
            continue
        assert contribution is not None, f"{name}: no contribution for a float operand"
        reduced.append(builder.sum_to_size(contribution, builder.shape(operand)))
    graph.outputs = [out] + [r for r in reduced if r is not None]
    verify(graph, f"vjp of {name}", allow_placeholders=False)
    return graph, reduced, out_type


# Ops whose VJP refuses a backward through them with a BendcError, as torch refuses it.
REFUSING_VJPS = frozenset({"floor_divide"})


@pytest.mark.parametrize("name", sorted(REFUSING_VJPS))
def test_refusing_vjp_rules_raise_a_user_error(name):
    with pytest.raises(bendc.BendcError, match=name):
        _vjp_graph(name)


@pytest.mark.parametrize("name", [n for n in op_names() if OPS[n].vjp is not None and n not in REFUSING_VJPS])
def test_vjp_rule_matches_central_differences(name):
    """<vjp(g), d> = d/de <f(x + e d), g> for each float operand, in every direction tried."""
    sample = SAMPLES[name]
    opdef = OPS[name]
    graph, reduced, out_type = _vjp_graph(name)
    rng = np.random.default_rng(2)
    values = draw(sample, rng)
    cotangent = rng.uniform(-1.0, 1.0, size=out_type.shape).astype(np.float32)
    results = interpret(graph, values + [cotangent])
    contributions = iter(results[1:])
    epsilon = 1e-2
    for position, contribution_id in enumerate(reduced):
        if contribution_id is None:
            continue
        contribution = next(contributions).astype(np.float64)
        assert contribution.shape == sample.types[position].shape
        for trial in range(2):
            direction = rng.uniform(-1.0, 1.0, size=sample.types[position].shape)
            if position in sample.positive:
                direction *= 0.1  # stay in the positive domain

            def phi(step: float) -> float:
                moved = list(values)
                moved[position] = (values[position].astype(np.float64) + step * direction).astype(np.float32)
                output = opdef.reference(moved, dict(sample.attrs))
                return float(np.sum(np.asarray(output, dtype=np.float64) * cotangent))

            numeric = (phi(epsilon) - phi(-epsilon)) / (2 * epsilon)
            analytic = float(np.sum(contribution * direction))
            scale = float(np.sum(np.abs(contribution * direction))) + 1e-3
            assert abs(numeric - analytic) <= 2e-3 * scale + 1e-4, \
                f"{name} operand {position} trial {trial}: numeric {numeric}, vjp {analytic}"


# ------------------------------------------------------------------ every op appears in a program
def mlp(x, target, w1, b1, w2, b2):
    h = F.relu(F.linear(x, w1, b1))
    loss = F.cross_entropy(F.linear(h, w2, b2), target)
    loss.backward()
    return loss, w1.grad, b1.grad, w2.grad, b2.grad


def elementwise(x, w):
    a = F.exp(x * w) + F.log(w * w + 1.0) - F.tanh(x) / (2.0 + F.sigmoid(w))
    b = F.sqrt(a * a + 1.0) * -F.gelu(x - w) + F.gelu(w, approximate="tanh") + 1.0 / (w * w + 1.0)
    c = F.softmax(b, 1) + F.log_softmax(a, 0) + x.relu() * w
    loss = F.mse_loss(c, x) + c.mean(dim=0).sum()
    loss.backward()
    return loss, w.grad


def layout(x, index, pick, w, v):
    y = (x * w).reshape(2, 6).T.reshape(3, 4)
    z = y.permute(1, 0).transpose(0, 1).unsqueeze(0)
    rows = F.index_select(z[0], 0, index)
    picked = F.gather(y, 1, pick)
    sliced = y[1:, ::2] + y[0, 1:3] + y[..., 1:, 0:2]
    batched = z.reshape(1, 3, 4) @ v            # broadcast batch dims: sum_to_size in the backward
    vector = y[0] @ v[0]                         # 1-D promotion
    loss = rows.sum() + picked.sum(dim=1, keepdim=True).mean() + sliced.sum() + batched.sum() + vector.sum()
    loss.backward()
    return loss, w.grad


def optimizers(p, g, m, v, buf, w, step):
    loss = (p * w).sum()
    loss.backward()
    grad = w.grad + g
    sgd, new_buf = F.sgd_step(w, grad, 0.1, momentum=0.9, buf=buf)
    adam, new_m, new_v = F.adam_step(w, grad, m, v, 3, 1e-3, weight_decay=0.01)
    traced, _, _ = F.adam_step(w, grad, m, v, step, 1e-3)
    return sgd, new_buf, adam, new_m, new_v, traced


def functional_optimizers(w, g, m, v, step, lr, beta1, beta2):
    """bendc.optim with a traced lr (adam_lr_step_size) and traced betas (bias_correction)."""
    import bendc.optim

    loss = (w * g).sum()
    loss.backward()
    state = {"step": step, "exp_avg": m, "exp_avg_sq": v}
    traced_lr, _ = bendc.optim.adamw(w, w.grad, state, lr)
    traced_betas, _ = bendc.optim.adam(w, w.grad, state, lr, (beta1, beta2))
    return traced_lr, traced_betas


def _rng(shape, seed, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


COVERAGE_PROGRAMS: dict[str, tuple[Callable, tuple[str, ...], Callable[[], tuple]]] = {
    "mlp": (mlp, ("w1", "b1", "w2", "b2"), lambda: (
        _rng((4, 5), 0), np.array([0, 2, 1, 2]), _rng((6, 5), 1), _rng((6,), 2), _rng((3, 6), 3), _rng((3,), 4))),
    "elementwise": (elementwise, ("w",), lambda: (_rng((2, 3), 0), _rng((2, 3), 1))),
    "layout": (layout, ("w",), lambda: (
        _rng((3, 4), 0), np.array([2, 0, 2]), np.array([[3, 0], [1, 1], [0, 2]]), _rng((3, 4), 1),
        _rng((2, 4, 5), 2))),
    "optimizers": (optimizers, ("w",), lambda: (
        _rng((2, 3), 0), _rng((2, 3), 1), _rng((2, 3), 2), _rng((2, 3), 3, 0.1, 1.0), _rng((2, 3), 4),
        _rng((2, 3), 5), np.array(4, np.int64))),
    "functional_optimizers": (functional_optimizers, ("w",), lambda: (
        _rng((2, 3), 0), _rng((2, 3), 1), _rng((2, 3), 2), _rng((2, 3), 3, 0.1, 1.0), np.array(2, np.float32),
        np.array(1e-3, np.float32), np.array(0.9, np.float32), np.array(0.999, np.float32))),
}

# Functional features the API promises; a program uses each one that exists, so
# the ops behind them are covered as soon as they land.
if hasattr(F, "layer_norm"):
    def layer_norm(x, w, b):
        loss = F.layer_norm(x, (4,), w, b).sum()
        loss.backward()
        return loss, w.grad, b.grad

    COVERAGE_PROGRAMS["layer_norm"] = (layer_norm, ("w", "b"),
                                       lambda: (_rng((3, 4), 0), _rng((4,), 1), _rng((4,), 2)))
if hasattr(F, "group_norm"):
    def group_norm(x, w, b):
        loss = F.group_norm(x, 2, w, b).sum()
        loss.backward()
        return loss, w.grad, b.grad

    COVERAGE_PROGRAMS["group_norm"] = (group_norm, ("w", "b"),
                                       lambda: (_rng((2, 4, 3), 0), _rng((4,), 1), _rng((4,), 2)))
if hasattr(F, "batch_norm"):
    def batch_norm(x, w, b, mean, var):
        y = F.batch_norm(x, mean, var, w, b, True)
        loss = (y * y).sum()
        loss.backward()
        return loss, w.grad, b.grad, mean, var

    COVERAGE_PROGRAMS["batch_norm"] = (batch_norm, ("w", "b"), lambda: (
        _rng((3, 4, 5), 0), _rng((4,), 1), _rng((4,), 2), _rng((4,), 3), np.abs(_rng((4,), 4)) + 0.5))
if hasattr(F, "rope"):
    def rope(x, cos, sin, w):
        loss = F.rope(x * w, cos, sin).sum()
        loss.backward()
        return loss, w.grad

    COVERAGE_PROGRAMS["rope"] = (rope, ("w",), lambda: (
        _rng((2, 3, 4), 0), _rng((3, 2), 1), _rng((3, 2), 2), _rng((2, 3, 4), 3)))
if hasattr(F, "scaled_dot_product_attention"):
    def attention(q, k, v, w):
        out = F.scaled_dot_product_attention(q * w, k, v, is_causal=True, enable_gqa=True)
        loss = out.sum()
        loss.backward()
        return loss, w.grad

    COVERAGE_PROGRAMS["attention"] = (attention, ("w",), lambda: (
        _rng((1, 2, 3, 4), 0), _rng((1, 1, 3, 4), 1), _rng((1, 1, 3, 4), 2), _rng((1, 2, 3, 4), 3)))


# Data parallel (bendc.distributed): in one process the all-reduce is the identity.
def all_reduce(x, w):
    loss = F.all_reduce(x * w, op="sum").sum()
def selection(x, y, w):
    """Comparisons as masks, casts, where, clamp, powers, tril/triu and the shape methods (issue 14)."""
    a = x * w
    masks = (a < y).float() + (a > y) * a + (a >= 0.5) + (a <= y).float() * (a == y) + (a != y) * 2.0
    picked = F.where(a > 0, a, y).masked_fill(y < 0, 1.5) + a.clamp(-0.5, y) + a.clip(max=0.25)
    powers = (a * a + 1.0) ** 1.5 + (a * a + 1.0) ** (y * y) + 2.0 ** a + (a * a + 1.0).rsqrt() + abs(a) * a.sign()
    shapes = F.cat([a.tril(), a.triu(1)], 1).sum() + F.stack([a, y]).sum() + F.pad(a, (1, -1)).sum()
    loss = (masks * picked + powers).sum() + shapes + a.detach().sum()
    loss.backward()
    return loss, w.grad


COVERAGE_PROGRAMS["all_reduce"] = (all_reduce, ("w",), lambda: (_rng((2, 3), 0), _rng((2, 3), 1)))


def sharded_update(x, w):
    """data_parallel="sharded"'s halves (bendc.distributed), as bendc.optim emits them: one rank."""
    import bendc.distributed as distributed

    loss = (x * w).sum()
    loss.backward()
    grad = distributed.sharded_gradient(F.all_reduce(w.grad, op="mean"), 0, 1)
    return loss, distributed.gather_shard(distributed.shard_of(w, 0, 1) - 0.1 * grad, (2, 3), 1)


COVERAGE_PROGRAMS["sharded_update"] = (sharded_update, ("w",), lambda: (_rng((2, 3), 0), _rng((2, 3), 1)))
# dropout, activations, losses (op-coverage issue)
def activations_losses(x, w, target, logits, seed, index, table):
    h = F.dropout(x * w, 0.25, seed=seed)
    h = F.silu(h) + F.softplus(h, 2.0, 1.0) + F.leaky_relu(h, 0.1) + F.elu(h) + F.hardtanh(h, -0.5, 0.5)
    loss = F.cross_entropy(logits * w, target, ignore_index=1, label_smoothing=0.1) + h.sum()
    loss = loss + F.binary_cross_entropy_with_logits(x * w, x.sigmoid(), pos_weight=x[0]) + F.normalize(x * w).sum()
    loss = loss + F.nll_loss(logits * w, target) + F.embedding(index, table, padding_idx=0).sum()
    loss = loss + F.scaled_dot_product_attention((x * w).reshape(1, 1, 2, 3), x.reshape(1, 1, 2, 3),
                                                 x.reshape(1, 1, 2, 3), dropout_p=0.5, is_causal=True,
                                                 seed=seed).sum()
    loss.backward()
    return loss, w.grad, table.grad


COVERAGE_PROGRAMS["activations_losses"] = (activations_losses, ("w", "table"), lambda: (
    _rng((2, 3), 0), _rng((2, 3), 1), np.array([0, 1]), _rng((2, 3), 2), np.array(7, np.int64),
    np.array([[0, 2], [1, 0]]), _rng((3, 4), 3)))
# ---- reductions beyond sum (bendc/reductions.py)
def reductions(x, w):
    y = x * w
    values, indices = y.max(dim=1)
    low = F.min(y, 0, keepdim=True).values
    spread = y.amax(dim=(0, 1)) - y.amin(1, keepdim=True).sum() + y.max() - y.min()
    moments = y.var(1, correction=0).sum() + y.std(dim=0).sum() + F.logsumexp(y, 1).sum()
    loss = values.sum() + low.sum() + spread + moments + (y.cumsum(1) * x).sum()
    loss.backward()
    return loss, w.grad, indices, y.argmax(), F.argmin(y, 1)


COVERAGE_PROGRAMS["reductions"] = (reductions, ("w",), lambda: (_rng((3, 4), 0), _rng((3, 4), 1)))
COVERAGE_PROGRAMS["selection"] = (selection, ("w",), lambda: (_rng((2, 3), 0), _rng((2, 3), 1), _rng((2, 3), 2)))


def _method_program(method: str):
    """A program for an op that declares its Tensor method (OpDef.method): its value and gradient."""
    def program(x, w):
        loss = (getattr(x * w, method)()).sum()
        loss.backward()
        return loss, w.grad

    return program


COVERAGE_PROGRAMS["rsqrt"] = (_method_program("rsqrt"), ("w",), lambda: (_rng((2, 3), 0, 0.5, 2.0),
                                                                        _rng((2, 3), 1, 0.5, 2.0)))
def everyday_math(x, y, u, p, step):
    """Issue 22's elementwise ops (bendc/ops/math_ops.py), each on its domain, and adagrad's lr_decay."""
    import bendc.optim

    a, b = x * y, y * 2.0
    picked = F.maximum(a, b) + a.minimum(b) + F.fmax(a, b) + a.fmin(b) + a.atan2(b) + a.lerp(b, y)
    masks = a.isnan().float() + a.isinf().float() + a.isfinite().float() + a.nan_to_num(posinf=1.0)
    rounded = a.floor() + a.ceil() + a.round() + a.trunc() + a.frac()
    trig = a.sin() + a.cos() + a.tan() + (u * y).asin() + (u * y).acos() + a.atan() + a.sinh() + a.cosh()
    special = a.erf() + a.erfc() + a.exp2() + a.expm1() + (p * y * y).log2() + (p + y * y).log10() + (p * y).log1p()
    loss = (picked + masks + rounded + trig + special).sum()
    loss.backward()
    state = {"step": step, "sum": bendc.tree.map(lambda v: v * 0.0, y)}
    updated, _ = bendc.optim.adagrad(y, y.grad, state, 0.1, lr_decay=0.01)
    return loss, y.grad, updated


MATH_OPS = ("maximum", "minimum", "fmax", "fmin", "atan2", "lerp", "isnan", "isinf", "isfinite", "nan_to_num",
            "floor", "ceil", "round", "trunc", "frac", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
            "erf", "erfc", "exp2", "expm1", "log2", "log10", "log1p")
COVERAGE_PROGRAMS["everyday_math"] = (everyday_math, ("y",), lambda: (
    _rng((2, 3), 0), _rng((2, 3), 1, 0.5, 1.0), _rng((2, 3), 2, -0.9, 0.9), _rng((2, 3), 3, 0.5, 2.0),
    np.array(2.0, np.float32)))
for _method, _op in METHODS.items():  # ops that declare a method need no hand-written program
    if _op in MATH_OPS:
        continue
    COVERAGE_PROGRAMS.setdefault(_op, (_method_program(_method), ("w",), lambda: (_rng((2, 3), 0), _rng((2, 3), 1))))


def sort_scatter(x, w, index):
    """Products, a flip, sorts and scatters, float // and % (bendc/sort_scatter.py, issue 22)."""
    a = x * w
    values, order = a.sort(dim=1, descending=True)
    top, _ = a.topk(2, dim=0)
    spread = a.scatter_reduce(0, index, a[:2], "amax", include_self=False) + F.scatter(a, 0, index, 1.5)
    rest = a.prod(1).sum() + a.cumprod(0).sum() + a.flip(1).sum() + (a % 0.75).sum() + (a // 0.5).detach().sum()
    loss = values.sum() + top.sum() + spread.sum() + rest + a.argsort(dim=0).float().sum()
    loss.backward()
    return loss, w.grad, order


COVERAGE_PROGRAMS["sort_scatter"] = (sort_scatter, ("w",), lambda: (
    _rng((3, 4), 0), _rng((3, 4), 1), np.array([[0, 2, 1, 1], [2, 0, 0, 1]])))


# Ops that no user program can produce, only a VJP of a VJP (second derivatives);
# test_vjp_rule_matches_central_differences builds them directly. Keep it short.
ONLY_REACHABLE_AS_VJP_OF_VJP: frozenset[str] = frozenset()


def split_projection(x, w):
    """Slices that tile a tensor (q/k/v of one projection): canonicalize writes their gradient as a concat."""
    qkv = x @ w
    loss = (qkv[:, :2] * qkv[:, 2:3] + qkv[:, 3:]).sum()
    loss.backward()
    return loss, w.grad


COVERAGE_PROGRAMS["split_projection"] = (split_projection, ("w",), lambda: (_rng((3, 4), 0), _rng((4, 5), 1)))


def creation_indexing(x, w, index):
    """Tensors made inside the function, index arithmetic, advanced indexing and index assignment (issue 22)."""
    a = x * w
    made = F.arange(3).float() + F.tensor([0.5, -1.0, 2.0]) + F.eye(2, 3) + F.zeros(2, 3)
    shifted = (index + 1) * 2 - 1
    picked = a[:, shifted // 2 % 3] + a[:, [-1]] + a[[1, 0], index[:2]].sum() + F.one_hot(index, 3).float().sum(0)
    written = a.clone()
    written[:, 0] = 2.0
    loss = (made * picked).sum() + (a[a > 0.0].sum() + written.sum()) * (x.long() + 1).float().sum()
    loss.backward()
    return loss, w.grad, (a > 0).sum(0) + index.sum()


COVERAGE_PROGRAMS["creation_indexing"] = (creation_indexing, ("w",), lambda: (
    _rng((2, 3), 0), _rng((2, 3), 1), np.array([2, 0, -1], np.int64)))


def _traced_programs():
    """(name, traced IR, autodiff IR, IR after canonicalize and after the tiled attention schedule:
    ops that rewrites introduce) per program."""
    for name, (fn, leaves, make_inputs) in COVERAGE_PROGRAMS.items():
        step = bendc.jit(fn, leaves=leaves, target="reference",
                         passes=["canonicalize", "attention_schedule_tiled"])
        outputs = step(*make_inputs())
        for value in outputs if isinstance(outputs, tuple) else (outputs,):
            value = np.asarray(value)
            assert value.dtype.kind != "f" or np.isfinite(value).all(), f"{name} gave a non-finite value"
        yield (name, parse_graph(step.ir("traced")), parse_graph(step.ir("autodiff")),
               parse_graph(step.ir("canonicalize")), parse_graph(step.ir("attention_schedule_tiled")))


@pytest.fixture(scope="module")
def traced_programs():
    return list(_traced_programs())


def test_every_op_appears_in_a_test_program(traced_programs):
    seen: dict[str, str] = {}
    for name, *graphs in traced_programs:
        for graph in graphs:
            for node in graph.nodes():
                seen.setdefault(node.op, name)
    never = sorted(set(OPS) - set(seen) - ONLY_REACHABLE_AS_VJP_OF_VJP)
    assert never == [], f"ops no test program produces: {never}"
    unknown = sorted(set(seen) - set(OPS))
    assert unknown == [], f"programs produced unregistered ops: {unknown}"
    stale = sorted(ONLY_REACHABLE_AS_VJP_OF_VJP & set(seen))
    assert stale == [], f"programs do produce {stale}: remove them from ONLY_REACHABLE_AS_VJP_OF_VJP"


def test_vjp_rules_run_by_programs_or_directly(traced_programs):
    """Every VJP rule runs: in a program's backward, else in the direct central-difference test."""
    run_by_programs: set[str] = set()
    for _, traced, autodiff, *_ in traced_programs:
        for node in autodiff.nodes():
            if node.vjp_of is not None and node.vjp_of in autodiff:
                run_by_programs.add(autodiff.node(node.vjp_of).op)
    with_rules = {name for name, opdef in OPS.items() if opdef.vjp is not None}
    assert run_by_programs <= with_rules
    direct_only = with_rules - run_by_programs
    # These forward ops only ever appear inside a backward graph; their rules run in
    # test_vjp_rule_matches_central_differences (which covers every rule).
    assert direct_only <= set(SAMPLES)
    assert {"add", "mul", "matmul", "relu", "gather", "index_select", "log_softmax"} <= run_by_programs

# convolution and pooling (op-coverage issue)
if hasattr(F, "conv2d"):
    def conv_pool(x, w, b, v):
        h = F.max_pool2d(F.conv2d(x, w, b, padding=1), 2)
        loss = F.avg_pool2d(h, 2, ceil_mode=True).sum() + F.adaptive_avg_pool2d(F.conv1d(v, w[:, :, 0], stride=2),
                                                                                  1).sum()
        loss.backward()
        return loss, x.grad, w.grad, b.grad

    COVERAGE_PROGRAMS["conv_pool"] = (conv_pool, ("x", "w", "b"), lambda: (
        _rng((2, 3, 6, 6), 0), _rng((4, 3, 3, 3), 1), _rng((4,), 2), _rng((2, 3, 9), 3)))
