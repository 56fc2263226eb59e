"""The tiled (flash-attention) schedule's CUDA kernels: ``attention_tiled`` (one kernel) and
``attention_tiled_grad`` (two), written with the kernel kit. Their outputs are the CPU ops'
packed layouts (ops/attention/tiled.py), so the IR and its ``index`` views are the same on both
targets.

Forward (``kernel``): a block per (batch, head, tile of BQ queries), the heaviest causal tiles
first. The Q tile stays in shared memory; K and then V tiles of BK keys stream through one
shared buffer. Per key tile: S = scale * Q K^T into shared memory (masked to -inf past T and,
causal, above the diagonal), each query's running max (its own thread), P = exp(S - max) in
place, the running sum, and O = O * exp(old max - new max) + P V in registers (each thread owns
a fixed micro-tile of O). Causal blocks wholly above the diagonal are never loaded; blocks that
cross it are masked. At the end O / sum and each query's logsumexp (max + log sum) go into the
packed output.

Backward, flash-attention-2's recompute from the saved logsumexp, split into two kernels so that
no float is ever accumulated by two blocks (no atomics, the same sums in the same order on every
run):

- ``key_grads``: a block per (batch, key/value head, tile of BK keys) keeps that tile's dK and dV
  in registers and walks the group's query heads in order and, for each, its query tiles in order
  (causal: from the first one that reaches the tile's keys). Per query tile it recomputes
  P^T = exp(scale K Q^T - lse) and dP^T = V dO^T, accumulates dV += P^T dO, forms
  dS^T = P^T (dP^T - D) scale (D = rowsum(dO * O), from the saved O) and accumulates dK += dS^T Q.
  With fewer than MIN_BLOCKS such blocks (two per SM of sm_90), each tile's walk is split into
  parts (:func:`key_grads_parts`), a block per (batch, key/value head, key tile, part), each
  writing its part's dK and dV into a scratch array (``Kernels.scratch``: a temporary buffer of
  the step); ``key_grads_sum`` then adds the parts of each cell in order of parts. The same bits
  every run, still no atomics (the split changes the order of the sums against the unsplit walk,
  within the tolerances).
- ``query_grads``: a block per (batch, head, tile of BQ queries) keeps dQ in registers and walks
  its key tiles (causal: up to the diagonal), recomputing P and dP the same way: dQ += dS K.

Each block owns the output rows it writes, so the split is race-free; the price is computing
S and dP twice (7 tile products per tile pair instead of flash-attention-2's 5 with atomic dQ).

A thread's register tiles are local arrays (``cuda.local.array``) walked by loops of constant
trip count (:class:`Owned`): NVVM unrolls them and keeps the arrays in registers (no local loads
or stores in the PTX), and numba's typing, liveness, SSA and lowering passes, which grow with the
source's statements, see ~140-170 lines a kernel instead of 260-420 unrolled ones (compile time).

Tile sizes (:func:`forward_tiles`, :func:`backward_tiles`): the largest of CANDIDATES whose
shared memory fits MAX_SHARED_BYTES and whose per-thread accumulators fit MAX_ACCUMULATORS,
for THREADS threads. For D = Dv = 64: forward 64 x 32, backward 32 x 32; for D = Dv = 128:
forward 32 x 32, backward 16 x 16 (queries x keys). Shared rows have an odd length (a column
walk then hits 32 banks). Arithmetic is float32 (``np.float32`` constants), exp and log are
``math.*`` (libdevice's expf and logf), and the generated module's ``@jit`` compiles without LTO,
so products and sums round as written (no contraction).
"""
from __future__ import annotations

from dataclasses import dataclass

from bendc.errors import UnsupportedError
from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit

THREADS = 128  # threads per block (4 warps)
# (queries, keys) per tile, the preferred first: more queries per tile streams K and V fewer times.
CANDIDATES = ((64, 64), (64, 32), (32, 64), (32, 32), (32, 16), (16, 32), (16, 16), (8, 16))
MAX_ACCUMULATORS = 64  # float32 values a thread keeps live in registers (accumulators and a tile's scores)
# key_grads has a block per (batch, key/value head, key tile); fewer than MIN_BLOCKS split each
# tile's walk over query heads and tiles into parts (key_grads_parts), added in order afterwards.
# Two blocks per SM of sm_90's 132 (H100 and H200 SXM): the kernel holds 4 blocks of 128 threads
# per SM (its registers bind), so a grid of half a wave or less leaves the GPU mostly idle.
SMS = 132
MIN_BLOCKS = 2 * SMS
MAX_PARTS = 8
# Blocks of THREADS each of the three kernels asks to keep resident per SM (launch bounds: at most
# 65536 / (128 x 4) = 128 registers a thread; without them ptxas gave the split key_grads 159 and
# so 3 blocks). The PTX tests check that no kernel spills under the bound.
RESIDENT = 4


