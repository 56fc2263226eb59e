"""The all-reduce in one process: the op, the bucket pass, the plan's start and wait steps, the
runtime's bucket over a two-rank mirror world, the timeout. No MPI needed (mpiexec tests:
test_distributed.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as F
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from runtime import collective


def _rng(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def mlp_step(x, y, w1, b1, w2, b2):
    h = F.relu(F.linear(x, w1, b1))
    loss = F.mse_loss(F.linear(h, w2, b2), y)
    loss.backward()
    return loss, w1 - 0.1 * w1.grad, b1 - 0.1 * b1.grad, w2 - 0.1 * w2.grad, b2 - 0.1 * b2.grad


ARGS = [_rng(s, k) for k, s in enumerate(((4, 6), (4, 3), (16, 6), (16,), (3, 16), (3,)))]
LEAVES = ("w1", "b1", "w2", "b2")


class MirrorBackend(collective.Backend):
    """Rank 0 of a world of ``size`` where every rank sends the same message (an in-process test
    of packing, exchange, rank-ordered reduction and unpacking). The all-gather of the reduced
    shards gives the other owners' shards as they would reduce them (with ``op``): each the
    rank-ordered reduction of ``size`` copies of its run of the last message scattered."""

    name = "mirror"
    rank = 0

    def __init__(self, size: int = 2, op: str = "mean") -> None:
        self.size = size
        self.op = op
        self.exchanges = 0
        self.scattered = None

    def start_allgather(self, send, receive):
        self.exchanges += 1
        receive[:] = send
        return None

    def start_allreduce_sum(self, buffer):
        buffer *= self.size
        return None

    def start_alltoallv(self, send, send_counts, receive, receive_counts):
        self.exchanges += 1
        self.scattered = (send.copy(), list(send_counts))
        receive[:] = send[:send_counts[0]]  # every rank's run for rank 0 is the same
        return None

    def start_allgatherv(self, send, receive, counts):
        self.exchanges += 1
        message, runs = self.scattered
        starts = collective.displacements(counts)
        receive[:counts[0]] = send
        for owner in range(1, self.size):
            copies = np.tile(message[starts[owner]:starts[owner] + runs[owner]], (self.size, 1))
            collective.ordered_reduce(copies, self.op, self.size,
                                      receive[starts[owner]:starts[owner] + counts[owner]])
        return None

    def test(self, handle):
        return True


class StuckBackend(MirrorBackend):
    """A world whose other rank never answers."""

    def test(self, handle):
        return False


@pytest.fixture
def world():
    """Sets the process's world for one test, then puts back a local one."""
    def use(backend):
        return collective.use_world(backend)

    yield use
    collective.use_world(collective.LocalBackend())


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_all_reduce_on_one_rank_is_the_identity_with_torch_gradients(target, tmp_path):
    def step(x, w):
        loss = (F.all_reduce(x * w, op="sum") * F.all_reduce(w, op="mean")).sum()
        loss.backward()
        return loss, w.grad

    x, w = _rng((2, 3), 0), _rng((2, 3), 1)
    loss, grad = bendc.jit(step, leaves=("w",), target=target, cache_dir=str(tmp_path))(x, w)
    tw = torch.from_numpy(w.copy()).requires_grad_()
    want = (torch.from_numpy(x) * tw * tw).sum()
    want.backward()
    np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(grad, tw.grad.numpy())  # + - * only: bit-exact


def test_an_unknown_reduce_op_names_the_line(tmp_path):
    def step(x):
        return F.all_reduce(x, op="max")

    with pytest.raises(bendc.BendcError, match=r"test_collective.py:\d+.*all_reduce op='max'"):
        bendc.jit(step, target="reference")(ARGS[0])


def test_data_parallel_on_one_rank_is_bit_identical_to_the_plain_step(tmp_path):
    plain = bendc.jit(mlp_step, leaves=LEAVES, target="cpu", cache_dir=str(tmp_path))(*ARGS)
    parallel_step = bendc.jit(mlp_step, leaves=LEAVES, target="cpu", cache_dir=str(tmp_path), data_parallel=True)
    parallel = parallel_step(*ARGS)
    for got, want in zip(parallel, plain):
        np.testing.assert_array_equal(got, want)
    final = parallel_step.ir("final")
    assert final.count("all_reduce[bucket=0, group=\"world\", op=\"mean\"]") == 4  # one message for all
    assert format_graph(parse_graph(final)) == final  # printed IR parses back


