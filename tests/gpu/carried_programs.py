"""The programs tests/gpu/carried.py builds here and carries to the device machine."""
from __future__ import annotations


def chain(x, w, b):
    """+ - * / only: the cuda build's outputs are the cpu build's bit for bit (no FMA)."""
    return ((x * w + b) * x - b) / (w * w + 1.0), (x - w) * (b + 2.0)


def tall_product(x, w):
    """x @ w with 1,100,000 rows: 68,750 row tiles, past grid.y's 65535 blocks (the grid probe)."""
    return x @ w


TALL_ROWS = 1_100_000
