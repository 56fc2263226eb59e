"""The elementwise pieces of torch's losses that no general op spells exactly.

```
%1 = class_valid[ignore_index=-100] %target           : bool[N]   target != ignore_index
%2 = class_safe[classes=10, ignore_index=-100] %target : i64[N]  target, 0 where ignored (a gather index)
%3 = bce_logits %x, %t (, %pos_weight)                : f32[..]   torch's stable binary cross-entropy with logits
%4 = bce_logits_vjp[wrt="input"] %g, %x, %t (, %pw)   : f32[..]   its input gradient
                                                                 (wrt="target": operands %g, %x (, %pw))
%5 = padding_rows[padding_idx=0] %rows, %index        : f32[N,D]  rows (embedding); no gradient where index == padding_idx
%6 = zero_padding[padding_idx=0] %g, %index           : f32[N,D]  g, 0 where index == padding_idx
%7 = norm_clamp[eps=1e-12] %sumsq                     : f32[..]   max(sqrt(sumsq), eps) (normalize's denominator)
%8 = norm_clamp_vjp[eps=1e-12] %g, %sumsq             : f32[..]   g / (2 sqrt(sumsq)) where sqrt(sumsq) >= eps, > 0
```

bendc.functional composes nll_loss, cross_entropy, binary_cross_entropy_with_logits, embedding and
normalize from these and the general ops (gather, where, sum, log_softmax).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op, require_float

F32 = np.float32


def _c(value: float) -> str:
    return f"np.float32({value!r})"


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _int_attr(attrs, name):
    value = attrs.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InferError(f"{name} must be an int, got {value!r}", unsupported=True)
    return value


# ------------------------------------------------------------------ class targets
def _infer_class(dtype):
    def infer(types, attrs):
        (target,) = types
        _int_attr(attrs, "ignore_index")
        if not target.is_index:
            raise InferError(f"class targets must be int64/int32, got {target}", unsupported=True)
        return TensorType(dtype or target.dtype, target.shape)

    return infer


define_op(
    name="class_valid",
    arity=1,
    infer=_infer_class("bool"),
    reference=lambda v, a: np.asarray(v[0] != a["ignore_index"]),
    lowering=Lowering("elementwise", scalar=lambda t, *, ignore_index: f"({t} != {ignore_index})"),
    no_vjp="a mask of integer targets",
    attr_names=("ignore_index",),
    doc="`%1 = class_valid[ignore_index=-100] %target : bool[N]`: target != ignore_index.",
)

define_op(
    name="class_safe",
    arity=1,
    infer=_infer_class(None),
    reference=lambda v, a: np.asarray(np.where(v[0] != a["ignore_index"], v[0], 0), dtype=v[0].dtype),
    lowering=Lowering("elementwise", scalar=lambda t, *, classes, ignore_index: (
        f"({t} if {t} != {ignore_index} else 0)")),
    no_vjp="integer targets",
    attr_names=("classes", "ignore_index"),
    # the targets index the classes (artifact.index_bounds draws random targets below ``classes``)
    index_operand=0,
    indexed_size=lambda shapes, out, attrs: attrs["classes"],
    doc="`%2 = class_safe[classes=10, ignore_index=-100] %target : i64[N]`: target, 0 where it is ignore_index "
        "(an index gather can read).",
)


# ------------------------------------------------------------------ binary cross-entropy with logits
def _log_sigmoid(x):
    with np.errstate(over="ignore"):
        return np.minimum(x, F32(0.0)) - np.log1p(np.exp(-np.abs(x)))


def _scalar_log_sigmoid(x: str) -> str:
    return f"(({x} if {x} < {_c(0.0)} else {_c(0.0)}) - math.log1p(math.exp(-abs({x}))))"


def _infer_bce(types, attrs):
    if len(types) not in (2, 3):
        raise InferError(f"takes 2 or 3 operands (input, target, pos_weight), got {len(types)}")
    require_float(types, "bce_logits")
    return TensorType("f32", broadcast_shapes(*(t.shape for t in types)))


def _reference_bce(values, attrs):
    x, t = values[:2]
    log_sig = _log_sigmoid(x)
    if len(values) == 3:
        log_sig = log_sig * ((values[2] - F32(1.0)) * t + F32(1.0))
    return _f32((F32(1.0) - t) * x - log_sig)


def _scalar_bce(x, t, pos_weight=None):
    log_sig = _scalar_log_sigmoid(x)
    if pos_weight is not None:
        log_sig = f"{log_sig} * (({pos_weight} - {_c(1.0)}) * {t} + {_c(1.0)})"
    return f"(({_c(1.0)} - {t}) * {x} - {log_sig})"


def vjp_bce(b, node, grad, needs):
    """d bce_logits = (bce_logits_vjp[wrt=input], bce_logits_vjp[wrt=target]): torch's
    binary_cross_entropy_with_logits_backward and _target_backward (pos_weight takes none)."""
    x, t, *pos_weight = node.inputs
    grad_x = b.emit("bce_logits_vjp", (grad, x, t, *pos_weight), wrt="input") if needs[0] else None
    grad_t = b.emit("bce_logits_vjp", (grad, x, *pos_weight), wrt="target") if needs[1] else None
    return (grad_x, grad_t) + ((None,) if len(node.inputs) == 3 else ())


define_op(
    name="bce_logits",
    arity=None,
    infer=_infer_bce,
    reference=_reference_bce,
    lowering=Lowering("elementwise", scalar=_scalar_bce),
    vjp=vjp_bce,
    doc="`%3 = bce_logits %x, %t : f32[..]`: (1 - t) * x - log_sigmoid(x) * ((pos_weight - 1) * t + 1) "
        "(the third operand, pos_weight, optional), log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)).",
)


def _infer_bce_vjp(types, attrs):
    if attrs.get("wrt") not in ("input", "target"):
        raise InferError(f"wrt must be 'input' or 'target', got {attrs.get('wrt')!r}")
    if attrs["wrt"] == "input" and len(types) not in (3, 4):
        raise InferError(f"takes 3 or 4 operands (grad, input, target, pos_weight), got {len(types)}")
    if attrs["wrt"] == "target" and len(types) not in (2, 3):
        raise InferError(f"takes 2 or 3 operands (grad, input, pos_weight), got {len(types)}")
    require_float(types, "bce_logits_vjp")
    return TensorType("f32", broadcast_shapes(*(t.shape for t in types)))


def _reference_bce_vjp(values, attrs):
    g, x = values[:2]
    if attrs["wrt"] == "input":
        t = values[2]
        with np.errstate(over="ignore"):
            s = F32(1.0) / (F32(1.0) + np.exp(-x))
        if len(values) == 4:
            weighted = values[3] * t
            return _f32((((weighted + F32(1.0)) - t) * s - weighted) * g)
        return _f32((s - t) * g)
    if len(values) == 3:
        return _f32((_log_sigmoid(-x) - _log_sigmoid(x) * values[2]) * g)
    return _f32(-x * g)


def _scalar_bce_vjp(g, x, *rest, wrt):
    s = f"({_c(1.0)} / ({_c(1.0)} + math.exp(-{x})))"
    if wrt == "input":
        t, pos_weight = rest[0], (rest[1] if len(rest) == 2 else None)
        if pos_weight is not None:
            weighted = f"({pos_weight} * {t})"
            return f"(((({weighted} + {_c(1.0)}) - {t}) * {s} - {weighted}) * {g})"
        return f"(({s} - {t}) * {g})"
    pos_weight = rest[0] if rest else None
    if pos_weight is not None:
        return f"(({_scalar_log_sigmoid(f'(-{x})')} - {_scalar_log_sigmoid(x)} * {pos_weight}) * {g})"
    return f"((-{x}) * {g})"


define_op(
    name="bce_logits_vjp",
    arity=None,
    infer=_infer_bce_vjp,
    reference=_reference_bce_vjp,
    lowering=Lowering("elementwise", scalar=_scalar_bce_vjp),
    no_vjp="second derivatives of binary_cross_entropy_with_logits are not supported",
    attr_names=("wrt",),
    doc="`%4 = bce_logits_vjp[wrt=\"input\"] %g, %x, %t : f32[..]`: (sigmoid(x) - t) * g, with pos_weight "
        "((pw*t + 1 - t) * sigmoid(x) - pw*t) * g; wrt=target (operands g, x, pw): -x * g, with pos_weight "
        "(log_sigmoid(-x) - log_sigmoid(x) * pw) * g (torch's formulas).",
)


# ------------------------------------------------------------------ embedding padding rows
def _infer_padding(name):
    def infer(types, attrs):
        rows, index = types
        _int_attr(attrs, "padding_idx")
        require_float((rows,), name)
        if not index.is_index:
            raise InferError(f"{name} needs an integer index, got {index}", unsupported=True)
        return TensorType("f32", broadcast_shapes(rows.shape, index.shape))

    return infer


def vjp_padding_rows(b, node, grad, needs):
    """d padding_rows(rows) = g, 0 where index == padding_idx: torch's embedding_backward."""
    index = node.inputs[1]
    return (b.emit("zero_padding", (grad, index), padding_idx=node.attr["padding_idx"]), None)


