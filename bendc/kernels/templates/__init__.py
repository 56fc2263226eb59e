"""numba source the kit copies into generated CPU kernels, as Python files read as text."""
