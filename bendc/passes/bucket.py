"""Gradient bucketing: small all-reduces share one message.

Each ``all_reduce`` costs a message (a latency) however small its tensor; PyTorch's
DistributedDataParallel therefore packs gradients into buckets of up to 25 MB (``bucket_cap_mb``)
and all-reduces a bucket as soon as its last gradient is ready. This pass does the same on the
IR: all-reduces, in the order their operands become final (the graph's topological order), join
the open bucket (``bucket=N`` on the node) while it stays under the cap, has the same reduce op,
and the bucket's step can still be placed (no path between two of its members through other
kernels). The plan then starts each bucket once, waits once (bendc/codegen/plan.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from bendc.ir.graph import Graph
from bendc.ops import OPS
from bendc.passes.manager import PassContext, register
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


@register("bucket", "Group all_reduce ops into buckets of up to 25 MB, one message each (DDP's buckets).",
          BucketOptions())
def bucket_all_reduces(graph: Graph, context: PassContext, options: BucketOptions) -> Graph:
    collectives = [id for id in graph.order() if OPS[graph.node(id).op].lowering.kind == "collective"]
    bucket_of: dict[int, int] = {}
    sizes: list[int] = []
    members: list[list[int]] = []
    for id in collectives:
        node = graph.node(id)
        size = nbytes(node.type.dtype, node.type.shape)
        joins = False
        if members:
            last = graph.node(members[-1][0])
            why = None
            if sizes[-1] + size > options.cap_bytes:
                why = f"it would pass the {_size_text(options.cap_bytes)} cap"
            elif last.attr["op"] != node.attr["op"] or last.attr["group"] != node.attr["group"]:
                why = f"op={node.attr['op']} differs from the bucket's op={last.attr['op']}"
            elif not _placeable(graph, {**bucket_of, id: len(members) - 1}):
                why = "it reads a member's result, through other kernels (a message cannot wait for itself)"
            joins = why is None
            if not joins:
                context.decide("bucket", f"%{id} opens bucket {len(members)}: {why}")
        if joins:
            members[-1].append(id)
            sizes[-1] += size
        else:
            members.append([id])
            sizes.append(size)
        bucket_of[id] = len(members) - 1
    for number, (ids, size) in enumerate(zip(members, sizes)):
        for id in ids:
            node = graph.node(id)
            graph.replace(node.replace(attrs={**node.attr, "bucket": number}))
        lines = sorted({graph.node(i).loc.short for i in ids if graph.node(i).loc is not None})
        where = f"; lines {', '.join(lines)}" if lines else ""
        context.decide("bucket", f"bucket {number}: {len(ids)} all_reduce ({' '.join(f'%{i}' for i in ids)}), "
                                 f"{_size_text(size)} in one message (cap {_size_text(options.cap_bytes)}){where}")
    return graph
