"""Elementwise fusion over forward and VJP nodes alike.

Maximal groups of elementwise ops over one iteration space (the group's
domain shape) become one kernel with several inputs and outputs. ``expand``
and size-1 ``reshape`` nodes join a group as broadcast reads of their
operand. Groups never span a matrix product, reduction, gather or scatter;
every pair of adjacent nodes that is not fused is recorded with the reason.
Scalar constants are inlined into the kernels that read them. On the cpu
target an op whose kernel takes an elementwise epilogue (``Lowering.epilogue``:
conv2d) joins the group that reads its result: its kernel applies the group to
each block of its result while the block is in cache (bendc/kernels/epilogue.py).

The pass only annotates: each grouped node gets ``kernel=k`` (printed
``# [k3] ...``); the kernel plan reads the groups from the graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bendc.errors import InternalError
from bendc.ir.graph import Graph, Node
from bendc.ir.types import numel
from bendc.ops import OPS
from bendc.ops.base import reduced_axes
from bendc.passes.manager import PassContext, register


def is_unit_reshape(graph: Graph, node: Node) -> bool:
    """A reshape that only inserts or removes size-1 dimensions."""
    if node.op != "reshape":
        return False
    source = graph.node(node.inputs[0]).type.shape
    return [d for d in source if d != 1] == [d for d in node.type.shape if d != 1]


def is_fusible(graph: Graph, node: Node) -> bool:
    """Elementwise ops, and broadcast-like layout ops that read their operand per cell."""
    if node.op == "const":
        return False
    if OPS[node.op].lowering.kind == "elementwise":
        return True
    return node.op == "expand" or is_unit_reshape(graph, node)


@dataclass
class Group:
    id: int
    domain: tuple[int, ...]
    members: set[int] = field(default_factory=set)
    epilogues: list[int] = field(default_factory=list)  # sums accumulated while the cells are computed
    producer: int | None = None  # an op whose kernel computes the group as its epilogue (absorb_producers)


def _merged_domain(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The iteration space of two groups together, or None when they differ."""
    if a == b or numel(b) == 1:
        return a
    if numel(a) == 1:
        return b
    return None


def _fits(node: Node, domain: tuple[int, ...]) -> bool:
    """A member is computed per cell: its shape is the domain, or it holds one element."""
    return node.type.shape == domain or node.type.numel == 1


def fusion_groups(graph: Graph, context: PassContext | None = None) -> dict[int, Group]:
    """Producer-into-consumer grouping, newest node first.

    A fusible node joins the group of one of its consumers when it fits that
    group's iteration space and no path leaves the group and comes back
    through the node (which would make the kernel wait for itself). Groups
    made only of layout ops are dropped: those ops stay zero-copy views.
    """
    ancestors: dict[int, set[int]] = {}  # in topological order: each from its operands' (no search per node)
    for id in graph.order():
        found: set[int] = set()
        for operand in set(graph.node(id).inputs):
            found.add(operand)
            found |= ancestors[operand]
        ancestors[id] = found
    group_of: dict[int, Group] = {}
    groups: dict[int, Group] = {}

    def note(text: str) -> None:
        if context is not None:
            context.decide("fuse", text)

    def cycle_through(members: set[int]) -> int | None:
        """An operand outside ``members`` that depends on a member: the kernel would wait for itself."""
        for member in members:
            for operand in graph.node(member).inputs:
                if operand not in members and ancestors[operand] & members:
                    return operand
        return None

    for id in reversed(graph.order()):
        node = graph.node(id)
        if not is_fusible(graph, node):
            continue
        chosen: Group | None = None
        for user in graph.users(id):
            group = group_of.get(user)
            if group is None or group is chosen:
                continue
            domain = _merged_domain(chosen.domain, group.domain) if chosen else group.domain
            if domain is None or not _fits(node, domain):
                note(f"not fused %{id} -> %{user}: different iteration spaces {node.type} vs "
                     f"[{','.join(map(str, group.domain))}]")
                continue
            proposed = group.members | {id} | (chosen.members if chosen else set())
            blocker = cycle_through(proposed)
            if blocker is not None:
                note(f"not fused %{id} -> %{user}: %{blocker} needs %{id} and feeds the kernel of %{user}")
                continue
            if chosen is not None:  # the node feeds two kernels: they become one
                for member in group.members:
                    group_of[member] = chosen
                chosen.members |= group.members
                chosen.domain = domain
                del groups[group.id]
            else:
                chosen = group
        if chosen is None:
            chosen = Group(id, node.type.shape)
            groups[chosen.id] = chosen
        chosen.members.add(id)
        group_of[id] = chosen
    return {gid: group for gid, group in groups.items()
            if any(OPS[graph.node(m).op].lowering.kind == "elementwise" for m in group.members)}


