"""numba template: the dense layout's helpers (t*t cells, a row per work item).

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
from numba import njit


# ---------------------------------------------------------------- TEMPLATE

@njit(cache=True, no_cfunc_wrapper=True)
def _items(t):
    """Work items per head: one row (or column block) each."""
    return t


@njit(cache=True, no_cfunc_wrapper=True)
def _deal(item, t):
    """The row (or column block) of a work item."""
    return item, -1


@njit(cache=True, no_cfunc_wrapper=True)
def _row_start(i, t):
    """Row i of the dense matrix starts at cell i*t."""
    return i * t


@njit(cache=True, no_cfunc_wrapper=True)
def _row_length(i, t):
    """Every row holds all t positions."""
    return t


@njit(cache=True, no_cfunc_wrapper=True)
def _column_first(j, t):
    """Every column holds all t rows."""
    return 0
