"""The attention ops' CUDA kernels (``Lowering.cuda``), written with the kernel kit."""
from __future__ import annotations

from bendc.errors import UnsupportedError
from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit
from bendc.ops.attention.layout import resolve_schedule, score_cells, work_items

# A block per work item: a pair of rows (i, t-1-i) of one (batch, head), the
# middle row of an odd t alone (triangular), or one row (dense); dk and dv deal
# pairs of columns (j, t-1-j) of one (batch, key/value head) the same way (a
# column j of the triangle holds rows i >= j: t - j cells, so a pair holds
# t + 1). Within a block, threads take the item's cells (scores) or its output
# elements in turn. Sums over d, j and i run in the CPU kernels' order, one
# thread per output element (no FMA contraction: the same products and sums);
# the softmax's max and sums over a row are shared-memory trees (as the
# softmax row kernel), so P and the outputs agree with the CPU within the
# tolerances. dK and dV loop over the group's query heads in head order inside
# the thread that owns the output element: no atomics, deterministic, no zero kernel.

class _CudaDeal:
    """The generated lines that deal one head's work items to a block, for a resolved schedule."""

    def __init__(self, schedule: str, t: int):
        self.pair = schedule == "triangular"
        self.t = t
        self.items = len(work_items(t, schedule))
        self.slots = 2 if self.pair else 1  # rows (or columns) a work item holds at most
        self.cells = t + 1 if self.pair else t  # cells a work item holds at most

    def per_slot(self, first: list[str], second: list[str]) -> list[str]:
        """``first`` for the item's first row (slot 0), ``second`` for its second (slot 1)."""
        if not self.pair:
            return first
        return ["if slot == 0:"] + _indent(first) + ["else:"] + _indent(second)

    def rows(self) -> list[str]:
        """row0, length0, start0 (and row1, length1, start1) of ``item`` and its ``cells``."""
        t = self.t
        if not self.pair:
            return ["row0 = item", f"length0 = {t}", f"start0 = row0 * {t}", f"cells = {t}"]
        return ["row0 = item",
                f"row1 = {t - 1} - item",
                "length0 = item + 1  # row i holds the positions j <= i",
                f"length1 = {t} - item",
                "if row1 == row0:",
                "    length1 = 0  # the middle row of an odd t is an item of its own",
                "start0 = row0 * (row0 + 1) // 2  # row i starts at cell i(i+1)/2",
                "start1 = row1 * (row1 + 1) // 2",
                "cells = length0 + length1"]

    def cell(self) -> list[str]:
        """slot, row i, position j and layout cell ``position`` of the item's cell ``c``."""
        if not self.pair:
            return ["slot = 0", "i = row0", "j = c", "position = start0 + c"]
        return ["if c < length0:", "    slot = 0", "    i = row0", "    j = c",
                "else:", "    slot = 1", "    i = row1", "    j = c - length0",
                "position = (start0 if slot == 0 else start1) + j"]

    def output_row(self, width: int) -> list[str]:
        """slot, ``col``, row i, its first item cell ``first``, ``length`` and layout ``start`` of
        output element ``e`` of the item's rows (``length`` 0: the item has no such row)."""
        if not self.pair:
            return ["col = e", "i = row0", "first = 0", "length = length0", "start = start0"]
        return [f"slot = e // {width}", f"col = e - slot * {width}",
                "if slot == 0:", "    i = row0", "    first = 0", "    length = length0", "    start = start0",
                "else:", "    i = row1", "    first = length0", "    length = length1", "    start = start1"]

    def columns(self, width: int) -> list[str]:
        """Column ``j`` (slot 0 or 1 of ``item``) and ``col`` of output element ``e``; ``present``
        is False for the missing partner of the middle column."""
        t = self.t
        if not self.pair:
            return ["col = e", "j = item", "present = True"]
        return [f"slot = e // {width}", f"col = e - slot * {width}",
                f"j = item if slot == 0 else {t - 1} - item",
                f"present = slot == 0 or {t - 1} - item != item"]

    def column_rows(self) -> str:
        """The first row that holds column j: j in the triangle, 0 dense."""
        return "j" if self.pair else "0"

    def row_start(self, row: str) -> str:
        return f"{row} * ({row} + 1) // 2" if self.pair else f"{row} * {self.t}"


