"""The kernel plan: the fused graph as an ordered list of launches over cells.

Each step is one kernel: a fused elementwise group (``k3``), or one node of
another kind (``matmul7``, ``sum16``, ``permute6``). A step reads values and
writes values; ``view`` steps (layout ops, constants) return a view instead
of writing a buffer. Steps that depend on constants only are ``hoisted``: the
runtime runs them once when it binds the plan. The plan is plain data (JSON)
so that the runtime can run it without the compiler.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import networkx as nx

from bendc.ir.graph import Graph
from bendc.ir.types import numel
from bendc.ops import OPS
from runtime.dtypes import nbytes


@dataclass
class Step:
    name: str
    kind: str
    convention: str  # "write" or "view"
    nodes: list[int]
    inputs: list[int]
    outputs: list[int]
    cells: int
    hoisted: bool = False
    source: str = ""
    module: str = ""
    lines: list[str] = field(default_factory=list)  # the user's source lines, for reports
    op: str = ""  # the op of the step's first node and its user's line (path:line), for errors
    loc: str = ""
    # Target-specific, optional (empty on cpu): the cuda kernels' launch configurations
    # ({kernel, grid, block, shared_bytes}, in launch order; an ahead-of-time build adds entry,
    # cubin, arguments and parameters: bendc/codegen/ptx.py) and an index check's error message.
    launches: list[dict] = field(default_factory=list)
    check: str = ""
    value: float | None = None  # a cuda source step's constant (the cubin runtime uploads it; plan.json)
    phase: str = ""  # collective steps: "start", "poll" or "wait" (bendc/ops/collective.py)
    # cuda: [input position, first element, elements] of each input whose kernel argument is a window
    # of its root's flat array rather than the whole (bendc/codegen/views.py StepReads)
    windows: list[list[int]] = field(default_factory=list)


@dataclass
class KernelPlan:
    name: str
    params: list[int]
    param_names: list[str]
    outputs: list[int]
    values: dict[int, tuple[str, tuple[int, ...]]]  # id -> (dtype, shape)
    steps: list[Step]
    buffers: list[int] = field(default_factory=list)  # planned temporary buffers, bytes each
    storage: dict[int, int] = field(default_factory=dict)  # value -> buffer index
    memory: dict[str, int] = field(default_factory=dict)  # peak and naive bytes
    donations: dict[int, int] = field(default_factory=dict)  # output written over a donated parameter

    def to_json(self) -> dict:
        data = asdict(self)
        data["values"] = {str(k): [d, list(s)] for k, (d, s) in self.values.items()}
        data["storage"] = {str(k): v for k, v in self.storage.items()}
        data["donations"] = {str(k): v for k, v in self.donations.items()}
        return data

    @staticmethod
    def from_json(data: dict) -> "KernelPlan":
        plan = KernelPlan(**{**data, "steps": [Step(**s) for s in data["steps"]]})
        plan.values = {int(k): (d, tuple(s)) for k, (d, s) in data["values"].items()}
        plan.storage = {int(k): v for k, v in data["storage"].items()}
        plan.donations = {int(k): v for k, v in data.get("donations", {}).items()}
        return plan


def build_plan(graph: Graph) -> KernelPlan:
    """Contract fusion groups to units and order them topologically."""
    unit_of: dict[int, tuple] = {}
    members: dict[tuple, list[int]] = {}
    order = graph.order()
    position = {id: index for index, id in enumerate(order)}
    collectives = [id for id in order if OPS[graph.node(id).op].lowering.kind == "collective"]
    # What reads a reduced value (the optimizer) runs after the rest of the backward where it can:
    # the exchange overlaps that work (see _split_collectives).
    deferred = set().union(*(graph.descendants(id) for id in collectives))
    for id in order:
        node = graph.node(id)
        if node.op == "param":
            continue
        if node.op == "const" and not _const_needs_step(graph, id):
            continue
        if node.kernel is not None:
            unit = ("k", node.kernel)
        elif id in collectives and "bucket" in node.attr:
            unit = ("c", node.attr["bucket"])
        else:
            unit = ("n", id)
        unit_of[id] = unit
        members.setdefault(unit, []).append(id)
    contracted = graph.contract(unit_of.get)
    first = {unit: (any(i in deferred for i in ids), min(position[i] for i in ids)) for unit, ids in members.items()}
    steps: list[Step] = []
    hoisted_values: set[int] = set()
    for unit in nx.lexicographical_topological_sort(contracted, key=lambda u: first[u]):
        step = _make_step(graph, unit, sorted(members[unit], key=position.get))
        step.hoisted = step.kind != "collective" and all(i in hoisted_values for i in step.inputs)
        if step.hoisted:
            hoisted_values.update(step.outputs)
        steps.append(step)
    steps = _split_collectives(steps)
    values = {}
    for id in order:
        node = graph.node(id)
        values[id] = (node.type.dtype, node.type.shape)
    return KernelPlan(graph.name, list(graph.params),
                      [graph.node(p).attr["name"] for p in graph.params],
                      list(graph.outputs), values, steps)


def _split_collectives(steps: list[Step]) -> list[Step]:
    """Each collective step becomes a ``start`` step right after the last step writing one of its
    inputs (the gradients are final there) and a ``wait`` step right before the first step reading
    one of its outputs (the optimizer), the steps between them running while the message moves
    (with a ``poll`` of the message after each)."""
    result = [step for step in steps if step.kind != "collective"]
    for step in (s for s in steps if s.kind == "collective"):
        inputs, outputs = set(step.inputs), set(step.outputs)
        producers = [index for index, other in enumerate(result) if inputs & set(other.outputs)]
        start = Step(f"{step.name}_start", step.kind, "write", step.nodes, step.inputs, [], step.cells,
                     lines=step.lines, op=step.op, loc=step.loc, phase="start")
        result.insert(max(producers) + 1 if producers else 0, start)
        readers = [index for index, other in enumerate(result) if outputs & set(other.inputs)]
        wait = Step(f"{step.name}_wait", step.kind, "write", step.nodes, [], step.outputs, step.cells,
                    lines=step.lines, op=step.op, loc=step.loc, phase="wait")
        result.insert(min(readers) if readers else len(result), wait)
    return _add_polls(result)


def _add_polls(steps: list[Step]) -> list[Step]:
    """A ``poll`` step after each kernel that runs while a bucket is in flight: MPI moves a
    non-blocking message only inside MPI calls, so the exchange advances between kernels."""
    result: list[Step] = []
    in_flight: dict[str, Step] = {}
    polls: dict[str, int] = {}
    for step in steps:
        result.append(step)
        if step.kind == "collective":
            base = step.name.rsplit("_", 1)[0]
            if step.phase == "start":
                in_flight[base] = step
            else:
                in_flight.pop(base, None)
        elif step.convention == "write" and not step.hoisted:
            for base, start in in_flight.items():
                number = polls[base] = polls.get(base, -1) + 1
                result.append(Step(f"{base}_poll{number}", "collective", "write", start.nodes, [], [], 0,
                                   lines=start.lines, op=start.op, loc=start.loc, phase="poll"))
    return result


def program_signature(plan: KernelPlan) -> str:
    """The program as the ranks compare it: its name, its parameters' types, its collectives' shapes."""
    def type_text(value: int) -> str:
        dtype, shape = plan.values[value]
        return f"{dtype}[{','.join(map(str, shape))}]"

    params = ", ".join(f"{name} {type_text(p)}" for name, p in zip(plan.param_names, plan.params))
    messages = "; ".join(f"{s.name} {' '.join(type_text(v) for v in s.outputs)}"
                         for s in plan.steps if s.kind == "collective" and s.phase == "wait")
    return f"{plan.name}({params}) all-reduces {messages}"


def collective_step(plan: KernelPlan, step: Step, graph: Graph):
    """What the op's collective renderer is given for one phase of a bucket."""
    from bendc.ops.collective import CollectiveStep

    node = graph.node(step.nodes[0])
    shapes = tuple(tuple(graph.node(n).type.shape) for n in step.nodes)
    return CollectiveStep(step.name, step.phase, f"{plan.name}.{step.name.rsplit('_', 1)[0]}", node.attr["op"],
                          shapes, program_signature(plan))


