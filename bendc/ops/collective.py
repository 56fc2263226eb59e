"""Collective ops: the gradient all-reduce of data-parallel training.

``all_reduce[op=mean, group=world] %g`` is, on every rank, the reduction of that rank's ``%g``
with every other rank's (``sum``, or ``mean``: the sum over the world size). Its reference runs
the reduction in-process through the runtime's world (runtime/collective.py): the identity in a
process of one rank. Its VJP is the all-reduce of the gradient with the same op
(torch.distributed's autograd: y = sum_r x_r gives dL/dx_r = sum_s dL_s/dy).

Lowering (kind ``collective``): the plan splits each bucket of all-reduces (the ``bucket`` pass
groups them; ``bucket=N`` on the node) into a ``start`` step, placed as soon as the bucket's
gradients are final, and a ``wait`` step, placed just before the first reader of a reduced value.
The renderers below write both steps' modules: they name one runtime ``Bucket`` (the same key)
that packs, exchanges (non-blocking), reduces in a fixed rank order and unpacks.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from bendc.kernels.cuda_kit import Kernels
from bendc.ops.base import InferError, Lowering, define_op, require_float
from runtime.collective import reference_all_reduce

REDUCE_OPS = ("mean", "sum")
GROUPS = ("world",)


@dataclass(frozen=True)
class CollectiveStep:
    """What a collective renderer is given: one plan step of a bucket (or of one unbucketed
    all-reduce), its phase, the reduced tensors' shapes in message order, and the program's
    signature that the ranks compare at the first exchange."""

    name: str
    phase: str  # "start" (reads the gradients), "poll" (advances the message) or "wait" (writes the results)
    bucket: str  # the key both phases' modules name
    op: str
    shapes: tuple[tuple[int, ...], ...]
    signature: str

    @property
    def key(self) -> str:
        digest = hashlib.sha256(repr((self.bucket, self.op, self.shapes, self.signature)).encode()).hexdigest()
        return f"{self.bucket}-{digest[:12]}"

    @property
    def arguments(self) -> str:
        if self.phase == "poll":
            return ""
        prefix = "in" if self.phase == "start" else "out"
        return ", ".join(f"{prefix}{k}" for k in range(len(self.shapes)))


def _infer_all_reduce(types, attrs):
    (x,) = types
    require_float(types, "all_reduce")
    if attrs.get("op") not in REDUCE_OPS:
        raise InferError(f"all_reduce op={attrs.get('op')!r}: one of {', '.join(REDUCE_OPS)}")
    if attrs.get("group") not in GROUPS:
        raise InferError(f"all_reduce group={attrs.get('group')!r}: only 'world' (every rank)")
    return x


def _reference_all_reduce(values, attrs):
    return reference_all_reduce(values[0], attrs["op"])


def vjp_all_reduce(b, node, grad, needs):
    """d all_reduce(x, op) = all_reduce(g, op): torch.distributed's autograd for sum and mean."""
    return (b.emit("all_reduce", (grad,), op=node.attr["op"], group=node.attr["group"]),)


def _module(step: CollectiveStep) -> str:
    return (f"from runtime.collective import bucket\n\n"
            f"BUCKET = bucket({step.key!r}, {step.op!r}, {step.shapes!r},\n"
            f"                {step.signature!r})\n\n")


def _cpu_all_reduce(step: CollectiveStep) -> str:
    """A plain Python kernel (no numba): the runtime's bucket does the work on numpy buffers."""
    return _module(step) + f"\ndef kernel({step.arguments}):\n    BUCKET.{step.phase}({step.arguments})\n"


def _cuda_all_reduce(step: CollectiveStep) -> Kernels:
    """A host function over device arrays (no launch): the bucket hands them to a CUDA-aware
    backend as they are, or stages them through host memory."""
    source = f"\ndef host({step.arguments}):\n    BUCKET.{step.phase}({step.arguments})\n"
    return Kernels(f"all_reduce {step.phase} of {step.bucket} (host: {len(step.shapes)} tensors)", source, [],
                   prelude=_module(step))


define_op(
    name="all_reduce",
    arity=1,
    infer=_infer_all_reduce,
    reference=_reference_all_reduce,
    lowering=Lowering("collective", cpu=_cpu_all_reduce, cuda=_cuda_all_reduce),
    vjp=vjp_all_reduce,
    attr_names=("op", "group"),
    doc="`%1 = all_reduce[group=world, op=mean] %0 : f32[16,64]`: the sum (or mean) of %0 over every rank "
        "(MPI, runtime/collective.py); the `bucket` pass adds `bucket=N` (one message per bucket).",
)