def attach_epilogues(graph: Graph, groups: dict[int, Group], context: PassContext | None) -> None:
    """A sum over a member of a group's full iteration space joins the group as an epilogue:
    the kernel accumulates it while it computes the cells, instead of writing the operand
    for another kernel to read back. Not when the group itself needs the sum."""
    group_of = {m: g for g in groups.values() for m in g.members}
    for node in graph.nodes():
        if reduced_axes(graph, node) is None or node.type.dtype != "f32":
            continue
        group = group_of.get(node.inputs[0])
        if group is None or graph.node(node.inputs[0]).type.shape != group.domain or numel(group.domain) == 1:
            continue
        if graph.descendants(node.id) & group.members:
            if context is not None:
                context.decide("fuse", f"not fused %{node.inputs[0]} -> %{node.id}: the kernel of "
                                       f"%{node.inputs[0]} needs the {node.op}")
            continue
        group.members.add(node.id)
        group.epilogues.append(node.id)


def kernel_cycle(graph: Graph, groups: dict[int, Group]) -> list[int] | None:
    """Group ids on a cycle of the graph of kernels, or None when kernels can be ordered.

    Each group is convex on its own, but two groups can still need each other: a member
    of A feeds B while another member of B feeds A, through nodes that are independent.
    """
    unit_of: dict[int, tuple] = {m: ("k", g.id) for g in groups.values() for m in g.members}
    contracted = graph.contract(lambda id: unit_of.get(id, ("n", id)))
    edges = {unit: set(contracted.successors(unit)) for unit in contracted if contracted.out_degree(unit)}
    state: dict[tuple, int] = {}  # 1: on the current path, 2: done
    for start in list(edges):
        if state.get(start):
            continue
        path, stack = [], [(start, iter(sorted(edges.get(start, ()))))]
        state[start] = 1
        path.append(start)
        while stack:
            unit, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[unit] = 2
            elif state.get(child) == 1:
                cycle = path[path.index(child):]
                return [u[1] for u in cycle if u[0] == "k"]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges.get(child, ())))))
    return None


def late_members(graph: Graph, groups: dict[int, Group], gid: int) -> set[int]:
    """The members of group ``gid`` that need a value computed after the group's kernel: a member
    reading a kernel (or node) downstream of the group, and the members that read those.

    On a cycle of kernels such members always exist, and so do members that are not late (the
    group's first member in topological order reads nothing downstream of the group), so
    splitting the group into the two makes progress.
    """
    unit_of: dict[int, tuple] = {m: ("k", g.id) for g in groups.values() for m in g.members}

    def unit(id: int) -> tuple:
        return unit_of.get(id, ("n", id))

    contracted = graph.contract(unit)
    downstream: set[tuple] = set()
    frontier = [("k", gid)]
    while frontier:  # the units reachable from the group's kernel
        for successor in contracted.successors(frontier.pop()):
            if successor not in downstream:
                downstream.add(successor)
                frontier.append(successor)
    downstream.discard(("k", gid))
    late: set[int] = set()
    members = groups[gid].members
    for id in graph.order():
        if id in members and any(o in late or (o not in members and unit(o) in downstream)
                                 for o in graph.node(id).inputs):
            late.add(id)
    return late


def break_cycles(graph: Graph, groups: dict[int, Group], context: PassContext | None) -> None:
    """Split groups until the kernels can be ordered.

    A group on a cycle of kernels is split in two where it can be: the members that need a value
    computed after its kernel (late_members) move to a kernel of their own, with their epilogue
    sums, and the rest stay. Where no group on the cycle splits so (every member of each is late),
    a group of several members is split node by node; one always exists, since a cycle of
    one-node kernels would be a cycle of the graph. Bounded: each round adds a group and leaves
    none empty, so there are at most as many rounds as members.
    """
    next_id = max(groups, default=-1) + 1

    def add(members: set[int], epilogues: list[int], domain: tuple[int, ...]) -> None:
        nonlocal next_id
        if any(OPS[graph.node(m).op].lowering.kind == "elementwise" for m in members):
            groups[next_id] = Group(next_id, domain, set(members), epilogues)
            next_id += 1
        # else: only layout members, which go back to being views

    for _ in range(sum(len(g.members) for g in groups.values()) + 1):
        cycle = kernel_cycle(graph, groups)
        if cycle is None:
            return
        lates = {gid: late_members(graph, groups, gid) for gid in cycle}
        proper = [gid for gid in cycle if lates[gid] and lates[gid] != groups[gid].members]
        if proper:
            gid = min(proper, key=lambda g: (len(lates[g]), g))
            group, late = groups.pop(gid), lates[gid]
            add(group.members - late, [e for e in group.epilogues if e not in late], group.domain)
            add(late, [e for e in group.epilogues if e in late], group.domain)
            note = f"the kernel of {_listing(group.members)} was split: {_listing(late)} need values computed after it"
        else:
            gid = min((g for g in cycle if len(groups[g].members) > 1), key=lambda g: (len(groups[g].members), g))
            group = groups.pop(gid)
            for member in sorted(group.members):
                add({member}, [], graph.node(member).type.shape)
            note = f"the kernel of {_listing(group.members)} was split node by node"
        if context is not None:
            context.decide("fuse", f"{note} (the kernels of {len(cycle)} groups needed each other)")
    raise InternalError("fuse: kernels still need each other after splitting every group")


