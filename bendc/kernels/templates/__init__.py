"""numba source the kit copies into generated kernels, as Python files read as text.

``cpu_math.py`` holds the CPU kernels' float32 transcendentals (bendc/kernels/cpu_kit.py copies them).
Other helpers are functions that scalar renderers call by name on both targets (``philox.py``:
counter-based random words): ``helper_functions`` gives the source a generated module needs.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

_TEMPLATE_MARKER = "# ---------------------------------------------------------------- TEMPLATE\n"
# CPU helpers are ordinary njit functions: LLVM inlines them into the kernel after linking (the same
# machine code and bits), where numba's own inline="always" typed a copy per call site: a kernel
# calling bendc_exp at 9 sites (a sum in 8 lanes) took 2.3 s to compile inlined, 1.2 s not.
_CPU_DECORATOR = '@njit(cache=True, error_model="numpy")'
_CUDA_DECORATOR = '@cuda.jit(device=True, inline="always")'  # inlined: PTX builds need no device link

# helper function name -> the template file that defines it
HELPERS: dict[str, str] = {"bendc_philox": "philox.py"}


@lru_cache(maxsize=None)
def template_text(file: str) -> str:
    """A template file's functions (the text after its TEMPLATE line)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), file), encoding="utf-8") as stream:
        return stream.read().split(_TEMPLATE_MARKER, 1)[1].strip("\n") + "\n"


def helper_functions(body: str, target: str) -> str:
    """The source of the helpers ``body`` calls, decorated for ``target`` ("cpu": njit;
    "cuda": an inlined device function), or "" where it calls none."""
    files = sorted({file for name, file in HELPERS.items() if re.search(rf"\b{name}\(", body)})
    parts = []
    for file in files:
        text = template_text(file)
        if target == "cuda":
            text = text.replace(_CPU_DECORATOR, _CUDA_DECORATOR)
        parts.append(f"\n# from bendc/kernels/templates/{file}\n{text}")
    return "".join(parts)
