"""Collective ops: the gradient all-reduce of data-parallel training, and the reduce-scatter and
all-gather of its sharded optimizer.

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

``jit(..., data_parallel="sharded")`` (ZeRO-1) splits the all-reduce around the optimizer:
``reduce_scatter[op=mean, group=world, ranks=N] %g : f32[P]`` is this rank's shard of the
reduction of ``%g`` (flat, the elements ``shard_counts`` gives it, padded with zeros to
P = ceil(numel / N) so that every rank's program has the same types); the optimizer updates that
shard only; ``all_gather[op=concat, group=world, ranks=N, shape=S] %s : f32[S]`` is the tensor
whose shard on each rank is that rank's ``%s`` (its padding dropped). Both are collectives: the
``bucket`` pass groups each kind apart, and the runtime's ``ShardBucket`` moves them.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from bendc.kernels.cuda_kit import Kernels
from bendc.ops.base import InferError, Lowering, define_op, require_float
from runtime.collective import (CollectiveError, reference_all_gather, reference_all_reduce,
                                reference_reduce_scatter, shard_size, world)

REDUCE_OPS = ("mean", "sum")
GATHER_OPS = ("concat",)
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



# ------------------------------------------------------------------ the sharded optimizer's halves
def _require_ranks(attrs, op: str) -> int:
    ranks = attrs.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise InferError(f"{op} ranks={ranks!r}: the world size the step is traced for (an int >= 1)")
    if attrs.get("group") not in GROUPS:
        raise InferError(f"{op} group={attrs.get('group')!r}: only 'world' (every rank)")
    return ranks


def _infer_reduce_scatter(types, attrs):
    (x,) = types
    require_float(types, "reduce_scatter")
    if attrs.get("op") not in REDUCE_OPS:
        raise InferError(f"reduce_scatter op={attrs.get('op')!r}: one of {', '.join(REDUCE_OPS)}")
    ranks = _require_ranks(attrs, "reduce_scatter")
    return x.with_shape((shard_size(x.numel, ranks),))


def _check_world(attrs, op: str) -> None:
    """The reference runs in the world the step was traced for (the shard sizes depend on it)."""
    size = world().size
    if size != attrs["ranks"]:
        raise CollectiveError(f"{op} traced for {attrs['ranks']} ranks runs in a world of {size}: trace the step "
                              "again in this world")


def _reference_reduce_scatter(values, attrs):
    _check_world(attrs, "reduce_scatter")
    return reference_reduce_scatter(values[0], attrs["op"])


def vjp_reduce_scatter(b, node, grad, needs):
    """d reduce_scatter(x, sum) = all_gather(g) (each owner's gradient to every rank); mean: / N."""
    x = node.inputs[0]
    gathered = b.emit("all_gather", (grad,), op="concat", group=node.attr["group"], ranks=node.attr["ranks"],
                      shape=b.shape(x))
    if node.attr["op"] == "mean":
        gathered = b.div(gathered, b.const(float(node.attr["ranks"])))
    return (gathered,)


def _infer_all_gather(types, attrs):
    (x,) = types
    require_float(types, "all_gather")
    if attrs.get("op") not in GATHER_OPS:
        raise InferError(f"all_gather op={attrs.get('op')!r}: 'concat' (the ranks' shards in rank order)")
    ranks = _require_ranks(attrs, "all_gather")
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or any(not isinstance(d, int) or d < 0 for d in shape):
        raise InferError(f"all_gather shape={shape!r}: the gathered tensor's shape (non-negative ints)")
    shape = tuple(shape)
    total = 1
    for size in shape:
        total *= size
    if x.shape != (shard_size(total, ranks),):
        raise InferError(f"all_gather of {x} into [{','.join(map(str, shape))}] on {ranks} ranks needs a padded "
                         f"shard f32[{shard_size(total, ranks)}]")
    return x.with_shape(shape)


def _reference_all_gather(values, attrs):
    _check_world(attrs, "all_gather")
    return reference_all_gather(values[0], attrs["shape"])


def vjp_all_gather(b, node, grad, needs):
    """d all_gather(s) = reduce_scatter(g, sum): every rank's gradient of the owner's shard, summed."""
    return (b.emit("reduce_scatter", (grad,), op="sum", group=node.attr["group"], ranks=node.attr["ranks"]),)


def _shard_module(step: CollectiveStep, kind: str) -> str:
    return (f"from runtime.collective import shard_bucket\n\n"
            f"BUCKET = shard_bucket({step.key!r}, {kind!r}, {step.op!r}, {step.shapes!r},\n"
            f"                      {step.signature!r})\n\n")


def _shard_renderers(kind: str):
    """The cpu and cuda renderers of one of the sharded optimizer's collectives."""
    def cpu(step: CollectiveStep) -> str:
        return _shard_module(step, kind) + f"\ndef kernel({step.arguments}):\n    BUCKET.{step.phase}({step.arguments})\n"

    def cuda(step: CollectiveStep) -> Kernels:
        source = f"\ndef host({step.arguments}):\n    BUCKET.{step.phase}({step.arguments})\n"
        return Kernels(f"{kind} {step.phase} of {step.bucket} (host: {len(step.shapes)} tensors, staged through "
                       "host memory)", source, [], prelude=_shard_module(step, kind))

    cpu.__doc__ = f"A plain Python kernel over the runtime's {kind} bucket (numpy buffers)."
    cuda.__doc__ = f"A host function over device arrays: the {kind} bucket stages them through host memory."
    return cpu, cuda


_rs_cpu, _rs_cuda = _shard_renderers("reduce_scatter")
_ag_cpu, _ag_cuda = _shard_renderers("all_gather")

define_op(
    name="reduce_scatter",
    arity=1,
    infer=_infer_reduce_scatter,
    reference=_reference_reduce_scatter,
    lowering=Lowering("collective", cpu=_rs_cpu, cuda=_rs_cuda),
    vjp=vjp_reduce_scatter,
    attr_names=("op", "group", "ranks"),
    doc="`%1 = reduce_scatter[group=world, op=mean, ranks=2] %0 : f32[512]`: this rank's shard of the sum (or "
        "mean) of %0 over every rank, flat, padded with zeros to ceil(numel / ranks) (data_parallel=\"sharded\").",
)

define_op(
    name="all_gather",
    arity=1,
    infer=_infer_all_gather,
    reference=_reference_all_gather,
    lowering=Lowering("collective", cpu=_ag_cpu, cuda=_ag_cuda),
    vjp=vjp_all_gather,
    attr_names=("op", "group", "ranks", "shape"),
    doc="`%2 = all_gather[group=world, op=concat, ranks=2, shape=(16,64)] %1 : f32[16,64]`: every rank's "
        "padded shard %1 (its own elements) joined in rank order (data_parallel=\"sharded\").",
)