define_op(
    name="padding_rows",
    arity=2,
    infer=_infer_padding("padding_rows"),
    reference=lambda v, a: _f32(np.broadcast_to(v[0], np.broadcast_shapes(v[0].shape, v[1].shape))),
    # the value is the row whatever the index (the index decides only the gradient)
    lowering=Lowering("elementwise", scalar=lambda rows, index, *, padding_idx: (
        f"({rows} if {index} != {padding_idx} else {rows})")),
    vjp=vjp_padding_rows,
    attr_names=("padding_idx",),
    doc="`%5 = padding_rows[padding_idx=0] %rows, %index : f32[N,D]`: the rows of an embedding lookup "
        "(index (N, 1)); their gradient is 0 where index == padding_idx.",
)

define_op(
    name="zero_padding",
    arity=2,
    infer=_infer_padding("zero_padding"),
    reference=lambda v, a: _f32(np.where(v[1] != a["padding_idx"], v[0], F32(0.0))),
    lowering=Lowering("elementwise", scalar=lambda g, index, *, padding_idx: (
        f"({g} if {index} != {padding_idx} else {_c(0.0)})")),
    no_vjp="built only by padding_rows' VJP (bendc has no create_graph)",
    attr_names=("padding_idx",),
    doc="`%6 = zero_padding[padding_idx=0] %g, %index : f32[N,D]`: g, 0 where index == padding_idx.",
)


