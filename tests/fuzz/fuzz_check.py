"""Comparing a bendc run of a drawn program with torch eager in float32 and float64."""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import torch

from fuzz_gen import Output, Program, run_bendc, run_torch
from fuzz_known import known_bug, known_mismatch

STRICT = os.environ.get("BENDC_FUZZ_STRICT") == "1"
KNOWN_HITS: Counter = Counter()
STATS: list | None = [] if os.environ.get("BENDC_FUZZ_STATS") else None  # tolerance measurements
EXACT_CHECKS = [0]

# ---------------------------------------------------------------- tolerances
# Accept bendc's float32 result r where |r - t64| <= C * |t32 - t64| + FLOOR * scale, elementwise, with
# t32/t64 torch's float32/float64 results of the same program and scale = max(1, max |t64|) over the
# tensor. torch's own float32 error measures how ill-conditioned each element is; C lets bendc take a
# different rounding path (another summation order, libm vs numpy exp); FLOOR covers elements where
# torch32 happens to land (nearly) on the float64 value while any other order is a few ulps off.
# Measured (BENDC_FUZZ_STATS=1, 2026-12-01) over ~7,500 random programs, reference and cpu, ~6,500
# compared tensors: with FLOOR = 1e-6 the largest C needed was 5.8 (a gradient through mse_loss, a
# mean and exp: bendc 2.6e-6 off, torch32 2.8e-7 off); with C = 16 the largest FLOOR needed was
# 2.4e-7 (5e-7 even with C = 4; 99.9% of outputs below 1.2e-7). So C = 16 is ~3x and FLOOR = 1e-6
# (8 float32 ulps of the scale) ~4x the worst seen. Outputs marked exact (built only from + - * /
# neg relu, x ** 2, x ** 3, scalar / tensor, identities and layout ops; gradients only where no
# tensor operand was broadcast and no reciprocal was taken) must instead equal torch float32 bit
# for bit; 1,400 of the tensors of a 2,000-program reference run were compared that way.
C = 16.0
FLOOR = 1e-6

# ---------------------------------------------------------------- comparison
def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32).copy()
    a[np.isnan(a)] = np.nan  # one NaN pattern
    return a.view(np.int32)


def check_outputs(program: Program, ours, t32, t64, target: str) -> list[str]:
    problems = []
    if len(ours) != len(t64):
        return [f"{len(ours)} outputs, torch {len(t64)}"]
    for out, r, a, e in zip(program.outputs, ours, t32, t64):
        what = out.what
        if (r is None) != (e is None):
            problems.append(f"{what}: bendc {'None' if r is None else 'a value'}, torch "
                            f"{'None' if e is None else 'a value'}")
            continue
        if r is None:
            continue
        r = np.asarray(r)
        if r.shape != e.shape:
            problems.append(f"{what}: shape {r.shape}, torch {e.shape}")
            continue
        if r.dtype != np.float32:
            problems.append(f"{what}: dtype {r.dtype}, expected float32")
            continue
        r64 = r.astype(np.float64)
        a32 = a.astype(np.float32).astype(np.float64)
        if out.exact:
            if STATS is not None:
                EXACT_CHECKS[0] += 1
            if not np.array_equal(_bits(r), _bits(a)):
                bad = np.argwhere(_bits(r) != _bits(a))[:3].tolist()
                problems.append(f"{what}: not bitwise equal to torch float32 at {bad}: "
                                f"{r[tuple(bad[0])]!r} vs {a32[tuple(bad[0])]!r}")
            continue
        finite = np.isfinite(a32)
        if not np.array_equal(np.isnan(r64), np.isnan(a32)) or not np.array_equal(
                r64[~finite & ~np.isnan(a32)], a32[~finite & ~np.isnan(a32)]):
            problems.append(f"{what}: non-finite pattern differs: bendc {r!r}, torch32 {a32!r}")
            continue
        ok = finite & np.isfinite(e)
        scale = max(1.0, float(np.max(np.abs(e[ok])))) if ok.any() else 1.0
        err = np.abs(r64[ok] - e[ok])
        tol = C * np.abs(a32[ok] - e[ok]) + FLOOR * scale
        if STATS is not None and err.size:
            noisy = err > 1e-7 * scale
            ref = np.abs(a32[ok] - e[ok])
            c_needed = float(np.max(err[noisy] / np.maximum(ref[noisy], 1e-300))) if noisy.any() else 0.0
            over = err - FLOOR * scale
            c_floor = float(np.max(over[over > 0] / np.maximum(ref[over > 0], 1e-300))) if (over > 0).any() else 0.0
            STATS.append((float(np.max(err)) / scale, c_needed, float(np.max(np.maximum(err - C * ref, 0))) / scale,
                          c_floor))
        if (err > tol).any() or not np.isfinite(r64[ok]).all():
            worst = int(np.argmax(err - tol))
            problems.append(f"{what}: |bendc - torch64| = {err[worst]:.3g} > tolerance {tol[worst]:.3g} "
                            f"(torch32 error {np.abs(a32[ok] - e[ok])[worst]:.3g}, scale {scale:.3g}); "
                            f"{int((err > tol).sum())} of {err.size} elements")
    return problems


