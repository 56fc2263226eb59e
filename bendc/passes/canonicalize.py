"""Canonicalization: local rewrites that keep PyTorch's bits.

Each rule is a small function with a one-line docstring; it returns the id of
the value that replaces the node, or None when it does not match. The pass
runs the rules to a fixed point, bounded.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from bendc.builder import Builder
from bendc.errors import InternalError
from bendc.ir.graph import Graph, Node
from bendc.ops import OPS
from bendc.passes.dce import remove_dead
from bendc.passes.manager import PassContext, register

MAX_ROUNDS = 50

Rule = Callable[[Graph, Builder, Node], "int | None"]


def _const_value(graph: Graph, id: int) -> float | None:
    node = graph.node(id)
    return node.attr["value"] if node.op == "const" else None


def _same_bits(a: float | None, b: float) -> bool:
    return a is not None and np.float32(a).tobytes() == np.float32(b).tobytes()


def fold_constants(graph: Graph, b: Builder, node: Node) -> int | None:
    """Fold a scalar float op whose operands are all constants into one const."""
    if node.op == "const" or not node.inputs or node.type.shape != () or not node.type.is_float:
        return None
    operands = [graph.node(i) for i in node.inputs]
    if any(o.op != "const" for o in operands):
        return None
    values = [np.array(o.attr["value"], dtype=np.float32) for o in operands]
    result = np.asarray(OPS[node.op].reference(values, node.attr), dtype=np.float32)
    return b.const(float(result))


def fold_mul_by_one(graph: Graph, b: Builder, node: Node) -> int | None:
    """x * 1 -> x (and 1 * x), where the shapes agree (x + 0 stays: -0.0 + 0.0 is +0.0)."""
    if node.op != "mul":
        return None
    for mine, other in (node.inputs, reversed(node.inputs)):
        if _same_bits(_const_value(graph, other), 1.0) and graph.node(mine).type == node.type:
            return mine
    return None


def fold_div_by_one(graph: Graph, b: Builder, node: Node) -> int | None:
    """x / 1 -> x."""
    if node.op == "div" and _same_bits(_const_value(graph, node.inputs[1]), 1.0):
        if graph.node(node.inputs[0]).type == node.type:
            return node.inputs[0]
    return None


def fold_double_negation(graph: Graph, b: Builder, node: Node) -> int | None:
    """neg(neg(x)) -> x."""
    if node.op == "neg":
        inner = graph.node(node.inputs[0])
        if inner.op == "neg":
            return inner.inputs[0]
    return None


def fold_identity_layout(graph: Graph, b: Builder, node: Node) -> int | None:
    """reshape/expand/sum_to_size to the operand's own shape, identity permute -> operand."""
    if node.op in ("reshape", "expand", "sum_to_size"):
        if graph.node(node.inputs[0]).type == node.type:
            return node.inputs[0]
    if node.op == "permute" and node.attr["perm"] == tuple(range(node.type.ndim)):
        return node.inputs[0]
    if node.op == "sum" and not node.attr["dims"] and graph.node(node.inputs[0]).type == node.type:
        return node.inputs[0]
    return None


def fold_detach(graph: Graph, b: Builder, node: Node) -> int | None:
    """detach(x) -> x: the gradients are built before passes run, so a detach only copies."""
    return node.inputs[0] if node.op == "detach" else None


def fold_permute_chain(graph: Graph, b: Builder, node: Node) -> int | None:
    """permute(permute(x, p), q) -> permute(x, p∘q), or x when that is the identity."""
    if node.op != "permute":
        return None
    inner = graph.node(node.inputs[0])
    if inner.op != "permute":
        return None
    perm = tuple(inner.attr["perm"][q] for q in node.attr["perm"])
    if perm == tuple(range(len(perm))):
        return inner.inputs[0]
    return b.permute(inner.inputs[0], perm)


def fold_reshape_chain(graph: Graph, b: Builder, node: Node) -> int | None:
    """reshape(reshape(x)) -> reshape(x), or x when shapes agree."""
    if node.op != "reshape":
        return None
    inner = graph.node(node.inputs[0])
    if inner.op != "reshape":
        return None
    source = inner.inputs[0]
    if graph.node(source).type == node.type:
        return source
    return b.reshape(source, node.type.shape)


