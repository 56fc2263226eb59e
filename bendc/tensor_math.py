"""Tensor methods of issue 22's elementwise ops that take attributes: ``nan_to_num`` and ``round``
(with ``decimals``). The ops that trace straight from their operands (``x.sin()``,
``x.maximum(y)``, ``x.lerp(end, weight)``, ...) declare their method in bendc/ops/math_ops.py.

:class:`MathMethods` is mixed into :class:`bendc.trace.Tensor`; ``FUNCTIONS`` gives
``bendc.functional.<name>`` and the torch bridge ``torch.<name>`` / ``torch.Tensor.<name>``.
This module imports nothing of the tracer at import time (bendc.trace imports it).
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from bendc.errors import UnsupportedError, user_location

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _number(value: Any, name: str, op: str, loc, default: float) -> float:
    """A Python number argument (None: ``default``) as a float rounded to float32."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UnsupportedError(f"{op}: {name} must be a Python number or None, got {type(value).__name__}",
                               loc=loc, op=op)
    return float(np.float32(value))


class MathMethods:
    """nan_to_num and round(decimals=) of a traced tensor (PyTorch's)."""

    __slots__ = ()

    def nan_to_num(self, nan: Any = 0.0, posinf: Any = None, neginf: Any = None):
        """torch.nan_to_num: NaN -> nan, +inf -> posinf, -inf -> neginf (default: the float32 extremes)."""
        with self.tracer.at_user_line("nan_to_num") as builder:
            attrs = dict(nan=_number(nan, "nan", "nan_to_num", builder.loc, 0.0),
                         posinf=_number(posinf, "posinf", "nan_to_num", builder.loc, _FLOAT32_MAX),
                         neginf=_number(neginf, "neginf", "nan_to_num", builder.loc, -_FLOAT32_MAX))
            return self.tracer.emit("nan_to_num", (self.id,), **attrs)

    def round(self, decimals: Any = 0):
        """torch.round: to the nearest integer, ties to even; with ``decimals`` d > 0 round(x * 10**d) / 10**d,
        d < 0 round(x / 10**-d) * 10**-d (torch's formula, 10**|d| rounded to float32)."""
        with self.tracer.at_user_line("round") as builder:
            if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)):
                raise UnsupportedError(f"round: decimals must be an int, got {decimals!r}", loc=builder.loc, op="round")
            decimals = int(decimals)
            if decimals == 0:
                return self.tracer.emit("round", (self.id,))
            scale = float(np.float32(10.0 ** abs(decimals)))
            if decimals > 0:
                return self.tracer.emit("round", ((self * scale).id,)) / scale
            return self.tracer.emit("round", ((self / scale).id,)) * scale


def _function(name: str) -> Callable:
    def function(input: Any, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        if out is not None:
            raise UnsupportedError(f"{name}: out= is not supported", loc=user_location(), op=name)
        if not isinstance(input, MathMethods):
            raise UnsupportedError(f"{name} expects a traced tensor, got {type(input).__name__}",
                                   loc=user_location(), op=name)
        return getattr(input, name)(*args, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"torch.{name}(input, ...): ``input.{name}(...)``."
    function.bendc = f"`Tensor.{name}`"
    return function


# bendc.functional.<name>, torch.<name> and torch.Tensor.<name> for each method above.
FUNCTIONS = {name: _function(name) for name in ("nan_to_num", "round")}
