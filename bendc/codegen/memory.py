"""The memory plan: buffer liveness over the launch order and reuse of dead
buffers of the right size.

Values written by kernels into temporaries get a planned buffer; views
(layout steps) alias their operand's buffer and keep it alive; graph outputs
get fresh arrays each call (the caller keeps them), and hoisted values live
for the plan's lifetime. A buffer is free again after the last step that
reads any value stored in it, and is reused only by a value of exactly its
size, never by an output of the step that frees it.
"""
from __future__ import annotations

from bendc.codegen.plan import KernelPlan, value_bytes


def plan_memory(plan: KernelPlan, donated: frozenset[int] = frozenset()) -> list[str]:
    """Fill plan.buffers, plan.storage, plan.donations and plan.memory; returns the decisions as text.

    ``donated`` names parameters whose arrays the caller gives up: an
    elementwise kernel whose output has a donated parameter's type, and that
    is the parameter's last reader, writes the output over it (an optimizer
    step updating its parameter in place).
    """
    root: dict[int, int] = {}
    for step in plan.steps:
        for value in step.outputs:
            root[value] = root.get(step.inputs[0], step.inputs[0]) if (
                step.convention == "view" and step.inputs) else value
    for param in plan.params:
        root[param] = param
    end = len(plan.steps)
    last_use: dict[int, int] = {}
    for index, step in enumerate(plan.steps):
        for value in step.inputs:
            last_use[root[value]] = index
    for value in plan.outputs:
        last_use[root[value]] = end  # a view returned to the caller is copied at the end of the call
    outputs = set(plan.outputs)
    planned = [v for step in plan.steps if step.convention == "write" and not step.hoisted
               for v in step.outputs if v not in outputs]
    free: dict[int, list[int]] = {}  # size -> free buffer indices
    releases: dict[int, list[int]] = {}  # step index -> buffers freed after it
    buffers: list[int] = []
    storage: dict[int, int] = {}
    decisions = []
    planned_set = set(planned)
    for index, step in enumerate(plan.steps):
        for value in step.outputs:
            if value not in planned_set:
                continue
            size = value_bytes(plan, value)
            if free.get(size):
                buffer = free[size].pop()
                decisions.append(f"%{value} ({size} bytes) reuses buffer b{buffer} in {step.name}")
            else:
                buffer = len(buffers)
                buffers.append(size)
            storage[value] = buffer
            releases.setdefault(last_use.get(value, index), []).append(buffer)
        for buffer in releases.pop(index, []):
            free.setdefault(buffers[buffer], []).append(buffer)
    donations = _donations(plan, donated, root, last_use, outputs, decisions)
    plan.donations = donations
    naive = sum(value_bytes(plan, v) for v in planned)
    plan.buffers = buffers
    plan.storage = storage
    plan.memory = {"planned_bytes": sum(buffers), "naive_bytes": naive, **_peak(plan, planned, last_use)}
    return decisions


def _donations(plan: KernelPlan, donated: frozenset[int], root: dict[int, int], last_use: dict[int, int],
               outputs: set[int], decisions: list[str]) -> dict[int, int]:
    """Output -> the donated parameter it is written over: in an elementwise step that is the
    parameter's last reader (no later step reads the old value), of the parameter's type, where the
    step reads the parameter only directly (a view of it, read through other indices, would see
    cells already overwritten). A donated parameter with no such output is named with the reason."""
    donations: dict[int, int] = {}
    for index, step in enumerate(plan.steps):
        if step.kind != "elementwise" or step.hoisted:
            continue
        for value in step.outputs:
            if value not in outputs:
                continue
            for param in step.inputs:
                if (param in donated and param not in donations.values() and last_use.get(param) == index
                        and plan.values[param] == plan.values[value]
                        and not any(root[other] == param for other in step.inputs if other != param)):
                    donations[value] = param
                    decisions.append(f"%{value} is written in place over the donated parameter "
                                     f"{plan.param_names[plan.params.index(param)]} in {step.name}")
                    break
    for param in plan.params:
        if param in donated and param not in donations.values():
            name = plan.param_names[plan.params.index(param)]
            reason = _kept_reason(plan, param, root, last_use.get(param))
            decisions.append(f"the donated parameter {name} is not updated in place ({reason}): "
                             "its update gets its own memory (the cubin runtime: feeding it back is one device-to-device copy)")
    return donations


def _kept_reason(plan: KernelPlan, param: int, root: dict[int, int], last: int | None) -> str:
    """Why a donated parameter is not written over, for the report."""
    if last is None:
        return "no step reads it"
    if last == len(plan.steps):
        return "it is returned"
    step = plan.steps[last]
    if step.kind != "elementwise":
        return f"its last reader {step.name} is a {step.kind} step, not an elementwise one"
    if any(root[other] == param for other in step.inputs if other != param):
        return f"its last reader {step.name} reads it through a view, at other cells than it writes"
    return f"its last reader {step.name} writes no returned output of its type"


def _peak(plan: KernelPlan, planned: list[int], last_use: dict[int, int]) -> dict[str, int | str]:
    """The static peak of temporary memory: the bytes of the values live at the worst step (from the
    step writing each to its last reader; a reused buffer holds one live value at a time, so this is
    also the live buffers' size there), and that step."""
    defined = {value: index for index, step in enumerate(plan.steps) for value in step.outputs}
    live = [0] * (len(plan.steps) + 1)
    for value in planned:
        first = defined[value]
        for index in range(first, max(first, last_use.get(value, first)) + 1):
            live[index] += value_bytes(plan, value)
    worst = max(range(len(plan.steps)), key=lambda index: live[index], default=0)
    return {"peak_bytes": live[worst] if plan.steps else 0,
            "peak_step": plan.steps[worst].name if plan.steps else ""}
