"""Scaled dot-product attention: the ops (ops.py), the layouts of their score matrices
(layout.py, shared with passes/attention.py), the tiled schedule's two ops (tiled.py), their CPU kernels (cpu.py, over the numba
templates in templates/) and CUDA kernels (cuda.py; the tiled schedule's in cuda_tiled.py)."""
from bendc.ops.attention import ops, tiled  # noqa: F401  (define the ops)
from bendc.ops.attention.layout import (SCHEDULES, pack, resolve_schedule, row_start, score_cells, unpack,
                                        work_items)

__all__ = ["SCHEDULES", "pack", "resolve_schedule", "row_start", "score_cells", "unpack", "work_items"]
