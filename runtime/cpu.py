"""Run a kernel plan on the CPU.

Binding (once per signature) allocates the planned buffers, makes the typed
views of them, and runs the hoisted steps. A call then only binds the
inputs, allocates the outputs and runs the steps in order: no graph walks
and no lookups by name in the hot loop.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

import numba
import numpy as np

from runtime.dtypes import DTYPES, numel

# Parallel kernels use numba's own thread pool: its OpenMP layer spins its threads and
# collapses when another OpenMP runtime (PyTorch's) or another process shares the cores.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"


class KernelError(Exception):
    """A check inside a kernel failed (e.g. an index out of range): the step (kernel) and what
    went wrong; the plan's step records the op and the user's line for the error a user sees."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail


class KernelFailure(Exception):
    """A generated kernel failed to compile or run for another reason than a check (a bug in the
    compiler, not the user's): the step and the error."""

    def __init__(self, step: str, error: BaseException) -> None:
        super().__init__(f"{step}: {type(error).__name__}: {str(error).strip()}")
        self.step = step
        self.error = error


def _typed(buffer: np.ndarray, dtype: str, shape: Sequence[int]) -> np.ndarray:
    count = numel(shape)
    return buffer.view(DTYPES[dtype])[:count].reshape(tuple(shape))




def _references(previous: Any) -> int:
    return sys.getrefcount(previous)


def _probe(previous: Any) -> int:
    """The references _recycled sees, through the same call depth."""
    return _references(previous)


# The count for an object held by one list entry only (as ``returned`` holds an output the
# caller dropped), measured rather than assumed.
_PROBE_LIST = [object()]
_UNHELD = _probe(_PROBE_LIST[0])


