"""The translator's typing rules (runtime/native/types.py) against numba's own typing context, for
every pair of scalar types the generated kernels use: a rule that differs would change the bits."""
from __future__ import annotations

import operator

import pytest
from numba.core import types as nt
from numba.core.registry import cpu_target

from runtime.native import types as T

SCALARS = [T.BOOL, T.INT8, T.UINT8, T.INT16, T.INT32, T.UINT32, T.INT64, T.UINT64, T.FLOAT32, T.FLOAT64]


@pytest.fixture(scope="module")
def typing_context():
    context = cpu_target.typing_context
    context.refresh()
    return context


def numba_type(scalar: T.Scalar):
    return nt.boolean if scalar == T.BOOL else getattr(nt, scalar.name)


def resolved(context, function, *args):
    try:
        signature = context.resolve_function_type(function, tuple(numba_type(a) for a in args), {})
    except Exception:  # noqa: BLE001 - numba refuses the operation
        return None
    return None if signature is None else signature.return_type.name if signature.return_type != nt.boolean \
        else "bool"


def ours(rule, *args):
    try:
        return rule(*args).name
    except T.Unsupported:
        return None


@pytest.mark.parametrize("function, rule", [
    (operator.add, T.arithmetic), (operator.sub, T.arithmetic), (operator.mul, T.arithmetic),
    (operator.floordiv, T.arithmetic), (operator.mod, T.arithmetic), (operator.truediv, T.true_division),
    (operator.and_, T.bitwise), (operator.or_, T.bitwise), (operator.xor, T.bitwise),
    (operator.lshift, T.shift), (operator.rshift, T.shift), (operator.pow, T.power),
], ids=lambda v: getattr(v, "__name__", ""))
def test_binary_operations_type_as_numba_types_them(typing_context, function, rule):
    differ = []
    for a in SCALARS:
        for b in SCALARS:
            if function is operator.pow and a.kind != "f" and b.kind != "f":
                continue  # integer ** integer: the translator takes literal exponents only (static power)
            expected, got = resolved(typing_context, function, a, b), ours(rule, a, b)
            if expected != got:
                differ.append(f"{a} {function.__name__} {b}: numba {expected}, translator {got}")
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("function, rule", [(operator.neg, T.negation), (operator.invert, T.inversion)],
                         ids=["neg", "invert"])
def test_unary_operations_type_as_numba_types_them(typing_context, function, rule):
    for a in SCALARS:
        assert resolved(typing_context, function, a) == ours(rule, a), a


def test_unification_and_comparisons_follow_numpy_promotion(typing_context):
    for a in SCALARS:
        for b in SCALARS:
            unified = typing_context.unify_pairs(numba_type(a), numba_type(b))
            assert (unified.name if unified != nt.boolean else "bool") == T.unify(a, b).name, (a, b)
            # a comparison casts both operands to their unified type
            signature = typing_context.resolve_function_type(operator.lt, (numba_type(a), numba_type(b)), {})
            operand = signature.args[0]
            assert (operand.name if operand != nt.boolean else "bool") == T.promote(a, b).name, (a, b)
