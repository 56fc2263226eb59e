"""The attention schedule: how each attention call site lays out its scores.

For every ``attention`` node (a call site) the pass picks a schedule, writes
it into the node's ``schedule`` attribute and into every node of its
backward (``attention_probs``, ``attention_score_grad``, ``attention_vjp``,
whose score layouts must agree), and records why in the report:

- ``triangular`` when causal: P and G are packed lower triangles of
  t(t+1)/2 cells per head, dealt in row pairs (i, t-1-i) of t+1 cells, so
  half the dense work and memory, and every work item the same size;
- ``dense`` when not causal: every row attends to all t positions.

``attention_schedule_triangular`` and ``attention_schedule_dense`` are the
same pass with the choice forced (benchmarks measure one schedule against the
other with the same compiler); a forced triangular schedule falls back to
dense where attention is not causal, and says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from bendc.errors import InternalError
from bendc.ir.graph import Graph, Node
from bendc.ops import OPS
from bendc.ops.attention.layout import resolve_schedule, score_cells, work_items
from bendc.passes.manager import PassContext, register, register_variant

ATTENTION_OPS = ("attention", "attention_probs", "attention_score_grad", "attention_vjp")


@dataclass(frozen=True)
class ScheduleOptions:
    """``force``: None to choose per call site, else 'triangular' or 'dense'."""

    force: str | None = None


def choose(node: Node, options: ScheduleOptions) -> tuple[str, str]:
    """(schedule, reason) for one attention call site."""
    causal = node.attr["causal"]
    if options.force == "dense":
        return "dense", "forced dense (attention_schedule_dense)"
    if not causal:
        if options.force == "triangular":
            return "dense", "forced triangular, but not causal: every row attends to all positions, so dense"
        return "dense", "not causal: every row attends to all positions"
    if options.force == "triangular":
        return "triangular", "forced triangular (attention_schedule_triangular)"
    return "triangular", "causal: row i attends to positions j <= i only"


def _describe(node: Node, schedule: str) -> str:
    """Cells, work items and bytes of P (and G) per head for a schedule."""
    batch, heads, t, _ = node.type.shape
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


def attention_schedule(graph: Graph, context: PassContext, options: ScheduleOptions) -> Graph:
    """Pick each call site's schedule; the nodes of its backward follow it."""
    chosen: dict[int, str] = {}  # node id -> schedule
    for node in graph.nodes():
        if node.op != "attention":
            continue
        schedule, reason = choose(node, options)
        chosen[node.id] = schedule
        followers = [n.id for n in graph.nodes() if n.op in ATTENTION_OPS and n.vjp_of == node.id]
        where = f" at {node.loc.short}" if node.loc is not None else ""
        backward = f"; backward %{', %'.join(map(str, followers))} follow" if followers else ""
        context.decide("attention_schedule",
                       f"%{node.id} attention{where} {node.type} causal={node.attr['causal']}: {schedule}: "
                       f"{reason}; {_describe(node, schedule)}{backward}")
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


register("attention_schedule", "Choose each attention call site's schedule: triangular when causal, else dense.",
         ScheduleOptions())(attention_schedule)
register_variant("attention_schedule", "attention_schedule_triangular",
                 "attention_schedule with the triangular schedule forced (causal sites).", force="triangular")
register_variant("attention_schedule", "attention_schedule_dense",
                 "attention_schedule with the dense schedule forced.", force="dense")
