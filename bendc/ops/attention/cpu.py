"""The attention ops' CPU kernels: numba loops over work items (``prange``) with numpy's layouts.

Generated modules hold only numba code and a numpy wrapper (the runtime needs
nothing else). Shapes are read from the arrays, so one compiled kernel serves
every shape; only the schedule, causal, scale and parallelism are in the text.
The numba code is in templates/*.py, real Python files read as text.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

from bendc.ir.types import TensorType
from bendc.kernels import cpu_policy as policy
from bendc.ops.attention.layout import resolve_schedule, whole_heads

_TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
_MARKER = "# ---------------------------------------------------------------- TEMPLATE\n"
_PLACEHOLDER = re.compile(r"\b(PARALLEL|SCALE|CAUSAL|FUSED)\b")


@lru_cache(maxsize=None)
def template(name: str) -> str:
    """The kernel source of ``templates/<name>.py``: what follows its TEMPLATE line."""
    with open(os.path.join(_TEMPLATES, f"{name}.py"), encoding="utf-8") as stream:
        text = stream.read()
    return "\n\n" + text.split(_MARKER, 1)[1].strip("\n") + "\n"


def _filled(name: str, **values) -> str:
    """A template with PARALLEL, SCALE, CAUSAL (and FUSED) replaced by ``values`` (reprs)."""
    return _PLACEHOLDER.sub(lambda match: repr(values[match.group(1).lower()]), template(name))


def _parallel(types: list[TensorType], out: TensorType) -> bool:
    """Parallel when the products do enough work: scores cells times the row width."""
    batch, heads = types[0].shape[:2]
    arrays = [type for type in types + [out] if type.ndim == 4]
    t = max(type.shape[2] for type in arrays)
    width = max(type.shape[3] for type in arrays)
    return policy.parallel("rows", batch * heads * t * t * width)


def _cpu_source(name: str, layout: str, parallel: bool, **values) -> str:
    return (template(f"layout_{layout}") + template("rows") + _filled(name, parallel=parallel, **values)).lstrip("\n")


def cpu_attention(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    return _cpu_source("forward", layout, _parallel(list(ins), out), scale=attrs["scale"],
                       causal=attrs["causal"])


def cpu_probs(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    return _cpu_source("probs", layout, _parallel(list(ins), out), scale=attrs["scale"], causal=attrs["causal"])


def cpu_score_grad(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    return _cpu_source("score_grad", layout, _parallel(list(ins), out), scale=attrs["scale"])


def cpu_vjp(attrs, ins, out):
    layout = resolve_schedule(attrs["schedule"], attrs["causal"])
    name = "vjp_rows" if attrs["wrt"] == "q" else "vjp_columns"
    return _cpu_source(name, layout, _parallel(list(ins), out))


def tiled_source(name: str, ins: list[TensorType], out: TensorType, attrs) -> str:
    """The tiled schedule's kernels (templates/tiled.py) and the wrapper ``templates/<name>.py``."""
    values = {"parallel": _parallel(ins, out), "scale": attrs["scale"], "causal": attrs["causal"],
              "fused": whole_heads(ins[0].shape[2])}
    return (_filled("tiled", **values) + _filled(name, **values)).lstrip("\n")