def test_the_bucket_cap_splits_messages_and_the_report_gives_their_sizes(tmp_path):
    step = bendc.jit(mlp_step, leaves=LEAVES, target="cpu", cache_dir=str(tmp_path), data_parallel=True,
                     bucket_mb=0.0005)  # 524 bytes: w1's gradient (384 bytes) does not fit beside the others
    step(*ARGS)
    report = step.report()
    assert "[bucket] bucket 0: 3 all_reduce" in report and "268 bytes in one message (cap 524 bytes)" in report
    assert "[bucket] bucket 1: 1 all_reduce" in report and "opens bucket 1: it would pass the 524 bytes cap" in report
    default = bendc.jit(mlp_step, leaves=LEAVES, target="reference", data_parallel=True)
    default(*ARGS)
    assert "(cap 25.00 MiB)" in default.report()  # DistributedDataParallel's bucket_cap_mb


def test_each_bucket_starts_when_its_gradients_are_final_and_waits_before_the_first_reader(tmp_path):
    step = bendc.jit(mlp_step, leaves=LEAVES, target="cpu", cache_dir=str(tmp_path), data_parallel=True,
                     bucket_mb=0.0005)
    step(*ARGS)
    plan = step._executable().run.plan
    steps = plan["steps"]
    for number in (0, 1):
        start = next(i for i, s in enumerate(steps) if s["name"] == f"all_reduce_b{number}_start")
        wait = next(i for i, s in enumerate(steps) if s["name"] == f"all_reduce_b{number}_wait")
        writers = [i for i, s in enumerate(steps) if set(s["outputs"]) & set(steps[start]["inputs"])]
        readers = [i for i, s in enumerate(steps) if set(s["inputs"]) & set(steps[wait]["outputs"])]
        assert start > max(writers) and all(s["phase"] == "poll" for s in steps[max(writers) + 1:start])
        assert all(s["kind"] == "collective" for s in steps[wait + 1:min(readers)])  # other buckets' waits
        assert start < wait
    # bucket 0 (the gradients final first) is in flight while w1's gradient is computed
    start0 = next(i for i, s in enumerate(steps) if s["name"] == "all_reduce_b0_start")
    wait0 = next(i for i, s in enumerate(steps) if s["name"] == "all_reduce_b0_wait")
    assert any(s["kind"] == "matmul" for s in steps[start0 + 1:wait0])
    assert any(s["name"].startswith("all_reduce_b0_poll") for s in steps[start0 + 1:wait0])
    assert "collective all_reduce_b0: 3 tensors, 268 bytes in one message" in step.report()


@pytest.mark.parametrize("op, factor", [("mean", 1.0), ("sum", 2.0)])
def test_a_bucket_over_two_mirrored_ranks_reduces_in_rank_order(world, op, factor, tmp_path):
    backend = world(MirrorBackend(2, op)).backend

    def step(x, w):
        loss = (F.all_reduce(x * w, op=op)).sum()
        loss.backward()
        return loss, w.grad

    x, w = _rng((2, 3), 0), _rng((2, 3), 1)
    loss, grad = bendc.jit(step, leaves=("w",), target="cpu", cache_dir=str(tmp_path), passes=[
        "dce", "canonicalize", "cse", "fuse", "bucket"])(x, w)
    np.testing.assert_allclose(loss, (x * w).astype(np.float64).sum() * factor, rtol=1e-6)  # a float32 sum
    np.testing.assert_array_equal(grad, (x * np.float32(factor)).astype(np.float32))
    assert backend.exchanges >= 2  # the program check, then the message


def test_the_ordered_reduction_sums_ranks_in_rank_order_in_float64():
    gathered = np.array([[1e8, 1.0], [1.0, 3.0], [-1e8, 5.0]], np.float32)
    out = np.empty(2, np.float32)
    collective.ordered_reduce(gathered, "sum", 3, out)
    np.testing.assert_array_equal(out, [1.0, 9.0])  # float32 left to right would give 0.0 for the first
    collective.ordered_reduce(gathered, "mean", 3, out)
    np.testing.assert_array_equal(out, np.float32([1 / 3, 3.0]))


