"""Known bendc bugs the fuzzer finds, by failure signature.

A drawn program whose bendc run raises an exception matching one of these signatures (or, for
KNOWN_MISMATCHES, whose outputs differ as described) is
counted (and reported in a warning at the end of the test) instead of failing the test, so the
fixed-seed sample passes while the bugs are open. When a bug is fixed, DELETE ITS ENTRY: the
sample then checks those programs again. ``BENDC_FUZZ_STRICT=1`` ignores this list altogether.
Anything not matching an entry (a new crash, or any value/gradient mismatch) fails the test.
"""
from __future__ import annotations

import re
from dataclasses import dataclass



@dataclass(frozen=True)
class KnownBug:
    number: int
    name: str
    example: str            # a minimal program showing it
    targets: tuple[str, ...]  # "*": every target (front end, passes)
    exception: str          # regex matching type(e).__name__ in full
    message: str            # regex searched in str(e)

    def matches(self, error: BaseException, target: str) -> bool:
        return ((target in self.targets or "*" in self.targets) and re.fullmatch(self.exception, type(error).__name__) is not None
                and re.search(self.message, str(error)) is not None)


# ---- THE LIST: remove an entry once its bug is fixed ------------------------------------
# Bugs 1-6 (empty launch list, repeated operands, all-int indexing, non-finite constants, fusion
# cycles, several ellipses) are fixed: tests/test_regressions.py keeps a test per class, and their
# programs stay in every sample (KNOWN_BUG_PROGRAMS below).
KNOWN_BUGS: tuple[KnownBug, ...] = ()

# Found by this fuzzer (not one of the six bugs of the brief): mismatches rather than exceptions,
# matched by a predicate over (program, target, problem lines). Remove an entry once fixed.
@dataclass(frozen=True)
class KnownMismatch:
    number: int
    name: str
    example: str
    targets: tuple[str, ...]
    matches_program: object   # (program, target, problems) -> bool

    def matches(self, program, target: str, problems: list[str]) -> bool:
        return target in self.targets and self.matches_program(program, target, problems)


# 7 (cpu epilogue sums over >= 65536 cells ran in float32, ~100x less accurate than numpy's and
# torch's pairwise sums) is fixed: epilogue sums accumulate in float64 and round once.
KNOWN_MISMATCHES: tuple[KnownMismatch, ...] = ()
# ------------------------------------------------------------------------------------------


def known_mismatch(program, target: str, problems: list[str]) -> KnownMismatch | None:
    return next((bug for bug in KNOWN_MISMATCHES if bug.matches(program, target, problems)), None)


def known_bug(error: BaseException, target: str) -> KnownBug | None:
    return next((bug for bug in KNOWN_BUGS if bug.matches(error, target)), None)


# Each bug's program (fuzz_gen.explicit_program arguments), run in every sample as a hypothesis
# @example, and a regex over generated sources showing the generator draws programs of that shape
# (test_fuzz.test_generator_draws_known_bug_shapes).
KNOWN_BUG_PROGRAMS = {
    1: ([("x", (3, 4), False)], [], ["x"]),
    2: ([("x", (3, 3), False)], ["y = x @ x"], ["y"]),
    3: ([("v", (3, 4), False)], ["y = v[1, 2] * 2.0"], ["y"]),
    4: ([("x", (3, 4), False)], ["y = x * math.inf"], ["y"]),
    5: ([("x", (4, 8), True), ("y", (6, 3), True)],
        ["out = x.exp().mean() * y.sigmoid().sum()", "out.backward()"], ["out", "x.grad", "y.grad"]),
    6: ([("a", (3, 4), False)], ["y = a[..., ...]"], ["y"]),
}
# The families searched for each shape (every family is also drawn by the full mix).
KNOWN_BUG_FAMILIES = {1: ("identity", "backward"), 2: ("matmul", "attention"), 3: ("index", "arith_scalar"),
                      4: ("nonfinite",), 5: ("combine", "unary", "backward"), 6: ("identity",)}
KNOWN_BUG_SHAPES = {
    1: r"^def step\([^)]*\):\n    return",
    2: r"(\w+) @ \1\b|scaled_dot_product_attention\((\w+), \2, \2",
    3: r"\w+\[-?\d+, -?\d+\]",
    4: r"math\.(inf|nan)",
    5: r"\w+\.\w+\(\)\.mean\(\) \* \w+\.\w+\(\)\.sum\(\)",
    6: r"\[\.\.\., \.\.\.\]",
}
