"""SPEC strings: each parameter's shape, dtype and leaf-ness.

``x=f32[64,784] y=i64[64] w=f32[10,784]:leaf`` -> {"x": (f32[64,784], False), ...}

Pytree parameters name each array by its dotted path: a name component makes a
dict key, a number a list index (0, 1, ... in full)::

    params.w1=f32[128,64]:leaf params.b1=f32[128]:leaf state.step=f32[] state.exp_avg.w1=f32[128,64]
    batch.0=f32[64,64] batch.1=i64[64]

:func:`spec_shapes` gives those as the pytree shapes ``JitFunction.lower`` and
``export`` take (``{"params": {"w1": "f32[128,64]", ...}, "batch": ["f32[64,64]", "i64[64]"]}``);
``:leaf`` marks a whole parameter (``leaves=("params",)``), so every entry of a
parameter carries it or none does.
"""
from __future__ import annotations

import re
from typing import Any

from bendc.errors import SignatureError
from bendc.ir.types import TensorType

_ENTRY = re.compile(r"(\w+(?:\.\w+)*)=(\w+\[[\d,\s]*\])(:leaf)?")


def parse_spec(text: str) -> dict[str, tuple[TensorType, bool]]:
    """Parse a SPEC (names may be dotted paths); a bad entry raises SignatureError naming it."""
    specs: dict[str, tuple[TensorType, bool]] = {}
    for entry in text.split():
        match = _ENTRY.fullmatch(entry)
        if not match:
            raise SignatureError(f"bad shape entry {entry!r}; write name=f32[64,784], name=f32[10]:leaf or "
                                 "params.w=f32[10,784] (a pytree parameter's entry)", op="spec")
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


def is_tree_spec(shapes: Any) -> bool:
    """Whether ``shapes`` (a SPEC or a dict) describes a pytree parameter."""
    if isinstance(shapes, str):
        return any("." in name for name in parse_spec(shapes))
    return isinstance(shapes, dict) and not all(isinstance(v, (str, TensorType)) for v in shapes.values())


def spec_shapes(text: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(parameter name -> its shape or pytree of shapes as type text, the parameters marked :leaf)."""
    nested: dict[str, Any] = {}
    marks: dict[str, set[bool]] = {}
    for name, (type, leaf) in parse_spec(text).items():
        parts = name.split(".")
        marks.setdefault(parts[0], set()).add(leaf)
        node = nested
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SignatureError(f"{'.'.join(parts[:depth + 1])!r} is an array and a container in the SPEC",
                                     op="spec")
            node = child
        if parts[-1] in node:
            raise SignatureError(f"{name!r} is an array and a container in the SPEC", op="spec")
        node[parts[-1]] = str(type)
    mixed = sorted(name for name, flags in marks.items() if len(flags) > 1)
    if mixed:
        raise SignatureError(f"mark every entry of {mixed[0]!r} :leaf or none of them (leaves are whole "
                             "parameters: leaves=('params',))", op="spec")
    shapes = {name: _lists(value, name) for name, value in nested.items()}
    return shapes, tuple(name for name, flags in marks.items() if True in flags)


def _lists(node: Any, path: str) -> Any:
    """Dicts whose keys are all numbers become lists (0, 1, ... in full)."""
    if not isinstance(node, dict):
        return node
    items = {key: _lists(value, f"{path}.{key}") for key, value in node.items()}
    numbers = [key.isdigit() for key in items]
    if not any(numbers):
        return items
    if not all(numbers):
        raise SignatureError(f"{path!r} mixes list indices and dict keys in the SPEC", op="spec")
    if sorted(int(key) for key in items) != list(range(len(items))):
        raise SignatureError(f"{path!r} lists indices {sorted(int(k) for k in items)}; a list needs 0..n-1",
                             op="spec")
    return [items[str(index)] for index in range(len(items))]
