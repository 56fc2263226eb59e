"""Gradient bucketing: small all-reduces share one message.

Each ``all_reduce`` costs a message (a latency) however small its tensor; PyTorch's
DistributedDataParallel therefore packs gradients into buckets of up to 25 MB (``bucket_cap_mb``)
and all-reduces a bucket as soon as its last gradient is ready. This pass does the same on the
IR: all-reduces, in the order their operands become final (the graph's topological order), join
the open bucket (``bucket=N`` on the node) while it stays under the cap, has the same reduce op,
and the bucket's step can still be placed (no path between two of its members through other
kernels). The plan then starts each bucket once, waits once (bendc/codegen/plan.py).

Under ``data_parallel="sharded"`` the all-reduce is split around the optimizer (bendc/distributed.py):
``reduce_scatter`` ops (each rank's shard of the reduced gradient), the optimizer on the shards,
then ``all_gather`` ops (the updated parameters). Each collective op is bucketed apart (an
open bucket per op: the optimizer's reduce-scatters and all-gathers interleave in the graph's
order), bucket numbers running over all of them, and the report adds each bucket's bytes per rank
and the optimizer state each rank holds (the step's inputs of a shard's size that the sharded
update reads), against what it would hold unsharded.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from bendc.ir.graph import Graph
from bendc.ops import OPS
from bendc.passes.manager import PassContext, register
from runtime.collective import shard_counts
from runtime.dtypes import nbytes

DDP_BUCKET_BYTES = 25 * 1024 * 1024  # torch DistributedDataParallel's bucket_cap_mb=25


@dataclass(frozen=True)
class BucketOptions:
    cap_bytes: int = DDP_BUCKET_BYTES


def _placeable(graph: Graph, bucket_of: dict[int, int]) -> bool:
    """Whether every bucket, with fused kernels and other nodes as their own units, leaves the
    graph of units acyclic (a bucket is one step: its members must not depend on each other)."""
    def unit(id: int):
        node = graph.node(id)
        if id in bucket_of:
            return ("c", bucket_of[id])
        return ("k", node.kernel) if node.kernel is not None else ("n", id)

    return nx.is_directed_acyclic_graph(graph.contract(unit))


def _size_text(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} KiB" if size < 1024 ** 2 else \
        f"{size / 1024 ** 2:.2f} MiB"


def _message_elements(graph: Graph, id: int) -> int:
    """The elements a collective contributes to its bucket's message: the whole tensor it reduces
    (all_reduce, reduce_scatter) or gathers (all_gather)."""
    node = graph.node(id)
    return graph.node(node.inputs[0]).type.numel if node.op == "reduce_scatter" else node.type.numel


def _bytes_per_rank(graph: Graph, ids: list[int]) -> str:
    """What a rank sends and receives in one exchange of a sharded bucket (a range over the ranks:
    shards differ by one element): a reduce-scatter sends the shards it does not own and receives
    N-1 copies of its own; an all-gather sends its own shard to N-1 ranks and receives the rest."""
    node = graph.node(ids[0])
    ranks = node.attr["ranks"]
    sizes = [_message_elements(graph, i) for i in ids]
    total = sum(sizes)
    own = [sum(shard_counts(n, ranks)[rank] for n in sizes) for rank in range(ranks)]
    others = [4 * (total - mine) if ranks > 1 else 0 for mine in own]
    gathered = [4 * mine * (ranks - 1) for mine in own]
    sent, received = (others, gathered) if node.op == "reduce_scatter" else (gathered, others)

    def span(values: list[int]) -> str:
        low, high = min(values), max(values)
        return f"{low} bytes" if low == high else f"{low}-{high} bytes"

    return f"per rank of {ranks}: {span(sent)} sent, {span(received)} received"


def _optimizer_state(graph: Graph) -> str | None:
    """The optimizer state per rank: the step's non-leaf inputs of a padded shard's shape that the
    sharded update reads (an ancestor of an all_gather), against the whole tensors' bytes."""
    gathers = [graph.node(id) for id in graph.order() if graph.node(id).op == "all_gather"]
    if not gathers:
        return None
    params = {id for id in graph.params if not graph.node(id).attr.get("leaf")}
    held = whole = 0
    arrays = 0
    seen: set[int] = set()
    for gather in gathers:
        shard = graph.node(gather.inputs[0]).type
        for id in sorted(graph.ancestors(gather.inputs[0]) & params - seen):
            if graph.node(id).type.shape == shard.shape:
                seen.add(id)
                arrays += 1
                held += nbytes(shard.dtype, shard.shape)
                whole += nbytes(gather.type.dtype, gather.type.shape)
    ranks = gathers[0].attr["ranks"]
    return (f"optimizer state per rank: {_size_text(held)} in {arrays} shard arrays (unsharded: "
            f"{_size_text(whole)}; {ranks} ranks)")


@register("bucket", "Group all_reduce ops into buckets of up to 25 MB, one message each (DDP's buckets).",
          BucketOptions())
def bucket_all_reduces(graph: Graph, context: PassContext, options: BucketOptions) -> Graph:
    collectives = [id for id in graph.order() if OPS[graph.node(id).op].lowering.kind == "collective"]
    bucket_of: dict[int, int] = {}
    sizes: list[int] = []
    members: list[list[int]] = []
    open_bucket: dict[str, int] = {}  # collective op -> the number of its open bucket
    for id in collectives:
        node = graph.node(id)
        size = 4 * _message_elements(graph, id) if node.op == "reduce_scatter" else \
            nbytes(node.type.dtype, node.type.shape)
        joins = False
        if node.op in open_bucket:
            current = open_bucket[node.op]
            last = graph.node(members[current][0])
            why = None
            if sizes[current] + size > options.cap_bytes:
                why = f"it would pass the {_size_text(options.cap_bytes)} cap"
            elif last.attr["op"] != node.attr["op"] or last.attr["group"] != node.attr["group"]:
                why = f"op={node.attr['op']} differs from the bucket's op={last.attr['op']}"
            elif not _placeable(graph, {**bucket_of, id: current}):
                why = "it reads a member's result, through other kernels (a message cannot wait for itself)"
            joins = why is None
            if not joins:
                context.decide("bucket", f"%{id} opens bucket {len(members)}: {why}")
        if joins:
            members[open_bucket[node.op]].append(id)
            sizes[open_bucket[node.op]] += size
        else:
            open_bucket[node.op] = len(members)
            members.append([id])
            sizes.append(size)
        bucket_of[id] = open_bucket[node.op]
    for number, (ids, size) in enumerate(zip(members, sizes)):
        for id in ids:
            node = graph.node(id)
            graph.replace(node.replace(attrs={**node.attr, "bucket": number}))
        lines = sorted({graph.node(i).loc.short for i in ids if graph.node(i).loc is not None})
        where = f"; lines {', '.join(lines)}" if lines else ""
        op = graph.node(ids[0]).op
        sharded = f"; {_bytes_per_rank(graph, ids)}" if op in ("reduce_scatter", "all_gather") else ""
        context.decide("bucket", f"bucket {number}: {len(ids)} {op} ({' '.join(f'%{i}' for i in ids)}), "
                                 f"{_size_text(size)} in one message (cap {_size_text(options.cap_bytes)})"
                                 f"{sharded}{where}")
    state = _optimizer_state(graph)
    if state is not None:
        context.decide("bucket", state)
    return graph