def _cuda_block(work: int) -> int:
    """Threads of a block: a power of two (the trees halve it) covering an item's cells or output
    elements, up to MAX_BLOCK. Unlike the row kernels' tree_block it may be less than a warp: only
    tiny items (t below 31 and head sizes below 16) get one, where a real GPU loses nothing that
    matters and the simulator (which pays per thread and per syncthreads) much less time."""
    block = 1
    while block < work and block < kit.MAX_BLOCK:
        block *= 2
    return block


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _work_loop(count: int | str, items: int, decode: list[str], body: list[str]) -> list[str]:
    """Blocks take work items in turn: ``bh`` (or ``bkv``) and ``item`` from ``work``. ``count``:
    the (batch, head) pairs, as :func:`_heads` reads them."""
    total = count * items if isinstance(count, int) else f"{count} * {items}"
    return (["work = cuda.blockIdx.x", f"while work < {total}:"]
            + _indent(decode + body) + ["    work += cuda.gridDim.x"])


def _heads(op, count: int) -> int | str:
    """``count`` (batch x heads) pairs as the kernel reads them: the output's length over its
    elements per pair (kit.length_of), so one source serves every batch size."""
    return op.count(count, numel(op.shape) // count)


def _head_decode(heads: int, group: int, items: int) -> list[str]:
    return [f"bh = work // {items}", f"item = work - bh * {items}", f"b = bh // {heads}", f"h = bh - b * {heads}",
            f"hk = h // {group}  # the key/value head of query head h"]


def _cuda_launch(op, block: int, work: int, shared_bytes: int):
    node = op.node
    if shared_bytes > kit.MAX_SHARED_BYTES:
        raise UnsupportedError(f"{node.op} {node.type} on cuda keeps a work item's scores in shared memory: "
                               f"{shared_bytes} bytes, more than {kit.MAX_SHARED_BYTES}", loc=node.loc, op=node.op)
    return kit.Launch("kernel", (max(1, min(work, kit.MAX_ROWS)), 1, 1), (block, 1, 1), shared_bytes)


def _cuda_softmax(op, store: str):
    """attention (``store`` "shared": P stays in shared memory and is multiplied by V) or
    attention_probs (``store`` "out": P is written in the layout)."""
    layout = resolve_schedule(op.attrs["schedule"], op.attrs["causal"])
    batch, heads, t, depth = op.shapes[0]
    group = heads // op.shapes[1][1]
    deal = _CudaDeal(layout, t)
    width = op.shapes[2][3] if store == "shared" else 0
    block = _cuda_block(max(deal.cells, deal.slots * max(width, depth)))
    partials = tuple(f"partial{slot}" for slot in range(deal.slots))
    cells_per_head = score_cells(t, layout)
    score = "scores[c]" if store == "shared" else f"out0[bh * {cells_per_head} + position]"
    mask = op.attrs["causal"] and layout == "dense"
    dot = ["acc = np.float32(0.0)", f"for d in range({depth}):",
           f"    acc += query[slot, d] * {op.read(1, ['b', 'hk', 'j', 'd'])}",
           f"s = acc * np.float32({op.attrs['scale']!r})"]
    if mask:  # positions after i are masked (their probability is 0)
        dot = ["s = np.float32(-math.inf)", "if j <= i:"] + _indent(dot)

    def cells_loop(body: list[str]) -> list[str]:
        return ["c = t", "while c < cells:"] + _indent(deal.cell() + body) + ["    c += BLOCK"]

    def each(template: str) -> list[str]:
        return [template.format(slot=slot) for slot in range(deal.slots)]

    item = (deal.rows()
            + ["# the item's query rows, in shared memory",
               "e = t", f"while e < {deal.slots * depth}:"]
            + _indent([f"slot = e // {depth}", f"d = e - slot * {depth}",
                       "i = row0 if slot == 0 else row1" if deal.pair else "i = row0",
                       f"query[slot, d] = {op.read(0, ['b', 'h', 'i', 'd'])}", "e += BLOCK"])
            + ["cuda.syncthreads()",
               "# scale * q . k for each of the item's cells, and each row's maximum"]
            + each("top{slot} = np.float32(-math.inf)")
            + cells_loop(dot + [f"{score} = s"]
                         + deal.per_slot(["if s > top0:", "    top0 = s"], ["if s > top1:", "    top1 = s"]))
            + each("partial{slot}[t] = top{slot}") + kit.tree_lines("max", partials)
            + each("top{slot} = partial{slot}[0]") + ["cuda.syncthreads()",
                                                       "# exp(s - max) and each row's sum"]
            + each("total{slot} = np.float32(0.0)")
            + cells_loop(deal.per_slot([f"x = math.exp({score} - top0)", "total0 += x"],
                                       [f"x = math.exp({score} - top1)", "total1 += x"]) + [f"{score} = x"])
            + each("partial{slot}[t] = total{slot}") + kit.tree_lines("sum", partials)
            + each("total{slot} = partial{slot}[0]")
            + ["# the probabilities"]
            + cells_loop(deal.per_slot([f"{score} = {score} / total0"], [f"{score} = {score} / total1"])))
    if store == "shared":
        item += (["cuda.syncthreads()", "# the item's output rows: P . V, in order of j",
                  "e = t", f"while e < {deal.slots * width}:"]
                 + _indent(deal.output_row(width)
                           + ["if length > 0:",
                              "    acc = np.float32(0.0)",
                              "    for j in range(length):",
                              f"        acc += scores[first + j] * {op.read(2, ['b', 'hk', 'j', 'col'])}",
                              f"    out0[(bh * {t} + i) * {width} + col] = acc",
                              "e += BLOCK"]))
    item.append("cuda.syncthreads()  # shared memory is reused by the block's next item")
    shared = [f"query = cuda.shared.array(({deal.slots}, {max(depth, 1)}), numba.float32)"]
    if store == "shared":
        shared.append(f"scores = cuda.shared.array({max(deal.cells, 1)}, numba.float32)")
    shared += [f"{name} = cuda.shared.array(BLOCK, numba.float32)" for name in partials]
    body = shared + ["t = cuda.threadIdx.x"] + _work_loop(_heads(op, batch * heads), deal.items,
                                                          _head_decode(heads, group, deal.items), item)
    shared_bytes = 4 * (deal.slots * max(depth, 1) + len(partials) * block
                        + (max(deal.cells, 1) if store == "shared" else 0))
    what = "softmax(scale * q k^T) . v" if store == "shared" else f"P in the {layout} layout"
    source = f"\nBLOCK = {block}\n" + kit.kernel_source(
        "kernel", op.arguments, body, f"A block per work item ({layout}): {what}.")
    launch = _cuda_launch(op, block, batch * heads * deal.items, shared_bytes)
    return kit.Kernels(f"{op.node.op} ({layout}): {batch * heads} heads x {deal.items} work items of up to "
                      f"{deal.cells} cells, a block each", source, [launch])


def cuda_attention(op):
    return _cuda_softmax(op, "shared")


def cuda_probs(op):
    return _cuda_softmax(op, "out")


def cuda_score_grad(op):
    """G = P * (dP - rowsum(dP * P)) * scale, dP = dO . V^T: a block per work item; dP is written
    into G's cells first, then rescaled in place (each thread keeps its own cells)."""
    layout = resolve_schedule(op.attrs["schedule"], op.attrs["causal"])
    batch, kv_heads, t, width = op.shapes[1]
    heads = op.shapes[2][1]
    group = heads // kv_heads
    deal = _CudaDeal(layout, t)
    cells_per_head = score_cells(t, layout)
    block = _cuda_block(max(deal.cells, deal.slots * width))
    partials = tuple(f"partial{slot}" for slot in range(deal.slots))
    out = f"out0[bh * {cells_per_head} + position]"
    probability = op.read(0, ["b", "h", "position"])

    def cells_loop(body: list[str]) -> list[str]:
        return ["c = t", "while c < cells:"] + _indent(deal.cell() + body) + ["    c += BLOCK"]

    def each(template: str) -> list[str]:
        return [template.format(slot=slot) for slot in range(deal.slots)]

    item = (deal.rows()
            + ["# the item's rows of the output gradient, in shared memory",
               "e = t", f"while e < {deal.slots * width}:"]
            + _indent([f"slot = e // {width}", f"d = e - slot * {width}",
                       "i = row0 if slot == 0 else row1" if deal.pair else "i = row0",
                       f"grads[slot, d] = {op.read(2, ['b', 'h', 'i', 'd'])}", "e += BLOCK"])
            + ["cuda.syncthreads()", "# dP = dO . v for each cell, and each row's sum of dP * P"]
            + each("total{slot} = np.float32(0.0)")
            + cells_loop(["acc = np.float32(0.0)", f"for d in range({width}):",
                          f"    acc += grads[slot, d] * {op.read(1, ['b', 'hk', 'j', 'd'])}",
                          f"{out} = acc"]
                         + deal.per_slot([f"total0 += acc * {probability}"], [f"total1 += acc * {probability}"]))
            + each("partial{slot}[t] = total{slot}") + kit.tree_lines("sum", partials)
            + each("total{slot} = partial{slot}[0]")
            + ["# G = P * (dP - the row's sum) * scale"]
            + cells_loop(deal.per_slot(["total = total0"], ["total = total1"])
                         + [f"{out} = {probability} * ({out} - total) * np.float32({op.attrs['scale']!r})"])
            + ["cuda.syncthreads()  # shared memory is reused by the block's next item"])
    body = ([f"grads = cuda.shared.array(({deal.slots}, {max(width, 1)}), numba.float32)"]
            + [f"{name} = cuda.shared.array(BLOCK, numba.float32)" for name in partials]
            + ["t = cuda.threadIdx.x"]
            + _work_loop(_heads(op, batch * heads), deal.items, _head_decode(heads, group, deal.items), item))
    shared_bytes = 4 * (deal.slots * max(width, 1) + len(partials) * block)
    source = f"\nBLOCK = {block}\n" + kit.kernel_source(
        "kernel", op.arguments, body, f"A block per work item ({layout}): G from P, dO and v.")
    launch = _cuda_launch(op, block, batch * heads * deal.items, shared_bytes)
    return kit.Kernels(f"attention_score_grad ({layout}): {batch * heads} heads x {deal.items} work items of up "
                      f"to {deal.cells} cells, a block each", source, [launch])


def cuda_vjp(op):
    """dq = G . k (a block per work item of rows, a thread per output element summing over j in
    order); dk = G^T . q and dv = P^T . dO (a block per work item of columns, a thread per output
    element summing over the group's query heads in order, then over the column's rows i in order)."""
    layout = resolve_schedule(op.attrs["schedule"], op.attrs["causal"])
    batch, heads, cells_per_head = op.shapes[0]
    _, _, t, width = op.shapes[1]
    deal = _CudaDeal(layout, t)
    block = _cuda_block(deal.slots * width)
    if op.attrs["wrt"] == "q":
        kv_heads = op.shapes[1][1]
        group = heads // kv_heads
        item = (deal.rows() + ["e = t", f"while e < {deal.slots * width}:"]
                + _indent(deal.output_row(width)
                          + ["if length > 0:",
                             "    acc = np.float32(0.0)",
                             "    for j in range(length):",
                             f"        acc += {op.read(0, ['b', 'h', '(start + j)'])} * "
                             f"{op.read(1, ['b', 'hk', 'j', 'col'])}",
                             f"    out0[(bh * {t} + i) * {width} + col] = acc",
                             "e += BLOCK"]))
        body = ["t = cuda.threadIdx.x"] + _work_loop(_heads(op, batch * heads), deal.items,
                                                     _head_decode(heads, group, deal.items), item)
        work = batch * heads * deal.items
        what = f"{batch * heads} heads x {deal.items} work items of rows"
    else:
        kv_heads = op.attrs["heads"]
        group = heads // kv_heads
        column_cell = f"(({deal.row_start('i')}) + j)"  # cell (i, j) of the layout
        decode = [f"bkv = work // {deal.items}", f"item = work - bkv * {deal.items}",
                  f"b = bkv // {kv_heads}", f"hk = bkv - b * {kv_heads}"]
        item = (["e = t", f"while e < {deal.slots * width}:"]
                + _indent(deal.columns(width)
                          + ["if present:",
                             "    acc = np.float32(0.0)",
                             f"    for member in range({group}):",
                             f"        h = hk * {group} + member",
                             f"        for i in range({deal.column_rows()}, {t}):",
                             f"            acc += {op.read(0, ['b', 'h', column_cell])} * "
                             f"{op.read(1, ['b', 'h', 'i', 'col'])}",
                             f"    out0[(bkv * {t} + j) * {width} + col] = acc",
                             "e += BLOCK"]))
        body = ["t = cuda.threadIdx.x"] + _work_loop(_heads(op, batch * kv_heads), deal.items, decode, item)
        work = batch * kv_heads * deal.items
        what = f"{batch * kv_heads} key/value heads x {deal.items} work items of columns"
    source = f"\nBLOCK = {block}\n" + kit.kernel_source(
        "kernel", op.arguments, body, f"A block per work item ({layout}): the gradient of {op.attrs['wrt']}.")
    launch = _cuda_launch(op, block, work, 0)
    return kit.Kernels(f"attention_vjp wrt {op.attrs['wrt']} ({layout}): {what}, a block each", source, [launch])
