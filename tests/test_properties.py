"""Property tests: random small programs, bendc's reference target against PyTorch eager.

A drawn program is plain data (``Program``: inputs and a list of ``Step``
records), so the same program runs twice through one interpreter,
``execute``: once on bendc's traced Tensors inside a ``bendc.jit`` function,
once on torch tensors. Both tensor types share the method names used here
(``x.exp()``, ``x.sum(dim, keepdim)``, ``x @ y``, ``x[key]``, ...), so the
interpreter is written once.

Properties:

1. values and gradients: loss, the last value before the loss reduction and
   every leaf's ``.grad`` agree with PyTorch within chain tolerances;
2. + - * / and neg only: the last value is bit-identical to PyTorch's, and
   so is every gradient when no tensor operand was broadcast;
3. the printed IR of every stage round-trips through the parser, and the
   parsed final graph, interpreted, gives the jitted call's outputs bit for
   bit.

The generator keeps values finite and away from fragile spots: inputs are
uniform in [-2, 2], a tensor divisor ``y`` becomes ``y*y + 1``, log and sqrt
take ``x*x + 1``, exp takes ``tanh(x)`` once values may exceed 2, and a bound
on every value's magnitude rules out products that would grow past ``LIMIT``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bendc
from bendc.ir.interp import interpret
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from conftest import assert_bitwise, assert_close, factor_shape

# Magnitude bound past which the generator stops multiplying (keeps every value finite).
LIMIT = 1e3
MAX_RANK = 4

# Tolerances for chains of up to 8 float32 ops (a few more after the x*x + 1 and
# tanh guards) and their backward. One float32 rounding is 6e-8 relative; numpy's
# and PyTorch's exp/log/tanh/sigmoid differ by an ulp or two, and BLAS and the two
# libraries' sum orders differ in the last bits; a chain compounds these through its
# condition number. A relative test alone fails where a value cancels to near zero:
# the worst case seen is tanh's backward 1 - y*y with y a few ulps below 1, where a
# one-ulp difference in y is a large relative difference in the gradient. So the
# absolute part scales with the reference tensor's largest magnitude: 1e-5 of the
# tensor's scale is still only ~100 ulps of the values that produced it. Over 6,000
# random draws the worst error was a quarter of this tolerance (gradients), 1/40 of
# it for losses and last values.
CHAIN_RTOL = 1e-4
CHAIN_ATOL = 1e-5

ARITHMETIC = ("add", "sub", "mul", "div")


# ================================================================== programs as data
@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    leaf: bool
    seed: int

    def array(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return rng.uniform(-2.0, 2.0, size=self.shape).astype(np.float32)


@dataclass(frozen=True)
class Step:
    """One op. ``args`` are operands: ("v", index) for a value, ("s", number) for a Python scalar."""

    op: str
    args: tuple
    attrs: tuple = ()

    def attr(self, name: str) -> Any:
        return dict(self.attrs)[name]


@dataclass(frozen=True)
class Program:
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    reduction: str          # "sum" or "mean": loss = last.<reduction>()
    extra: int | None       # a value that requires grad, added (summed) when the last one does not
    broadcasts: bool        # some tensor-tensor op has operands of different shapes

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.leaf)

    def __repr__(self) -> str:
        lines = ["Program:"]
        for position, item in enumerate(self.inputs):
            kind = "leaf" if item.leaf else "const"
            lines.append(f"  v{position} = {item.name}: {kind} f32{list(item.shape)} (seed {item.seed})")
        for position, step in enumerate(self.steps, start=len(self.inputs)):
            lines.append(f"  v{position} = {_describe(step)}")
        last = len(self.inputs) + len(self.steps) - 1
        loss = f"v{last}.{self.reduction}()"
        if self.extra is not None:
            loss += f" + v{self.extra}.sum()"
        lines.append(f"  loss = {loss}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:  # hypothesis prints falsifying examples with this
        printer.text(repr(self))


def _operand_text(arg) -> str:
    kind, value = arg
    return f"v{value}" if kind == "v" else repr(value)


def _describe(step: Step) -> str:
    args = [_operand_text(a) for a in step.args]
    op = step.op
    if op in ARITHMETIC:
        symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
        right = args[1]
        if op == "div" and step.args[1][0] == "v":
            right = f"({right}*{right} + 1)"
        return f"{args[0]} {symbol} {right}"
    if op == "neg":
        return f"-{args[0]}"
    if op == "exp":
        return f"{args[0]}.tanh().exp()" if step.attr("squash") else f"{args[0]}.exp()"
    if op in ("log", "sqrt"):
        return f"({args[0]}*{args[0]} + 1).{op}()"
    if op == "matmul":
        return f"{args[0]} @ {args[1]}"
    if op == "T":
        return f"{args[0]}.T"
    if op == "index":
        return f"{args[0]}[{_key_text(step.attr('key'))}]"
    attrs = ", ".join(f"{k}={v!r}" for k, v in step.attrs)
    return f"{args[0]}.{op}({attrs})"


def _key_text(key) -> str:
    parts = []
    for entry in key:
        if isinstance(entry, int):
            parts.append(str(entry))
        else:
            start, stop, stride = entry
            parts.append(f"{'' if start is None else start}:{'' if stop is None else stop}"
                         + ("" if stride is None else f":{stride}"))
    return ", ".join(parts)


# ================================================================== the interpreter
def _positive(x):
    """x*x + 1: a value >= 1 built from + and * only."""
    return x * x + 1.0


def _apply(step: Step, values: list) -> Any:
    def operand(arg):
        kind, value = arg
        return values[value] if kind == "v" else value

    op = step.op
    args = [operand(a) for a in step.args]
    if op == "add":
        return args[0] + args[1]
    if op == "sub":
        return args[0] - args[1]
    if op == "mul":
        return args[0] * args[1]
    if op == "div":
        divisor = _positive(args[1]) if step.args[1][0] == "v" else args[1]
        return args[0] / divisor
    x = args[0]
    if op == "neg":
        return -x
    if op == "exp":
        return (x.tanh() if step.attr("squash") else x).exp()
    if op == "log":
        return _positive(x).log()
    if op == "sqrt":
        return _positive(x).sqrt()
    if op in ("tanh", "sigmoid", "relu"):
        return getattr(x, op)()
    if op in ("sum", "mean"):
        return getattr(x, op)(dim=step.attr("dim"), keepdim=step.attr("keepdim"))
    if op in ("softmax", "log_softmax"):
        return getattr(x, op)(step.attr("dim"))
    if op == "reshape":
        return x.reshape(step.attr("shape"))
    if op == "permute":
        return x.permute(*step.attr("perm"))
    if op == "transpose":
        return x.transpose(step.attr("dim0"), step.attr("dim1"))
    if op == "T":
        return x.T
    if op == "unsqueeze":
        return x.unsqueeze(step.attr("dim"))
    if op == "matmul":
        return x @ args[1]
    if op == "index":
        key = tuple(e if isinstance(e, int) else slice(*e) for e in step.attr("key"))
        return x[key]
    raise AssertionError(f"unknown op {op}")


def execute(program: Program, inputs: Sequence[Any]) -> tuple:
    """Run the program on bendc or torch tensors: (loss, last value, grad of each leaf)."""
    values = list(inputs)
    for step in program.steps:
        values.append(_apply(step, values))
    last = values[-1]
    loss = getattr(last, program.reduction)()
    if program.extra is not None:
        loss = loss + values[program.extra].sum()
    loss.backward()
    grads = tuple(values[i].grad for i, item in enumerate(program.inputs) if item.leaf)
    return (loss, last, *grads)


# Fixed-arity wrappers: bendc binds named parameters (no *args).
def _wrapper(program: Program) -> Callable:
    count = len(program.inputs)
    if count == 1:
        def step1(in0):
            return execute(program, [in0])
        return step1
    if count == 2:
        def step2(in0, in1):
            return execute(program, [in0, in1])
        return step2
    assert count == 3

    def step3(in0, in1, in2):
        return execute(program, [in0, in1, in2])
    return step3


def run_bendc(program: Program):
    """(jitted function, its outputs) on the reference target."""
    fn = bendc.jit(_wrapper(program), leaves=program.leaves, target="reference")
    arrays = [item.array() for item in program.inputs]
    return fn, arrays, fn(*arrays)


def run_torch(program: Program) -> tuple:
    tensors = [torch.from_numpy(item.array()).requires_grad_(item.leaf) for item in program.inputs]
    results = execute(program, tensors)
    return tuple(None if r is None else r.detach().numpy() for r in results)


def output_names(program: Program) -> list[str]:
    return ["loss", "last value"] + [f"grad of {name}" for name in program.leaves]


# ================================================================== the strategy
def _matmul_shape(a: tuple, b: tuple) -> tuple | None:
    """torch.matmul's result shape, or None where the shapes do not fit."""
    if not a or not b:
        return None
    try:
        return np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    except ValueError:
        return None