def _const_needs_step(graph: Graph, id: int) -> bool:
    """Constants are inlined into fused kernels; others read them from a step (an op computing a
    fused group as its epilogue reads its own operands as arrays)."""
    return id in graph.outputs or any(graph.node(u).kernel is None or OPS[graph.node(u).op].lowering.epilogue
                                      for u in graph.users(id))


def epilogue_producer(graph: Graph, ids: list[int]) -> int | None:
    """The member of a fused group whose own kernel computes the rest of the group as its epilogue
    (bendc/passes/fusion.py, absorb_producers), or None."""
    return next((i for i in ids if OPS[graph.node(i).op].lowering.epilogue), None)


def _make_step(graph: Graph, unit: tuple, ids: list[int]) -> Step:
    step = _make_step_body(graph, unit, ids)
    first = graph.node(step.nodes[0])
    step.op = first.op
    step.loc = str(first.loc) if first.loc is not None else ""
    return step


def _make_step_body(graph: Graph, unit: tuple, ids: list[int]) -> Step:
    nodes = [graph.node(i) for i in ids]
    lines = sorted({n.loc.short for n in nodes if n.loc is not None})
    if unit[0] == "k":
        member_set = set(ids)
        producer = epilogue_producer(graph, ids)
        if producer is not None:
            return _epilogue_step(graph, unit, ids, producer, lines)
        inputs: list[int] = []
        for node in nodes:
            for operand in node.inputs:
                if operand not in member_set and graph.node(operand).op != "const" and operand not in inputs:
                    inputs.append(operand)
        outputs = [i for i in ids if i in graph.outputs or any(u not in member_set for u in graph.users(i))]
        cells = numel(elementwise_domain(graph, ids))
        return Step(f"k{unit[1]}", "elementwise", "write", ids, inputs, outputs, cells, lines=lines)
    node = nodes[0]
    lowering = OPS[node.op].lowering
    if lowering.kind == "collective":  # a bucket: one message for all its nodes
        name = f"all_reduce_b{unit[1]}" if unit[0] == "c" else f"{node.op}{node.id}"
        return Step(name, "collective", "write", ids, [n.inputs[0] for n in nodes], list(ids),
                    sum(n.type.numel for n in nodes), lines=lines)
    # An op's own kernel takes one input per operand, in order (x @ x reads x twice); the generic
    # elementwise kernel (an unfused elementwise node) one per value, as a fused group's does.
    inputs = list(dict.fromkeys(node.inputs)) if lowering.kind == "elementwise" else list(node.inputs)
    return Step(f"{node.op}{node.id}", lowering.kind, lowering.convention, ids, inputs,
                [node.id], node.type.numel, lines=lines)


