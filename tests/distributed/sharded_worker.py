"""One rank of a sharded-optimizer test (tests/distributed/test_sharded.py runs it under mpiexec).

    sharded_worker.py SCENARIO CACHE_DIR OUT_DIR

``train``: three steps of a tiny MLP whose first layer is updated by SGD (momentum, weight decay)
and second by Adam (L2 weight decay), each rank on its shard of a fixed global batch, once under
``data_parallel="sharded"`` and once under ``data_parallel=True``. After every step the sharded
parameters must be bit-identical to the unsharded ones and across the ranks; the state the sharded
step returns must be this rank's shards (ceil(n / N) elements each), and after the last step
``full_state`` of it bit-identical to the unsharded state. Rank 0 writes the report, the IR after
the bucket pass and every rank's traffic of the sharded step (traffic.json). ``killed``: rank 1 is
killed (SIGKILL) on step 3 in the middle of the sharded exchange, its reduce-scatter done and its
all-gather not started. ``optimizers``: the checks of ``train`` with RMSprop (momentum, centered,
weight decay) on the first layer's weight, plain RMSprop on its bias, Adagrad (lr_decay, weight
decay, an initial accumulator) on the second layer's weight and Adadelta (weight decay) on its
bias.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

import bendc
import bendc.distributed
import bendc.functional as F
from bendc import tree

GLOBAL_BATCH, FEATURES, HIDDEN, OUTPUTS, STEPS = 24, 6, 16, 3, 3  # 24 rows: 1, 2, 3 or 4 ranks


def step(params, sgd_state, adam_state, x, y):
    h = F.relu(F.linear(x, params["w1"], params["b1"]))
    loss = F.mse_loss(F.linear(h, params["w2"], params["b2"]), y)
    loss.backward()
    grads = tree.map(lambda p: p.grad, params)
    first = {"w1": params["w1"], "b1": params["b1"]}
    second = {"w2": params["w2"], "b2": params["b2"]}
    first, sgd_state = bendc.optim.sgd(first, {k: grads[k] for k in first}, sgd_state, lr=0.1, momentum=0.9,
                                       weight_decay=0.01)
    second, adam_state = bendc.optim.adam(second, {k: grads[k] for k in second}, adam_state, lr=0.01,
                                          weight_decay=0.01)
    return loss, {**first, **second}, sgd_state, adam_state


def step_other_optimizers(params, w1_state, b1_state, w2_state, b2_state, x, y):
    h = F.relu(F.linear(x, params["w1"], params["b1"]))
    loss = F.mse_loss(F.linear(h, params["w2"], params["b2"]), y)
    loss.backward()
    grads = tree.map(lambda p: p.grad, params)

    def one(name):
        return {name: params[name]}, {name: grads[name]}

    w1, w1_state = bendc.optim.rmsprop(*one("w1"), w1_state, lr=0.01, momentum=0.9, centered=True, weight_decay=0.01)
    b1, b1_state = bendc.optim.rmsprop(*one("b1"), b1_state, lr=0.01)
    w2, w2_state = bendc.optim.adagrad(*one("w2"), w2_state, lr=0.1, lr_decay=0.01, weight_decay=0.01)
    b2, b2_state = bendc.optim.adadelta(*one("b2"), b2_state, weight_decay=0.01)
    return loss, {**w1, **b1, **w2, **b2}, w1_state, b1_state, w2_state, b2_state


def optimizer_states(scenario: str, params, sharded: bool) -> tuple[list, list[tuple[str, ...]]]:
    """The step's optimizer states (whole, or this rank's shards) and the parameters each one updates."""
    if scenario == "optimizers":
        groups = [("w1",), ("b1",), ("w2",), ("b2",)]
        w1, b1, w2, b2 = ({name: params[name]} for (name,) in groups)
        return [bendc.optim.init_rmsprop(w1, momentum=0.9, centered=True, sharded=sharded),
                bendc.optim.init_rmsprop(b1, sharded=sharded),
                bendc.optim.init_adagrad(w2, initial_accumulator_value=0.1, sharded=sharded),
                bendc.optim.init_adadelta(b2, sharded=sharded)], groups
    first, second = split(params)
    return [bendc.optim.init_sgd(first, 0.9, sharded=sharded), bendc.optim.init_adam(second, sharded=sharded)], \
        [("w1", "b1"), ("w2", "b2")]


def problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((GLOBAL_BATCH, FEATURES)).astype(np.float32)
    y = rng.standard_normal((GLOBAL_BATCH, OUTPUTS)).astype(np.float32)
    shapes = {"w1": (HIDDEN, FEATURES), "b1": (HIDDEN,), "w2": (OUTPUTS, HIDDEN), "b2": (OUTPUTS,)}
    params = {name: rng.standard_normal(shape).astype(np.float32) * 0.5 for name, shape in shapes.items()}
    return x, y, params


def split(params):
    return {k: params[k] for k in ("w1", "b1")}, {k: params[k] for k in ("w2", "b2")}


def main() -> int:
    scenario, cache_dir, out_dir = sys.argv[1:4]
    rank, size = bendc.distributed.init()
    from mpi4py import MPI
    from runtime import collective

    def jitted(mode):
        # bucket_mb small enough that the reduce-scatters make two buckets
        return bendc.jit(step_other_optimizers if scenario == "optimizers" else step, leaves=("params",),
                         target="cpu", cache_dir=cache_dir, data_parallel=mode, bucket_mb=0.0003)

    sharded_step, plain_step = jitted("sharded"), jitted(True)
    x, y, params = problem()
    rows = GLOBAL_BATCH // size
    xs, ys = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
    states, groups = optimizer_states(scenario, params, sharded=True)
    sharded = (dict(params), *states)
    plain = (dict(params), *optimizer_states(scenario, params, sharded=False)[0])
    for number in range(1, STEPS + 1):
        if scenario == "killed" and rank == 1 and number == 3:
            original = collective.ShardBucket.start

            def killed(self, *values):
                if self.kind == "all_gather":
                    os.kill(os.getpid(), signal.SIGKILL)
                original(self, *values)

            collective.ShardBucket.start = killed
        if number == STEPS:
            collective.world().traffic.clear()
        _, *sharded = sharded_step(*sharded, xs, ys)
        if scenario == "killed":
            continue
        traffic = bendc.distributed.traffic()
        _, *plain = plain_step(*plain, xs, ys)
        for name in params:
            if not np.array_equal(sharded[0][name], plain[0][name]):
                raise AssertionError(f"step {number}: rank {rank}'s sharded {name} differs from the unsharded step")
        gathered = MPI.COMM_WORLD.allgather(b"".join(np.ascontiguousarray(sharded[0][k]).tobytes() for k in params))
        if any(other != gathered[0] for other in gathered):
            raise AssertionError(f"step {number}: the ranks' parameters differ")
        for state in sharded[1:]:
            for key, value in state.items():
                if key != "step":
                    for name, leaf in value.items():
                        want = (-(-params[name].size // size),)
                        if leaf.shape != want:
                            raise AssertionError(f"state {key}[{name}] is {leaf.shape}, the shard is {want}")
    if scenario == "killed":
        return 0
    for mine, reference, names in zip(sharded[1:], plain[1:], groups):
        whole = bendc.distributed.full_state(mine, {name: sharded[0][name] for name in names})
        for key in reference:
            got, want = tree.flatten(whole[key])[0], tree.flatten(reference[key])[0]
            if not all(np.array_equal(g, w) for g, w in zip(got, want)):
                raise AssertionError(f"full_state {key} differs from the unsharded state")
    traffics = MPI.COMM_WORLD.allgather(traffic)
    if rank == 0:
        with open(os.path.join(out_dir, "traffic.json"), "w") as stream:
            json.dump(traffics, stream)
        with open(os.path.join(out_dir, "report.txt"), "w") as stream:
            stream.write(sharded_step.report())
        with open(os.path.join(out_dir, "bucket.ir"), "w") as stream:
            stream.write(sharded_step.ir("bucket"))
        np.savez(os.path.join(out_dir, "params.npz"), **sharded[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