def _broadcast(a: tuple, b: tuple) -> tuple | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


def _related_shape(draw, base: tuple) -> tuple:
    """A shape that broadcasts with ``base`` most of the time, or an unrelated one."""
    if draw(st.booleans()):
        return draw(st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple))
    drop = draw(st.integers(0, len(base)))
    shape = list(base[drop:])
    for axis in range(len(shape)):
        if draw(st.integers(0, 3)) == 0:
            shape[axis] = 1
    return tuple(shape)


def _signed(magnitudes: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(lambda m, negative: -m if negative else m, magnitudes, st.booleans())


# Python scalars: ints, and float32-representable floats away from 0 (|s| >= 0.5 for divisors).
_SCALARS = st.one_of(st.sampled_from([2, -1, 3]), _signed(st.floats(0.25, 3.0, width=32)))
_DIVISOR_SCALARS = st.one_of(st.sampled_from([2, -4]), _signed(st.floats(0.5, 3.0, width=32)))


class _Builder:
    """Tracks the shape, magnitude bound and requires-grad of every drawn value."""

    def __init__(self, draw, inputs: Sequence[Input]) -> None:
        self.draw = draw
        self.shapes = [item.shape for item in inputs]
        self.bounds = [2.0 for _ in inputs]
        self.grad = [item.leaf for item in inputs]
        self.steps: list[Step] = []
        self.broadcasts = False

    def add(self, step: Step, shape: tuple, bound: float) -> None:
        grad = any(self.grad[v] for kind, v in step.args if kind == "v")
        self.steps.append(step)
        self.shapes.append(tuple(shape))
        self.bounds.append(float(bound))
        self.grad.append(grad)

    def pick(self) -> int:
        """A value index, the newest one half the time."""
        last = len(self.shapes) - 1
        return self.draw(st.one_of(st.just(last), st.integers(0, last)))

    # ------------------------------------------------------------- op choices
    def arithmetic(self, op: str, x: int) -> bool:
        draw, shape, bound = self.draw, self.shapes[x], self.bounds[x]
        partners = [j for j in range(len(self.shapes)) if _broadcast(shape, self.shapes[j]) is not None]
        form = draw(st.sampled_from(["tensor", "scalar_right", "scalar_left"]))
        if form == "tensor":
            y = draw(st.sampled_from(partners))  # x itself always broadcasts
            other = self.bounds[y]
            left, right = (x, y) if draw(st.booleans()) else (y, x)
            left_bound, right_bound = self.bounds[left], self.bounds[right]
            out_shape = _broadcast(shape, self.shapes[y])
            if op in ("add", "sub"):
                new_bound = bound + other
            elif op == "mul":
                new_bound = bound * other
            else:
                new_bound = left_bound  # a / (b*b + 1), |.| <= |a|
            if new_bound > LIMIT or (op == "div" and right_bound ** 2 + 1 > LIMIT):
                return False
            self.add(Step(op, (("v", left), ("v", right))), out_shape, new_bound)
            self.broadcasts |= self.shapes[left] != self.shapes[right]
            return True
        if op == "div" and form == "scalar_right":
            scalar = draw(_DIVISOR_SCALARS)
        else:
            scalar = draw(_SCALARS)
        if op in ("add", "sub"):
            new_bound = bound + abs(scalar)
        elif op == "mul":
            new_bound = bound * abs(scalar)
        elif form == "scalar_right":
            new_bound = bound / abs(scalar)
        else:
            new_bound = abs(scalar)  # s / (x*x + 1)
        if new_bound > LIMIT or (op == "div" and form == "scalar_left" and bound ** 2 + 1 > LIMIT):
            return False
        args = (("v", x), ("s", scalar)) if form == "scalar_right" else (("s", scalar), ("v", x))
        self.add(Step(op, args), shape, new_bound)
        return True

    def general(self, op: str, x: int) -> bool:
        draw, shape, bound = self.draw, self.shapes[x], self.bounds[x]
        rank = len(shape)
        arg = (("v", x),)
        if op == "neg" or op == "relu":
            self.add(Step(op, arg), shape, bound)
        elif op in ("tanh", "sigmoid"):
            self.add(Step(op, arg), shape, 1.0)
        elif op == "exp":
            squash = bound > 2.0
            self.add(Step(op, arg, (("squash", squash),)), shape, math.exp(min(bound, 2.0)) if not squash
                     else math.e)
        elif op in ("log", "sqrt"):
            if bound * bound + 1 > LIMIT:
                return False
            value = math.log(bound * bound + 1) if op == "log" else math.sqrt(bound * bound + 1)
            self.add(Step(op, arg), shape, value)
        elif op in ("sum", "mean"):
            form = draw(st.sampled_from(["int", "all", "tuple"]))
            if form == "all":
                dim, axes = None, list(range(rank))
            elif form == "int" or rank == 0:
                # PyTorch takes dim 0 or -1 of a 0-d tensor and reduces nothing
                dim = draw(st.integers(-max(rank, 1), max(rank, 1) - 1))
                axes = [dim % rank] if rank else []
            else:
                axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
                dim = tuple(a - rank if draw(st.booleans()) else a for a in axes)
            keepdim = draw(st.booleans())
            out = [1 if axis in axes else d for axis, d in enumerate(shape)] if keepdim else \
                [d for axis, d in enumerate(shape) if axis not in axes]
            count = int(np.prod([shape[a] for a in axes], dtype=np.int64))
            new_bound = bound * count if op == "sum" else bound
            if new_bound > LIMIT:
                return False
            self.add(Step(op, arg, (("dim", dim), ("keepdim", keepdim))), out, new_bound)
        elif op in ("softmax", "log_softmax"):
            dim = draw(st.integers(-max(rank, 1), max(rank, 1) - 1))  # a 0-d tensor is one row
            new_bound = 1.0 if op == "softmax" else 2 * bound + math.log(shape[dim] if rank else 1) + 1
            self.add(Step(op, arg, (("dim", dim),)), shape, new_bound)
        elif op == "reshape":
            numel = int(np.prod(shape, dtype=np.int64))
            target = factor_shape(draw, numel)
            spelled = list(target)
            if spelled and draw(st.booleans()):
                spelled[draw(st.integers(0, len(spelled) - 1))] = -1
            self.add(Step(op, arg, (("shape", tuple(spelled)),)), target, bound)
        elif op == "permute":
            if rank < 2:
                return False
            perm = tuple(draw(st.permutations(range(rank))))
            if draw(st.booleans()):
                perm = tuple(p - rank if draw(st.booleans()) else p for p in perm)
            self.add(Step(op, arg, (("perm", perm),)), tuple(shape[p] for p in perm), bound)
        elif op == "transpose":
            if rank < 2:
                return False
            dim0 = draw(st.integers(-rank, rank - 1))
            dim1 = draw(st.integers(-rank, rank - 1))
            out = list(shape)
            out[dim0], out[dim1] = out[dim1], out[dim0]
            self.add(Step(op, arg, (("dim0", dim0), ("dim1", dim1))), out, bound)
        elif op == "T":
            if rank != 2:  # PyTorch deprecates .T on other ranks
                return False
            self.add(Step(op, arg), shape[::-1], bound)
        elif op == "unsqueeze":
            if rank >= MAX_RANK:
                return False
            dim = draw(st.integers(-rank - 1, rank))
            out = list(shape)
            out.insert(dim % (rank + 1), 1)
            self.add(Step(op, arg, (("dim", dim),)), out, bound)
        elif op == "matmul":
            partners = [(j, _matmul_shape(shape, self.shapes[j])) for j in range(len(self.shapes))]
            partners = [(j, out) for j, out in partners
                        if out is not None and bound * self.bounds[j] * shape[-1] <= LIMIT]
            if not partners:
                return False
            y, out = draw(st.sampled_from(partners))
            self.add(Step(op, (("v", x), ("v", y))), out, bound * self.bounds[y] * shape[-1])
            self.broadcasts = True  # batch dims and 1-D operands may broadcast
        elif op == "index":
            if rank == 0:
                return False
            count = draw(st.integers(1, rank))
            key, out = [], []
            for axis in range(count):
                size = shape[axis]
                kind = draw(st.sampled_from(["int", "slice", "full"]))
                if kind == "int":
                    key.append(draw(st.integers(-size, size - 1)))
                elif kind == "full":
                    key.append((None, None, None))
                    out.append(size)
                else:
                    start = draw(st.integers(0, size - 1))
                    stop = draw(st.integers(start + 1, size))
                    stride = draw(st.sampled_from([None, 1, 2]))
                    spelled_start = start - size if draw(st.booleans()) else start
                    spelled_stop = None if stop == size and draw(st.booleans()) else stop
                    key.append((spelled_start, spelled_stop, stride))
                    out.append(len(range(start, stop, stride or 1)))
            out.extend(shape[count:])
            self.add(Step(op, arg, (("key", tuple(key)),)), out, bound)
        else:
            raise AssertionError(op)
        return True


GENERAL_OPS = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu",
               "sum", "mean", "reshape", "permute", "transpose", "T", "unsqueeze", "matmul", "softmax",
               "log_softmax", "index")
