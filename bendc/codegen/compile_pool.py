"""Compiling a plan's kernels on every core at once, before its first call.

numba compiles a kernel when it is first called, one after another: a cold transformer step spent
~20 s in 57 serial compiles. Here, before the plan is bound, a dry run of its launch list (views
run, every other step's arrays allocated but not computed) records the numba types each kernel
module's functions will be called with; the jobs, slowest first (by source length), are then
shared between this process and ``BENDC_COMPILE_WORKERS`` worker processes
(``python -m bendc.codegen.compile_pool``). A worker imports the module from its file as this
process does (runtime/artifact.py ``load_module``: hash-checked, numba's cache hardened) and
compiles the function for the recorded types: numba writes the machine code into the kernel
cache beside the module (``cache=True``, signed under this user's key, saved under the index's
lock), and this process then loads it from there. The cache is the only thing shared, so its crash
safety holds as for two processes compiling at once, and the machine code is the same as a serial
compile's (the same LLVM, flags and CPU: tests/codegen/test_compile_pool.py checks the bits).

Anything the dry run cannot type (a wrapper that fails on uninitialised data, a keyword call) is
left to numba's lazy compile at the first call, as before; a worker that fails or dies leaves its
job to it too. ``BENDC_COMPILE_WORKERS``: the number of worker processes (default: the usable
cores less one, this process being the other; 0 compiles here only). Jobs go to workers only when
there are at least ``POOL_FROM_JOBS``: a worker's start (~0.4 s: Python, numpy, numba) costs more
than a few small kernels take.

``BENDC_LOG=compile`` logs the profile (bendc/logs.py): every kernel compiled, slowest first, with
numba's time by phase (typing, parfors, lowering with LLVM) and where it ran.
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
import types as pytypes
import warnings
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Sequence

import numpy as np

POOL_FROM_JOBS = 4
# Native compiles take 10-400 ms each: a worker (~0.5 s to start) pays off from this many jobs.
NATIVE_POOL_FROM_JOBS = 12


@dataclass(frozen=True)
class Job:
    """One function of a kernel module to compile for one signature (numba types)."""

    path: str        # the module's file
    module: str      # its structural name (runtime.artifact.module_name)
    function: str    # the function's name in the module
    signature: tuple  # numba types, one per argument
    cost: int         # the module's source length: the order jobs are taken in, largest first


@dataclass
class Compiled:
    """A job's outcome: seconds of numba work, by phase, where (``main`` or ``worker N``), error."""

    job: Job
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    where: str = "main"
    error: str | None = None
    functions: int = 1  # the module's functions it compiled (the job's and the helpers it calls)


@dataclass
class Profile:
    """A cold compile's profile: bendc's stages (seconds by name), the kernels compiled."""

    stages: dict[str, float] = field(default_factory=dict)
    kernels: list[Compiled] = field(default_factory=list)
    workers: int = 0
    wall: float = 0.0

    def lines(self, name: str) -> list[str]:
        total = sum(self.stages.values()) + self.wall
        head = ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in self.stages.items())
        lines = [f"compile profile of {name}: {total:.2f} s ({head}; kernels {self.wall:.2f} s on "
                 f"{self.workers + 1} process{'es' if self.workers else ''})"]
        for item in sorted(self.kernels, key=lambda k: -k.seconds):
            phases = ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in item.phases.items() if seconds >= 0.005)
            failed = f" FAILED ({item.error}): left to the first call" if item.error else ""
            lines.append(f"  {item.seconds:6.2f} s  {item.job.module}.{item.job.function} [{item.where}]"
                         f"{' ' + phases if phases else ''}{failed}")
        return lines


# ------------------------------------------------------------------ the dry run
def _is_dispatcher(value: Any) -> bool:
    return hasattr(value, "py_func") and hasattr(value, "compile") and hasattr(value, "overloads")