def test_a_rank_that_never_answers_is_a_distributed_error_after_the_timeout(world, monkeypatch, tmp_path):
    world(StuckBackend(2))
    monkeypatch.setenv("BENDC_COLLECTIVE_TIMEOUT", "0.2")
    step = bendc.jit(mlp_step, leaves=LEAVES, target="cpu", cache_dir=str(tmp_path), data_parallel=True)
    with pytest.raises(bendc.DistributedError, match=r"rank 0 of 2: .* got no answer from every rank within 0.2 s"):
        step(*ARGS)


def test_a_bucket_checks_that_every_rank_runs_the_same_program(world):
    class Differs(MirrorBackend):
        def start_allgather(self, send, receive):
            receive[:] = send
            receive[1] = 0  # rank 1's digest and signature differ
            return None

    world(Differs(2))
    bucket = collective.Bucket("b", "mean", [(2,)], "step(x f32[2])")
    with pytest.raises(collective.CollectiveError, match="the ranks run different programs"):
        bucket.start(np.ones(2, np.float32))


def test_shards_cover_a_bucket_in_rank_order_with_the_first_ranks_one_longer():
    assert collective.shard_counts(67, 8) == [9, 9, 9, 8, 8, 8, 8, 8]
    assert collective.shard_counts(3, 8) == [1, 1, 1, 0, 0, 0, 0, 0]  # ranks that own nothing
    assert collective.displacements([9, 9, 8]) == [0, 9, 18]


@pytest.mark.parametrize("ranks", [2, 4, 8, 64])
def test_the_ordered_scheme_moves_about_twice_the_gradients_per_rank_whatever_the_ranks(ranks):
    total = 1_000_003  # not divisible by any of the rank counts
    for rank in range(ranks):
        sent, received = collective.exchange_bytes("ordered", total, rank, ranks)
        assert sent == received <= 2.1 * 4 * total
        assert sent >= 2 * (ranks - 1) / ranks * 4 * total - 8 * ranks
    assert collective.exchange_bytes("allgather", total, 0, ranks) == (4 * total * (ranks - 1),) * 2
    assert collective.exchange_bytes("native", total, 0, ranks) == (None, None)


def test_the_all_gather_starts_at_the_wait_never_at_a_poll(world):
    """Whether a reduce-scatter is done at a poll depends on timing; the all-gathers (collectives)
    must start in the same order on every rank: at the waits, in the plan's order."""
    backend = world(MirrorBackend(3, "sum")).backend
    bucket = collective.Bucket("poll", "sum", [(5,), (2,)], "step(x f32[7])")
    bucket.start(np.arange(5, dtype=np.float32), np.ones(2, np.float32))
    assert bucket.phase == "scatter"
    bucket.poll()
    assert bucket.phase == "scatter" and backend.exchanges == 2  # program check, alltoallv
    out = [np.empty(5, np.float32), np.empty(2, np.float32)]
    bucket.wait(*out)
    assert backend.exchanges == 3  # the allgatherv
    np.testing.assert_array_equal(out[0], 3 * np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(out[1], [3.0, 3.0])
    assert collective.world().traffic[bucket.key] == ("ordered", 28, 4 * (4 + 3 * 2), 4 * (3 * 2 + 4))


# ------------------------------------------------------------------ stale shared memory of killed ranks
def test_stale_shared_memory_of_dead_ranks_is_removed_and_a_live_jobs_is_kept(tmp_path):
    """libfabric's shm regions are named by their rank's pid; those of dead pids go, a live pid's stay.
    MPICH's mpich_shm_* regions go when no process maps them and they are older than quiet_s."""
    import mmap
    import os
    import subprocess
    import sys

    from bendc.distributed import remove_stale_shared_memory

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    dead = int(finished.stdout)
    names = [f"{dead}:0:0", f"{dead}:1:0:787278833", f"{os.getpid()}:0:0", "mpich_shm_old", "mpich_shm_mapped",
             "mpich_shm_new", "someone_elses_file", "12:notapid"]
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    for name in ("mpich_shm_old", "mpich_shm_mapped"):
        os.utime(tmp_path / name, (1, 1))
    with open(tmp_path / "mpich_shm_mapped", "r+b") as file, mmap.mmap(file.fileno(), 4096):
        removed = remove_stale_shared_memory(tmp_path, quiet_s=60)
    assert sorted(removed) == sorted([f"{dead}:0:0", f"{dead}:1:0:787278833", "mpich_shm_old"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{os.getpid()}:0:0", "mpich_shm_mapped", "mpich_shm_new", "someone_elses_file", "12:notapid"])
    assert remove_stale_shared_memory(tmp_path / "absent") == []