def transpose_matmul_result(graph: Graph, b: Builder, node: Node) -> int | None:
    """swap(matmul(a, c)) -> matmul(swap(c), swap(a)): write the product in the layout that is used."""
    if node.op != "permute" or node.type.ndim < 2:
        return None
    swap = tuple(range(node.type.ndim - 2)) + (node.type.ndim - 1, node.type.ndim - 2)
    inner = graph.node(node.inputs[0])
    if node.attr["perm"] != swap or inner.op != "matmul" or len(graph.users(inner.id)) != 1:
        return None
    if inner.id in graph.outputs:
        return None
    a, c = inner.inputs
    if graph.node(a).type.ndim != node.type.ndim or graph.node(c).type.ndim != node.type.ndim:
        return None  # broadcast batch dims: keep the product as written
    return b.matmul(b.permute(c, swap), b.permute(a, swap))


def fold_batched_weight_gradient(graph: Graph, b: Builder, node: Node) -> int | None:
    """sum over batch of matmul(swap(x), c) -> one matmul of x and c with the batch folded into rows."""
    # A linear layer's weight gradient on (batch, t, features) inputs: one (m, rows) @ (rows, n)
    # BLAS call instead of a batched product and a sum over its batch (another summation order:
    # the product is not bit-exact either way).
    if node.op != "sum_to_size" or node.type.ndim != 2:
        return None
    product = graph.node(node.inputs[0])
    if product.op != "matmul" or len(graph.users(product.id)) != 1 or product.id in graph.outputs:
        return None
    ndim = product.type.ndim
    if ndim < 3 or product.type.shape[-2:] != node.type.shape:
        return None
    swapped, right = (graph.node(i) for i in product.inputs)
    swap = tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)
    if swapped.op != "permute" or swapped.attr["perm"] != swap or graph.node(right.id).type.ndim != ndim:
        return None
    left = graph.node(swapped.inputs[0])  # (*batch, t, m)
    if left.type.shape[:-2] != right.type.shape[:-2]:
        return None  # broadcast batch dims
    rows = 1
    for size in left.type.shape[:-1]:
        rows *= size
    flat_left = b.reshape(left.id, (rows, left.type.shape[-1]))
    flat_right = b.reshape(right.id, (rows, right.type.shape[-1]))
    return b.matmul(b.permute(flat_left, (1, 0)), flat_right)


def _add_leaves(graph: Graph, node: Node, root: bool = True) -> list[int]:
    """The operands of a tree of adds of one type (inner adds used only by the tree)."""
    if node.op != "add" or (not root and (len(graph.users(node.id)) != 1 or node.id in graph.outputs)):
        return [node.id]
    if any(graph.node(i).type != node.type for i in node.inputs) or node.inputs[0] == node.inputs[1]:
        return [node.id]
    return [leaf for i in node.inputs for leaf in _add_leaves(graph, graph.node(i), root=False)]


def _slice_part(shape: tuple[int, ...], spec) -> tuple[int, int, int] | None:
    """(axis, start, stop) where ``spec`` slices one axis by step 1 and keeps the others whole."""
    cut = None
    for axis, entry in enumerate(spec):
        if isinstance(entry, int) or entry[2] != 1:
            return None
        if (entry[0], entry[1]) != (0, shape[axis]):
            if cut is not None:
                return None
            cut = (axis, entry[0], entry[1])
    return cut