class _Recorder:
    """Stands for a numba function in the dry run: records the types it is called with."""

    def __init__(self, name: str, calls: list[tuple[str, tuple]]) -> None:
        self.name, self.calls = name, calls

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError("keyword arguments: left to numba's lazy compile")
        from numba.core.typing.typeof import Purpose, typeof

        self.calls.append((self.name, tuple(typeof(arg, Purpose.argument) for arg in args)))


def _shadow(module: Any, calls: list[tuple[str, tuple]]) -> dict[str, Any]:
    """The module's namespace with its numba functions replaced by recorders and its Python
    functions rebound to that namespace (so a wrapper calling a helper records the helper's calls)."""
    namespace = dict(vars(module))
    for name, value in vars(module).items():
        if _is_dispatcher(value):
            namespace[name] = _Recorder(name, calls)
        elif isinstance(value, pytypes.FunctionType) and value.__module__ == module.__name__:
            namespace[name] = pytypes.FunctionType(value.__code__, namespace, value.__name__, value.__defaults__,
                                                   value.__closure__)
    return namespace


def kernel_jobs(plan: dict, modules: dict[str, Any], paths: dict[str, str]) -> list[Job]:
    """The compile jobs of a plan: its launch list run dry (see the module docstring).

    ``modules``: module name -> imported kernel module; ``paths``: module name -> its file.
    Functions already compiled for the recorded types (in this process) are left out."""
    from runtime.cpu import _typed
    from runtime.dtypes import DTYPES

    values = {int(k): (d, tuple(s)) for k, (d, s) in plan["values"].items()}
    arrays: dict[int, np.ndarray] = {}
    buffers = [np.empty(size, dtype=np.uint8) for size in plan["buffers"]]
    for value, buffer in plan["storage"].items():
        dtype, shape = values[int(value)]
        arrays[int(value)] = _typed(buffers[buffer], dtype, shape)
    for param in plan["params"]:
        dtype, shape = values[param]
        arrays[param] = np.empty(shape, DTYPES[dtype])
    donations = {int(k): v for k, v in plan.get("donations", {}).items()}
    seen: set[tuple[str, str, tuple]] = set()
    jobs: list[Job] = []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for step in plan["steps"]:
            module = modules[step["module"]]
            if any(i not in arrays for i in step["inputs"]):
                return jobs  # a value the dry run could not make: the rest compiles lazily
            ins = [arrays[i] for i in step["inputs"]]
            if step["convention"] == "view":
                try:
                    arrays[step["outputs"][0]] = module.kernel(*ins)
                except Exception:  # noqa: BLE001 - the first call will say what is wrong
                    return jobs
                continue
            for value in step["outputs"]:
                if value not in arrays:
                    dtype, shape = values[value]
                    arrays[value] = arrays[donations[value]] if value in donations else np.empty(shape, DTYPES[dtype])
            outs = [arrays[o] for o in step["outputs"]]
            numba_functions = [v for v in vars(module).values() if _is_dispatcher(v)]
            if all(function.overloads for function in numba_functions):
                continue  # compiled already (another program, another batch size): nothing to run dry
            calls: list[tuple[str, tuple]] = []
            kernel = module.kernel
            try:
                if _is_dispatcher(kernel):
                    _Recorder("kernel", calls)(*ins, *outs)
                else:
                    _shadow(module, calls)["kernel"](*ins, *outs)
            except Exception:  # noqa: BLE001 - a wrapper that needs real data: lazy compile
                pass
            source_length = os.path.getsize(paths[step["module"]])
            for function, signature in calls:
                key = (step["module"], function, signature)
                dispatcher = getattr(module, function)
                if key in seen or tuple(signature) in dispatcher.overloads:
                    continue
                seen.add(key)
                jobs.append(Job(paths[step["module"]], step["module"], function, signature, source_length))
    return jobs


# ------------------------------------------------------------------ compiling
_PHASES = (("typing", ("nopython_type_inference",)), ("parfors", ("parfor",)),
           ("lowering+LLVM", ("native_lowering",)))


