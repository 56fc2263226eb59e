"""SPEC strings: each parameter's shape, dtype and leaf-ness.

``x=f32[64,784] y=i64[64] w=f32[10,784]:leaf`` -> {"x": (f32[64,784], False), ...}
"""
from __future__ import annotations

import re

from bendc.errors import SignatureError
from bendc.ir.types import TensorType

_ENTRY = re.compile(r"(\w+)=(\w+\[[\d,\s]*\])(:leaf)?")


def parse_spec(text: str) -> dict[str, tuple[TensorType, bool]]:
    """Parse a SPEC; a bad entry raises SignatureError naming it."""
    specs: dict[str, tuple[TensorType, bool]] = {}
    for entry in text.split():
        match = _ENTRY.fullmatch(entry)
        if not match:
            raise SignatureError(f"bad shape entry {entry!r}; write name=f32[64,784] or name=f32[10]:leaf",
                                 op="spec")
        try:
            type = TensorType.parse(match.group(2).replace(" ", ""))
        except (ValueError, AssertionError):
            raise SignatureError(f"bad type in {entry!r}; dtypes are f32, i64, i32", op="spec") from None
        if match.group(1) in specs:
            raise SignatureError(f"parameter {match.group(1)!r} appears twice", op="spec")
        specs[match.group(1)] = (type, bool(match.group(3)))
    return specs


def format_spec(specs: dict[str, tuple[TensorType, bool]]) -> str:
    return " ".join(f"{name}={type}{':leaf' if leaf else ''}" for name, (type, leaf) in specs.items())
