"""The compile report's text: a summary (kernels, fused kernels, launches, bytes moved, the static
peak of memory against the naive plan), then each pass's decisions with every node named by op and
user line (``%1008 gelu@gpt.py:31``), repeated reasons grouped, then the backend's lines."""
from __future__ import annotations

import re
from typing import Any, Iterable

from bendc.ir.graph import Graph

NODE = re.compile(r"%(\d+)")
SHOWN_PER_GROUP = 4


def node_name(graph: Graph, id: int) -> str:
    """``%1008 gelu@gpt.py:31`` (the op, and the user's line where the node has one)."""
    try:
        node = graph.node(id)
    except (KeyError, IndexError):
        return f"%{id}"
    return f"%{id} {node.op}" + (f"@{node.loc.short}" if node.loc is not None else "")


def name_nodes(graph: Graph, text: str) -> str:
    return NODE.sub(lambda match: node_name(graph, int(match[1])), text)


def group_decisions(decisions: Iterable[tuple[str, str]], graph: Graph) -> list[str]:
    """``[pass] text`` lines; decisions of one pass that differ only in their node numbers are one
    line with the count, the reason once, and the first few node sets named."""
    groups: dict[tuple[str, str], list[str]] = {}
    for pass_name, text in decisions:
        groups.setdefault((pass_name, NODE.sub("%N", text)), []).append(text)
    lines = []
    for (pass_name, shape), texts in groups.items():
        if len(texts) == 1:  # a kernel of many nodes lists its lines already: its nodes stay numbers
            many = len(NODE.findall(texts[0])) > SHOWN_PER_GROUP
            lines.append(f"[{pass_name}] {texts[0] if many else name_nodes(graph, texts[0])}")
            continue
        head, colon, reason = shape.partition(": ")
        joiner = " -> " if head.count("%N") == 2 and "->" in head else ", "
        refs = []
        for text in texts:
            ids = [node_name(graph, int(n)) for n in NODE.findall(text)]
            pair, rest = ids[:2] if joiner == " -> " else ids, ids[2:] if joiner == " -> " else []
            refs.append(joiner.join(pair) + (f" (via {', '.join(rest)})" if rest else ""))
        if colon and "%N" not in reason:  # "not fused %N -> %N: matmul is a matmul kernel"
            title = f"{head.replace(' %N', '').replace(' ->', '')}: {reason}"
        else:
            title = shape
        more = f"; and {len(texts) - SHOWN_PER_GROUP} more" if len(texts) > SHOWN_PER_GROUP else ""
        lines.append(f"[{pass_name}] {title} ({len(texts)}x): " + "; ".join(refs[:SHOWN_PER_GROUP]) + more)
    return lines


def summary_lines(plan: Any) -> list[str]:
    """Kernels, fused kernels and launches; bytes moved; the static peak of temporaries."""
    from bendc.codegen.plan import plan_stats

    stats = plan_stats(plan)
    writes = [s for s in plan.steps if s.convention == "write"]
    fused = [s for s in writes if len(s.nodes) > 1]
    lines = [f"kernels: {len(writes)} kernels ({len(fused)} fused, holding {sum(len(s.nodes) for s in fused)} "
             f"nodes), {len(plan.steps) - len(writes)} views; {stats['launches']} launches and "
             f"{_size(stats['bytes_moved'])} moved per call"]
    memory = plan.memory
    if memory:
        lines.append(f"memory: static peak {_size(memory.get('peak_bytes', 0))} of live temporaries "
                     f"(at {memory.get('peak_step') or '-'}); planned buffers {_size(memory['planned_bytes'])} in "
                     f"{len(plan.buffers)}; naive plan {_size(memory['naive_bytes'])} (one buffer per value, all "
                     f"live); outputs {_size(sum(_bytes(plan, o) for o in plan.outputs))}")
    return lines


def _bytes(plan: Any, value: int) -> int:
    from bendc.codegen.plan import value_bytes

    return value_bytes(plan, value)


def _size(count: int) -> str:
    if count >= 1 << 20:
        return f"{count / (1 << 20):.2f} MiB"
    if count >= 1 << 10:
        return f"{count / (1 << 10):.1f} KiB"
    return f"{count} bytes"


def format_report(name: str, target: str, decisions: list[tuple[str, str]], graph: Graph,
                  backend: list[str], plan: Any | None) -> str:
    lines = [f"bendc report for {name} (target {target})", f"final IR: {len(graph)} nodes"]
    if plan is not None:
        lines.extend(summary_lines(plan))
    lines.extend(group_decisions(decisions, graph))
    if not decisions:
        lines.append("no pass changed the graph")
    for line in backend:  # kernels and memory decisions: nodes named where there are few
        few = len(NODE.findall(line)) <= SHOWN_PER_GROUP
        lines.append(f"[{target}] {name_nodes(graph, line) if few else line}")
    return "\n".join(lines) + "\n"
