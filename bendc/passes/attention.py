"""The attention schedule: how each attention call site lays out its scores.

For every ``attention`` node (a call site) the pass picks a schedule and records why in the
report:

- ``triangular`` (causal): P and G are packed lower triangles of t(t+1)/2 cells per head,
  dealt in row pairs (i, t-1-i) of t+1 cells, so half the dense work and memory, and every
  work item the same size;
- ``dense`` (not causal): every row attends to all t positions;
- ``tiled`` (flash attention, ops/attention/tiled.py): blocks of queries by keys, tile
  products in BLAS, an online softmax; the forward saves O and each query's logsumexp, the
  backward recomputes the tiles from them. It never stores the T x T matrices that the two
  others keep for the backward (P and G: 2 * B*H*cells*4 bytes). On the CPU a sequence of up to
  ``SMALL_HEAD`` (64) positions runs each head as one fused kernel whose scores stay in cache
  (loop products, no BLAS call per tile; templates/tiled.py ``_small_forward_head``).

On the CPU (and for the reference interpreter, which follows the CPU's rule) a site is tiled
when its sequence is at least ``tiled_from`` positions (the crossover measured on a 2-core
machine, fwd+bwd with B=4: at t=4 the schedules tie, from t=8 tiled wins, 1.1x-1.4x at t=8,
2x and more from t=16, causal or not, D=4..64) or when P and G would take more than
``memory_budget`` bytes; otherwise triangular when causal, dense when not. On cuda a site is
tiled over the same budget or from ``cuda_tiled_from`` (2) key tiles of the cuda forward kernel
(ops/attention/cuda_tiled.py: 32 keys for D = 64 or 128, 64 for D <= 32): from there a query tile
streams K and V in steps and, causal, skips the tiles above the diagonal, while the row schedules
keep P and G. No GPU has measured that crossover; the report says so, and gives the cuda tiles,
threads and shared memory per block (``bendc compile --target cuda`` adds each kernel's registers
and spills). Head sizes no tile fits (the backward's shared memory, from D = 256) keep
triangular or dense, forced or not.

Triangular and dense write the schedule into the ``schedule`` attribute of the site and every
node of its backward (``attention_probs``, ``attention_score_grad``, ``attention_vjp``, whose
score layouts must agree). Tiled rewrites the site into ``attention_tiled`` and an ``index``
view of O, and its backward into one ``attention_tiled_grad`` with an ``index`` view per
gradient (the layout is in ops/attention/tiled.py).

``attention_schedule_triangular``, ``attention_schedule_dense`` and
``attention_schedule_tiled`` are the same pass with the choice forced (benchmarks measure one
schedule against another with the same compiler); a forced triangular schedule falls back to
dense where attention is not causal, and a forced tiled one to triangular or dense on cuda where
no tile fits the head sizes, and each says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from bendc.errors import InternalError
from bendc.ir.graph import Graph, Node
from bendc.ops import OPS
from bendc.ops.attention.layout import SMALL_HEAD, TILE, resolve_schedule, score_cells, whole_heads, work_items
from bendc.passes.manager import PassContext, register, register_variant

ATTENTION_OPS = ("attention", "attention_probs", "attention_score_grad", "attention_vjp")
MIB = 1 << 20


@dataclass(frozen=True)
class ScheduleOptions:
    """``force``: None to choose per call site, else 'triangular', 'dense' or 'tiled'.
    ``tiled_from``: the sequence length from which tiled wins on the CPU (measured with the
    schedules forced, see the module docstring). ``memory_budget``: the most bytes P and G together may take in the
    triangular or dense schedule before a site is tiled whatever its length. ``cuda_tiled_from``:
    on cuda, the key tiles of the tiled forward (ops/attention/cuda_tiled.py) from which a site is
    tiled: with two or more a query tile streams K and V in steps and, causal, skips the tiles above
    the diagonal; with one there is nothing to skip. Not a crossover measured on a GPU."""

    force: str | None = None
    tiled_from: int = 8
    memory_budget: int = 256 * MIB
    cuda_tiled_from: int = 2


def _size(count: int) -> str:
    return f"{count / MIB:.1f} MiB" if count >= MIB else f"{count} bytes"


def _score_bytes(node: Node, schedule: str) -> int:
    """Bytes of the backward's P and G (each B*H*cells float32) in the triangular or dense layout."""
    batch, heads, t, _ = node.type.shape
    return 2 * batch * heads * score_cells(t, schedule) * 4


