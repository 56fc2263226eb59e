"""The verifier: run after every pass. A failure is an InternalError naming
the stage and the offending IR line."""
from __future__ import annotations

from bendc.errors import InternalError
from bendc.ir.graph import Graph
from bendc.ir.printer import format_node
from bendc.ops import OPS
from bendc.ops.base import InferError


def verify(graph: Graph, stage: str = "?", *, allow_placeholders: bool = True) -> None:
    """Check types, arity, acyclicity, that every use is defined, and outputs."""
    if not graph.is_acyclic():
        raise InternalError(f"after stage {stage!r}: the graph has a cycle")
    for node in graph.nodes():
        def fail(message: str) -> None:
            raise InternalError(f"after stage {stage!r}: {message}\n    {format_node(graph, node)}")

        opdef = OPS.get(node.op)
        if opdef is None:
            fail(f"unknown op {node.op!r}")
        for operand in node.inputs:
            if operand not in graph:
                fail(f"operand %{operand} is not defined")
        if opdef.arity is not None and len(node.inputs) != opdef.arity:
            fail(f"{node.op} takes {opdef.arity} operands, has {len(node.inputs)}")
        if opdef.lowering.kind == "placeholder" and not allow_placeholders:
            fail(f"{node.op} must be resolved by autodiff")
        types = [graph.node(i).type for i in node.inputs]
        try:
            inferred = opdef.infer(types, node.attr)
        except InferError as error:
            fail(f"type inference fails: {error}")
        if inferred != node.type:
            fail(f"type {node.type} differs from the inferred {inferred}")
    for output in graph.outputs:
        if output not in graph:
            raise InternalError(f"after stage {stage!r}: output %{output} is not defined")
    for param in graph.params:
        if graph.node(param).op != "param":
            raise InternalError(f"after stage {stage!r}: %{param} listed as a parameter")
    constants = graph.constant_params()
    if constants != graph.params[len(graph.params) - len(constants):]:
        raise InternalError(f"after stage {stage!r}: the lifted constants {constants} are not the last parameters")
