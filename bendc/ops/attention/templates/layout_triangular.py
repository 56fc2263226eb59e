"""numba template: the triangular layout's helpers (packed lower triangle, rows dealt in pairs i and t-1-i).

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
from numba import njit

# ---------------------------------------------------------------- TEMPLATE

@njit(cache=True, no_cfunc_wrapper=True)
def _items(t):
    """Work items per head: pairs of rows (i, t-1-i), t+1 cells each; the middle row of an odd t alone."""
    return (t + 1) // 2


@njit(cache=True, no_cfunc_wrapper=True)
def _deal(item, t):
    """The rows (or column blocks) of a work item: item and t-1-item; -1 when item is the middle one."""
    other = t - 1 - item
    if other == item:
        return item, -1
    return item, other


@njit(cache=True, no_cfunc_wrapper=True)
def _row_start(i, t):
    """Row i of the packed lower triangle starts at cell i(i+1)/2."""
    return i * (i + 1) // 2


@njit(cache=True, no_cfunc_wrapper=True)
def _row_length(i, t):
    """Row i holds the positions j <= i."""
    return i + 1


@njit(cache=True, no_cfunc_wrapper=True)
def _column_first(j, t):
    """Column j holds the rows i >= j."""
    return j
