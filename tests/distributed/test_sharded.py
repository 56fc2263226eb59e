"""The sharded optimizer (``data_parallel="sharded"``, ZeRO-1) on 2, 3 and 4 ranks of this machine.

Each test runs tests/distributed/sharded_worker.py under ``mpiexec -n N`` with a timeout (a hang
fails the test). The worker checks, every step and on every rank, that the sharded step's
parameters are bit-identical to the unsharded ``data_parallel=True`` step's (SGD with momentum
and Adam, both with weight decay) and across the ranks, that the returned state is this rank's
shards, and that ``full_state`` of it is bit-identical to the unsharded state. Shards are uneven on
every world here (b1's 16 elements over 3 ranks: 6, 5, 5; b2's 3 over 2 and 4: 2, 1 and 1, 1, 1, 0).
RMSprop, Adagrad and Adadelta are checked the same way (scenario ``optimizers``).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mpi_launch import WORKER, run_ranks

SHARDED_WORKER = WORKER.with_name("sharded_worker.py")
SIZES = {"w1": 96, "b1": 16, "w2": 48, "b2": 3}
GRADIENT_BYTES = 4 * sum(SIZES.values())


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("sharded-cache"))


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sharded_steps_are_bit_identical_to_the_unsharded_step(ranks, cache_dir, tmp_path):
    result = run_ranks(ranks, [str(SHARDED_WORKER), "train", cache_dir, str(tmp_path)], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ir = (tmp_path / "bucket.ir").read_text()
    # the all-reduce is split around the optimizer: no all_reduce is left
    assert "all_reduce" not in ir and ir.count("reduce_scatter[") == 4 and ir.count("all_gather[") == 4
    assert f"reduce_scatter[bucket=0, group=\"world\", op=\"mean\", ranks={ranks}]" in ir
    padded = {name: math.ceil(n / ranks) for name, n in SIZES.items()}
    assert f": f32[{padded['w1']}]" in ir and f"shape=(16,6)] " in ir
    report = (tmp_path / "report.txt").read_text()
    assert "[bucket] bucket 0: 3 reduce_scatter" in report and "[bucket] bucket 1: 3 all_gather" in report
    assert f"per rank of {ranks}: " in report
    # SGD's momentum buffers of w1 and b1, Adam's two moments of w2 and b2, this rank's shards
    held = 4 * (padded["w1"] + padded["b1"] + 2 * (padded["w2"] + padded["b2"]))
    whole = 4 * (96 + 16 + 2 * (48 + 3))
    assert f"optimizer state per rank: {held} bytes in 6 shard arrays (unsharded: {whole} bytes; {ranks} ranks)" \
        in report
    traffics = json.loads((tmp_path / "traffic.json").read_text())
    for rank, traffic in enumerate(traffics):
        assert traffic["scheme"] == "sharded" and traffic["buckets"] == 4
        assert traffic["gradient_bytes"] == GRADIENT_BYTES
        # a rank sends the shards it does not own and its own updated shards to N-1 ranks
        own = sum(-(-n // ranks) if rank < n % ranks or n % ranks == 0 else n // ranks for n in SIZES.values())
        assert traffic["bytes_sent"] == traffic["bytes_received"] == 4 * ((sum(SIZES.values()) - own)
                                                                         + own * (ranks - 1))
        assert traffic["bytes_sent"] <= 2.1 * GRADIENT_BYTES
    saved = np.load(tmp_path / "params.npz")
    assert sorted(saved.files) == sorted(SIZES)


@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_rmsprop_adagrad_adadelta_are_bit_identical_to_the_unsharded_step(ranks, cache_dir, tmp_path):
    """RMSprop (momentum, centered, weight decay; and plain), Adagrad (lr_decay, weight decay, an initial
    accumulator) and Adadelta (weight decay), each on one parameter: every step's parameters are
    bit-identical to the unsharded step's and across the ranks, the state is this rank's shards, and
    full_state of it is bit-identical to the unsharded state (the worker checks; it fails the run)."""
    result = run_ranks(ranks, [str(SHARDED_WORKER), "optimizers", cache_dir, str(tmp_path)], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ir = (tmp_path / "bucket.ir").read_text()
    assert "all_reduce" not in ir and ir.count("reduce_scatter[") == 4 and ir.count("all_gather[") == 4
    padded = {name: math.ceil(n / ranks) for name, n in SIZES.items()}
    # rmsprop's three arrays of w1, one of b1, adagrad's sum of w2, adadelta's two arrays of b2
    held = 4 * (3 * padded["w1"] + padded["b1"] + padded["w2"] + 2 * padded["b2"])
    assert f"optimizer state per rank: {held} bytes in 7 shard arrays" in (tmp_path / "report.txt").read_text()


def test_a_rank_killed_mid_sharded_exchange_ends_the_job_with_a_message(cache_dir, tmp_path):
    """Rank 1 is killed (SIGKILL) on step 3 after its reduce-scatter, before its all-gather of the
    updated parameters, rank 0 waiting on that all-gather: mpiexec ends the job and names the kill,
    long before rank 0's own timeout (60 s); the run's own timeout (90 s) fails the test on a hang."""
    result = run_ranks(2, [str(SHARDED_WORKER), "killed", cache_dir, str(tmp_path)], timeout=90,
                       env={"BENDC_COLLECTIVE_TIMEOUT": "60"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "BAD TERMINATION" in output and "signal 9" in output, output
    assert not (tmp_path / "params.npz").exists()


# ------------------------------------------------------------------ one process (a world of 1)
def _one_process_step():
    import bendc
    import bendc.functional as F
    from bendc import tree

    def step(params, state, x):
        loss = F.linear(x, params["w"], params["b"]).sum()
        loss.backward()
        grads = tree.map(lambda p: p.grad, params)
        params, state = bendc.optim.adam(params, grads, state, lr=0.01)
        return loss, params, state

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    return step, params, rng.standard_normal((2, 4)).astype(np.float32)


def test_a_whole_state_under_sharding_is_an_error_naming_the_shard():
    import bendc
    from bendc.errors import BendcError

    step, params, x = _one_process_step()
    sharded = bendc.jit(step, leaves=("params",), target="reference", data_parallel="sharded")
    with pytest.raises(BendcError) as error:
        sharded(params, bendc.optim.init_adam(params), x)
    message = str(error.value)
    assert "state['exp_avg'] of a parameter f32[3,4] is this rank's shard f32[12], got f32[3,4]" in message
    assert "sharded=True" in message and "test_sharded.py" in message
    with pytest.raises(BendcError, match="data_parallel='shard'"):
        bendc.jit(step, data_parallel="shard")


@pytest.mark.parametrize("optimizer", ["rmsprop", "adagrad", "adadelta"])
def test_one_rank_sharded_rmsprop_adagrad_adadelta_match_the_unsharded_step(optimizer):
    """A world of one: two steps under sharding give the unsharded parameters and state bit for bit;
    a whole state is refused naming this optimizer's init function."""
    import bendc
    import bendc.distributed
    from bendc import tree
    from bendc.errors import BendcError

    update = {"rmsprop": lambda p, g, s: bendc.optim.rmsprop(p, g, s, lr=0.01, momentum=0.5, centered=True),
              "adagrad": lambda p, g, s: bendc.optim.adagrad(p, g, s, lr=0.1, lr_decay=0.1, weight_decay=0.1),
              "adadelta": lambda p, g, s: bendc.optim.adadelta(p, g, s, weight_decay=0.1)}[optimizer]
    init = {"rmsprop": lambda p, sharded: bendc.optim.init_rmsprop(p, 0.5, True, sharded=sharded),
            "adagrad": lambda p, sharded: bendc.optim.init_adagrad(p, 0.5, sharded=sharded),
            "adadelta": lambda p, sharded: bendc.optim.init_adadelta(p, sharded=sharded)}[optimizer]
    _, params, x = _one_process_step()

    def step(params, state, x):
        loss = bendc.functional.linear(x, params["w"], params["b"]).sum()
        loss.backward()
        return update(params, tree.map(lambda p: p.grad, params), state)

    sharded = bendc.jit(step, leaves=("params",), target="reference", data_parallel="sharded")
    plain = bendc.jit(step, leaves=("params",), target="reference", data_parallel=True)
    mine, state = dict(params), init(params, True)
    assert all(leaf.shape == (params[k].size,) for key, part in state.items() if key != "step"
               for k, leaf in part.items())
    want, want_state = dict(params), init(params, False)
    for _ in range(2):
        mine, state = sharded(mine, state, x)
        want, want_state = plain(want, want_state, x)
        assert all(np.array_equal(mine[k], want[k]) for k in params)
    whole = bendc.distributed.full_state(state, params)
    for key in want_state:
        assert all(np.array_equal(a, b) for a, b in zip(tree.flatten(whole[key])[0], tree.flatten(want_state[key])[0]))
    assert "all_gather" in sharded.ir("final") and "all_gather" not in plain.ir("final")
    with pytest.raises(BendcError, match=f"make the state with bendc.optim.init_{optimizer}"):
        sharded(params, init(params, False), x)


def test_one_rank_sharded_step_and_state_round_trip():
    """A world of one: the shard is the whole flat tensor; the step equals the unsharded one and
    full_state / shard_state turn the flat shards into the whole state and back."""
    import bendc
    import bendc.distributed

    step, params, x = _one_process_step()
    sharded = bendc.jit(step, leaves=("params",), target="cpu", data_parallel="sharded")
    plain = bendc.jit(step, leaves=("params",), target="cpu", data_parallel=True)
    state = bendc.optim.init_adam(params, sharded=True)
    assert state["exp_avg"]["w"].shape == (12,) and state["exp_avg_sq"]["b"].shape == (3,)
    _, new, state = sharded(params, state, x)
    _, want, want_state = plain(params, bendc.optim.init_adam(params), x)
    assert all(np.array_equal(new[k], want[k]) for k in params)
    whole = bendc.distributed.full_state(state, params)
    assert all(np.array_equal(whole["exp_avg"][k], want_state["exp_avg"][k]) for k in params)
    again = bendc.distributed.shard_state(whole, params)
    assert all(np.array_equal(again["exp_avg_sq"][k], state["exp_avg_sq"][k]) for k in params)