def evaluate(program: Program, target: str, cache_dir: str | None, count_known: bool = True):
    """(None, None) when bendc agrees with torch (or hits a known bug), else (signature, message):
    the signature is the exception's type, or "mismatch", or "torch" where torch rejects the program."""
    try:
        t64 = run_torch(program, torch.float64)
        t32 = run_torch(program, torch.float32)
    except Exception as error:  # a generator bug: it must draw only programs torch accepts
        return "torch", f"torch rejects a generated program ({type(error).__name__}: {error})"
    try:
        _, ours = run_bendc(program, target, cache_dir)
    except Exception as error:
        bug = None if STRICT else known_bug(error, target)
        if bug is not None:
            if count_known:
                KNOWN_HITS[(target, bug.number, bug.name)] += 1
            return None, None
        return type(error).__name__, f"bendc ({target}) raised {type(error).__name__}: {str(error)[:2000]}"
    problems = check_outputs(program, ours, t32, t64, target)
    if problems:
        bug = None if STRICT else known_mismatch(program, target, problems)
        if bug is not None:
            if count_known:
                KNOWN_HITS[(target, bug.number, bug.name)] += 1
            return None, None
        return "mismatch", f"bendc ({target}) differs from torch:\n  " + "\n  ".join(problems)
    return None, None


def _smaller(program: Program):
    """Programs with one line, one output or one unused input fewer, or the default pass pipeline."""
    if program.passes is not None:
        yield replace(program, passes=None)
    for i in range(len(program.lines) - 1, -1, -1):
        yield replace(program, lines=program.lines[:i] + program.lines[i + 1:])
    if len(program.outputs) > 1:
        for i in range(len(program.outputs)):
            yield replace(program, outputs=program.outputs[:i] + program.outputs[i + 1:])
    defined = [m.group(1) for line, _ in program.lines for m in [re.match(r"(\w+) = ", line)] if m]
    for i, out in enumerate(program.outputs):  # return an earlier value instead (lets its users go)
        for name in defined:
            if name != out.text and ".grad" not in out.text and defined.index(name) < len(defined) - 1:
                yield replace(program, outputs=program.outputs[:i] + (Output(name, name, False, f"value {name}"),)
                              + program.outputs[i + 1:])
    text = program.source()
    for i, item in enumerate(program.inputs):
        if len(re.findall(rf"\b{item.name}\b", text)) == 1:  # only in the signature
            yield replace(program, inputs=program.inputs[:i] + program.inputs[i + 1:])


def minimize(program: Program, target: str, cache_dir: str | None, signature: str, budget: int = 150):
    """Greedy line/output/input deletion after hypothesis's shrinking (which cannot delete a step in
    the middle of a program: later steps name values by position). Keeps the failure signature."""
    if signature == "torch":  # a generator bug: deleting lines would only trade it for a NameError
        return program
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for candidate in _smaller(program):
            tries += 1
            if evaluate(candidate, target, cache_dir, count_known=False)[0] == signature:
                program, progress = candidate, True
                break
            if tries >= budget:
                break
    return program


LAST_FAILURE: dict = {}   # target -> the last failing program (hypothesis replays the minimal one last)


def run_and_check(program: Program, target: str, cache_dir: str | None) -> None:
    signature, message = evaluate(program, target, cache_dir)
    if signature is not None:
        LAST_FAILURE[target] = (program, signature)
        raise AssertionError(f"{message}\n\nrepro (shrunk by hypothesis):\n{program.repro(target)}")


def minimized_report(target: str, cache_dir: str | None) -> str:
    """The last failure of ``target``, minimized further, with its message: for the test's final error."""
    if target not in LAST_FAILURE:
        return ""
    program, signature = LAST_FAILURE.pop(target)
    small = minimize(program, target, cache_dir, signature)
    _, message = evaluate(small, target, cache_dir, count_known=False)
    return f"{message}\n\nminimal repro ({signature}):\n{small.repro(target)}"
