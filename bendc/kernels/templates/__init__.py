"""numba source the kit copies into generated kernels, as Python files read as text.

``cpu_math.py`` holds the CPU kernels' float32 transcendentals (bendc/kernels/cpu_kit.py copies them).
Other helpers are functions that scalar renderers call by name on both targets (``philox.py``:
counter-based random words; ``floordiv.py``: torch's float32 floor division): ``helper_functions``
gives the source a generated module needs.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

_TEMPLATE_MARKER = "# ---------------------------------------------------------------- TEMPLATE\n"
# CPU helpers are ordinary njit functions: LLVM inlines them into the kernel after linking (the same
# machine code and bits), where numba's own inline="always" typed a copy per call site: a kernel
# calling bendc_exp at 9 sites (a sum in 8 lanes) took 2.3 s to compile inlined, 1.2 s not.
# A template file's own functions keep numba's CPython wrapper (tests and the registry's checks call
# them from Python). Their copies in a generated module get neither that nor the cfunc wrapper:
# only the module's numba code calls them, and each copy's wrappers cost a compile of their own.
_TEMPLATE_DECORATOR = '@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)'
_CPU_DECORATOR = '@njit(cache=True, error_model="numpy", no_cpython_wrapper=True, no_cfunc_wrapper=True)'
_CUDA_DECORATOR = '@cuda.jit(device=True, inline="always")'  # inlined: PTX builds need no device link

# Spellings a cuda copy changes: numba's CPU target types np.fmod of scalars and not math.fmod, numba.cuda
# the other way round.
CUDA_SPELLINGS = {"np.fmod(": "math.fmod("}

# helper function name -> the template file that defines it
HELPERS: dict[str, str] = {"bendc_philox": "philox.py", "bendc_floor_divide": "floordiv.py", "bendc_lanes8": "lanes.py",
                          "bendc_rows_fma": "products.py"}


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
        parts.append(f"\n# from bendc/kernels/templates/{file}\n{copied(template_text(file), target)}")
    return "".join(parts)


def copied(text: str, target: str) -> str:
    """Template functions as a generated module holds them: decorated for ``target`` ("cpu" or "cuda")."""
    assert _TEMPLATE_DECORATOR in text, "a template function without the template decorator"
    if target == "cpu":
        return text.replace(_TEMPLATE_DECORATOR, _CPU_DECORATOR)
    for cpu_spelling, cuda_spelling in CUDA_SPELLINGS.items():
        text = text.replace(cpu_spelling, cuda_spelling)
    return text.replace(_TEMPLATE_DECORATOR, _CUDA_DECORATOR)