BITWISE_OPS = ("add", "sub", "mul", "div", "neg")


@st.composite
def programs(draw, ops: Sequence[str] = GENERAL_OPS) -> Program:
    count = draw(st.integers(1, 3))
    base = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    shapes = [base] + [_related_shape(draw, base) for _ in range(count - 1)]
    leaves = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    if not any(leaves):
        leaves[draw(st.integers(0, count - 1))] = True
    inputs = tuple(Input(f"in{i}", shapes[i], leaves[i], draw(st.integers(0, 2 ** 32 - 1)))
                   for i in range(count))
    builder = _Builder(draw, inputs)
    length = draw(st.integers(2, 8))
    while len(builder.steps) < length:
        for _attempt in range(8):
            op = draw(st.sampled_from(ops))
            x = builder.pick()
            done = builder.arithmetic(op, x) if op in ARITHMETIC else builder.general(op, x)
            if done:
                break
        else:  # nothing drawn fits: a cheap op that always does
            builder.general("neg", x)
    reduction = draw(st.sampled_from(["sum", "mean"]))
    extra = None
    if not builder.grad[-1]:
        extra = max(i for i, g in enumerate(builder.grad) if g)
    return Program(inputs, tuple(builder.steps), reduction, extra, builder.broadcasts)


# ================================================================== properties
def assert_chain_close(actual, expected, what: str) -> None:
    """assert_close with CHAIN_RTOL, and CHAIN_ATOL scaled by the reference's magnitude."""
    expected = np.asarray(expected, dtype=np.float32)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    assert_close(actual, expected, what, rtol=CHAIN_RTOL, atol=CHAIN_ATOL * scale)


