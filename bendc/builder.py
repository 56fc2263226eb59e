"""The one way nodes are made: the tracer and every VJP rule use a Builder.

``emit`` infers the result type through the op's definition and turns an
inference failure into a BendcError naming the user's line, the op the user
called and the operand types.
"""
from __future__ import annotations

from typing import Any, Sequence

from bendc.errors import ShapeError, SourceLoc, UnsupportedError
from bendc.ir.graph import Graph
from bendc.ir.types import TensorType
from bendc.ops import OPS
from bendc.ops.base import InferError, f32_value


class Builder:
    """Appends typed nodes to a graph, tagged with a source line."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.loc: SourceLoc | None = None
        self.vjp_of: int | None = None
        self.user_op: str | None = None  # the user's op name, for error messages

    def emit(self, op: str, inputs: Sequence[int], /, **attrs: Any) -> int:  # /: an attr may be named op
        opdef = OPS[op]
        types = [self.graph.node(i).type for i in inputs]
        try:
            if opdef.arity is not None and len(inputs) != opdef.arity:
                raise InferError(f"takes {opdef.arity} operands, got {len(inputs)}")
            result = opdef.infer(types, attrs)
        except InferError as error:
            shapes = ", ".join(str(t) for t in types)
            message = f"{error} (operands: {shapes})" if types else str(error)
            kind = UnsupportedError if error.unsupported else ShapeError
            raise kind(message, loc=self.loc, op=self.user_op or op) from None
        return self.graph.add(op, inputs, attrs, result, loc=self.loc, vjp_of=self.vjp_of).id

    def type(self, value: int) -> TensorType:
        return self.graph.node(value).type

    def shape(self, value: int) -> tuple[int, ...]:
        return self.graph.node(value).type.shape

    # ------------------------------------------------------------ sugar
    def const(self, value: float) -> int:
        return self.emit("const", (), value=f32_value(value))

    def add(self, a: int, b: int) -> int:
        return self.emit("add", (a, b))

    def sub(self, a: int, b: int) -> int:
        return self.emit("sub", (a, b))

    def mul(self, a: int, b: int) -> int:
        return self.emit("mul", (a, b))

    def div(self, a: int, b: int) -> int:
        return self.emit("div", (a, b))

    def neg(self, a: int) -> int:
        return self.emit("neg", (a,))

    def exp(self, a: int) -> int:
        return self.emit("exp", (a,))

    def le(self, a: int, b: int) -> int:
        return self.emit("le", (a, b))

    def where(self, cond: int, a: int, b: int) -> int:
        return self.emit("where", (cond, a, b))

    def sum(self, a: int, dims: Sequence[int], keepdim: bool) -> int:
        return self.emit("sum", (a,), dims=tuple(dims), keepdim=keepdim)

    def sum_to_size(self, a: int, shape: Sequence[int]) -> int:
        if self.shape(a) == tuple(shape):
            return a
        return self.emit("sum_to_size", (a,), shape=tuple(shape))

    def expand(self, a: int, shape: Sequence[int]) -> int:
        if self.shape(a) == tuple(shape):
            return a
        return self.emit("expand", (a,), shape=tuple(shape))

    def reshape(self, a: int, shape: Sequence[int]) -> int:
        return self.emit("reshape", (a,), shape=tuple(shape))

    def permute(self, a: int, perm: Sequence[int]) -> int:
        return self.emit("permute", (a,), perm=tuple(perm))

    def matmul(self, a: int, b: int) -> int:
        return self.emit("matmul", (a, b))
