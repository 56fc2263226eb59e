"""conv2d's two VJP products on cuda as implicit GEMMs with shared-memory tiles (conv1d is conv2d
on (N, C, 1, L) views, so it runs the same kernels). bendc/ops/conv.py's ``cuda=`` renderers of
conv2d_grad_input and conv2d_grad_weight call :func:`grad_input_kernels` and
:func:`grad_weight_kernels` with the conv's sizes (``_conv_sizes``: N, C, H, W, O, CG, OG, KH, KW,
HO, WO, SH, SW, DH, DW, TOP, LEFT, G) and the tile size.

Input gradient: per group g, dx[g] (C/G, N*H*W) = W[g]^T (C/G, O/G*KH*KW) @ A (O/G*KH*KW, N*H*W),
where A[(o', i, j), (n, ih, iw)] is g[n, g*O/G + o', oh, ow] for the output position that tap (i, j)
of input position (ih, iw) reads, zero where there is none. With stride s > 1 the transposed
convolution has holes: tap i reaches input row ih only when s divides ih + top - i*dh. The kernels
use the per-phase decomposition rather than a guard: the input rows fall into s phases by
(ih + top) % s, and a phase's rows are reached by the taps i with i*dh % s equal to it, an
arithmetic progression i0, i0 + s/gcd(s, dh), ..; so each (row phase, column phase) is its own
dense implicit GEMM (one kernel each, every size a literal), over only the taps that reach it, with
oh = qh + B - t * dh/gcd(s, dh) for the phase's q-th row and t-th tap (no divisibility tests, no
wasted products; the bounds test 0 <= oh < HO remains, as the padding test does in the forward).
A phase no tap reaches is written with zeros. A block (TILE, TM) computes TM input channels
(TM: TILE, or the power of two covering C/G when that is smaller) by TILE input positions, from
shared-memory tiles of W^T (TM x TILE) and of A (TILE x TILE), A's loaded with consecutive
threads on consecutive positions.

Weight gradient: per group, dw[g] (O/G, C/G*KH*KW) = g[g] (O/G, N*HO*WO) @ columns (N*HO*WO,
C/G*KH*KW), the columns the forward's im2col of x (computed on the fly, never stored). The output
is small and the reduction long, so each block computes one TM x TILE tile of dw (TM output
channels, as above) and splits the N*HO*WO reduction over SLICES groups of threads in the block
(block (TILE, TM, SLICES), at most THREADS threads): slice z takes the reduction tiles z,
z + SLICES, .., and the slices' sums are added in slice order through shared memory at the end.
Both tiles are loaded with consecutive threads on consecutive reduction positions (coalesced
reads of g and of x). No atomics: the same inputs give the same bits every run. The reduction
is not split across blocks (that would need a scratch buffer for the partial tiles, which the
kernel kit does not provide), so a small dw runs on few blocks.

Both accumulate float32 products in float32 in reduction order, as the forward's kernel does (a
multiply then an add: the runtime turns FMA contraction off).
"""
from __future__ import annotations

import math

from bendc.kernels import cuda_kit as kit

THREADS = 512  # at most this many threads in a weight-gradient block (TILE * TILE * SLICES)


def _tile(rows: int, columns: int, tile: int) -> int:
    """The forward's rule: ``tile``, or at most 8 for a product whose sides are both at most 8."""
    return tile if max(rows, columns) > 8 else min(tile, 8)


def _offset(value: int) -> str:
    """`` + value`` / `` - value`` / nothing, to follow an index expression."""
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