def phases_of(dispatcher: Any, signature: tuple) -> dict[str, float]:
    """numba's pipeline times of a compiled signature, grouped (nested compiles are inside typing)."""
    try:
        metadata = dispatcher.get_metadata(signature)
    except Exception:  # noqa: BLE001 - loaded from the cache: no pipeline times
        return {}
    grouped = {name: 0.0 for name, _ in _PHASES}
    grouped["other"] = 0.0
    for passes in metadata.get("pipeline_times", {}).values():
        for name, timing in passes.items():
            seconds = timing.init + timing.run + timing.finalize
            group = next((g for g, keys in _PHASES if any(k in name for k in keys)), "other")
            grouped[group] += seconds
    return grouped


def _compiled(module: Any) -> int:
    """How many signatures the module's numba functions have compiled or loaded in this process."""
    return sum(len(value.overloads) for value in vars(module).values() if _is_dispatcher(value))


def compile_native_job(job: Job) -> Compiled | None:
    """Compile one job natively in this process (runtime/native: milliseconds, not worth a worker):
    its outcome, or None where the translator does not cover it (numba compiles it, here or in a
    worker)."""
    from runtime.artifact import load_module
    from runtime.native.jit import NativeFunction

    start = time.perf_counter()
    try:
        dispatcher = getattr(load_module(job.path, job.module), job.function)
        if not isinstance(dispatcher, NativeFunction) or not dispatcher.compile_native(job.signature):
            return None
    except Exception:  # noqa: BLE001 - numba's compile of it reports what is wrong
        return None
    record = dispatcher.compiles[tuple(job.signature)]
    phases = {"translate": record.translate, "LLVM": record.llvm, "load": record.load}
    return Compiled(job, time.perf_counter() - start, phases, "main, native" + (" (cached)" if record.cached else ""))


def compile_job(job: Job, where: str = "main") -> Compiled:
    """Compile one job in this process (numba caches the machine code beside the module)."""
    from runtime.artifact import load_module

    start = time.perf_counter()
    try:
        module = load_module(job.path, job.module)
        before = _compiled(module)
        dispatcher = getattr(module, job.function)
        dispatcher.compile(job.signature)
        record = getattr(dispatcher, "compiles", {}).get(tuple(job.signature))
        if record is not None and record.native:
            phases = {"translate": record.translate, "LLVM": record.llvm, "load": record.load}
            where += ", native" + (" (cached)" if record.cached else "")
        else:
            phases = phases_of(dispatcher, job.signature)
        return Compiled(job, time.perf_counter() - start, phases, where, functions=max(1, _compiled(module) - before))
    except Exception as error:  # noqa: BLE001 - the first call compiles it again and reports it
        return Compiled(job, time.perf_counter() - start, {}, where, f"{type(error).__name__}: {error}"[:200])


def worker_count() -> int:
    """BENDC_COMPILE_WORKERS, else the usable cores less one."""
    text = os.environ.get("BENDC_COMPILE_WORKERS", "").strip()
    if text:
        return max(0, int(text))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(0, cores - 1)


