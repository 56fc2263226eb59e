"""Native kernels: generated numba source compiled to machine code through LLVM without numba's
pipeline (translate.py: the translator; types.py: numba's typing rules; jit.py: compiling, caching
and calling). Imports numpy, llvmlite and the runtime only."""
