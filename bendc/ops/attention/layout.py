"""The layouts of attention's score matrices (shared by the ops, their kernels and the
attention_schedule pass): cells per head, where each row starts, how rows are dealt into work
items, and packing a (..., T, T) matrix into a layout and back."""
from __future__ import annotations

import numpy as np

from bendc.ops.base import InferError

SCHEDULES = ("auto", "triangular", "dense")


def resolve_schedule(schedule: str, causal: bool) -> str:
    """The layout a schedule attribute means: 'auto' is triangular when causal, else dense."""
    if schedule not in SCHEDULES:
        raise InferError(f"unknown attention schedule {schedule!r}; one of {', '.join(SCHEDULES)}")
    if schedule == "auto":
        return "triangular" if causal else "dense"
    if schedule == "triangular" and not causal:
        raise InferError("the triangular schedule needs causal attention (every position attends to all)")
    return schedule


def score_cells(t: int, schedule: str) -> int:
    """Cells per head of a score matrix in a resolved layout."""
    return t * (t + 1) // 2 if schedule == "triangular" else t * t


def row_start(i: int, t: int, schedule: str) -> int:
    """The first cell of row i: i(i+1)/2 in the packed triangle, i*t dense."""
    return i * (i + 1) // 2 if schedule == "triangular" else i * t


def work_items(t: int, schedule: str) -> list[tuple[int, ...]]:
    """The rows of each work item of one head: pairs (i, t-1-i), the middle row alone (triangular);
    one row each (dense)."""
    if schedule == "dense":
        return [(i,) for i in range(t)]
    return [(i,) if i == t - 1 - i else (i, t - 1 - i) for i in range((t + 1) // 2)]


def mask(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


def pack(full: np.ndarray, schedule: str) -> np.ndarray:
    """(..., T, T) -> (..., C) in the layout (the triangle's cells j <= i, row after row)."""
    t = full.shape[-1]
    if schedule == "triangular":
        rows, columns = np.tril_indices(t)
        return np.ascontiguousarray(full[..., rows, columns], dtype=np.float32)
    return np.ascontiguousarray(full.reshape(full.shape[:-2] + (t * t,)), dtype=np.float32)


def unpack(cells: np.ndarray, t: int, schedule: str) -> np.ndarray:
    """(..., C) -> (..., T, T); the triangle's cells above the diagonal are +0.0."""
    if schedule == "triangular":
        full = np.zeros(cells.shape[:-1] + (t, t), dtype=np.float32)
        rows, columns = np.tril_indices(t)
        full[..., rows, columns] = cells
        return full
    return cells.reshape(cells.shape[:-1] + (t, t))

TILE = 64  # the tiled schedule's block of queries and of keys (templates/tiled.py's BLOCK)
SMALL_HEAD = 64  # up to this length the CPU's tiled kernels run each head fused (templates/tiled.py's SMALL)


def whole_heads(t: int) -> bool:
    """Whether the CPU's tiled schedule runs each head of ``t`` positions fused, not in tiles."""
    return t <= SMALL_HEAD