def _epilogue_step(graph: Graph, unit: tuple, ids: list[int], producer: int, lines: list[str]) -> Step:
    """An op with a fused group as its epilogue: the op's own kernel, given its operands in order
    (x @ x reads x twice), then the group's other inputs; its result first among the outputs when
    it is read beyond the group."""
    node = graph.node(producer)
    rest = [i for i in ids if i != producer]
    member_set = set(ids)
    inputs = list(node.inputs)
    extra: list[int] = []
    for id in rest:
        for operand in graph.node(id).inputs:
            if operand not in member_set and graph.node(operand).op != "const" and operand not in extra:
                extra.append(operand)
    outputs = [i for i in [producer] + rest if i in graph.outputs or any(u not in member_set for u in graph.users(i))]
    lowering = OPS[node.op].lowering
    return Step(f"{node.op}{node.id}_k{unit[1]}", lowering.kind, "write", [producer] + rest, inputs + extra, outputs,
                node.type.numel, lines=lines)


def elementwise_domain(graph: Graph, ids: list[int]) -> tuple[int, ...]:
    """The iteration space of a fused group: its members' shape (numel-1 members aside; an op
    computing the group as its epilogue aside)."""
    shapes = {graph.node(i).type.shape for i in ids
              if graph.node(i).type.numel != 1 and graph.node(i).op not in ("sum", "sum_to_size")
              and not OPS[graph.node(i).op].lowering.epilogue}
    assert len(shapes) <= 1, f"group {ids} mixes iteration spaces {shapes}"
    return shapes.pop() if shapes else ()


