"""Dead-code elimination: drop nodes that no output depends on."""
from __future__ import annotations

from bendc.ir.graph import Graph
from bendc.passes.manager import PassContext, register


def remove_dead(graph: Graph) -> list[int]:
    """Remove the nodes no output depends on; returns their ids."""
    live = set(graph.outputs) | set(graph.params)
    for id in reversed(graph.order()):  # users before operands: one sweep
        if id in live:
            live.update(graph.node(id).inputs)
    dead = [id for id in reversed(graph.order()) if id not in live]
    for id in dead:
        graph.remove(id)
    return dead


@register("dce", "Remove nodes no output depends on (parameters stay).")
def dead_code_elimination(graph: Graph, context: PassContext) -> Graph:
    dead = remove_dead(graph)
    if dead:
        context.decide("dce", f"removed {len(dead)} dead nodes")
    return graph