def choose(node: Node, options: ScheduleOptions, target: str = "cpu", depth: int | None = None) -> tuple[str, str]:
    """(schedule, reason) for one attention call site (``depth``: q's head size D, which picks
    the cuda tiles; O's when not given)."""
    causal = node.attr["causal"]
    t = node.type.shape[2]
    rows = "triangular" if causal else "dense"
    if options.force == "dense":
        return "dense", "forced dense (attention_schedule_dense)"
    if options.force == "triangular":
        if not causal:
            return "dense", "forced triangular, but not causal: every row attends to all positions, so dense"
        return "triangular", "forced triangular (attention_schedule_triangular)"
    why_rows = "causal: row i attends to positions j <= i only" if causal else \
        "not causal: every row attends to all positions"
    if target == "cuda":
        depth = node.type.shape[3] if depth is None else depth
        forward, backward = _cuda_tiles(node, depth)
        if forward is None or backward is None:
            forced = "forced tiled, but " if options.force == "tiled" else ""
            return rows, (f"{forced}{why_rows}; no cuda tile fits head sizes D={depth}, Dv={node.type.shape[3]} "
                          f"in shared memory, so {rows} on cuda")
    if options.force == "tiled":
        return "tiled", "forced tiled (attention_schedule_tiled)"
    scores = _score_bytes(node, rows)
    if scores > options.memory_budget:
        return "tiled", (f"the {rows} schedule's P and G would take {_size(scores)}, over the "
                         f"{_size(options.memory_budget)} budget")
    if target == "cuda":
        return _cuda_length_rule(node, options, rows, why_rows, forward.keys, scores)
    if t >= options.tiled_from:
        how = (f"each head fused in cache up to t={SMALL_HEAD}" if whole_heads(t) else "blocked BLAS products")
        return "tiled", (f"t={t} >= {options.tiled_from}, where the tiled kernels ({how}) beat the per-row kernels "
                         f"(crossover measured on the CPU; {rows} would keep {_size(scores)} of P and G)")
    return rows, f"{why_rows}; t={t} < {options.tiled_from}: the per-row kernels tie with tiles this short"


def _cuda_tiles(node: Node, depth: int):
    """The cuda tiled kernels' (forward, backward) tiles for a call site's head sizes D and Dv
    (O's last axis); None where none fits."""
    from bendc.ops.attention.cuda_tiled import backward_tiles, forward_tiles

    width = node.type.shape[3]
    return forward_tiles(depth, width), backward_tiles(depth, width)


def _cuda_length_rule(node: Node, options: ScheduleOptions, rows: str, why_rows: str, keys: int,
                      scores: int) -> tuple[str, str]:
    """cuda: tiled from ``cuda_tiled_from`` key tiles of the forward kernel (a rule from the work
    the tiles skip, not a crossover measured on a GPU)."""
    t = node.type.shape[2]
    if t >= options.cuda_tiled_from * keys:
        skips = " and skips the tiles above the diagonal" if node.attr["causal"] else ""
        return "tiled", (f"t={t} >= {options.cuda_tiled_from} key tiles of {keys}: each query tile streams "
                         f"K and V through shared memory{skips}, and {rows} would keep {_size(scores)} of P and G "
                         "(a threshold from the work skipped, not measured on a GPU)")
    return rows, (f"{why_rows}; t={t} < {options.cuda_tiled_from} key tiles of {keys}: too short for the "
                  "tiles to skip work (a threshold not measured on a GPU)")