def _odd(n: int) -> int:
    """A shared row's length: n, or n + 1 when even (so a column walk spreads over the banks)."""
    return n | 1


def _power_of_two_at_least(n: int) -> int:
    return kit.power_of_two_at_least(max(n, 1))


@dataclass(frozen=True)
class Split:
    """A ``rows`` x ``cols`` tile over ``threads`` threads: thread t owns rows ty + TY*m (m < RM)
    and columns tx + TX*k (k < CM), with ty = t // TX and tx = t % TX. Columns from ``cols`` to
    ``width`` (= TX * CM) are padding: they read zeros and are never written out."""

    rows: int
    cols: int
    tx: int
    threads: int

    @property
    def ty(self) -> int:
        return self.threads // self.tx

    @property
    def rm(self) -> int:
        return self.rows // self.ty

    @property
    def cm(self) -> int:
        return kit.ceil_div(self.cols, self.tx)

    @property
    def width(self) -> int:
        return self.tx * self.cm

    @property
    def owned(self) -> int:
        return self.rm * self.cm


def split(rows: int, cols: int, threads: int) -> Split:
    """The micro-tiling with the fewest shared reads per product step (RM + CM), the widest on a
    tie. ``rows`` and ``threads`` are powers of two; TY never exceeds ``rows`` (a score tile,
    whose sides are powers of two with threads <= rows * cols, is then never padded)."""
    low, high = max(1, threads // rows), max(max(1, threads // rows), min(threads, _power_of_two_at_least(cols)))
    options = []
    tx = low
    while tx <= high:
        options.append(Split(rows, cols, tx, threads))
        tx *= 2
    return min(options, key=lambda s: (s.rm + s.cm, -s.tx))


@dataclass(frozen=True)
class Tiles:
    """One kernel family's tiles: ``queries`` x ``keys``, ``threads`` per block, static shared bytes
    of each kernel and the float32 accumulators a thread keeps."""

    queries: int
    keys: int
    threads: int
    shared_bytes: tuple[int, ...]
    accumulators: int

    def describe(self) -> str:
        shared = " and ".join(f"{n} bytes" for n in self.shared_bytes)
        return (f"tiles of {self.queries} queries x {self.keys} keys, {self.threads} threads, "
                f"{shared} of shared memory per block, {self.accumulators} accumulators per thread")


# ------------------------------------------------------------------ shared-memory layouts
def _forward_layout(bq: int, bk: int, depth: int, width: int, threads: int) -> dict:
    s, o = split(bq, bk, threads), split(bq, width, threads)
    arrays = {"q_tile": (bq, _odd(depth)), "kv_tile": (bk, _odd(max(depth, o.width))),
              "s_tile": (bq, _odd(bk)), "top": (bq,), "total": (bq,), "alpha": (bq,)}
    return {"s": s, "o": o, "arrays": arrays, "accumulators": o.owned + s.owned}


def _key_grads_layout(bq: int, bk: int, depth: int, width: int, threads: int) -> dict:
    st, dk, dv = split(bk, bq, threads), split(bk, depth, threads), split(bk, width, threads)
    arrays = {"k_tile": (bk, _odd(depth)), "v_tile": (bk, _odd(width)),
              "q_tile": (bq, _odd(max(depth, dk.width))), "g_tile": (bq, _odd(max(width, dv.width))),
              "p_tile": (bk, _odd(bq)), "lse_tile": (bq,), "delta_tile": (bq,)}
    return {"st": st, "dk": dk, "dv": dv, "arrays": arrays, "accumulators": dk.owned + dv.owned + 2 * st.owned}


def _query_grads_layout(bq: int, bk: int, depth: int, width: int, threads: int) -> dict:
    sq, dq = split(bq, bk, threads), split(bq, depth, threads)
    arrays = {"q_tile": (bq, _odd(depth)), "g_tile": (bq, _odd(width)),
              "k_tile": (bk, _odd(max(depth, dq.width))), "v_tile": (bk, _odd(width)),
              "ds_tile": (bq, _odd(bk)), "lse_tile": (bq,), "delta_tile": (bq,)}
    return {"sq": sq, "dq": dq, "arrays": arrays, "accumulators": dq.owned + 2 * sq.owned}


def _bytes(layout: dict) -> int:
    total = 0
    for shape in layout["arrays"].values():
        cells = 1
        for size in shape:
            cells *= size
        total += 4 * cells
    return total


def _choose(layouts, depth: int, width: int) -> Tiles | None:
    threads = THREADS
    for bq, bk in CANDIDATES:
        if threads > bq * bk:
            continue
        made = [layout(bq, bk, depth, width, threads) for layout in layouts]
        shared = tuple(_bytes(m) for m in made)
        accumulators = max(m["accumulators"] for m in made)
        if max(shared) <= kit.MAX_SHARED_BYTES and accumulators <= MAX_ACCUMULATORS:
            return Tiles(bq, bk, threads, shared, accumulators)
    return None


def forward_tiles(depth: int, width: int) -> Tiles | None:
    """attention_tiled's tiles for head sizes D and Dv (None: no candidate fits)."""
    return _choose([_forward_layout], depth, width)


def backward_tiles(depth: int, width: int) -> Tiles | None:
    """attention_tiled_grad's tiles (one choice for both kernels; None: no candidate fits)."""
    return _choose([_key_grads_layout, _query_grads_layout], depth, width)


# ------------------------------------------------------------------ generated lines
def _indent(lines: list[str], levels: int = 1) -> list[str]:
    return ["    " * levels + line for line in lines]


def _shared(arrays: dict) -> list[str]:
    """One declaration a line (the simulator aliases two shared arrays declared on one line)."""
    return [f"{name} = cuda.shared.array({shape if len(shape) > 1 else shape[0]}, numba.float32)"
            for name, shape in arrays.items()]


@dataclass(frozen=True)
class Owned:
    """A split as generated code sees it: the thread's cells (m, k) in a local array of RM x CM,
    row ``{prefix}y + TY*m`` and column ``{prefix}x + TX*k`` of the tile. Cells are visited by
    loops over m and k with constant trip counts, which NVVM unrolls completely, so the local
    arrays stay in registers (tests/cuda/test_ptx_attention_tiled.py checks the PTX for local
    loads and stores) while numba's passes see a few statements instead of one per cell."""

    split: Split
    prefix: str

    def row(self, m: str = "m") -> str:
        return f"({self.prefix}y + {self.split.ty} * {m})"

    def col(self, k: str = "k") -> str:
        return f"({self.prefix}x + {self.split.tx} * {k})"

    def constants(self) -> list[str]:
        s, p = self.split, self.prefix
        return [f"{p}y = t // {s.tx}", f"{p}x = t - {p}y * {s.tx}"]

    def declare(self, acc: str) -> str:
        return f"{acc} = cuda.local.array(({self.split.rm}, {self.split.cm}), numba.float32)"

    def cells(self, body: list[str]) -> list[str]:
        """``body`` for each of the thread's cells (m, k), in order of rows then columns."""
        return [f"for m in range({self.split.rm}):", f"    for k in range({self.split.cm}):"] + _indent(body, 2)

    def set(self, acc: str, value: str) -> list[str]:
        return self.cells([f"{acc}[m, k] = {value}"])

    def product(self, acc: str, count: int, left: str, right: str) -> list[str]:
        """{acc}[m, k] += left(row m, i) * right(i, column k) for i in order (``left`` and
        ``right`` are templates over {row} and {col}); the row and column operands go through the
        local arrays ``lhs`` and ``rhs`` (:func:`_scratch`)."""
        body = ([f"for m in range({self.split.rm}):", f"    lhs[m] = {left.format(row=self.row())}",
                 f"for k in range({self.split.cm}):", f"    rhs[k] = {right.format(col=self.col())}"]
                + self.cells([f"{acc}[m, k] = {acc}[m, k] + lhs[m] * rhs[k]"]))
        return [f"for i in range({count}):"] + _indent(body)

    def write(self, acc: str, first: str, t: int, used: int, target: str) -> list[str]:
        """The accumulators of rows first + row (those < t) and columns < used into ``target``, a
        template over {row} (first + row) and {col}."""
        place = target.format(row=f"{first} + {self.row()}", col=self.col())
        return self.cells([f"if {first} + {self.row()} < {t} and {self.col()} < {used}:", f"    {place} = {acc}[m, k]"])


def _operands(*owned: Owned) -> list[str]:
    """The local arrays ``lhs`` and ``rhs`` of the kernel's products (Owned.product): a row and a
    column operand of each of the thread's rows and columns, for the widest split."""
    rows, cols = max(o.split.rm for o in owned), max(o.split.cm for o in owned)
    return [f"lhs = cuda.local.array({rows}, numba.float32)", f"rhs = cuda.local.array({cols}, numba.float32)"]


def _load(tile: str, shape: tuple[int, int], first: str, count: int, columns: int, read: str,
          threads: int) -> list[str]:
    """Fill a shared tile cooperatively: row r, column c is ``read`` (over ``row`` = first + r
    and ``c``) where row < count and c < columns, else +0.0 (ragged rows and padding)."""
    rows, width = shape
    return ["e = t", f"while e < {rows * width}:",
            f"    r = e // {width}", f"    c = e - r * {width}", f"    row = {first} + r",
            "    x = np.float32(0.0)", f"    if row < {count} and c < {columns}:", f"        x = {read}",
            f"    {tile}[r, c] = x", f"    e += {threads}"]


def _row_loop(threads: int, rows: int, body: list[str]) -> list[str]:
    """The tile's rows r dealt to threads in turn."""
    return ["r = t", f"while r < {rows}:"] + _indent(body) + [f"    r += {threads}"]


def _zero_tail(threads: int, rows: int, first: str, count: int, row_base: str, used: int, width: int) -> list[str]:
    """+0.0 into columns used..width-1 of the block's output rows (the packed output's spare columns)."""
    if used >= width:
        return []
    spare = width - used
    return ["e = t", f"while e < {rows * spare}:", f"    r = e // {spare}", f"    row = {first} + r",
            f"    if row < {count}:", f"        out0[({row_base} + row) * {width} + {used} + e - r * {spare}] = "
            "np.float32(0.0)", f"    e += {threads}"]


def _batches(op, batch: int) -> int | str:
    """The batch size as the kernel reads it: the packed output's length over its elements per batch
    entry (kit.length_of), so one source serves every batch size."""
    return op.count(batch, numel(op.shape) // batch)


def _work(count: int | str, decode: list[str], body: list[str]) -> list[str]:
    return (["work = cuda.blockIdx.x", f"while work < {count}:"] + _indent(decode + body)
            + ["    cuda.syncthreads()  # shared memory is reused by the block's next item",
               "    work += cuda.gridDim.x"])


def _launch(op, kernel: str, blocks: int, threads: int, shared: int) -> kit.Launch:
    return kit.Launch(kernel, (max(1, min(blocks, kit.MAX_ROWS)), 1, 1), (threads, 1, 1), shared)


def _no_tiles(op, what: str):
    node = op.node
    raise UnsupportedError(f"{node.op} {node.type} on cuda: no {what} tile of {CANDIDATES} fits "
                           f"{kit.MAX_SHARED_BYTES} bytes of shared memory and {MAX_ACCUMULATORS} "
                           "accumulators per thread for these head sizes", loc=node.loc, op=node.op)


def _masked(causal: bool, key: str, query: str, t: int, ragged_queries: bool = True) -> str:
    """When score (query, key) is masked: a key past the sequence, causal a key after the query,
    and (``ragged_queries``) a query past the sequence. The forward keeps those queries' rows
    unmasked (finite, never written out); the backward needs them masked (their logsumexp is 0)."""
    condition = f"{key} >= {t}" + (f" or {query} >= {t}" if ragged_queries else "")
    return condition + (f" or {key} > {query}" if causal else "")


def _lse_read(op, t: int, width: int, query: str) -> str:
    """Query ``query``'s logsumexp in attention_tiled's packed value (operand 3)."""
    return op.read(3, ["b", "h", f"({t} + ({query}) // {width})", f"(({query}) % {width})"])


# ------------------------------------------------------------------ attention_tiled
def cuda_tiled(op):
    """attention_tiled: a block per (batch, head, query tile), online softmax over the key tiles."""
    batch, heads, t, depth = op.shapes[0]
    kv_heads, width = op.shapes[1][1], op.shapes[2][3]
    group = heads // kv_heads
    causal, scale = op.attrs["causal"], f"np.float32({op.attrs['scale']!r})"
    tiles = forward_tiles(depth, width)
    if tiles is None:
        _no_tiles(op, "forward")
    bq, bk, threads = tiles.queries, tiles.keys, tiles.threads
    layout = _forward_layout(bq, bk, depth, width, threads)
    s, o, arrays = Owned(layout["s"], "s"), Owned(layout["o"], "o"), layout["arrays"]
    nq, nk = kit.ceil_div(t, bq), kit.ceil_div(t, bk)
    rows = t + kit.ceil_div(t, width)  # a head's rows: O, then the logsumexps
    lse_cells = kit.ceil_div(t, width) * width
    last = f"(min(first + {bq}, {t}) - 1) // {bk} + 1" if causal else str(nk)
    decode = [f"bh = work // {nq}", f"item = work - bh * {nq}", f"b = bh // {heads}", f"h = bh - b * {heads}",
              f"hk = h // {group}  # the key/value head of query head h",
              f"block = {nq - 1} - item  # the longest causal rows first" if causal else "block = item",
              f"first = block * {bq}"]
    mask = s.cells([f"x = sc[m, k] * {scale}",
                    f"if {_masked(causal, f'k0 + {s.col()}', f'first + {s.row()}', t, False)}:",
                    "    x = np.float32(-math.inf)", f"s_tile[{s.row()}, {s.col()}] = x"])
    key_tile = ([f"k0 = kb * {bk}", "cuda.syncthreads()  # the Q tile is in; the previous key tile's readers are done"]
                + _load("kv_tile", arrays["kv_tile"], "k0", t, depth, op.read(1, ["b", "hk", "row", "c"]), threads)
                + ["cuda.syncthreads()", "# S = scale * Q K^T, masked"]
                + s.set("sc", "np.float32(0.0)")
                + s.product("sc", depth, "q_tile[{row}, i]", "kv_tile[{col}, i]")
                + mask
                + ["cuda.syncthreads()", "# V replaces K; each query's new running max"]
                + _load("kv_tile", arrays["kv_tile"], "k0", t, width, op.read(2, ["b", "hk", "row", "c"]), threads)
                + _row_loop(threads, bq, ["mx = top[r]", f"for c in range({bk}):", "    x = s_tile[r, c]",
                                          "    if x > mx:", "        mx = x",
                                          "alpha[r] = math.exp(top[r] - mx)", "top[r] = mx"])
                + ["cuda.syncthreads()", "# P = exp(S - max)"]
                + s.cells([f"s_tile[{s.row()}, {s.col()}] = math.exp(s_tile[{s.row()}, {s.col()}] - top[{s.row()}])"])
                + ["cuda.syncthreads()", "# the running sums, and O = O * alpha + P V"]
                + _row_loop(threads, bq, ["x = total[r] * alpha[r]", f"for c in range({bk}):",
                                          "    x = x + s_tile[r, c]", "total[r] = x"])
                + [f"for m in range({o.split.rm}):", f"    lhs[m] = alpha[{o.row()}]"]
                + o.cells(["o[m, k] = o[m, k] * lhs[m]"])
                + o.product("o", bk, "s_tile[{row}, i]", "kv_tile[i, {col}]"))
    body = (_load("q_tile", arrays["q_tile"], "first", t, depth, op.read(0, ["b", "h", "row", "c"]), threads)
            + _row_loop(threads, bq, ["top[r] = np.float32(-math.inf)", "total[r] = np.float32(0.0)"])
            + o.set("o", "np.float32(0.0)")
            + [f"for kb in range({last}):"] + _indent(key_tile)
            + ["cuda.syncthreads()  # the sums are final", "# O / sum and each query's logsumexp"])
    body += o.cells([f"if first + {o.row()} < {t} and {o.col()} < {width}:",
                     f"    out0[(bh * {rows} + first + {o.row()}) * {width} + {o.col()}] = o[m, k] / total[{o.row()}]"])
    lse = f"out0[(bh * {rows} + {t}) * {width} + first + r]"  # query first + r's logsumexp cell
    body += _row_loop(threads, bq, [f"if first + r < {t}:", f"    {lse} = top[r] + math.log(total[r])"])
    if lse_cells > t:  # the unused tail of the last logsumexp row
        body += [f"if block == {nq - 1}:", "    e = t", f"    while e < {lse_cells - t}:",
                 f"        out0[(bh * {rows} + {t}) * {width} + {t} + e] = np.float32(0.0)", f"        e += {threads}"]
    kernel_body = (_shared(arrays) + [s.declare("sc"), o.declare("o")] + _operands(s, o)
                   + ["t = cuda.threadIdx.x"] + s.constants() + o.constants()
                   + _work(f"{_batches(op, batch)} * {heads * nq}", decode, body))
    source = kit.kernel_source("kernel", op.arguments, kernel_body,
                               f"attention_tiled: a block per (batch, head, {bq} queries), {bk} keys a step.",
                               kit.bounded_decorator(threads, RESIDENT))
    launch = _launch(op, "kernel", batch * heads * nq, threads, tiles.shared_bytes[0])
    skipped = ", causal blocks above the diagonal skipped" if causal else ""
    return kit.Kernels(f"attention_tiled: {batch * heads} heads x {nq} query tiles, a block each; "
                       f"{tiles.describe()}{skipped}", source, [launch])


# ------------------------------------------------------------------ attention_tiled_grad
def _recompute(o: Owned, key: str, query: str, depth: int, width: int, t: int, causal: bool, scale: str,
               reads: tuple[str, str, str, str]) -> list[str]:
    """p[m, k] and, replacing dP in d[m, k], dS of the thread's cells of a score tile, cell (m, k) being key
    k0 + key(m, k) and query q0 + query(m, k) (``key``, ``query``: templates over {row} and
    {col}): P = exp(scale S - lse), 0 where masked; dS = P (dP - D) scale. ``reads``: the
    left and right operands of S and of dP, as product templates."""
    lines = o.set("p", "np.float32(0.0)") + o.product("p", depth, reads[0], reads[1])
    lines += o.set("d", "np.float32(0.0)") + o.product("d", width, reads[2], reads[3])
    here_key, here_query = key.format(row=o.row(), col=o.col()), query.format(row=o.row(), col=o.col())
    return lines + o.cells([f"x = math.exp(p[m, k] * {scale} - lse_tile[{here_query}])",
                            f"if {_masked(causal, f'k0 + {here_key}', f'q0 + {here_query}', t)}:",
                            "    x = np.float32(0.0)", "p[m, k] = x",
                            f"d[m, k] = x * (d[m, k] - delta_tile[{here_query}]) * {scale}"])


def _row_statistics(op, threads: int, bq: int, t: int, width: int) -> list[str]:
    """Each query row's logsumexp and D = rowsum(dO * O) (from the saved O), in order of columns."""
    return _row_loop(threads, bq, [
        "i = q0 + r", "lse = np.float32(0.0)", "dot = np.float32(0.0)", f"if i < {t}:",
        f"    lse = {_lse_read(op, t, width, 'i')}", f"    for c in range({width}):",
        f"        dot = dot + {op.read(4, ['b', 'h', 'i', 'c'])} * {op.read(3, ['b', 'h', 'i', 'c'])}",
        "lse_tile[r] = lse", "delta_tile[r] = dot"])


def cuda_tiled_grad(op):
    """attention_tiled_grad: dK and dV per key tile (``key_grads``), then dQ per query tile
    (``query_grads``); each block writes only its own rows of the packed output."""
    batch, heads, t, depth = op.shapes[0]
    kv_heads, width = op.shapes[1][1], op.shapes[2][3]
    group = heads // kv_heads
    packed, columns = heads + 2 * kv_heads, max(depth, width)
    causal, scale = op.attrs["causal"], f"np.float32({op.attrs['scale']!r})"
    tiles = backward_tiles(depth, width)
    if tiles is None:
        _no_tiles(op, "backward")
    bq, bk, threads = tiles.queries, tiles.keys, tiles.threads
    nq, nk = kit.ceil_div(t, bq), kit.ceil_div(t, bk)
    q_read, g_read = op.read(0, ["b", "h", "row", "c"]), op.read(4, ["b", "h", "row", "c"])
    k_read, v_read = op.read(1, ["b", "hk", "row", "c"]), op.read(2, ["b", "hk", "row", "c"])

    # key_grads: dK and dV of one key tile, over the group's query heads and their query tiles (or,
    # split, over a part of that walk, into the scratch array; key_grads_sum adds the parts)
    layout = _key_grads_layout(bq, bk, depth, width, threads)
    st, dk, dv = Owned(layout["st"], "st"), Owned(layout["dk"], "dk"), Owned(layout["dv"], "dv")
    arrays = layout["arrays"]
    pairs, first_tile = batch * kv_heads, f"k0 // {bq}" if causal else "0"
    parts = key_grads_parts(pairs * nk, group * nq)
    arguments = op.scratch_arguments if parts > 1 else op.arguments
    dk_base, dv_base = f"(b * {packed} + {heads} + hk) * {t}", f"(b * {packed} + {heads + kv_heads} + hk) * {t}"
    # the batch from the output's length and, split, the parts from the scratch array's: one source
    # for every batch size that splits (and one for every size that does not)
    counts = [f"pairs = {_batches(op, batch)} * {kv_heads}  # (batch, key/value head) pairs"]
    if parts > 1:
        counts.append(f"parts = {op.scratch}.shape[0] // (pairs * {t * (depth + width)})")
    decode = (["part = work % parts", "pair = work // parts"] if parts > 1 else ["pair = work"])
    decode += [f"bkv = pair // {nk}", f"kb = pair - bkv * {nk}  # causal: the longest key columns first",
               f"b = bkv // {kv_heads}", f"hk = bkv - b * {kv_heads}", f"k0 = kb * {bk}",
               f"span = {nq} - {first_tile}  # the query tiles that reach the key tile, per head",
               f"steps = {group} * span  # the walk: the group's heads in order, each over its query tiles"]
    decode += (["lo = part * steps // parts", "hi = (part + 1) * steps // parts  # this part's share"]
               if parts > 1 else ["lo = 0", "hi = steps"])
    query_tile = (["cuda.syncthreads()  # K and V are in; the previous query tile's readers are done"]
                  + _load("q_tile", arrays["q_tile"], "q0", t, depth, q_read, threads)
                  + _load("g_tile", arrays["g_tile"], "q0", t, width, g_read, threads)
                  + _row_statistics(op, threads, bq, t, width)
                  + ["cuda.syncthreads()", "# P^T and dS^T of the tile, recomputed from the logsumexp"]
                  + _recompute(st, "{row}", "{col}", depth, width, t, causal, scale,
                               ("k_tile[{row}, i]", "q_tile[{col}, i]", "v_tile[{row}, i]", "g_tile[{col}, i]"))
                  + st.cells([f"p_tile[{st.row()}, {st.col()}] = p[m, k]"])
                  + ["cuda.syncthreads()", "# dV += P^T dO"]
                  + dv.product("dv", bq, "p_tile[{row}, i]", "g_tile[i, {col}]")
                  + ["cuda.syncthreads()", "# dS^T replaces P^T"]
                  + st.cells([f"p_tile[{st.row()}, {st.col()}] = d[m, k]"])
                  + ["cuda.syncthreads()", "# dK += dS^T Q"]
                  + dk.product("dk", bq, "p_tile[{row}, i]", "q_tile[i, {col}]"))
    body = (_load("k_tile", arrays["k_tile"], "k0", t, depth, k_read, threads)
            + _load("v_tile", arrays["v_tile"], "k0", t, width, v_read, threads)
            + dk.set("dk", "np.float32(0.0)") + dv.set("dv", "np.float32(0.0)")
            + ["for step in range(lo, hi):", "    member = step // span", f"    h = hk * {group} + member",
               f"    q0 = ({first_tile} + step - member * span) * {bq}"]
            + _indent(query_tile))
    if parts == 1:
        body += (["# dK and dV of the tile's keys (+0.0 in the spare columns)"]
                 + dk.write("dk", "k0", t, depth, f"out0[({dk_base} + {{row}}) * {columns} + {{col}}]")
                 + _zero_tail(threads, bk, "k0", t, dk_base, depth, columns)
                 + dv.write("dv", "k0", t, width, f"out0[({dv_base} + {{row}}) * {columns} + {{col}}]")
                 + _zero_tail(threads, bk, "k0", t, dv_base, width, columns))
    else:
        partial = f"{op.scratch}[(base + {{row}}) * {depth + width} + "
        body += (["# this part's dK and dV of the tile's keys, into its rows of the scratch array (the",
                  "# indices from work again: fewer values live over the walk, fewer registers)",
                  f"base = ((work % parts) * pairs + work // (parts * {nk})) * {t}"]
                 + dk.write("dk", "k0", t, depth, partial + "{col}]")
                 + dv.write("dv", "k0", t, width, partial + f"{depth} + {{col}}]"))
    key_body = (_shared(arrays) + [st.declare("p"), st.declare("d"), dk.declare("dk"), dv.declare("dv")]
                + _operands(st, dk, dv) + ["t = cuda.threadIdx.x"] + st.constants() + dk.constants() + dv.constants()
                + counts + _work(f"pairs * {nk}" + (" * parts" if parts > 1 else ""), decode, body))
    split = " and a part of its walk" if parts > 1 else ""
    source = kit.kernel_source("key_grads", arguments, key_body,
                               f"attention_tiled_grad: dK and dV, a block per (batch, key/value head, {bk} keys{split}).",
                               kit.bounded_decorator(threads, RESIDENT))
    launches = [_launch(op, "key_grads", pairs * nk * parts, threads, tiles.shared_bytes[0])]
    if parts > 1:
        sum_source, sum_launch = _key_grads_sum(op, batch, t, depth, width, heads, kv_heads)
        source += sum_source
        launches.append(sum_launch)

    # query_grads: dQ of one query tile, over its key tiles
    layout = _query_grads_layout(bq, bk, depth, width, threads)
    sq, dq, arrays = Owned(layout["sq"], "sq"), Owned(layout["dq"], "dq"), layout["arrays"]
    dq_base = f"(b * {packed} + h) * {t}"
    last = f"(min(q0 + {bq}, {t}) - 1) // {bk} + 1" if causal else str(nk)
    decode = [f"bh = work // {nq}", f"item = work - bh * {nq}", f"b = bh // {heads}", f"h = bh - b * {heads}",
              f"hk = h // {group}",
              f"q0 = ({nq - 1} - item) * {bq}  # the longest causal rows first" if causal else f"q0 = item * {bq}"]
    key_tile = ([f"k0 = kb * {bk}",
                 "cuda.syncthreads()  # Q, dO and the statistics are in; the previous key tile's readers are done"]
                + _load("k_tile", arrays["k_tile"], "k0", t, depth, k_read, threads)
                + _load("v_tile", arrays["v_tile"], "k0", t, width, v_read, threads)
                + ["cuda.syncthreads()", "# P and dS of the tile, recomputed from the logsumexp"]
                + _recompute(sq, "{col}", "{row}", depth, width, t, causal, scale,
                             ("q_tile[{row}, i]", "k_tile[{col}, i]", "g_tile[{row}, i]", "v_tile[{col}, i]"))
                + sq.cells([f"ds_tile[{sq.row()}, {sq.col()}] = d[m, k]"])
                + ["cuda.syncthreads()", "# dQ += dS K"]
                + dq.product("dq", bk, "ds_tile[{row}, i]", "k_tile[i, {col}]"))
    body = (_load("q_tile", arrays["q_tile"], "q0", t, depth, q_read, threads)
            + _load("g_tile", arrays["g_tile"], "q0", t, width, g_read, threads)
            + _row_statistics(op, threads, bq, t, width)
            + dq.set("dq", "np.float32(0.0)")
            + [f"for kb in range({last}):"] + _indent(key_tile)
            + ["# dQ of the tile's queries (+0.0 in the spare columns)"]
            + dq.write("dq", "q0", t, depth, f"out0[({dq_base} + {{row}}) * {columns} + {{col}}]")
            + _zero_tail(threads, bq, "q0", t, dq_base, depth, columns))
    query_body = (_shared(arrays) + [sq.declare("p"), sq.declare("d"), dq.declare("dq")] + _operands(sq, dq)
                  + ["t = cuda.threadIdx.x"] + sq.constants() + dq.constants()
                  + _work(f"{_batches(op, batch)} * {heads * nq}", decode, body))
    source += kit.kernel_source("query_grads", arguments, query_body,
                                f"attention_tiled_grad: dQ, a block per (batch, head, {bq} queries).",
                                kit.bounded_decorator(threads, RESIDENT))
    launches.append(_launch(op, "query_grads", batch * heads * nq, threads, tiles.shared_bytes[1]))
    walk = (f" in {parts} parts of each tile's walk (added in a fixed order by key_grads_sum)" if parts > 1 else "")
    return kit.Kernels(f"attention_tiled_grad: dK and dV over {batch * kv_heads} key/value heads x {nk} key "
                       f"tiles{walk}, then dQ over {batch * heads} heads x {nq} query tiles, a block each (no atomics); "
                       f"{tiles.describe()}", source, launches,
                       scratch=parts * pairs * t * (depth + width) if parts > 1 else 0)


def key_grads_parts(blocks: int, walk: int) -> int:
    """Into how many parts key_grads splits each key tile's walk over (query head, query tile):
    the fewest that give MIN_BLOCKS blocks from ``blocks`` (batch x key/value heads x key tiles),
    at most ``walk`` (the longest walk: every part then has a step, but on the shortest causal
    tiles) and MAX_PARTS. One: no split, no scratch array."""
    if blocks >= MIN_BLOCKS:
        return 1
    return max(1, min(kit.ceil_div(MIN_BLOCKS, blocks), walk, MAX_PARTS))


def _key_grads_sum(op, batch: int, t: int, depth: int, width: int, heads: int,
                   kv_heads: int) -> tuple[str, kit.Launch]:
    """A kernel adding key_grads' parts of each dK and dV cell in order of parts (the same bits
    every run) into the packed output, +0.0 in the spare columns: a thread per output cell (the
    batch and the parts read from the output's and the scratch array's lengths)."""
    packed, columns, row = heads + 2 * kv_heads, max(depth, width), depth + width
    pairs = batch * kv_heads
    counts = [f"pairs = {_batches(op, batch)} * {kv_heads}",
              f"parts = {op.scratch}.shape[0] // (pairs * {t * row})"]
    body = [f"c = cell % {columns}", f"rest = cell // {columns}", "which = rest % 2  # 0: dK, 1: dV",
            "rest = rest // 2", f"i = rest % {t}", f"bkv = rest // {t}", f"b = bkv // {kv_heads}",
            f"hk = bkv - b * {kv_heads}", "x = np.float32(0.0)",
            f"if (which == 0 and c < {depth}) or (which == 1 and c < {width}):",
            f"    at = (bkv * {t} + i) * {row} + which * {depth} + c",
            "    for part in range(parts):",
            f"        x = x + {op.scratch}[at + part * pairs * {t * row}]",
            f"out0[((b * {packed} + {heads} + which * {kv_heads} + hk) * {t} + i) * {columns} + c] = x"]
    source = kit.kernel_source("key_grads_sum", op.scratch_arguments,
                               counts + kit.grid_stride_loop(f"pairs * {t * 2 * columns}", body),
                               "attention_tiled_grad: dK and dV, key_grads' parts added in order.")
    return source, kit.grid_stride_launch("key_grads_sum", pairs * t * 2 * columns)