def _phase(size: int, kernel: int, stride: int, dilation: int, pad: int, phase: int) -> dict:
    """One axis of one phase of the transposed convolution: the input indexes first, first + stride,
    .. (count of them) and the taps i0, i0 + step, .. (taps of them) that reach them; the q-th
    index's t-th tap reads output index q + base - t * delta."""
    first = (phase - pad) % stride
    count = max(0, kit.ceil_div(size - first, stride))
    reaching = [i for i in range(kernel) if (i * dilation) % stride == phase]
    step = stride // math.gcd(stride, dilation)
    i0 = reaching[0] if reaching else 0
    assert not reaching or reaching == list(range(i0, kernel, step))
    return dict(first=first, count=count, taps=len(reaching), i0=i0, step=step,
                base=(first + pad - i0 * dilation) // stride, delta=dilation // math.gcd(stride, dilation))


def _grad_input_phase(op: kit.CudaNode, s: dict, name: str, ph: dict, pw: dict, tile: int) -> tuple[str, kit.Launch]:
    """The implicit GEMM of one (row phase, column phase): block (TILE, TM) computes TM channels of
    its group by TILE of the phase's input positions."""
    columns = s["N"] * ph["count"] * pw["count"]
    cg, og = s["CG"], s["OG"]
    taps = ph["taps"] * pw["taps"]
    k_size = og * taps
    tile = _tile(cg, max(columns, k_size), tile)
    rows = min(tile, kit.power_of_two_at_least(cg))  # TM: fewer idle threads for few channels
    positions = ph["count"] * pw["count"]
    ih = f"{ph['first']} + qh * {s['SH']}" if ph["count"] > 1 else str(ph["first"])
    iw = f"{pw['first']} + qw * {s['SW']}" if pw["count"] > 1 else str(pw["first"])
    samples = op.count(s["N"], s["C"] * s["H"] * s["W"])  # from dx's length (kit.length_of)
    head = ["tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y", f"column = cuda.blockIdx.x * {tile} + tx",
            f"columns = {samples} * {ph['count'] * pw['count']}",
            "# the column's input position: sample n, the phase's qh-th row and qw-th column",
            f"n = column // {positions}", f"qh = column % {positions} // {pw['count']}",
            f"qw = column % {pw['count']}"]
    per_tile = [f"row = row_tile * {rows} + ty", "acc = np.float32(0.0)"]
    loop: list[str] = []
    if k_size:  # else no tap reaches this phase: zeros
        tap = [f"o = g * {og} + k // {taps}", f"th = k % {taps} // {pw['taps']}", f"tw = k % {pw['taps']}"]
        head = [f"tile_a = cuda.shared.array(({rows}, {tile + 1}), numba.float32)",
                f"tile_b = cuda.shared.array(({tile}, {tile + 1}), numba.float32)"] + head
        loop = ([f"for tile in range({kit.ceil_div(k_size, tile)}):",
                 "    # W^T: rows of this group's input channels, columns of the taps (o', th, tw)",
                 f"    k = tile * {tile} + tx",
                 f"    if row < {cg} and k < {k_size}:"]
                + ["        " + line for line in tap]
                + [f"        i = {ph['i0']} + th * {ph['step']}", f"        j = {pw['i0']} + tw * {pw['step']}",
                   f"        tile_a[ty, tx] = {op.read(1, ['o', 'row', 'i', 'j'])}",
                   "    else:", "        tile_a[ty, tx] = np.float32(0.0)",
                   "    # A: g at the output position tap k of the column's input position reads (0 off the edge)",
                   f"    for r in range(ty, {tile}, {rows}):",
                   f"        k = tile * {tile} + r",
                   "        value = np.float32(0.0)",
                   f"        if column < columns and k < {k_size}:"]
                + ["            " + line for line in tap]
                + [f"            oh = qh{_offset(ph['base'])} - th * {ph['delta']}",
                   f"            ow = qw{_offset(pw['base'])} - tw * {pw['delta']}",
                   f"            if oh >= 0 and oh < {s['HO']} and ow >= 0 and ow < {s['WO']}:",
                   f"                value = {op.read(0, ['n', 'o', 'oh', 'ow'])}",
                   "        tile_b[r, tx] = value",
                   "    cuda.syncthreads()",
                   f"    for kk in range({tile}):",
                   "        acc += tile_a[ty, kk] * tile_b[kk, tx]",
                   "    cuda.syncthreads()"])
    tail = [f"if row < {cg} and column < columns:",
            f"    ih = {ih}", f"    iw = {iw}",
            f"    out0[((n * {s['C']} + g * {cg} + row) * {s['H']} + ih) * {s['W']} + iw] = acc"]
    # columns on grid.x; channel tiles on y and groups on z, each block looping past 65535 of them
    row_tiles = kit.ceil_div(cg, rows)
    body = head + kit.block_loop("g", "z", s["G"], kit.block_loop("row_tile", "y", row_tiles, per_tile + loop + tail))
    grid = (kit.ceil_div(columns, tile), kit.grid_blocks(row_tiles), kit.grid_blocks(s["G"]))
    shared = (rows + tile) * (tile + 1) * 4 if k_size else 0
    doc = (f"Implicit GEMM over the input rows {ph['first']}, {ph['first'] + s['SH']}, .. and columns "
           f"{pw['first']}, {pw['first'] + s['SW']}, ..: {taps} of the {s['KH'] * s['KW']} taps reach them; "
           "one dx element per thread.")
    return kit.kernel_source(name, op.arguments, body, doc), kit.Launch(name, grid, (tile, rows, 1), shared)


def grad_input_kernels(op: kit.CudaNode, s: dict, tile: int) -> kit.Kernels:
    """dx = the transposed convolution of g by w: one implicit-GEMM kernel per (row, column) phase
    of the stride that holds input positions (one kernel at stride 1)."""
    sources, launches, products = [], [], []
    for rh in range(s["SH"]):
        ph = _phase(s["H"], s["KH"], s["SH"], s["DH"], s["TOP"], rh)
        for rw in range(s["SW"]):
            pw = _phase(s["W"], s["KW"], s["SW"], s["DW"], s["LEFT"], rw)
            if ph["count"] and pw["count"]:
                source, launch = _grad_input_phase(op, s, f"phase{rh}_{rw}", ph, pw, tile)
                sources.append(source)
                launches.append(launch)
                k_size, columns = s["OG"] * ph["taps"] * pw["taps"], s["N"] * ph["count"] * pw["count"]
                products.append(f"[{s['CG']},{k_size}] @ [{k_size},{columns}] in {launch.block[1]}x{launch.block[0]} tiles")
    return kit.Kernels(f"conv2d_grad_input {s['G']} group(s), implicit GEMM per stride phase: " + "; ".join(products),
                       "".join(sources), launches)


def grad_weight_kernels(op: kit.CudaNode, s: dict, tile: int) -> kit.Kernels:
    """dw = g @ im2col(x)^T per group: a TM x TILE tile of dw per block (TM output channels, at
    most TILE), the N*HO*WO reduction split over SLICES thread slices of the block and their sums
    added in slice order."""
    og, cg = s["OG"], s["CG"]
    taps = s["KH"] * s["KW"]
    k_size, positions = cg * taps, s["HO"] * s["WO"]
    reduction = s["N"] * positions
    tile = _tile(og, k_size, tile)
    rows = min(tile, kit.power_of_two_at_least(og))  # TM: fewer idle threads for few output channels
    tiles = kit.ceil_div(reduction, tile)
    slices = max(1, min(THREADS // (tile * rows), tiles))
    padded = tile + 1
    body = [f"tile_a = cuda.shared.array(({slices}, {rows}, {padded}), numba.float32)",
            f"tile_b = cuda.shared.array(({slices}, {tile}, {padded}), numba.float32)",
            "tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y", "tz = cuda.threadIdx.z",
            f"column = cuda.blockIdx.x * {tile} + tx",
            "# the reduction's N*HO*WO positions, N from x's length (kit.length_of), and the block's steps",
            f"reduction = {op.count(s['N'], s['C'] * s['H'] * s['W'])} * {positions}",
            f"steps = ((reduction + {tile - 1}) // {tile} + {slices - 1}) // {slices}"]
    per_tile = [f"row = row_tile * {rows} + ty",
            f"o = g * {og} + row",
            "acc = np.float32(0.0)",
            "for step in range(steps):",
            f"    tile = step * {slices} + tz",
            "    # g: rows of output channels, columns of reduction positions (n, oh, ow)",
            f"    p = tile * {tile} + tx",
            f"    if row < {og} and p < reduction:",
            f"        n = p // {positions}", f"        oh = p % {positions} // {s['WO']}", f"        ow = p % {s['WO']}",
            f"        tile_a[tz, ty, tx] = {op.read(1, ['n', 'o', 'oh', 'ow'])}",
            "    else:", "        tile_a[tz, ty, tx] = np.float32(0.0)",
            "    # im2col(x): rows of reduction positions, columns of taps (c, i, j) (0 in the padding),",
            "    # consecutive threads on consecutive positions (consecutive ow: coalesced reads of x)",
            f"    for e in range(ty * {tile} + tx, {tile * tile}, {rows * tile}):",
            f"        r = e % {tile}",
            f"        q = e // {tile}",
            f"        p = tile * {tile} + r",
            f"        k = cuda.blockIdx.x * {tile} + q",
            "        value = np.float32(0.0)",
            f"        if k < {k_size} and p < reduction:",
            f"            n = p // {positions}",
            f"            ih = p % {positions} // {s['WO']} * {s['SH']}{_offset(-s['TOP'])} + k % {taps} // {s['KW']} * {s['DH']}",
            f"            iw = p % {s['WO']} * {s['SW']}{_offset(-s['LEFT'])} + k % {s['KW']} * {s['DW']}",
            f"            if ih >= 0 and ih < {s['H']} and iw >= 0 and iw < {s['W']}:",
            f"                c = g * {cg} + k // {taps}",
            f"                value = {op.read(0, ['n', 'c', 'ih', 'iw'])}",
            "        tile_b[tz, r, q] = value",
            "    cuda.syncthreads()",
            f"    for kk in range({tile}):",
            "        acc += tile_a[tz, ty, kk] * tile_b[tz, kk, tx]",
            "    cuda.syncthreads()",
            "# the slices' sums, added in slice order",
            "tile_a[tz, ty, tx] = acc",
            "cuda.syncthreads()",
            f"if tz == 0 and row < {og} and column < {k_size}:",
            "    total = tile_a[0, ty, tx]",
            f"    for z in range(1, {slices}):",
            "        total += tile_a[z, ty, tx]",
            f"    out0[o * {k_size} + column] = total",
            "cuda.syncthreads()  # the slices' sums are read before the next tile overwrites them"]
    # dw columns on grid.x; channel tiles on y and groups on z, each block looping past 65535 of them
    row_tiles = kit.ceil_div(og, rows)
    body += kit.block_loop("g", "z", s["G"], kit.block_loop("row_tile", "y", row_tiles, per_tile))
    source = kit.kernel_source("kernel", op.arguments, body,
                               f"Implicit GEMM over the N*HO*WO reduction, {slices} slice(s) per block; "
                               "one dw element per (ty, tx), its slices summed in order.")
    shared = slices * (rows + tile) * padded * 4
    assert shared <= kit.MAX_SHARED_BYTES, shared
    grid = (kit.ceil_div(k_size, tile), kit.grid_blocks(row_tiles), kit.grid_blocks(s["G"]))
    launch = kit.Launch("kernel", grid, (tile, rows, slices), shared)
    return kit.Kernels(f"conv2d_grad_weight {s['G']} group(s) of [{og},{reduction}] @ [{reduction},{k_size}] "
                       f"implicit GEMM, {rows}x{tile} tiles, the reduction in {slices} slice(s) per block",
                       source, [launch])