# ------------------------------------------------------------------ normalize's denominator
def _infer_norm_clamp(types, attrs):
    require_float(types, "norm_clamp")
    eps = attrs.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, float):
        raise InferError(f"eps must be a float, got {eps!r}", unsupported=True)
    if len(types) == 2 and types[0].shape != types[1].shape:
        raise InferError("norm_clamp_vjp needs the gradient and the sum of squares of one shape")
    return types[0]


def _reference_norm_clamp(values, attrs):
    with np.errstate(invalid="ignore"):
        norm = np.sqrt(values[0])
    eps = F32(attrs["eps"])
    return _f32(np.where(norm < eps, eps, norm))


def _reference_norm_clamp_vjp(values, attrs):
    g, s = values
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.sqrt(s)
        grad = g / (F32(2.0) * norm)
    return _f32(np.where((norm >= F32(attrs["eps"])) & (norm > F32(0.0)), grad, F32(0.0)))


def vjp_norm_clamp(b, node, grad, needs):
    """d max(sqrt(s), eps) = g / (2 sqrt(s)) where sqrt(s) >= eps (clamp_min's backward) and
    sqrt(s) > 0 (norm_backward's mask), else 0."""
    return (b.emit("norm_clamp_vjp", (grad, node.inputs[0]), eps=node.attr["eps"]),)


define_op(
    name="norm_clamp",
    arity=1,
    infer=_infer_norm_clamp,
    reference=_reference_norm_clamp,
    lowering=Lowering("elementwise", scalar=lambda s, *, eps: (
        f"({_c(eps)} if math.sqrt({s}) < {_c(eps)} else math.sqrt({s}))")),
    vjp=vjp_norm_clamp,
    attr_names=("eps",),
    doc="`%7 = norm_clamp[eps=1e-12] %sumsq : f32[..]`: max(sqrt(sumsq), eps), torch's "
        "norm(x).clamp_min(eps) from the sum of squares.",
)

define_op(
    name="norm_clamp_vjp",
    arity=2,
    infer=_infer_norm_clamp,
    reference=_reference_norm_clamp_vjp,
    lowering=Lowering("elementwise", scalar=lambda g, s, *, eps: (
        f"({g} / ({_c(2.0)} * math.sqrt({s})) if math.sqrt({s}) >= {_c(eps)} and math.sqrt({s}) > {_c(0.0)} "
        f"else {_c(0.0)})")),
    no_vjp="second derivatives of normalize are not supported (bendc has no create_graph)",
    attr_names=("eps",),
    doc="`%8 = norm_clamp_vjp[eps=1e-12] %g, %sumsq : f32[..]`: g / (2 sqrt(sumsq)) where sqrt(sumsq) >= eps "
        "and > 0, else 0.",
)
