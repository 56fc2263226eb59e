"""Writing numba CPU kernels: decorators, loop nests and element reads.

Generated CPU kernels are ``@njit`` functions with ``cache=True`` (numba keeps
the machine code beside the module file), no fastmath (so + - * / round as
PyTorch's do) and numpy's error model; cells of large kernels run in parallel
(``prange``) on numba's own thread pool.
"""
from __future__ import annotations

from typing import Sequence

# CPU kernels over at least this many cells run their cells in parallel (prange);
# smaller ones stay serial, where threads cost more than they give.
PARALLEL_CELLS = 1 << 16


def njit_decorator(parallel: bool) -> str:
    return f"@njit(parallel={parallel}, cache=True, error_model='numpy')"


def element(array: str, index: Sequence[str]) -> str:
    """``array[i, j]``, or ``array[()]`` for a 0-d array."""
    return f"{array}[" + (", ".join(index) if index else "()") + "]"


def loop_nest(domain: Sequence[int], loops: Sequence[str], parallel_axis: int | None, body: list[str],
              indent: str = "    ") -> list[str]:
    """``for`` loops over ``domain`` (``prange`` on ``parallel_axis``) around ``body``."""
    lines = []
    for axis, size in enumerate(domain):
        loop = "prange" if axis == parallel_axis else "range"
        lines.append(f"{indent}for {loops[axis]} in {loop}({size}):")
        indent += "    "
    lines.extend(indent + line for line in body)
    return lines
