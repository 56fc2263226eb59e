"""The minimal runtime: runs a kernel plan. Imports numpy (and the generated
kernels, which import numba) only: no tracer, passes or networkx."""
from runtime.cpu import CpuProgram, KernelError

__all__ = ["CpuProgram", "KernelError"]