def _check_same_structure(ours, theirs, program) -> None:
    assert len(ours) == len(theirs)
    for name, a, b in zip(output_names(program), ours, theirs):
        assert (a is None) == (b is None), f"{name}: bendc {'None' if a is None else 'a value'}, " \
                                           f"torch {'None' if b is None else 'a value'}"


def _both(program: Program) -> tuple[list, list]:
    """The program's outputs from bendc and from torch, checked to have the same structure."""
    _, _, ours = run_bendc(program)
    theirs = run_torch(program)
    _check_same_structure(ours, theirs, program)
    return ours, theirs


PROPERTY_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(count: int):
    """Half of ``count`` fixed-seed programs in make test, all of them in make test-long."""
    return pytest.mark.parametrize("count", [count // 2, pytest.param(count, marks=pytest.mark.long)])


@examples(1000)
def test_values_and_gradients_match_torch(count: int) -> None:
    @settings(max_examples=count, **PROPERTY_SETTINGS)
    @given(program=programs())
    def check(program: Program) -> None:
        ours, theirs = _both(program)
        for name, a, b in zip(output_names(program), ours, theirs):
            if b is not None:
                assert_chain_close(a, b, name)

    check()


@examples(700)
def test_arithmetic_programs_are_bitwise(count: int) -> None:
    """+ - * / and neg round once per op in both libraries: the same bits.

    The loss is a sum, whose order differs (close only). Gradients are bit-exact
    too where no operand was broadcast (each VJP is PyTorch's formula, operand
    for operand); a broadcast operand's gradient is a sum over the broadcast
    dims, close only.
    """
    @settings(max_examples=count, **PROPERTY_SETTINGS)
    @given(program=programs(BITWISE_OPS))
    def check(program: Program) -> None:
        ours, theirs = _both(program)
        assert_bitwise(ours[1], theirs[1], "last value")
        for name, a, b in zip(output_names(program), ours, theirs):
            if b is None:
                continue
            if name.startswith("grad") and not program.broadcasts:
                assert_bitwise(a, b, name)
            else:
                assert_chain_close(a, b, name)

    check()


@examples(400)
def test_ir_round_trips_and_parsed_graph_runs(count: int) -> None:
    @settings(max_examples=count, **PROPERTY_SETTINGS)
    @given(program=programs())
    def check(program: Program) -> None:
        fn, arrays, ours = run_bendc(program)
        stages = fn.stages()
        assert {"traced", "autodiff", "final"} <= set(stages)
        for stage in stages:
            text = fn.ir(stage)
            assert format_graph(parse_graph(text)) == text, f"stage {stage} does not round-trip"
        graph = parse_graph(fn.ir("final"))
        results = interpret(graph, arrays)
        returned = [value for value in ours if value is not None]
        assert len(results) == len(returned)
        for position, (a, b) in enumerate(zip(results, returned)):
            assert_bitwise(a, b, f"output {position} of the parsed final graph")

    check()