def _epilogue_refusal(graph: Graph, group: Group, producer: Node) -> str | None:
    """Why the kernel of ``producer`` cannot compute ``group`` as its epilogue, or None when it can:
    the group runs over the producer's result (size-1 dimensions aside, as a size-1 reshape reads
    it), its leading axis the result's, so that each block of result rows is a block of group rows."""
    shape, domain = producer.type.shape, group.domain
    if producer.type.dtype != "f32":
        return f"{producer.op} writes {producer.type.dtype}"
    if [d for d in shape if d != 1] != [d for d in domain if d != 1] or numel(domain) == 1:
        return f"the kernel of the group runs over [{','.join(map(str, domain))}], not over its result {producer.type}"
    if domain[0] != shape[0]:
        return f"the group's leading axis ({domain[0]}) is not the leading axis of its result {producer.type}"
    return None


def absorb_producers(graph: Graph, groups: dict[int, Group], context: PassContext | None) -> None:
    """An op whose CPU kernel takes an elementwise epilogue (``Lowering.epilogue``) joins a group
    reading its result: the kernel applies the group to each block of its result right after
    computing it, instead of writing the result for another kernel to read back (it is still
    written where other kernels read it). The cpu target only: the cuda kernels take no epilogue."""
    if context is None or context.target != "cpu":
        return
    taken: set[int] = set()
    for gid in sorted(groups):
        group = groups[gid]
        operands = {o for m in group.members for o in graph.node(m).inputs if o not in group.members}
        for id in sorted(operands):
            producer = graph.node(id)
            if producer.op in ("param", "const") or not OPS[producer.op].lowering.epilogue or id in taken:
                continue
            reason = _epilogue_refusal(graph, group, producer)
            if reason is None:
                group.members.add(id)
                if kernel_cycle(graph, groups) is None:
                    group.producer = id
                    taken.add(id)
                    break
                group.members.discard(id)
                reason = "the group needs a value computed after it"
            context.decide("fuse", f"not fused %{id} -> kernel of {_listing(group.members)}: {reason}")


def _listing(ids) -> str:
    return " ".join(f"%{m}" for m in sorted(ids))


@register("fuse", "Group elementwise forward and VJP nodes into kernels over one iteration space.")
def fuse(graph: Graph, context: PassContext) -> Graph:
    groups = fusion_groups(graph, context)
    attach_epilogues(graph, groups, context)
    break_cycles(graph, groups, context)
    absorb_producers(graph, groups, context)
    # Number kernels by their first member, so the printed IR reads in order.
    ordered = sorted(groups.values(), key=lambda g: min(g.members))
    for number, group in enumerate(ordered):
        for id in group.members:
            graph.replace(graph.node(id).replace(kernel=number))
    for number, group in enumerate(ordered):
        outputs = [m for m in group.members
                   if m in graph.outputs or any(u not in group.members for u in graph.users(m))]
        internal = [m for m in sorted(group.members) if m not in outputs]
        saved = sum(2 * graph.node(m).type.nbytes for m in internal)
        members = " ".join(f"%{m}" for m in sorted(group.members))
        lines = sorted({graph.node(m).loc.short for m in group.members if graph.node(m).loc})
        epilogues = "".join(f", epilogue {graph.node(e).op} %{e}" for e in group.epilogues)
        if group.producer is not None:
            producer = graph.node(group.producer)
            epilogues += (f", computed by the kernel of {producer.op} %{producer.id} as its epilogue, block by block "
                          f"of its result (%{producer.id} " + ("also written" if group.producer in outputs else
                                                               "never written") + ")")
        context.decide("fuse", f"k{number}: {len(group.members)} nodes ({members}) over "
                               f"[{','.join(map(str, group.domain))}]{epilogues}, {len(internal)} intermediates "
                               f"kept in registers, {saved} bytes of memory traffic saved; lines {', '.join(lines)}")
    for node in graph.nodes():
        if node.kernel is not None or node.op in ("param", "const"):
            continue
        kind = OPS[node.op].lowering.kind
        for operand in node.inputs:
            if graph.node(operand).kernel is not None:
                context.decide("fuse", f"not fused %{operand} -> %{node.id}: {node.op} is a {kind} kernel")
    return graph
