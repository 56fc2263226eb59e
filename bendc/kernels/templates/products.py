"""Small matrix products over rows of 16-lane chunks, for kernels that keep a whole product in cache
(the fused attention heads of bendc/ops/attention/templates/tiled.py).

``bendc_rows_fma(dest, weights, down, sources, count, lo, hi, causal, fresh)`` adds to every row j of
dest (from zeros where ``fresh``: dest's values are not read)

    dest[j, r] = fma(w(j, s), sources[s, r], dest[j, r])   for s = 0, 1, ..., count - 1 in order,

w(j, s) = ``weights[s, j]`` when ``down`` else ``weights[j, s]``, each rounded once (``bendc_fma``),
at the lanes r in [lo, hi). ``causal`` keeps the cells a causal attention head holds, in chunks of 16
rows (its LANES): 0 all of them; 1 row j only at lanes from the start of its chunk on
(r >= (j // 16) * 16); 2 row j only from the sources up to the end of its chunk
(s < (j // 16 + 1) * 16); 3 row j only from the sources from the start of its chunk on
(s >= (j // 16) * 16). dest shares no memory with weights or sources.

Why a function: its loops as numba writes them load and store dest[j, r] for every source (or four,
unrolled by hand): a product of 64 x 32 by 32 x 64 ran at ~25 GFLOP/s, a sixth of one core's peak.
The native translator (runtime/native/translate.py, ``_rows_fma_vector``) emits it, for float32
rows with contiguous lanes and ``lo`` on a chunk, as a register-blocked product: a block of dest
rows by 16-lane vectors (on AVX-512 16 x 1, 8 x 2 or 4 x 4 by the rows' width, elsewhere 4 x 1:
``rows_fma_blocks``) stays in registers while the sources go by, the last vector of a row masked,
each cell's FMAs in the order above, so the bits are the body's. Anything else runs the body
below; numba compiles the body, which gives the same bits (BENDC_NATIVE_CHECK compares the two).
"""
import numpy as np
from numba import njit

from bendc.kernels.templates.cpu_math import bendc_fma

# ---------------------------------------------------------------- TEMPLATE
@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_rows_fma(dest, weights, down, sources, count, lo, hi, causal, fresh):
    """dest[j, r] = fma(w(j, s), sources[s, r], dest[j, r]) for s in order, r in [lo, hi), the cells ``causal``
    keeps, from dest[j, r] = 0 where ``fresh`` (callers keep 0 <= lo, hi <= the rows' length, count <= the sources)."""
    for j in range(dest.shape[0]):
        row = dest[j]
        chunk = (j // 16) * 16
        start = max(max(lo, 0), chunk) if causal == 1 else max(lo, 0)
        sources_to = min(max(count, 0), chunk + 16) if causal == 2 else max(count, 0)
        if fresh:
            for r in range(start, hi):
                row[r] = np.float32(0.0)
        for s in range(chunk if causal == 3 else 0, sources_to):
            w = weights[s, j] if down else weights[j, s]
            line = sources[s]
            for r in range(start, hi):
                row[r] = bendc_fma(w, line[r], row[r])