def _describe(node: Node, schedule: str, target: str = "cpu", depth: int = 0) -> str:
    """Cells, work items and bytes of P (and G) per head for a schedule (cuda's tiles need q's ``depth``)."""
    batch, heads, t, _ = node.type.shape
    if schedule == "tiled" and target == "cuda":
        forward, backward = _cuda_tiles(node, depth)
        blocks = -(-t // forward.queries)
        return (f"cuda forward: {forward.describe()}, {blocks} query tiles per head; backward (dK, dV per key "
                f"tile, then dQ per query tile): {backward.describe()}; the forward saves O and a logsumexp per "
                f"query ({batch * heads * t * 4} bytes), no T x T matrix; registers and spills: the compile "
                "report's 'compiled:' lines (bendc compile --target cuda)")
    if schedule == "tiled":
        block = TILE
        blocks = -(-t // block)
        tiles = blocks * (blocks + 1) // 2 if node.attr["causal"] else blocks * blocks
        kept = "at or below the diagonal, the diagonal one masked; " if node.attr["causal"] else ""
        return (f"blocks of {block} queries x {block} keys, {tiles} tiles per head ({kept}the last block "
                f"{t - (blocks - 1) * block} long); the forward saves O and a logsumexp per query "
                f"({batch * heads * t * 4} bytes), no T x T matrix")
    cells = score_cells(t, schedule)
    items = len(work_items(t, schedule))
    if schedule == "triangular":
        middle = f", the middle row {t // 2} alone ({t // 2 + 1} cells)" if t % 2 else ""
        shape = (f"packed lower triangle of {cells} cells per head (row i at i(i+1)/2; dense: {t * t}), "
                 f"{items} work items per head of rows (i, {t - 1}-i), {t + 1} cells each{middle}")
    else:
        shape = f"dense {t}x{t} = {cells} cells per head, {items} work items per head (one row, {t} cells)"
    return f"{shape}; the backward's P and G take {batch * heads * cells * 4} bytes each"


def _rescheduled(graph: Graph, node: Node, schedule: str) -> Node:
    attrs = {**node.attr, "schedule": schedule}
    type = OPS[node.op].infer([graph.node(i).type for i in node.inputs], attrs)
    return node.replace(attrs=attrs, type=type)


def _full(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    return tuple((0, size, 1) for size in shape)


def _view(graph: Graph, packed: Node, spec, like: Node, vjp_of: int | None) -> Node:
    """An ``index`` view of a packed value standing for ``like`` (its uses move to the view)."""
    view = graph.add("index", (packed.id,), {"spec": spec}, like.type, loc=like.loc, vjp_of=vjp_of)
    assert view.type == OPS["index"].infer([packed.type], {"spec": spec}), (view.type, like.type)
    graph.replace_uses(like.id, view.id)
    return view


def _tile(graph: Graph, site: Node, backward: list[Node]) -> str:
    """Rewrite a call site and its backward into the tiled ops and index views; their ids."""
    q, k, v = site.inputs
    attrs = {"causal": site.attr["causal"], "scale": site.attr["scale"]}
    operands = [graph.node(i).type for i in (q, k, v)]
    saved = graph.add("attention_tiled", (q, k, v), attrs, OPS["attention_tiled"].infer(operands, attrs),
                      loc=site.loc, vjp_of=site.vjp_of)
    batch, heads, t, depth = operands[0].shape
    kv_heads, width = operands[1].shape[1], operands[2].shape[3]
    made = [saved.id, _view(graph, saved, _full((batch, heads, t)), site, site.vjp_of).id]
    heads_of = {"q": (0, heads, depth), "k": (heads, heads + kv_heads, depth),
                "v": (heads + kv_heads, heads + 2 * kv_heads, width)}
    for grad, vjps in _backward_calls(backward).items():  # one attention_tiled_grad per backward call
        operands = [graph.node(i).type for i in (q, k, v, saved.id, grad)]
        grads = graph.add("attention_tiled_grad", (q, k, v, saved.id, grad), attrs,
                          OPS["attention_tiled_grad"].infer(operands, attrs), loc=site.loc, vjp_of=saved.id)
        made.append(grads.id)
        for wrt in ("q", "k", "v"):
            if wrt in vjps:
                first, end, columns = heads_of[wrt]
                spec = ((0, batch, 1), (first, end, 1), (0, t, 1), (0, columns, 1))
                made.append(_view(graph, grads, spec, vjps[wrt], saved.id).id)
    order = {"attention_vjp": 0, "attention_score_grad": 1, "attention_probs": 2}
    for node in sorted(backward, key=lambda n: order[n.op]):
        graph.remove(node.id)
    graph.remove(site.id)
    return ", ".join(f"%{i}" for i in made)


def _backward_calls(backward: list[Node]) -> dict[int, dict[str, Node]]:
    """A site's attention_vjp nodes per backward call through it (two losses' .backward() give two
    sets, which may share the recomputed attention_probs): keyed by the output gradient the call
    reads (attention_score_grad's third operand, the v vjp's second), the q and k vjps found by the
    score gradient they read; each set maps "q", "k", "v" to its vjp nodes."""
    calls: dict[int, dict[str, Node]] = {}
    scores: dict[int, int] = {}  # attention_score_grad id -> its output gradient
    for node in backward:
        if node.op == "attention_score_grad":
            scores[node.id] = node.inputs[2]
            calls.setdefault(node.inputs[2], {})
        elif node.op == "attention_vjp" and node.attr["wrt"] == "v":
            calls.setdefault(node.inputs[1], {})["v"] = node
    for node in backward:
        if node.op == "attention_vjp" and node.attr["wrt"] != "v":
            calls[scores[node.inputs[0]]][node.attr["wrt"]] = node
    return {grad: vjps for grad, vjps in calls.items() if vjps}


def attention_schedule(graph: Graph, context: PassContext, options: ScheduleOptions) -> Graph:
    """Pick each call site's schedule; the nodes of its backward follow it (or, tiled, are rewritten)."""
    chosen: dict[int, str] = {}  # node id -> schedule
    tiled: list[tuple[Node, list[Node], str]] = []
    for node in graph.nodes():
        if node.op != "attention":
            continue
        depth = graph.node(node.inputs[0]).type.shape[3]
        schedule, reason = choose(node, options, context.target, depth)
        followers = [n for n in graph.nodes() if n.op in ATTENTION_OPS and n.vjp_of == node.id]
        where = f" at {node.loc.short}" if node.loc is not None else ""
        text = (f"%{node.id} attention{where} {node.type} causal={node.attr['causal']}: {schedule}: "
                f"{reason}; {_describe(node, schedule, context.target, depth)}")
        if schedule == "tiled":
            tiled.append((node, followers, text))
            continue
        chosen[node.id] = schedule
        backward = f"; backward %{', %'.join(str(n.id) for n in followers)} follow" if followers else ""
        context.decide("attention_schedule", text + backward)
    for node, followers, text in tiled:
        # re-read the nodes: rewriting an earlier site moved its uses (this site's operands, when
        # one attention feeds another) to the earlier site's views
        node, followers = graph.node(node.id), [graph.node(n.id) for n in followers]
        made = _tile(graph, node, followers)
        context.decide("attention_schedule", f"{text}; rewritten to {made}")
    for node in graph.nodes():
        if node.op not in ATTENTION_OPS:
            continue
        if node.op == "attention" or node.vjp_of in chosen:
            schedule = chosen[node.id if node.op == "attention" else node.vjp_of]
        elif node.op == "attention_probs":  # a backward whose call site is gone: the same rule
            schedule = resolve_schedule(node.attr["schedule"], node.attr["causal"])
            if options.force == "dense" or (options.force == "triangular" and node.attr["causal"]):
                schedule = options.force
        else:  # scores read from an attention_probs or attention_score_grad node
            operand = graph.node(node.inputs[0])
            if operand.id not in chosen:
                raise InternalError(f"attention_schedule: %{node.id} {node.op} reads scores from "
                                    f"%{operand.id} {operand.op}")
            schedule = chosen[operand.id]
        chosen[node.id] = schedule
        if node.attr["schedule"] != schedule:
            graph.replace(_rescheduled(graph, node, schedule))
    return graph


register("attention_schedule", "Choose each attention call site's schedule: tiled for long sequences or "
         "over the memory budget, else triangular when causal, dense when not.",
         ScheduleOptions())(attention_schedule)
register_variant("attention_schedule", "attention_schedule_triangular",
                 "attention_schedule with the triangular schedule forced (causal sites).", force="triangular")
register_variant("attention_schedule", "attention_schedule_dense",
                 "attention_schedule with the dense schedule forced.", force="dense")
register_variant("attention_schedule", "attention_schedule_tiled",
                 "attention_schedule with the tiled schedule forced (cuda keeps triangular or dense where no "
                 "tile fits).",
                 force="tiled")