def _send(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the compile worker closed its pipe")
    (length,) = struct.unpack("<Q", head)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the compile worker closed its pipe")
    return pickle.loads(data)  # noqa: S301 - from the worker this process started


def worker_command() -> list[str]:
    """The command line of a worker process."""
    return [sys.executable, "-m", "bendc.codegen.compile_pool"]


def _worker_environment() -> dict[str, str]:
    """This process's environment, with bendc's and runtime's folder first on the path."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [environment.get("PYTHONPATH")] if p])
    return environment


def compile_all(jobs: Sequence[Job], workers: int | None = None) -> tuple[list[Compiled], int]:
    """Compile ``jobs`` here and in up to ``workers`` worker processes at once (see the module
    docstring); (outcomes, workers used). Jobs a worker did not finish are compiled here."""
    workers = worker_count() if workers is None else workers
    workers = min(workers, len(jobs) - 1) if len(jobs) >= POOL_FROM_JOBS else 0
    pending: "queue.Queue[Job]" = queue.Queue()
    for job in sorted(jobs, key=lambda j: -j.cost):
        pending.put(job)
    results: list[Compiled] = []
    lock = threading.Lock()

    def feed(number: int) -> None:
        try:
            process = subprocess.Popen(worker_command(), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=_worker_environment())
        except OSError:
            return
        job = None
        try:
            while True:
                try:
                    job = pending.get_nowait()
                except queue.Empty:
                    job = None
                    break
                _send(process.stdin, job)
                outcome = _receive(process.stdout)
                outcome.where = f"worker {number}" + outcome.where[len("worker"):]  # keeps ", native"
                with lock:
                    results.append(outcome)
                    if not outcome.error:
                        from bendc.progress import compiled_elsewhere

                        compiled_elsewhere(outcome.functions)
                job = None
        except (OSError, EOFError, pickle.UnpicklingError):
            pass
        finally:
            if job is not None:  # in flight when the worker failed: compiled here
                pending.put(job)
            try:
                process.stdin.close()
            except OSError:
                pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    threads = [threading.Thread(target=feed, args=(n + 1,), daemon=True) for n in range(workers)]
    for thread in threads:
        thread.start()
    while True:
        try:
            job = pending.get_nowait()
        except queue.Empty:
            if not any(thread.is_alive() for thread in threads) and pending.empty():
                break
            time.sleep(0.005)
            continue
        outcome = compile_job(job)
        with lock:
            results.append(outcome)
    for thread in threads:
        thread.join()
    return results, workers


def load_compiled(outcomes: Sequence[Compiled], modules: dict[str, Any]) -> None:
    """Load what the workers compiled into this process's functions (from the kernel cache); a
    job that failed in a worker is left to the first call, which compiles it and says why."""
    for outcome in outcomes:
        if outcome.where == "main" or outcome.error:
            continue
        dispatcher = getattr(modules[outcome.job.module], outcome.job.function)
        try:
            dispatcher.compile(outcome.job.signature)
        except Exception:  # noqa: BLE001 - compiled again (and reported) at the first call
            pass


def precompile(plan: dict, modules: dict[str, Any], paths: dict[str, str], profile: Profile | None = None) -> None:
    """Compile the kernels of a CPU plan before it is bound (see the module docstring)."""
    start = time.perf_counter()
    jobs = kernel_jobs(plan, modules, paths)
    if len(jobs) >= NATIVE_POOL_FROM_JOBS and worker_count() > 0:
        # Many kernels: shared with the worker processes, native or not (a worker compiles a native
        # kernel as this process would, into the same signed object cache, and this process loads it).
        # Threads would not overlap: llvmlite serializes every LLVM call under one lock.
        outcomes, workers = compile_all(jobs)
    else:  # a few: here, natively where the translator can (milliseconds), the rest as before
        native = [outcome for outcome in map(compile_native_job, jobs) if outcome is not None]
        done = {id(outcome.job) for outcome in native}
        jobs = [job for job in jobs if id(job) not in done]
        outcomes, workers = compile_all(jobs) if jobs else ([], 0)
        outcomes = native + outcomes
    load_compiled(outcomes, modules)
    if profile is not None:
        profile.kernels.extend(outcomes)
        profile.workers = max(profile.workers, workers)
        profile.wall += time.perf_counter() - start


# ------------------------------------------------------------------ the worker process
def _serve() -> None:
    """Compile the jobs sent on stdin, one at a time, answering each on stdout (fd 1 is moved to
    stderr first, so that nothing numba prints can garble the answers)."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            job = _receive(requests)
        except EOFError:
            return
        _send(answers, compile_job(job, "worker"))


if __name__ == "__main__":  # run as a module: its classes must pickle under their own module's name
    from bendc.codegen import compile_pool

    compile_pool._serve()
