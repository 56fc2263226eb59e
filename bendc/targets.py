"""From the final graph to something that runs, per target.

``reference`` interprets the graph with numpy. ``cpu`` builds the kernel
plan, renders each step to source (codegen), writes and imports the kernel
modules, plans memory, and binds the plan in the runtime.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from bendc.codegen.cache import default_cache_dir, kernel_path, load_module, write_kernel
from bendc.codegen.cpu import render_plan
from bendc.codegen.memory import plan_memory
from bendc.codegen.plan import KernelPlan, build_plan, describe_plan
from bendc.errors import RuntimeCheckError
from bendc.ir.graph import Graph
from bendc.ir.interp import Interpreter
from runtime.cpu import CpuProgram, KernelError


@dataclass
class Built:
    """What a target made of a graph."""

    run: Callable[[Sequence[np.ndarray]], list]
    kernels: dict[str, str] = field(default_factory=dict)
    report: list[str] = field(default_factory=list)
    plan: KernelPlan | None = None


def build_reference(graph: Graph) -> Built:
    interpreter = Interpreter(graph)
    aliases = set(graph.params)

    def run(inputs: Sequence[np.ndarray]) -> list:
        results = interpreter.run(inputs)
        # An output that is a parameter (or a view of one) must not alias the caller's array.
        return [np.array(r) if (o in aliases or r.base is not None) else r
                for o, r in zip(graph.outputs, results)]

    return Built(run)


def build_cpu(graph: Graph, cache_dir: str | None = None) -> Built:
    cache_dir = cache_dir or default_cache_dir()
    plan = build_plan(graph)
    render_plan(plan, graph)
    decisions = plan_memory(plan)
    kernels = {}
    for step in plan.steps:
        step.module = write_kernel(cache_dir, step.source)
        kernels[step.name] = load_module(kernel_path(cache_dir, step.module), step.module).kernel
    program = CpuProgram(plan.to_json(), kernels)
    steps = {step.name: step for step in plan.steps}

    def run(inputs: Sequence[np.ndarray]) -> list:
        try:
            return program.run(inputs)
        except KernelError as error:
            node = graph.node(steps[error.step].nodes[0])
            raise RuntimeCheckError(error.message.split(": ", 1)[-1], loc=node.loc, op=node.op) from None

    report = describe_plan(plan) + [f"memory: {d}" for d in decisions]
    return Built(run, {s.name: s.source for s in plan.steps}, report, plan)


def build(target: str, graph: Graph, cache_dir: str | None) -> Built:
    if target == "reference":
        return build_reference(graph)
    if target == "cpu":
        return build_cpu(graph, cache_dir)
    raise AssertionError(f"no builder for target {target}")
