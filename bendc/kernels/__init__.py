"""The kernel-text kit: the vocabulary op lowerings and codegen write kernels with.

``access`` (strided views and index arithmetic), ``cuda_kit`` (launches,
grid-stride loops, tree reductions, kernel sources, limits) and ``cpu_kit``
(the same for numba CPU source). The kit imports nothing of bendc but
``bendc.ir`` (and the runtime's dtype table): op files use it, never codegen.
"""
