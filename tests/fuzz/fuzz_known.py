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

import numpy as np


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
KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(1, "empty launch list", "def step(x): return x   /   x / 1   /   w.sum().backward(); return w.grad",
             ("cpu",), "IndentationError", r"launch list"),
    KnownBug(2, "repeated operand dropped", "def step(x): return x @ x   /   F.scaled_dot_product_attention(q, q, q)", ("cpu",), "TypeError",
             r"missing \d+ required positional arguments?: .*'out\d+'"),
    KnownBug(3, "all-int indexing to a 0-d value", "def step(v): return v[1, 2] * 2.0", ("cpu",),
             "TypingError", r"getitem\(float32, Tuple\(\)\)"),
    # NameError (not numba's TypingError) where the kernel is a prange one (>= 65536 cells)
    KnownBug(4, "non-finite constant", "def step(x): return x * math.inf", ("cpu",), "TypingError|NameError",
             r"name '(inf|nan)' is not defined"),
    KnownBug(5, "fusion cycle", "out = x.exp().mean() * y.sigmoid().sum(); out.backward()  (x f32[4,8], "
             "y f32[6,3] leaves; out, x.grad and y.grad returned)", ("*",), "InternalError", r"kernels still need each other"),
    KnownBug(6, "a[..., ...] rejected", "def step(a): return a[..., ...]", ("*",), "ShapeError",
             r"an index can hold one ellipsis"),
)

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


def _large_reduction_only(program, target, problems) -> bool:
    large = any(int(np.prod(i.shape, dtype=np.int64)) >= 65536 for i in program.inputs)
    return large and all("> tolerance" in p for p in problems)


KNOWN_MISMATCHES: tuple[KnownMismatch, ...] = (
    KnownMismatch(7, "cpu sums of >= 65536 cells lose accuracy",
                  "(x ** 2).sum() with x f32[256,256] uniform(-2,2): cpu 87172.414, reference and torch "
                  "float32 87172.79 (torch64 87172.7932): the cpu reduction is ~100x less accurate than "
                  "numpy's/torch's pairwise sums", ("cpu",), _large_reduction_only),
)
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
