"""Writing numba CPU kernels: decorators, loop nests and element reads.

Generated CPU kernels are ``@njit`` functions with ``cache=True`` (numba keeps
the machine code beside the module file), no fastmath (so + - * / round as
PyTorch's do) and numpy's error model; cells of large kernels run in parallel
(``prange``) on numba's own thread pool.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from bendc.kernels import cpu_policy as policy
from bendc.kernels.templates import copied, template_text

# When a kernel runs its cells in parallel: bendc/kernels/cpu_policy.py (the one place).

# The innermost loop of a nest keeps its extent as a literal when it is at most this (LLVM then
# unrolls it whole: 1.5-2.7x faster than a trip count read from a shape at extents 2 and 4, measured
# on [16384,4] and [32768,2]; from 8 up the shape-read loop was as fast or faster). Other extents
# are read from the arrays' shapes, so the source serves every batch size.
UNROLLED_EXTENT = 4

# A parallel loop that an epilogue sums over is split in at most this many chunks, each summing
# into its own partial result (a fixed count: results do not depend on the thread count).
REDUCTION_CHUNKS = 16


def njit_decorator(parallel: bool) -> str:
    """A generated kernel's decorator. ``no_cfunc_wrapper``: numba would otherwise compile a C
    wrapper per function for first-class function use, which bendc never makes (a quarter of a
    small kernel's compile time). Helpers that only numba code calls (templates/cpu_math.py) also
    go without the CPython wrapper."""
    return f"@njit(parallel={parallel}, cache=True, error_model='numpy', no_cfunc_wrapper=True)"


def element(array: str, index: Sequence[str]) -> str:
    """``array[i, j]``, or ``array[()]`` for a 0-d array."""
    return f"{array}[" + (", ".join(index) if index else "()") + "]"


def loop_nest(domain: Sequence[int | str], loops: Sequence[str], parallel_axis: int | None, body: list[str],
              indent: str = "    ", *, chunks: int = 0, lanes: int = 0, before: Mapping[int, list[str]] | None = None,
              after: Mapping[int, list[str]] | None = None, row_sums: Sequence[int] = (),
              scratch: Sequence[str] = ()) -> list[str]:
    """``for`` loops over ``domain`` (``prange`` on ``parallel_axis``) around ``body``; an extent is
    a literal or an expression (``out0.shape[0]``: the source then serves every size).

    ``chunks``: ``for chunk in prange(chunks)`` around the nest, where ``parallel_axis`` runs over
    the chunk's part of its range (chunk c: [c*d//chunks, (c+1)*d//chunks)). ``lanes``: the
    innermost loop runs ``lanes`` cells an iteration (``lane_loop``). ``before`` / ``after``: lines
    placed just before / after the loop of an axis, at its indentation (a row's lane sums start
    before the loops they run across and are stored after them). ``row_sums``: the numbers n of
    sums whose body writes each cell's term into the float64 row ``t<n>`` (sum_lines, vector
    lanes): the innermost loop is then a plain loop and each row is added into the lanes
    ``s<n>_*`` after it (bendc_lanes8); the rows are allocated where no two threads share one, as
    are the ``scratch`` lines' arrays (a cell-order sum's row: through_row)."""
    before, after = dict(before or {}), dict(after or {})
    inner_axis = len(domain) - 1
    lines = []
    if row_sums or scratch:
        allocation = [f"t{n} = np.empty({ROW_BLOCK}, np.float64)  # sum {n}'s terms, a block of the row at a time"
                      for n in row_sums] + list(scratch)
        if parallel_axis is None:  # serial: one for the kernel
            lines += [indent + line for line in allocation]
        elif chunks:  # one a chunk
            before[parallel_axis] = allocation + list(before.get(parallel_axis, []))
        else:  # one a cell of the parallel loop
            before[parallel_axis + 1] = allocation + list(before.get(parallel_axis + 1, []))
    if chunks:
        lines.append(f"{indent}for chunk in prange({chunks}):")
        indent += "    "

    def nest(axis: int, indent: str) -> list[str]:
        if axis == len(domain):
            return [indent + line for line in body]
        size = domain[axis]
        start, stop = "0", str(size)
        if chunks and axis == parallel_axis:
            start, stop = f"chunk * {size} // {chunks}", f"(chunk + 1) * {size} // {chunks}"
        if row_sums and axis == inner_axis:
            inner = row_sum_loop(loops[axis], start, stop, body, row_sums, indent)
        elif lanes and axis == inner_axis:
            inner = lane_loop(loops[axis], start, stop, lanes, body, indent)
        else:
            loop = "prange" if axis == parallel_axis and not chunks else "range"
            bounds = stop if start == "0" else f"{start}, {stop}"
            inner = [f"{indent}for {loops[axis]} in {loop}({bounds}):"] + nest(axis + 1, indent + "    ")
        return ([indent + line for line in before.get(axis, [])] + inner
                + [indent + line for line in after.get(axis, [])])

    return lines + nest(0, indent)


# ------------------------------------------------------------------ sums in lanes
# A sum over a kernel's innermost loop accumulates in SUM_LANES float64 partial sums (lanes) held in
# scalars: lane l adds the cells l, l+8, l+16, ... of the loop below its last multiple of 8 (carried
# across the enclosing loops the sum also runs over), the rest of the loop (fewer than 8 cells)
# continues lane 0, and the lanes are added in a fixed tree at the end (lane_tree). One running sum
# waits on each add's latency; eight independent ones pipeline: 2.9x faster over rows of 1024
# (numba runs LLVM without its SLP vectorizer and strict floating point forbids reassociating, so
# the lanes stay scalar registers). The order is set by the shape alone: no thread count, no CPU.
SUM_LANES = 8
LANE = "@LANE@"  # in a lane loop's body: replaced by the lane's number
# VECTOR_LANES: the innermost loop is a plain loop (LLVM vectorizes it with the rest of the body) that
# writes each cell's float64 term into a row block (t<n>, ROW_BLOCK cells), and after each block
# bendc_lanes8 adds it into the lanes (templates/lanes.py: one <8 x double> add a block of 8 cells in
# native code). Blocks are a multiple of SUM_LANES, so each cell keeps its lane: the order, and so
# the bits, are the unrolled form's. gpt's layer norm backward row sums ([1024, 128], two sums):
# 300 -> 105 us a kernel at 1 thread.
VECTOR_LANES = True
ROW_BLOCK = 512  # cells of a row block (4 KiB of float64 a sum: in L1)


def lane_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}_{lane}" for lane in range(count)]


def lane_tree(names: Sequence[str]) -> str:
    """The lanes added pairwise in a fixed order: ((s_0 + s_1) + (s_2 + s_3)) + ((s_4 + ...)."""
    terms = list(names)
    while len(terms) > 1:
        terms = [f"({terms[k]} + {terms[k + 1]})" for k in range(0, len(terms) - 1, 2)] + terms[len(terms) // 2 * 2:]
    return terms[0][1:-1] if len(names) > 1 else terms[0]  # the outermost pair needs no parentheses


def row_sum_loop(index: str, start: str, stop: str, body: list[str], row_sums: Sequence[int], indent: str) -> list[str]:
    """The innermost loop ``for index in range(start, stop)`` of a nest whose sums write their terms
    into rows (loop_nest's ``row_sums``): blocks of ROW_BLOCK cells (a multiple of SUM_LANES, so
    every cell keeps its lane), each a plain loop LLVM vectorizes, then each sum's block added into
    its lanes by bendc_lanes8. Every index is a sum of loop counters (never negative: no wraparound)."""
    first, count, cell = f"{index}_first", f"{index}_count", f"{index}_cell"
    length = stop if start == "0" else f"({stop} - {start})"
    base = "" if start == "0" else f"{start} + "
    lines = [f"{indent}for {index}_block in range(({length} + {ROW_BLOCK - 1}) // {ROW_BLOCK}):",
             f"{indent}    {first} = {base}{ROW_BLOCK} * {index}_block",
             f"{indent}    {count} = min({ROW_BLOCK}, {stop} - {first})",
             f"{indent}    for {cell} in range({count}):",
             f"{indent}        {index} = {first} + {cell}"]
    lines += [f"{indent}        {line}" for line in body]
    for n in row_sums:
        names = ", ".join(lane_names(f"s{n}", SUM_LANES))
        lines.append(f"{indent}    {names} = bendc_lanes8(t{n}, 0, {count}, {names})")
    return lines


def lane_loop(index: str, start: str, stop: str, lanes: int, body: list[str], indent: str) -> list[str]:
    """The innermost loop ``for index in range(start, stop)`` in blocks of ``lanes`` cells: the body
    written once per lane (LANE replaced by its number, ``index`` set to the lane's cell), then
    the rest of the range with lane 0. A literal extent equal to ``lanes`` (a tiny loop) is one
    block, written out."""
    def lane(number: int, cell: str, deeper: str) -> list[str]:
        return [f"{deeper}{index} = {cell}"] + [deeper + line.replace(LANE, str(number)) for line in body]

    if start == "0" and stop == str(lanes):
        return [line for number in range(lanes) for line in lane(number, str(number), indent)]
    length = stop if start == "0" else f"({stop} - {start})"
    base = "" if start == "0" else f"{start} + "
    block = f"{index}_block"
    lines = [f"{indent}for {block} in range({length} // {lanes}):"]
    for number in range(lanes):
        lines += lane(number, f"{base}{lanes} * {block} + {number}", indent + "    ")
    lines.append(f"{indent}for {index} in range({base}{length} // {lanes} * {lanes}, {stop}):  # the rest: lane 0")
    lines += [indent + "    " + line.replace(LANE, "0") for line in body]
    return lines


def lane_sum(total: str, term: str, index: str, extent: str, indent: str = "") -> list[str]:
    """Lines setting ``total`` (float64) to the sum of ``term`` over ``index`` in range(extent), in lanes
    (SUM_LANES scalars ``total_0``, ``total_1``, ...): a row kernel's sum. ``term`` is float64."""
    names = lane_names(total, SUM_LANES)
    return ([f"{indent}# {total}: {SUM_LANES} float64 lanes, lane l adding {index} = l, l+{SUM_LANES}, ... "
             "(the rest: lane 0), added in a fixed tree",
             indent + " = ".join(names) + " = np.float64(0.0)"]
            + lane_loop(index, "0", extent, SUM_LANES, [f"{total}_{LANE} += {term}"], indent)
            + [f"{indent}{total} = {lane_tree(names)}"])


def row_lanes(row: str, count: str, prefix: str = "s") -> tuple[str, str]:
    """(a line adding ``row[0:count]`` into fresh lanes ``prefix_0`` .. through bendc_lanes8, the lanes'
    tree as an expression): ``lane_sum``'s order over an array row, one vector add a block natively."""
    names = lane_names(prefix, SUM_LANES)
    zeros = ", ".join(["0.0"] * SUM_LANES)
    return f"{', '.join(names)} = bendc_lanes8({row}, 0, {count}, {zeros})", f"({lane_tree(names)})"


def lane_max(top: str, term: str, index: str, extent: str, indent: str = "") -> list[str]:
    """Lines setting ``top`` to the largest ``term`` over ``index`` in range(extent) (-inf when none is
    larger, NaNs skipped), in SUM_LANES independent chains combined in lane order: a row's maximum
    without one compare-and-select chain through the whole row. Which of equal values wins can differ
    from one chain (+0.0 against -0.0), never the value."""
    names = lane_names(top, SUM_LANES)
    lines = [f"{indent}# {top}: {SUM_LANES} lanes, lane l over {index} = l, l+{SUM_LANES}, ... (the rest: lane 0)",
             indent + " = ".join(names) + " = np.float32(-np.inf)"]
    lines += lane_loop(index, "0", extent, SUM_LANES,
                       [f"{top}_{LANE} = {term} if {term} > {top}_{LANE} else {top}_{LANE}"], indent)
    lines.append(f"{indent}{top} = {names[0]}")
    lines += [f"{indent}{top} = {name} if {name} > {top} else {top}" for name in names[1:]]
    return lines


@dataclass(frozen=True)
class SumLayout:
    """How a loop nest that sums runs: its parallel loop, whether that loop is split in chunks (when
    a sum runs over it: its cells would race on the output), and which sums go in lanes."""

    parallel_axis: int | None
    chunks: int                     # the parallel loop in this many chunks, summed apart (0: unsplit)
    runs: tuple[int | None, ...]    # per sum: the first of the trailing loops it sums in lanes, or None
    lanes: int                      # lanes of the innermost loop (0: no sum runs over it)
    vector: bool = False            # the lanes added a row at a time by bendc_lanes8 (sum_lines)


def sum_layout(domain: Sequence[int], reduced: Sequence[set[int]], kind: str = "rows") -> SumLayout:
    """The layout of a nest over ``domain`` whose sums reduce the axes ``reduced`` (one set a sum).

    The first loop of more than one cell runs in parallel when the policy says so for ``kind`` work
    (bendc/kernels/cpu_policy.py). When a sum runs over it, its range is split in a fixed number of chunks (set by the
    shape, not the thread count: the same sums on every machine), each summing into its own
    partial output, added in chunk order after the loop. A sum over the innermost loop sums in
    lanes across the trailing loops it reduces (its run), stored once after them; a tiny innermost
    loop (UNROLLED_EXTENT, written out whole) is one lane a cell."""
    cells = 1
    for size in domain:
        cells *= size
    parallel_axis = next((axis for axis, d in enumerate(domain) if d > 1), None) if policy.parallel(kind, cells) \
        else None
    chunks = min(REDUCTION_CHUNKS, domain[parallel_axis]) if any(parallel_axis in r for r in reduced) else 0
    inner = len(domain) - 1
    runs: list[int | None] = []
    for axes in reduced:
        first = None
        if domain and domain[-1] > 1 and inner in axes:
            first = inner
            while first > 0 and first - 1 in axes:
                first -= 1
        runs.append(first)
    lanes = 0
    if any(first is not None for first in runs):
        tiny = len(domain) > 1 and domain[-1] <= UNROLLED_EXTENT and parallel_axis != inner
        lanes = domain[-1] if tiny else SUM_LANES
    return SumLayout(parallel_axis, chunks, tuple(runs), lanes, vector=lanes == SUM_LANES and VECTOR_LANES)


@dataclass
class SumLines:
    """The source of one sum in a loop nest (``loop_nest``'s body line, before and after lines)."""

    prologue: list[str] = field(default_factory=list)
    body: str = ""
    before: dict[int, list[str]] = field(default_factory=dict)
    after: dict[int, list[str]] = field(default_factory=dict)
    epilogue: list[str] = field(default_factory=list)
    row: int | None = None  # its number, where its terms go through a row (loop_nest's row_sums)
    cell: str | None = None  # a sum in cell order: the float64 cell each term adds into (through_row)
    term: str = ""  # ... and the float32 term
    scratch: list[str] = field(default_factory=list)  # arrays the loops use, one a thread (loop_nest)


def sum_lines(number: int, value: str, out: str, kept: Sequence[str], axes: set[int], loops: Sequence[str],
              layout: SumLayout, run: int | None, what: str) -> SumLines:
    """Sum ``value`` (a float32 expression of the body) over ``axes`` into ``out[kept]``, accumulated
    in float64 and rounded once to float32 (a float32 running sum over many cells drifts far from
    the pairwise sums of numpy and PyTorch: ~100x their error over 65536 cells). ``number`` names
    its temporaries; ``what`` labels its lines.

    With chunks, a sum over the split loop sums each chunk into its own float64 partial output,
    added in chunk order after the loops (a sum that keeps that loop writes cells no other chunk
    writes, as without chunks); a sum in lanes whose run covers all its axes stores each output cell once; other
    sums add into a float64 copy of the output, rounded after the loops."""
    lines = SumLines()
    wide = f"np.float64({value})"
    flat, partial = f"z{number}", f"w{number}"
    cell = None
    if layout.chunks and layout.parallel_axis in axes:  # (a sum that keeps the split axis has cells of its own)
        total, chunks = f"p{number}", layout.chunks
        cell = element(total, ["chunk", *kept])
        lines.prologue.append(f"{total} = np.zeros(({chunks},) + {out}.shape, np.float64)")
        lines.epilogue += sum_partials(total, out, chunks, str(number))
    elif run is None or not axes <= set(range(run, len(loops))):
        total = f"a{number}"
        cell = element(total, kept)
        lines.prologue.append(f"{total} = np.zeros({out}.shape, np.float64)")
        lines.epilogue += [f"{flat} = {out}.reshape({out}.size)", f"{partial} = {total}.reshape({total}.size)",
                           f"for q in range({flat}.size):", f"    {flat}[q] = np.float32({partial}[q])"]
    if run is None:  # in cell order
        lines.body = f"{cell} += {wide}  # {what}"
        lines.cell, lines.term = cell, value
        return lines
    names = lane_names(f"s{number}", layout.lanes)
    lines.before[run] = [f"# {what} over {', '.join(loops[run:])}: {layout.lanes} float64 lanes, lane l adding the "
                         f"cells {loops[-1]} = l, l+{layout.lanes}, ... (the rest: lane 0), added in a fixed tree "
                         "after the loop", " = ".join(names) + " = np.float64(0.0)"]
    tree = lane_tree(names)
    lines.after[run] = [f"{element(out, kept)} = np.float32({tree})" if cell is None else f"{cell} += {tree}"]
    if layout.vector:
        lines.body = f"t{number}[{loops[-1]}_cell] = {wide}  # {what}: the cell's term"
        lines.row = number
    else:
        lines.body = f"s{number}_{LANE} += {wide}  # {what}, lane {LANE}"
    return lines


def through_row(lines: SumLines, number: int, loops: Sequence[str], extent: str, what: str) -> bool:
    """Move a cell-order sum's adds out of the innermost loop (``loops[-1]``, ``extent`` cells):
    the loop writes each float32 term into a row ``u<number>``, and a second loop after it adds the
    row into the float64 cells. The same adds in the same order, so the same bits; the first loop
    then holds no float64 value, and LLVM, which sizes a loop's vectors by its widest type, runs
    it 16 lanes wide instead of 8. Worth it where the loop computes much a cell (a kit function:
    gelu's backward with its bias sums, gpt_small's (8, 64, 256), 0.210 -> 0.135 ms alone); a light
    loop gains nothing or loses the second pass (layer norm's backward 0.011 -> 0.012 ms). False
    (nothing changed) where the sum is not in cell order or its cells do not follow the loop."""
    inner = loops[-1]
    if lines.cell is None or not re.search(rf"\b{inner}\b", lines.cell):
        return False
    row = f"u{number}"
    lines.body = f"{row}[{inner}] = {lines.term}  # {what}: the cell's term, added after the loop"
    lines.after.setdefault(len(loops) - 1, []).extend(
        [f"for {inner} in range({extent}):", f"    {lines.cell} += np.float64({row}[{inner}])  # {what}"])
    lines.scratch.append(f"{row} = np.empty({extent}, np.float32)  # sum {number}'s terms, a row at a time")
    return True


def heavy_body(body: Sequence[str]) -> bool:
    """Whether a loop body calls libm's or the kit's float32 math (vectorizable_math's functions)."""
    text = "\n".join(body)
    return bool(_LIBM_CALL.search(text) or _kit_call().search(text))


def sum_kernel(shape: Sequence[int], axes: Sequence[int], kept: Sequence[str], what: str) -> str:
    """A kernel ``kernel(in0, out0)`` summing in0 (of ``shape``) over ``axes`` into out0 at ``kept``
    (an index over the loops i0, i1, ...: reduced axes dropped or 0), as a fused kernel's epilogue
    sum does (sum_layout, sum_lines; parallel as the policy says for "sums"); extents from in0's shape."""
    loops = [f"i{axis}" for axis in range(len(shape))]
    layout = sum_layout(shape, [set(axes)], "sums")
    lines = sum_lines(0, "r0", "out0", kept, set(axes), loops, layout, layout.runs[0], what)
    body = [f"r0 = {element('in0', loops)}", lines.body]
    extents: list[int | str] = [f"in0.shape[{axis}]" for axis in range(len(shape))]
    if len(shape) > 1 and shape[-1] <= UNROLLED_EXTENT:
        extents[-1] = shape[-1]
    source = [njit_decorator(layout.parallel_axis is not None), "def kernel(in0, out0):"]
    source += ["    " + line for line in lines.prologue]
    source += loop_nest(extents, loops, layout.parallel_axis, body, chunks=layout.chunks, lanes=layout.lanes,
                        before=lines.before, after=lines.after, row_sums=[] if lines.row is None else [lines.row])
    source += ["    " + line for line in lines.epilogue]
    return "\n".join(source) + "\n"


def lane_row_sums(rows: np.ndarray) -> np.ndarray:
    """What the kernels' lane sums give for each row of a 2-d float64 array, in the same order (the
    reference interpreter's statistics use it, so they match the cpu kernels bit for bit)."""
    count, columns = rows.shape
    full = columns // SUM_LANES * SUM_LANES
    lanes = np.zeros((count, SUM_LANES))
    if full:  # a sequential sum per lane (cumsum adds in order), from +0.0 as the kernels' are
        blocks = rows[:, :full].reshape(count, full // SUM_LANES, SUM_LANES)
        lanes = 0.0 + np.cumsum(blocks, axis=1)[:, -1, :]
    for column in range(full, columns):
        lanes[:, 0] += rows[:, column]
    terms = [lanes[:, lane] for lane in range(SUM_LANES)]
    while len(terms) > 1:
        terms = [terms[k] + terms[k + 1] for k in range(0, len(terms) - 1, 2)] + (
            [terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def sum_partials(partial: str, out: str, chunks: int | str, name: str) -> list[str]:
    """Statements writing ``out`` (float32) as the sum of the float64 partial sums
    ``partial[chunk, ...]`` added in chunk order (``name`` tells the temporaries apart)."""
    flat, wide, total = f"z{name}", f"w{name}", f"s{name}"
    return [f"{flat} = {out}.reshape({out}.size)", f"{wide} = {partial}.reshape(({chunks}, {flat}.size))",
            f"for q in range({flat}.size):", f"    {total} = np.float64(0.0)",
            f"    for chunk in range({chunks}):", f"        {total} += {wide}[chunk, q]",
            f"    {flat}[q] = np.float32({total})"]


# ------------------------------------------------------------------ transcendentals
_LIBM_CALL = re.compile(r"\bmath\.(exp|log|tanh|erf)\(")


@lru_cache(maxsize=None)
def math_prelude() -> str:
    """The source of the kit's float32 transcendentals (templates/cpu_math.py after its TEMPLATE line)."""
    return copied(template_text("cpu_math.py"), "cpu")


def vectorizable_math(body: str) -> tuple[str, str]:
    """(body with math.exp/log/tanh/erf calls replaced by the kit's branch-free float32 versions,
    the helper source the body then needs, or "" where it calls none). The scalar renderers
    write ``math.*`` (CUDA keeps those: libdevice is vectorized per thread already); on the CPU
    libm calls are opaque to LLVM's loop vectorizer, the kit's helpers are not."""
    replaced, count = _LIBM_CALL.subn(lambda match: f"bendc_{match.group(1)}(", body)
    calls_kit = count or _kit_call().search(replaced)  # or a CPU scalar renderer's own call (gelu's)
    return replaced, (math_prelude() if calls_kit else "")


@lru_cache(maxsize=None)
def _kit_call() -> re.Pattern:
    """A call of any function templates/cpu_math.py defines."""
    names = re.findall(r"^def (bendc_\w+)\(", template_text("cpu_math.py"), re.M)
    return re.compile(r"\b(" + "|".join(names) + r")\(")


def lines_call(shape: tuple[int, ...], axes: tuple[int, ...]) -> str:
    """A line reduction's kernel body: in0 as (lines, reduced elements), the kept axes first and the
    reduced ones last (row-major), out0 flat, handed to the ``_lines`` function rendered before it."""
    kept = [a for a in range(len(shape)) if a not in axes]
    reduced = " * ".join(f"in0.shape[{a}]" for a in axes) or "1"
    if not shape:
        lines = "in0.reshape((1, 1))"
    elif list(axes) == list(range(len(shape)))[len(kept):]:  # the reduced axes are the trailing ones
        lines = f"np.ascontiguousarray(in0).reshape((-1, {reduced}))"
    else:
        lines = f"np.ascontiguousarray(np.transpose(in0, {tuple(kept + list(axes))!r})).reshape((-1, {reduced}))"
    return ("def kernel(in0, out0):\n"
            f"    _lines({lines}, out0.reshape(out0.size))\n")
