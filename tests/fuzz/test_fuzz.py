"""Differential fuzzing: random programs through bendc.jit ("reference" and "cpu") against torch eager.

Each drawn program (tests/fuzz/fuzz_gen.py) runs under bendc and as torch eager code in float32
and float64; every returned value and gradient must agree (see ``check_outputs``). A failure
shrinks to a minimal program, printed as a standalone ``@bendc.jit`` snippet.

``make test`` runs a fixed-seed sample (``SAMPLE``). ``make fuzz N=10000`` (env ``BENDC_FUZZ_N``)
runs N random programs per target (``BENDC_FUZZ_SEED`` fixes the seed; ``BENDC_FUZZ_TARGETS``
picks targets; ``BENDC_FUZZ_STRICT=1`` fails on the known bugs of fuzz_known.py too).

Kernel cache: each session compiles into a fresh temporary cache dir (``BENDC_FUZZ_CACHE_DIR``
overrides it), so results never depend on leftover kernels. Within a session kernels are shared
by source hash, and shapes come from a small pool, so most programs reuse compiled kernels.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import warnings

import pytest
from hypothesis import HealthCheck, Phase, example, find, given, seed, settings
from hypothesis.errors import NoSuchExample

import bendc
from bendc.ir.parser import parse_graph
from bendc.ops import OPS
from fuzz_check import KNOWN_HITS, minimized_report, run_and_check
from fuzz_gen import FAMILIES, Program, explicit_program, programs, run_bendc
from fuzz_known import KNOWN_BUG_FAMILIES, KNOWN_BUG_PROGRAMS, KNOWN_BUG_SHAPES
from fuzz_ops import OP_TABLE

SAMPLE = {"reference": 300, "cpu": 25}  # programs per target in `make test` (plus the known-bug examples)
# make test-long's larger fixed-seed samples (the cpu's 250 programs, the sample of `make test` until
# the suite had to fit 12 minutes: each cpu program compiles its kernels, about 1.5 s apiece cold)
LONG_SAMPLE = {"cpu": 250}
FUZZ_N = int(os.environ.get("BENDC_FUZZ_N", "0"))
FUZZ_SEED = os.environ.get("BENDC_FUZZ_SEED")
TARGETS = os.environ.get("BENDC_FUZZ_TARGETS", "reference,cpu").split(",")

CACHE_DIR = os.environ.get("BENDC_FUZZ_CACHE_DIR") or tempfile.mkdtemp(prefix="bendc-fuzz-")
if not os.environ.get("BENDC_FUZZ_CACHE_DIR"):
    atexit.register(shutil.rmtree, CACHE_DIR, True)



def _settings(n: int):
    return settings(max_examples=n, deadline=None, database=None, derandomize=not FUZZ_N and FUZZ_SEED is None,
                    print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def _seeded(test):
    return seed(int(FUZZ_SEED))(test) if FUZZ_SEED is not None else test


def _report_known(target: str) -> None:
    hits = {k: v for k, v in KNOWN_HITS.items() if k[0] == target}
    if hits:
        warnings.warn(f"fuzz ({target}): programs hitting known bugs (fuzz_known.KNOWN_BUGS), skipped: " +
                      ", ".join(f"#{n} {name}: {count}" for (_, n, name), count in sorted(hits.items())))


# ---------------------------------------------------------------- the differential tests
def _with_known_bug_examples(test):
    for inputs, lines, outputs in KNOWN_BUG_PROGRAMS.values():
        test = example(program=explicit_program(inputs, lines, outputs))(test)
    return test


@pytest.mark.parametrize("target, sample", [pytest.param(t, FUZZ_N or SAMPLE[t], id=t) for t in TARGETS] + [
    pytest.param(t, n, id=f"{t}-{n}", marks=pytest.mark.long) for t, n in LONG_SAMPLE.items() if t in TARGETS])
def test_programs_match_torch(target: str, sample: int) -> None:
    @_settings(sample)
    @given(program=programs())
    @_with_known_bug_examples
    def check(program: Program) -> None:
        run_and_check(program, target, CACHE_DIR)
        counted[0] += 1

    counted = [0]
    try:
        _seeded(check)()
        if FUZZ_N:  # the long run's count, in pytest's warnings summary
            warnings.warn(f"fuzz ({target}): {counted[0]} programs ran and matched torch (asked for {FUZZ_N})")
    except AssertionError as error:
        report = minimized_report(target, CACHE_DIR)
        if report:
            raise AssertionError(f"{report}\n\n---- hypothesis's failure:\n{error}") from error
        raise
    finally:
        _report_known(target)


# ---------------------------------------------------------------- op coverage
def test_every_op_has_an_entry() -> None:
    missing = sorted(set(OPS) - set(OP_TABLE))
    stale = sorted(set(OP_TABLE) - set(OPS))
    assert not missing, (f"ops without an entry in tests/fuzz/fuzz_ops.py OP_TABLE: {missing}: give each a "
                         "front-end spelling and a generator family (fuzz_gen.FAMILIES), or the reason it "
                         "is reached only indirectly")
    assert not stale, f"OP_TABLE entries for ops no longer in bendc.ops.OPS: {stale}"
    for name, entry in OP_TABLE.items():
        assert entry.kind in ("direct", "indirect", "source"), name
        if entry.kind != "source":
            assert entry.families, f"{name}: no generator family reaches it"
        unknown = set(entry.families) - set(FAMILIES)
        assert not unknown, f"{name}: families {unknown} are not in fuzz_gen.FAMILIES"


def _ir_ops(jitted) -> set[str]:
    ops = set()
    for stage in ("traced", "autodiff", "final"):  # passes add no op kinds the IR of these lacks
        ops |= {node.op for node in parse_graph(jitted.ir(stage)).nodes()}
    return ops


REACH_DRAWS = 400  # per family; the most any family needed across seeds was 133 (losses)


def test_sample_reaches_every_op() -> None:
    """Every op in OPS appears in the IR (some stage) of programs drawn from the families that
    OP_TABLE says reach it (each family with backward calls mixed in): per family, fixed-seed draws
    until every op it is named for has been reached (by it or by an earlier family), at most
    REACH_DRAWS of them."""
    seen: dict[str, set[str]] = {family: set() for family in FAMILIES}
    wanted = {name: entry.families for name, entry in OP_TABLE.items() if entry.kind != "source"}

    def reached(name: str) -> bool:
        return any(name in seen.get(family, ()) for family in wanted[name])

    for family in FAMILIES:
        targets = [name for name, families in wanted.items() if family in families]

        def complete(program: Program) -> bool:
            try:
                jitted, _ = run_bendc(program, "reference", CACHE_DIR, repeat=False)
            except bendc.BendcError:
                return False
            seen[family].update(_ir_ops(jitted))
            return all(map(reached, targets))

        if not all(map(reached, targets)):
            try:  # the first draw that completes the family ends it (no shrinking: the ops are what counts)
                find(programs(families=(family, family, "backward")), complete,
                     settings=settings(max_examples=REACH_DRAWS, database=None, derandomize=True, deadline=None,
                                       phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
            except NoSuchExample:
                pass  # named below
    missing = [f"{name} (families {families})" for name, families in wanted.items() if not reached(name)]
    assert not missing, f"ops not reached by the families OP_TABLE names: {missing}"


# make test-long (24 s: up to 5,000 draws a shape): a property of the generator, not of the compiler;
# make test runs each known bug's own program (test_programs_match_torch's explicit examples).
@pytest.mark.long
@pytest.mark.parametrize("number", sorted(KNOWN_BUG_SHAPES))
def test_generator_draws_known_bug_shapes(number: int) -> None:
    """The generator draws programs of each known bug's shape (not only the hand-written example)."""
    pattern = re.compile(KNOWN_BUG_SHAPES[number], re.M)
    found = find(programs(families=KNOWN_BUG_FAMILIES[number]), lambda p: pattern.search(p.source()) is not None,
                 settings=settings(max_examples=5000, database=None, derandomize=True, deadline=None,
                                   suppress_health_check=list(HealthCheck)))
    assert pattern.search(found.source())