def _recycled(previous: np.ndarray | None, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """An output array: the one returned last call when nothing else holds it any more, else a
    new one. Fresh pages of a large np.empty fault on first write, which can cost a
    memory-bound kernel half its speed; a caller that keeps its results keeps them intact."""
    if previous is not None and _references(previous) == _UNHELD:
        return previous
    return np.empty(shape, dtype)


class CpuProgram:
    """A bound plan: call ``run(inputs)`` with one array per parameter."""

    def __init__(self, plan: dict[str, Any], kernels: dict[str, Callable]) -> None:
        values = {int(k): (d, tuple(s)) for k, (d, s) in plan["values"].items()}
        ids = sorted(values)
        slot = {id: index for index, id in enumerate(ids)}
        self.values: list[Any] = [None] * len(ids)
        buffers = [np.empty(size, dtype=np.uint8) for size in plan["buffers"]]
        for value, buffer in plan["storage"].items():
            dtype, shape = values[int(value)]
            self.values[slot[int(value)]] = _typed(buffers[buffer], dtype, shape)
        self.param_slots = [slot[p] for p in plan["params"]]
        self.value_ids = ids  # slot -> value id (the IR node)
        outputs = set(plan["outputs"])
        donations = {int(k): v for k, v in plan.get("donations", {}).items()}
        written_outputs: set[int] = set()
        program = []
        for step in plan["steps"]:
            view = step["convention"] == "view"
            fresh = []  # (slot, shape, dtype): a new array each call; dtype None: the donated input's array
            if not view:
                for value in step["outputs"]:
                    if value in donations:
                        fresh.append((slot[value], slot[donations[value]], None))
                        written_outputs.add(value)
                    elif self.values[slot[value]] is None:
                        dtype, shape = values[value]
                        fresh.append((slot[value], shape, DTYPES[dtype]))
                        if value in outputs and not step["hoisted"]:
                            written_outputs.add(value)
            entry = (step["name"], kernels[step["name"]], [slot[i] for i in step["inputs"]],
                     [slot[o] for o in step["outputs"]], view, fresh)
            if step["hoisted"]:
                try:
                    self._run_step(entry)
                except IndexError as error:
                    raise KernelError(step["name"], str(error)) from None
                except Exception as error:
                    raise KernelFailure(step["name"], error) from error
            else:
                program.append(entry)
        self.program = self._bind_views(program)
        # Outputs that a step wrote into a fresh array are the caller's; views and parameters are copied.
        self.output_slots = [(slot[o], o in written_outputs) for o in plan["outputs"]]
        self.returned = []
        self.modules: list[Any] = []  # the kernel modules (load_program sets them: compile counts)
        self.source, self.run = self._driver(plan["name"])

    returned: list  # the arrays last returned to the caller, one per fresh output

    def _bind_views(self, program: list) -> list:
        """The launch list without the views that can be taken once, here: a view step whose
        operands are all bound arrays (planned buffers, hoisted values, views bound before it)
        gives the same view every call, so its result is bound too, where it shares the operand's
        memory (a reshape that numpy answers with a copy runs each call: its data changes). The
        transformer's step took 179 views a call, now 71 (3.86-3.89 -> 3.81-3.85 ms, 1 thread)."""
        per_call = set(self.param_slots)  # the arguments and the fresh outputs: new arrays each call
        for *_, fresh in program:
            per_call.update(index for index, _, _ in fresh)
        kept = []
        for entry in program:
            _, kernel, ins, outs, view, _ = entry
            operands = [self.values[i] for i in ins]
            if not (view and ins and all(i not in per_call and a is not None for i, a in zip(ins, operands))):
                kept.append(entry)
                continue
            try:
                result = kernel(*operands)
            except Exception:  # noqa: BLE001 - the call will say what is wrong, with its step's name
                kept.append(entry)
                continue
            if isinstance(result, np.ndarray) and any(np.may_share_memory(result, a) for a in operands):
                self.values[outs[0]] = result
            else:
                kept.append(entry)
        return kept

    def _driver(self, name: str) -> tuple[str, Callable]:
        """The launch list as one straight-line Python function: a call costs a function
        call per kernel, with no loop, list building or lookups by name."""
        namespace: dict[str, Any] = {"recycled": _recycled, "array": np.array, "KernelError": KernelError,
                                     "KernelFailure": KernelFailure, "returned": self.returned}
        self._namespace = namespace  # the bound kernels and buffers (time_launch_list runs the same source)
        bound = {index for index, value in enumerate(self.values) if value is not None}

        def ref(index: int) -> str:
            if index in bound:
                namespace[f"g{index}"] = self.values[index]
                return f"g{index}"
            return f"v{index}"

        lines = [f"def run(inputs):"]
        if self.param_slots:
            lines.append(f"    {', '.join(f'v{i}' for i in self.param_slots)}, = inputs")
        names = []
        calls: list[str] = []  # the body of the try block: one call per step, with its outputs
        for number, (step, kernel, ins, outs, view, fresh) in enumerate(self.program):
            names.append(step)
            namespace[f"k{number}"] = kernel
            calls.append(f"        step = {number}  # {step}")
            for index, shape, dtype in fresh:
                if dtype is None:
                    calls.append(f"        v{index} = v{shape}  # written in place over a donated input")
                else:
                    namespace[f"t{index}"] = dtype
                    slot = len(self.returned)
                    self.returned.append(None)
                    calls.append(f"        v{index} = returned[{slot}] = recycled(returned[{slot}], "
                                 f"{tuple(shape)!r}, t{index})")
            args = ", ".join(ref(i) for i in ins)
            if view:
                calls.append(f"        {ref(outs[0])} = k{number}({args})")
            elif getattr(kernel, "launcher", None) is not None:
                # a native entry returns a status (runtime/native/jit.py): 0, or a retry through the
                # function object (another layout: another specialization; or the error it names)
                namespace[f"k{number}"] = kernel.launcher
                namespace[f"f{number}"] = kernel
                every = ", ".join([args] * bool(args) + [ref(o) for o in outs])
                calls.append(f"        if k{number}({every}):")
                calls.append(f"            f{number}({every})")
            else:
                calls.append(f"        k{number}({', '.join([args] * bool(args) + [ref(o) for o in outs])})")
        if calls:  # no try block when every step was hoisted or the function only returns
            lines += ["    step = -1", "    try:"] + calls + [
                "    except IndexError as error:",
                "        raise KernelError(NAMES[step] if step >= 0 else '?', str(error)) from None",
                "    except Exception as error:",
                "        raise KernelFailure(NAMES[step] if step >= 0 else '?', error) from error"]
        results = [ref(index) if owned else f"array({ref(index)})" for index, owned in self.output_slots]
        lines.append(f"    return [{', '.join(results)}]")
        namespace["NAMES"] = names
        source = "\n".join(lines) + "\n"
        exec(compile(source, f"<bendc launch list of {name}>", "exec"), namespace)  # noqa: S102
        return source, namespace["run"]

    def run_steps(self, inputs: Sequence[np.ndarray]):
        """Run one call step by step, slowly: yields (step name, {value id: array}) after each
        non-hoisted step, before the next one may reuse its buffers (the self-check's view)."""
        values = list(self.values)
        for index, array in zip(self.param_slots, inputs):
            values[index] = array
        for entry in self.program:
            try:
                self._run_step(entry, values)
            except IndexError as error:
                raise KernelError(entry[0], str(error)) from None
            except Exception as error:
                raise KernelFailure(entry[0], error) from error
            yield entry[0], {self.value_ids[o]: values[o] for o in entry[3]}

    def time_steps(self, inputs: Sequence[np.ndarray], clock: Callable[[], int],
                   reuse: dict | None = None) -> list[tuple[str, int, int]]:
        """Run one call step by step: (step name, start, end) per non-hoisted step, by ``clock``
        (e.g. time.perf_counter_ns); the profiler's view. Output arrays are allocated outside the
        timed spans and kept in ``reuse`` between calls (as the driver recycles them)."""
        values = list(self.values)
        for index, array in zip(self.param_slots, inputs):
            values[index] = array
        reuse = {} if reuse is None else reuse
        spans = []
        for name, kernel, ins, outs, view, fresh in self.program:
            for index, shape, dtype in fresh:
                if dtype is None:
                    values[index] = values[shape]
                else:
                    if index not in reuse:
                        reuse[index] = np.empty(shape, dtype)
                    values[index] = reuse[index]
            args = [values[i] for i in ins]
            if view:
                start = clock()
                values[outs[0]] = kernel(*args)
            else:
                # the call the launch list makes: a native entry itself (a status: 0 when it ran)
                launcher = getattr(kernel, "launcher", None)
                every = [*args, *[values[o] for o in outs]]
                start = clock()
                if launcher is None:
                    kernel(*every)
                elif launcher(*every):
                    kernel(*every)
            spans.append((name, start, clock()))
        return spans

    def time_launch_list(self, inputs: Sequence[np.ndarray], clock: Callable[[], int], runs: int) -> int:
        """The launch list's own time per call (the profiler's overhead row): the driver's source run
        ``runs`` times with every kernel a no-op, so what remains is its Python (argument binding,
        output allocation, the calls themselves, the copies of returned buffers; not a returned
        view's copy: views are no-ops too); the median, in ``clock``'s units."""
        namespace = dict(self._namespace)
        namespace["returned"] = [None] * len(self.returned)
        for number in range(len(self.program)):
            # a builtin taking any arguments and returning a false value (a launcher's "ran"); views
            # too (the profiler times them as steps)
            namespace[f"k{number}"] = namespace[f"f{number}"] = "".format
        exec(compile(self.source, "<bendc launch list, kernels off>", "exec"), namespace)  # noqa: S102
        run = namespace["run"]
        times = []
        for _ in range(runs):
            start = clock()
            run(inputs)
            times.append(clock() - start)
        return sorted(times)[len(times) // 2]

    def _run_step(self, entry, values: list | None = None) -> None:
        name, kernel, ins, outs, view, fresh = entry
        values = self.values if values is None else values
        for index, shape, dtype in fresh:
            values[index] = np.empty(shape, dtype) if dtype is not None else values[shape]
        if view:
            values[outs[0]] = kernel(*[values[i] for i in ins])
        else:
            kernel(*[values[i] for i in ins], *[values[o] for o in outs])
