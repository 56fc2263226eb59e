"""Writing numba CPU kernels: decorators, loop nests and element reads.

Generated CPU kernels are ``@njit`` functions with ``cache=True`` (numba keeps
the machine code beside the module file), no fastmath (so + - * / round as
PyTorch's do) and numpy's error model; cells of large kernels run in parallel
(``prange``) on numba's own thread pool.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Sequence

# CPU kernels over at least this many cells run their cells in parallel (prange);
# smaller ones stay serial, where threads cost more than they give.
PARALLEL_CELLS = 1 << 16

# The innermost loop of a nest keeps its extent as a literal when it is at most this (LLVM then
# unrolls it whole: 1.5-2.7x faster than a trip count read from a shape at extents 2 and 4, measured
# on [16384,4] and [32768,2]; from 8 up the shape-read loop was as fast or faster). Other extents
# are read from the arrays' shapes, so the source serves every batch size.
UNROLLED_EXTENT = 4

# A parallel loop that an epilogue sums over is split in at most this many chunks, each summing
# into its own partial result (a fixed count: results do not depend on the thread count).
REDUCTION_CHUNKS = 16


def njit_decorator(parallel: bool) -> str:
    return f"@njit(parallel={parallel}, cache=True, error_model='numpy')"


def element(array: str, index: Sequence[str]) -> str:
    """``array[i, j]``, or ``array[()]`` for a 0-d array."""
    return f"{array}[" + (", ".join(index) if index else "()") + "]"


def loop_nest(domain: Sequence[int | str], loops: Sequence[str], parallel_axis: int | None, body: list[str],
              indent: str = "    ") -> list[str]:
    """``for`` loops over ``domain`` (``prange`` on ``parallel_axis``) around ``body``; an extent is
    a literal or an expression (``out0.shape[0]``: the source then serves every size)."""
    lines = []
    for axis, size in enumerate(domain):
        loop = "prange" if axis == parallel_axis else "range"
        lines.append(f"{indent}for {loops[axis]} in {loop}({size}):")
        indent += "    "
    lines.extend(indent + line for line in body)
    return lines


def chunked_loop_nest(domain: Sequence[int | str], loops: Sequence[str], axis: int, chunks: int, body: list[str],
                      indent: str = "    ") -> list[str]:
    """``for chunk in prange(chunks)`` around ``for`` loops over ``domain``, where ``axis`` runs
    over the chunk's part of its range (chunk c: [c*d//chunks, (c+1)*d//chunks))."""
    size = domain[axis]
    lines = [f"{indent}for chunk in prange({chunks}):"]
    indent += "    "
    for number, extent in enumerate(domain):
        if number == axis:
            lines.append(f"{indent}for {loops[number]} in range(chunk * {size} // {chunks}, "
                         f"(chunk + 1) * {size} // {chunks}):")
        else:
            lines.append(f"{indent}for {loops[number]} in range({extent}):")
        indent += "    "
    lines.extend(indent + line for line in body)
    return lines


def sum_partials(partial: str, out: str, chunks: int | str, name: str) -> list[str]:
    """Statements writing ``out`` (float32) as the sum of the float64 partial sums
    ``partial[chunk, ...]`` added in chunk order (``name`` tells the temporaries apart)."""
    flat, wide, total = f"z{name}", f"w{name}", f"s{name}"
    return [f"{flat} = {out}.reshape({out}.size)", f"{wide} = {partial}.reshape(({chunks}, {flat}.size))",
            f"for q in range({flat}.size):", f"    {total} = np.float64(0.0)",
            f"    for chunk in range({chunks}):", f"        {total} += {wide}[chunk, q]",
            f"    {flat}[q] = np.float32({total})"]


# ------------------------------------------------------------------ transcendentals
_LIBM_CALL = re.compile(r"\bmath\.(exp|log|tanh|erf)\(")
_TEMPLATE_MARKER = "# ---------------------------------------------------------------- TEMPLATE\n"


@lru_cache(maxsize=None)
def math_prelude() -> str:
    """The source of the kit's float32 transcendentals (templates/cpu_math.py after its TEMPLATE line)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "cpu_math.py")
    with open(path, encoding="utf-8") as stream:
        text = stream.read()
    return text.split(_TEMPLATE_MARKER, 1)[1].strip("\n") + "\n"


def vectorizable_math(body: str) -> tuple[str, str]:
    """(body with math.exp/log/tanh/erf calls replaced by the kit's branch-free float32 versions,
    the helper source the body then needs, or "" where it calls none). The scalar renderers
    write ``math.*`` (CUDA keeps those: libdevice is vectorized per thread already); on the CPU
    libm calls are opaque to LLVM's loop vectorizer, the kit's helpers are not."""
    replaced, count = _LIBM_CALL.subn(lambda match: f"bendc_{match.group(1)}(", body)
    return replaced, (math_prelude() if count else "")