def concat_tiling_scatters(graph: Graph, b: Builder, node: Node) -> int | None:
    """Sum of index_scatters whose slices tile the tensor along one axis -> concat(part, ...) + 0 (no + 0: a split)."""
    # The gradient of q/k/v slices of one projection: each part written once, no zero-filled
    # full-size scatters and adds. + 0 keeps the bits: -0.0 + 0.0 is +0.0, as the scatters gave and as
    # torch's gradient of slices gives (its slice_backward's zeros, added); one add after the concat
    # (one kernel, and the parts stay what concat_of_merged_reshapes reads). The pieces of one split
    # call (each scatter's ``split``, every piece present) are torch's split_backward: a cat, -0.0 kept
    # (gpt_small's split q/k/v: an add over the (B, T, 3C) gradient a layer saved).
    if node.op != "add":
        return None
    leaves = _add_leaves(graph, node)
    if len(leaves) < 2 or len(set(leaves)) != len(leaves):
        return None
    parts = []
    for leaf in leaves:
        scatter = graph.node(leaf)
        if scatter.op != "index_scatter" or scatter.type != node.type or len(graph.users(leaf)) != 1 \
                or leaf in graph.outputs:
            return None
        part = _slice_part(node.type.shape, scatter.attr["spec"])
        if part is None:
            return None
        parts.append((part, scatter.inputs[0]))
    parts.sort(key=lambda item: item[0][1])
    axis = parts[0][0][0]
    position = 0
    for (part_axis, start, stop), _ in parts:
        if part_axis != axis or start != position:
            return None
        position = stop
    if position != node.type.shape[axis]:
        return None
    concat = b.emit("concat", tuple(g for _, g in parts), axis=axis)
    splits = {graph.node(leaf).attr.get("split") for leaf in leaves}
    return concat if len(splits) == 1 and None not in splits else b.add(concat, b.const(0.0))


def concat_of_merged_reshapes(graph: Graph, b: Builder, node: Node) -> int | None:
    """concat of reshapes merging each operand's axes from the last axis on -> reshape(concat(operands))."""
    # concat[axis=2](reshape(p_i, (B, T, H_i * D))) with p_i (B, T, H_i, D) is the (B, T, sum H_i, D)
    # concat of the p_i, viewed (B, T, sum H_i * D): the attention gradients' heads (B, H, T, D)
    # transposed to the projection's layout were each copied by their reshape, then again by the
    # concat; now the concat reads them through their strides, once.
    if node.op != "concat" or node.attr["axis"] != node.type.ndim - 1:
        return None
    axis, sources = node.attr["axis"], []
    for operand in node.inputs:
        reshape = graph.node(operand)
        if reshape.op != "reshape" or len(graph.users(operand)) != 1 or operand in graph.outputs:
            return None
        shape = graph.node(reshape.inputs[0]).type.shape
        if len(shape) < axis + 2 or shape[:axis] != node.type.shape[:axis]:
            return None
        sources.append((reshape.inputs[0], shape))
    if len({shape[axis + 1:] for _, shape in sources}) != 1:
        return None
    return b.reshape(b.emit("concat", tuple(source for source, _ in sources), axis=axis), node.type.shape)


RULES: tuple[Rule, ...] = (
    fold_constants,
    fold_mul_by_one,
    fold_div_by_one,
    fold_double_negation,
    fold_identity_layout,
    fold_detach,
    fold_permute_chain,
    fold_reshape_chain,
    transpose_matmul_result,
    concat_tiling_scatters,
    concat_of_merged_reshapes,
    fold_batched_weight_gradient,
)


@register("canonicalize", "Constant folding, x*1 -> x, identity layouts, permute/reshape chains, "
                          "tiling scatters -> concat, batched weight gradients -> one product.")
def canonicalize(graph: Graph, context: PassContext) -> Graph:
    b = Builder(graph)
    counts: dict[str, int] = {}
    for _ in range(MAX_ROUNDS):
        changed = False
        for id in graph.order():
            if id not in graph:
                continue
            node = graph.node(id)
            for rule in RULES:
                b.loc, b.vjp_of = node.loc, node.vjp_of
                replacement = rule(graph, b, node)
                if replacement is None or replacement == id:
                    continue
                graph.replace_uses(id, replacement)
                counts[rule.__name__] = counts.get(rule.__name__, 0) + 1
                changed = True
                break
        remove_dead(graph)
        if not changed:
            break
    else:
        raise InternalError(f"canonicalize: no fixed point after {MAX_ROUNDS} rounds")
    for name, count in sorted(counts.items()):
        context.decide("canonicalize", f"{name}: {count} rewrites ({globals()[name].__doc__})")
    return graph

