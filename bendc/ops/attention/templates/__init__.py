"""numba templates of the attention kernels, as Python files read as text (see cpu.py)."""