def value_bytes(plan: KernelPlan, value: int) -> int:
    dtype, shape = plan.values[value]
    return nbytes(dtype, shape)


def step_traffic(plan: KernelPlan, step: Step) -> int:
    """Bytes a write step reads and writes (views move nothing)."""
    if step.convention != "write":
        return 0
    return sum(value_bytes(plan, v) for v in step.inputs + step.outputs)


def plan_stats(plan: KernelPlan) -> dict[str, int]:
    """Kernel launches and bytes moved per call, and temporary memory planned vs naive."""
    launches = [s for s in plan.steps if s.convention == "write" and not s.hoisted and s.phase != "poll"]
    return {
        "launches": sum(max(1, len(s.launches)) for s in launches),  # cuda steps may launch two kernels
        "bytes_moved": sum(step_traffic(plan, s) for s in launches),
        "planned_bytes": plan.memory.get("planned_bytes", 0),
        "naive_bytes": plan.memory.get("naive_bytes", 0),
    }


def describe_plan(plan: KernelPlan) -> list[str]:
    """Report lines: each launch with its nodes, cells and bytes moved, then memory."""
    lines = []
    for step in plan.steps:
        if step.phase == "poll":  # counted on the bucket's line (describe_collectives)
            continue
        traffic = step_traffic(plan, step)
        what = "view" if step.convention == "view" else f"{step.cells} cells, {traffic} bytes moved"
        when = " (hoisted: runs once at bind)" if step.hoisted else ""
        nodes = " ".join(f"%{n}" for n in step.nodes)
        lines.append(f"{step.name}: {step.kind}, {what}{when}; nodes {nodes}; lines {', '.join(step.lines)}")
    lines += describe_collectives(plan)
    stats = plan_stats(plan)
    lines.append(f"{stats['launches']} kernel launches per call, {stats['bytes_moved']} bytes moved per call")
    if plan.memory:
        lines.append(f"temporaries: {plan.memory['planned_bytes']} bytes in {len(plan.buffers)} buffers "
                     f"(naive plan: {plan.memory['naive_bytes']} bytes, one buffer per value)")
    return lines


def describe_collectives(plan: KernelPlan) -> list[str]:
    """Per bucket: its message size, the step after which it starts and the step before which it
    is waited on, and the work in between (what the exchange overlaps)."""
    lines = []
    index = {step.name: number for number, step in enumerate(plan.steps)}
    for step in plan.steps:
        if step.kind != "collective" or step.phase != "start":
            continue
        base = step.name.rsplit("_", 1)[0]
        wait = index[f"{base}_wait"]
        start = index[step.name]
        between = [s for s in plan.steps[start + 1:wait] if s.convention == "write" and not s.hoisted
                   and s.kind != "collective"]
        size = sum(value_bytes(plan, v) for v in plan.steps[wait].outputs)
        after = next((s.name for s in reversed(plan.steps[:start]) if s.phase != "poll"), "the call's start")
        before = next((s.name for s in plan.steps[wait + 1:] if s.phase != "poll"), "the call's end")
        cells = sum(s.cells for s in between)
        polls = sum(1 for s in plan.steps[start + 1:wait] if s.phase == "poll" and s.name.startswith(f"{base}_poll"))
        lines.append(f"collective {base}: {len(step.nodes)} tensors, {size} bytes in one message; started "
                     f"after {after}, waited before {before}: {len(between)} kernels ({cells} cells, "
                     f"{sum(step_traffic(plan, s) for s in between)} bytes moved) of compute between start and "
                     f"wait, {polls} polls")
    return lines
