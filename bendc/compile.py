"""The one driver: trace -> autodiff -> passes -> plan -> build, with the on-disk cache,
stage dumps and the compile report.

``compile_step`` turns a :class:`Request` (a function and one signature) into
an :class:`Executable`. Per target: ``reference`` interprets the graph with
numpy; ``cpu`` builds the kernel plan, renders each step to source (codegen),
writes and imports the kernel modules, plans memory, and binds the plan in
the runtime; ``cuda`` does the same with numba.cuda kernels (codegen/cuda.py)
and binds them from cubins in the cubin runtime (runtime/cuda_graph.py) or on
numba-cuda's JIT (runtime/cuda.py), as bendc/cuda_jit.py chooses; it is not
cached on disk as a program yet (its kernel modules and cubins are, by hash). A compiled cpu program is stored as an artifact under
``<cache>/programs/<key>``, keyed by the traced IR, the passes, the target
and the bendc/numba/numpy versions; a second process with the same signature
loads it instead of compiling, and a corrupt entry is discarded and rebuilt.

Cache entries are code (runtime/trust.py): the cache folder must be this user's and
not writable by others (else ArtifactError, naming the chmod), entries are signed
with the user's key, and an entry the key did not sign (written by someone else,
or re-hashed after it was written) is never imported: it is discarded and
rebuilt, as a damaged one is. A rebuild is always possible and costs only time,
while refusing would stop every jit call until the user cleared the cache by
hand (after an upgrade, every older entry is unsigned); an artifact given to
``bendc run``, which cannot be rebuilt, is refused instead.
"""
from __future__ import annotations

import ctypes.util
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from bendc.artifact import compiler_fingerprint, discard_artifact, index_bounds, versions, write_artifact
from bendc.autodiff import differentiate
from bendc.codegen.cache import default_cache_dir, kernel_path, write_kernel
from bendc.codegen.compile_pool import Profile, precompile
from bendc.codegen.cpu import render_plan
from bendc.codegen.memory import plan_memory
from bendc.codegen.plan import KernelPlan, build_plan, describe_plan, plan_stats
from bendc.errors import (ArtifactError, DistributedError, InternalError, RuntimeCheckError, SourceLoc,
                          UnsupportedError, user_location)
from bendc.ir.graph import Graph
from bendc.ir.interp import Interpreter
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_context, format_graph
from bendc.ir.types import TensorType
from bendc.ir.verify import verify
from bendc.passes import PassContext, Pipeline
from bendc.trace import Tensor, Tracer
from bendc import logs, tree
from bendc.tree import Template
from runtime.artifact import (ArtifactInvalid, ArtifactUntrusted, load_module, load_program, read_stages, read_text,
                              with_constants)
from runtime.cuda import numba_cuda_installed
from runtime.collective import CollectiveError
from runtime.cpu import CpuProgram, KernelError, KernelFailure
from runtime.files import atomic_write
from runtime.trust import InsecurePath, load_key, private_cache


@dataclass
class Executable:
    """One traced and compiled signature."""

    graph: Graph
    stages: dict[str, str]
    tape: str
    template: Any
    report: str
    run: Callable[[Sequence[np.ndarray]], list]
    kernels: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    # What the trace read from torch modules (bendc/guards.py); ``guard()`` is True while it holds
    # (None: nothing to check). bendc/function.py reuses the executable only then.
    guards: tuple = ()
    guard: Callable[[], bool] | None = None

    def guarded(self, guards: Sequence[Any]) -> "Executable":
        """This executable with the module guards of its trace."""
        self.guards = tuple(guards)
        if len(self.guards) == 1:
            self.guard = self.guards[0].checker()
        elif self.guards:
            checks = [guard.checker() for guard in self.guards]
            self.guard = lambda: all(check() for check in checks)
        return self


@functools.lru_cache(maxsize=None)
def cuda_status() -> str | None:
    """"gpu" where numba-cuda imports and a GPU is usable, "simulator" under NUMBA_ENABLE_CUDASIM=1
    (numba's CUDA simulator, read when numba.cuda is imported), else None.

    Cheap where there is no GPU: numba.cuda is imported only when a CUDA driver is present.
    """
    if not numba_cuda_installed():
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "simulator"
    if not (os.path.exists("/dev/nvidiactl") or ctypes.util.find_library("cuda")):
        return None
    try:
        from numba import cuda

        return "gpu" if cuda.is_available() else None
    except Exception:  # a broken driver or toolkit: no cuda target
        return None


@dataclass
class Built:
    """What a target made of a graph."""

    run: Callable[[Sequence[np.ndarray]], list]
    kernels: dict[str, str] = field(default_factory=dict)
    report: list[str] = field(default_factory=list)
    plan: KernelPlan | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)  # extra artifact files (PTX, cubin)


def build_reference(graph: Graph) -> Built:
    interpreter = Interpreter(graph)
    aliases = set(graph.params)

    def run(inputs: Sequence[np.ndarray]) -> list:
        results = interpreter.run(inputs)
        # An output that is a parameter (or a view of one) must not alias the caller's array.
        return [np.array(r) if (o in aliases or r.base is not None) else r
                for o, r in zip(graph.outputs, results)]

    return Built(run)


def _step_loc(step: dict) -> SourceLoc | None:
    path, _, line = step["loc"].rpartition(":")
    return SourceLoc(path, int(line)) if path else None


def kernel_failure(error: KernelFailure, plan: dict, final_ir: Callable[[], Graph]) -> InternalError:
    """A generated kernel that failed (not a check): an InternalError naming the kernel, its op and
    user's line, with the IR of its nodes (``final_ir`` gives the graph, read only now)."""
    step = next((s for s in plan["steps"] if s["name"] == error.step), None)
    if step is None:
        return InternalError(f"kernel {error.step} failed: {error}")
    lines = [line.strip() for line in str(error.error).splitlines() if line.strip()][:8]
    return InternalError(f"kernel {step['name']} ({step['kind']}, module {step.get('module', '?')}) failed: "
                         f"{type(error.error).__name__}: " + "\n    ".join(lines),
                         loc=_step_loc(step), op=step["op"], context=format_context(final_ir(), step["nodes"]))


def cpu_runner(plan: dict, program: Any, final_ir: Callable[[], Graph]) -> Callable[[Sequence[np.ndarray]], list]:
    """program.run (cpu or cuda), with a kernel's failed check raised as a BendcError at the user's line
    and a kernel that fails otherwise as an InternalError naming it."""
    steps = {step["name"]: step for step in plan["steps"]}

    def run(inputs: Sequence[np.ndarray]) -> list:
        try:
            return program.run(inputs)
        except KernelError as error:
            step = steps[error.step]
            raise RuntimeCheckError(error.detail, loc=_step_loc(step), op=step["op"]) from None
        except CollectiveError as error:  # the cuda runtime's host steps raise it as it is
            raise DistributedError(str(error)) from None
        except KernelFailure as error:
            if isinstance(error.error, CollectiveError):  # a peer rank, not the kernel, failed
                step = steps[error.step]
                raise DistributedError(str(error.error), loc=_step_loc(step), op=step["op"]) from None
            raise kernel_failure(error, plan, final_ir) from error.error

    run.program, run.plan = program, plan  # what the self-check (bendc/check.py) steps through
    return run


def bind_cpu(plan: dict, kernels: dict[str, Callable], final_ir: Callable[[], Graph]) -> CpuProgram:
    """The plan bound on the CPU (hoisted steps run now): a failed kernel is an InternalError."""
    try:
        return CpuProgram(plan, kernels)
    except KernelError as error:
        step = next(s for s in plan["steps"] if s["name"] == error.step)
        raise RuntimeCheckError(error.detail, loc=_step_loc(step), op=step["op"]) from None
    except KernelFailure as error:
        raise kernel_failure(error, plan, final_ir) from error.error


Progress = Callable[[int, int, str], None]  # (kernel number from 1, kernel count, kernel name)


def build_cpu(graph: Graph, cache_dir: str, donate: Sequence[str] = (), progress: Progress | None = None,
              profile: Profile | None = None) -> Built:
    """Plan, render, write and import the kernel modules, compile them (on every core:
    bendc/codegen/compile_pool.py) and bind the plan."""
    started = time.perf_counter()
    plan = build_plan(graph)
    # The memory plan first: an elementwise kernel writes a donated parameter's update into the
    # parameter's own argument (plan.donations; bendc/codegen/cpu.py _render_elementwise_loops).
    decisions = plan_memory(plan, donated_params(graph, donate))
    render_plan(plan, graph)
    from bendc.progress import expect
    from runtime.machine import dispatchers

    kernels, modules = {}, {}
    for number, step in enumerate(plan.steps, start=1):
        if progress is not None:
            progress(number, len(plan.steps), step.name)
        step.module = write_kernel(cache_dir, step.source)
        modules[step.module] = load_module(kernel_path(cache_dir, step.module), step.module)
        kernels[step.name] = modules[step.module].kernel
    plan_json = plan.to_json()
    if profile is not None:
        profile.stages["plan+render"] = time.perf_counter() - started
    expect(sum(1 for function in dispatchers(modules.values()) if not function.overloads))  # to compile
    precompile(plan_json, modules, {m: kernel_path(cache_dir, m) for m in modules}, profile)
    report = describe_plan(plan) + [f"memory: {d}" for d in decisions]
    final_ir = lambda: graph  # noqa: E731
    program = with_constants(bind_cpu(plan_json, kernels, final_ir), graph.constant_values())
    return Built(cpu_runner(plan_json, program, final_ir),
                 {s.name: s.source for s in plan.steps}, report, plan)


@dataclass
class CudaKernels:
    """The cuda kernels of a graph, rendered and imported but not bound to a device."""

    plan: KernelPlan
    modules: dict[str, Any]  # step name -> imported kernel module
    report: list[str]


def donated_params(graph: Graph, donate: Sequence[str]) -> frozenset[int]:
    """The parameter nodes of the inputs named in ``donate``."""
    return frozenset(p for p in graph.params if graph.node(p).attr["name"] in donate)


def render_cuda(graph: Graph, cache_dir: str, donate: Sequence[str] = ()) -> CudaKernels:
    """Plan, render numba.cuda kernels (strided views resolved first), plan memory, import the modules.

    Needs numba-cuda but no GPU: the PTX tests and ``bendc compile`` use it too.
    The caller's device arrays are only read (each is copied into a static buffer, or read in place
    by the numba runtime); ``donate``: the memory plan writes a donated parameter's update over its
    static buffer where that is safe (plan.donations), which the cubin runtime keeps resident.
    """
    from bendc.codegen.cuda import describe_launches, describe_tiles, render_cuda_plan

    plan = build_plan(graph)
    views = render_cuda_plan(plan, graph)  # makes the copied views write steps: before the memory plan
    decisions = plan_memory(plan, donated_params(graph, donate))
    modules = {}
    for step in plan.steps:
        step.module = write_kernel(cache_dir, step.source)
        modules[step.name] = load_module(kernel_path(cache_dir, step.module), step.module)
    report = (describe_plan(plan) + [f"layout: {d}" for d in views.decisions] + [f"memory: {d}" for d in decisions]
              + [f"launch: {line}" for line in describe_launches(plan)]
              + [f"tiles: {line}" for line in describe_tiles(plan)])
    if any(step.kind == "collective" for step in plan.steps):
        from runtime.collective import cuda_transport

        report.append(f"collective: {cuda_transport()}")
    return CudaKernels(plan, modules, report)


def build_cuda(graph: Graph, cache_dir: str, donate: Sequence[str] = ()) -> Built:
    """The cuda kernels bound on the GPU (or numba's simulator): from cubins built for the GPU's
    architecture through the cubin runtime when they can be, else by numba-cuda's JIT
    (bendc/cuda_jit.py)."""
    from bendc.cuda_jit import bind_cuda

    kernels = render_cuda(graph, cache_dir, donate)
    plan_json, program, notes = bind_cuda(kernels, cache_dir)
    program = with_constants(program, graph.constant_values())
    return Built(cpu_runner(plan_json, program, lambda: graph), {s.name: s.source for s in kernels.plan.steps},
                 kernels.report + notes, kernels.plan)


def build_cuda_artifact(graph: Graph, cache_dir: str, arch: str, progress: Progress | None = None,
                        donate: Sequence[str] = ()) -> Built:
    """The cuda kernels compiled ahead of time for ``arch``: PTX (NVVM) and cubin (nvJitLink) per
    kernel (or their cubins from the kernel cache: bendc/codegen/cubins.py), with registers, spills
    and shared memory in the report. Needs numba-cuda, not a GPU."""
    from bendc.codegen.cubins import CubinCache
    from bendc.codegen.ptx import compile_plan, cubin_file, record_launches

    kernels = render_cuda(graph, cache_dir, donate)
    compiled = compile_plan(kernels.plan, kernels.modules, arch, progress, CubinCache(cache_dir, arch))
    record_launches(kernels.plan, compiled)  # entry symbols and parameter layouts, for runtime/cuda_graph.py
    files: dict[str, str | bytes] = {}
    for kernel in compiled:
        files[f"ptx/{kernel.step}.{kernel.kernel}.ptx"] = kernel.ptx
        files[cubin_file(kernel.step, kernel.kernel, arch)] = kernel.cubin
    report = kernels.report + [f"compiled: {kernel.describe()}" for kernel in compiled]

    def run(inputs: Sequence[np.ndarray]) -> list:
        raise RuntimeError("an ahead-of-time cuda build runs on a GPU: bendc run OUT there")

    built = Built(run, {s.name: s.source for s in kernels.plan.steps}, report, kernels.plan)
    built.files = files
    return built


def build(target: str, graph: Graph, cache_dir: str | None, donate: Sequence[str] = (),
          progress: Progress | None = None, profile: Profile | None = None) -> Built:
    if target == "reference":
        return build_reference(graph)
    if target == "cpu":
        return build_cpu(graph, cache_dir or default_cache_dir(), donate, progress, profile)
    if target == "cuda":
        return build_cuda(graph, cache_dir or default_cache_dir(), donate)
    raise AssertionError(f"no builder for target {target}")


# ------------------------------------------------------------------ on-disk cache
def program_key(traced_ir: str, passes: list[str], target: str, template: Any, donate: Sequence[str],
                parameters: dict[str, Any] | None = None) -> str:
    blob = json.dumps([traced_ir, passes, target, repr(template), sorted(donate), versions(),
                       compiler_fingerprint(), parameters], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def program_entry(cache_dir: str | None, key: str) -> str:
    return os.path.join(cache_dir or default_cache_dir(), "programs", key)


@dataclass
class Cached:
    stages: dict[str, str]
    tape: str
    template: Any
    report: str
    run: Callable
    kernels: dict[str, str]
    stats: dict[str, int]


def load_cached(entry: str, cache_dir: str | None, _retry: bool = True) -> Cached | None:
    """The cached program at ``entry``, None when absent; a corrupt entry is removed (unless another
    process put a valid one in its place while this one read it: then that one is loaded)."""
    if not os.path.exists(entry):
        return None
    try:
        kernel_dir = os.path.dirname(kernel_path(cache_dir or default_cache_dir(), "k"))
        manifest, plan, program = load_program(entry, kernel_dir)
        kernels = {step["name"]: read_text(entry, f"kernels/{step['module']}.py") for step in plan["steps"]}
        stats = plan_stats(KernelPlan.from_json(plan))
        stages = read_stages(entry, manifest)
        return Cached(stages, read_text(entry, "tape.txt"), Template.from_json(manifest["template"]),
                      read_text(entry, "report.txt") + "[cache] loaded from the on-disk cache\n",
                      cpu_runner(plan, program, lambda: parse_graph(stages["final"])), kernels, stats)
    # A program that does not bind (a kernel failing in a hoisted step) is rebuilt, which then
    # reports the failure as compiling does.
    except (ArtifactInvalid, OSError, ValueError, KeyError, KernelFailure) as error:
        if not discard_artifact(entry):  # valid now: replaced while read
            return load_cached(entry, cache_dir, _retry=False) if _retry else None
        if isinstance(error, ArtifactUntrusted):  # its hashes hold, but another key (or none) signed it
            print(f"bendc: discarded a cache entry that your key did not sign, {entry} (rebuilt now): "
                  f"{error.problem}", flush=True)
        else:
            print(f"bendc: discarded a corrupt cache entry {entry}: {error}", flush=True)
        return None


# ------------------------------------------------------------------ the driver
@dataclass(frozen=True)
class Request:
    """What to compile: a function, a signature (parameter types in order, static values), its
    leaves and donations, the passes, the target; ``artifact``: write an artifact folder there
    (the on-disk cache is then neither read nor written); ``cuda_arch``: build cuda kernels ahead
    of time for that architecture."""

    fn: Callable
    parameters: tuple[str, ...]
    types: tuple[tuple[str, TensorType], ...]
    static: dict[str, Any]
    leaves: tuple[str, ...]
    donate: tuple[str, ...]
    passes: tuple[Any, ...]
    target: str
    cache_dir: str | None = None
    artifact: str | None = None
    progress: Progress | None = None
    cuda_arch: str | None = None
    # The function's arguments from the traced parameters (by name): pytrees and dynamic scalars
    # (bendc/function.py); None: each parameter is one array or a static value.
    arguments: Callable[[dict[str, Tensor]], dict[str, Any]] | None = None
    data_parallel: bool = False  # every .grad read is all-reduced (mean) over the ranks
    # Each parameter's structure in the manifest's JSON form (bendc/function.py _parameters_json):
    # which inputs make up each pytree parameter, for runtime.load and ``bendc run``.
    structure: dict[str, Any] | None = None
    sign_with: str | None = None  # the key file an artifact is signed with (default: the user's key)


def check_trust(request: Request) -> None:
    """ArtifactError when the cache folder or a key file is one others could change (fixed by the
    chmod the message names); makes the cache folder (0700) and the user's key on first use."""
    try:
        if request.target != "reference" or request.artifact is not None:
            private_cache(request.cache_dir or default_cache_dir())
            load_key()
        if request.sign_with is not None:
            load_key(request.sign_with, create=False)
    except InsecurePath as error:
        raise ArtifactError(str(error), op="cache" if request.artifact is None else "compile") from None


def compile_step(request: Request) -> Executable:
    """Trace, differentiate, run the passes and build (or load the cached program)."""
    check_trust(request)
    name = request.fn.__name__
    profile, started = Profile(), time.perf_counter()
    tracer = Tracer(name, request.data_parallel, "cuda" if request.cuda_arch is not None else request.target)
    tensors: dict[str, Tensor] = {}
    for parameter, type in request.types:
        tensors[parameter] = tracer.param(parameter, type, leaf=parameter in request.leaves)
    if request.arguments is not None:
        ordered = request.arguments(tensors)
    else:
        call_args = {**request.static, **tensors}
        ordered = {parameter: call_args[parameter] for parameter in request.parameters}
    tracer.fn = request.fn  # functional_call names a module as the function does (bendc/guards.py)
    with tracer.active():
        result = request.fn(**ordered)
    outputs: list[int] = []
    template = flatten_result(result, outputs)
    traced = tracer.graph
    traced.outputs = outputs
    verify(traced, "traced")

    stages: dict[str, str] = {}
    dump = _Dumper(name)

    def on_stage(stage: str, graph: Graph) -> None:
        stages[stage] = format_graph(graph)
        dump.write(stage, stages[stage])

    on_stage("traced", traced)
    entry = None
    if request.artifact is None and request.target == "cpu" and all(isinstance(p, str) for p in request.passes):
        key = program_key(stages["traced"], list(request.passes), request.target, template, request.donate,
                          request.structure)
        entry = program_entry(request.cache_dir, key)
        cached = load_cached(entry, request.cache_dir)
        if cached is not None:
            for stage, text in cached.stages.items():  # the dumps of a compile, from the cache entry
                if stage != "traced":
                    dump.write(stage, text)
            final = parse_graph(cached.stages["final"])
            final.constants = dict(traced.constants)  # the IR names them by hash only
            return Executable(final, cached.stages, cached.tape, cached.template,
                              cached.report, cached.run, cached.kernels, cached.stats).guarded(tracer.module_guards)
    profile.stages["trace"] = time.perf_counter() - started
    started = time.perf_counter()
    graph = differentiate(traced)
    verify(graph, "autodiff", allow_placeholders=False)
    on_stage("autodiff", graph)
    profile.stages["autodiff"] = time.perf_counter() - started
    started = time.perf_counter()
    target = "cuda" if request.cuda_arch is not None else request.target
    context = PassContext(target=target)
    graph = Pipeline(request.passes).run(graph, context, on_stage)
    on_stage("final", graph)
    profile.stages["passes"] = time.perf_counter() - started
    if request.cuda_arch is not None:
        built = build_cuda_artifact(graph, request.cache_dir or default_cache_dir(), request.cuda_arch,
                                    request.progress, request.donate)
    else:
        built = build(target, graph, request.cache_dir, request.donate, request.progress, profile)
    if logs.enabled("compile"):
        for line in profile.lines(name):
            logs.LOGGER.info("%s", line)
    report = _report(name, target, context, graph, built.report, built.plan)
    tape = tracer.tape()
    destination = request.artifact if request.artifact is not None else entry
    if destination is not None:
        files, extra = built.files, {}
        if request.artifact is not None and target == "cpu":  # machine code in the artifact (bendc/aot.py)
            from bendc.aot import donated_feeds, machine_code

            code, extra["machine"], notes = machine_code(built.run, built.plan, request.cache_dir or
                                                         default_cache_dir(), _input_specs(request, graph))
            extra["feeds"] = donated_feeds(built.plan, graph)
            files = {**files, **code}
            report += "".join(f"[aot] {note}\n" for note in notes)
        elif request.artifact is not None and target == "cuda":  # the updates resident in their inputs' buffers
            from bendc.aot import donated_feeds

            extra["feeds"] = donated_feeds(built.plan, graph)
        write_artifact(destination, function=name, target=target,
                       inputs=_input_specs(request, graph), leaves=list(request.leaves), template=template,
                       plan=built.plan, stages=stages, report=report, tape=tape,
                       extra={"static": _json_static(request.static), "donate": list(request.donate),
                              **({"arch": request.cuda_arch} if request.cuda_arch else {}),
                              **({"parameters": request.structure} if request.structure is not None else {}),
                              **extra}, files=files,
                       replace=request.artifact is not None,  # a cache entry: keep a concurrent writer's
                       key_file=request.sign_with,
                       constants={graph.node(p).attr["name"]: graph.constants[graph.node(p).attr["name"]]
                                  for p in graph.constant_params()})
    stats = plan_stats(built.plan) if built.plan is not None else {}
    return Executable(graph, stages, tape, template, report, built.run, built.kernels,
                      stats).guarded(tracer.module_guards)


def _input_specs(request: Request, graph: Graph) -> list[dict[str, Any]]:
    """The manifest's inputs: name, dtype, shape, leaf, and index_bound for index parameters."""
    bounds = index_bounds(graph)
    specs = []
    for name, type in request.types:
        spec = {"name": name, "dtype": type.dtype, "shape": list(type.shape), "leaf": name in request.leaves}
        if name in bounds:
            spec["index_bound"] = bounds[name]
        specs.append(spec)
    return specs


def _report(name: str, target: str, context: PassContext, graph: Graph, backend: list[str],
            plan: KernelPlan | None = None) -> str:
    from bendc.reporting import format_report

    return format_report(name, target, list(context.decisions), graph, backend, plan)


class _Dumper:
    """Writes each stage to $BENDC_DUMP_DIR/<function>/<NN>-<stage>.ir (atomically)."""

    def __init__(self, name: str) -> None:
        root = os.environ.get("BENDC_DUMP_DIR")
        self.folder = os.path.join(root, name) if root else None
        self.count = 0

    def write(self, stage: str, text: str) -> None:
        if self.folder is None:
            return
        path = os.path.join(self.folder, f"{self.count:02d}-{stage}.ir")
        self.count += 1
        atomic_write(path, text)


def _json_static(static: dict[str, Any]) -> dict[str, Any]:
    """Static values for the manifest (JSON scalars; anything else as its repr)."""
    plain = (bool, int, float, str, type(None))
    return {name: value if isinstance(value, plain) else repr(value) for name, value in static.items()}


# ------------------------------------------------------------------ outputs
def flatten_result(value: Any, outputs: list[int]) -> Template:
    """The return value's structure (a pytree, bendc.tree) with tensors replaced by output slots."""
    leaves, treedef = tree.flatten(value)
    slots = []
    first: dict[int, int] = {}  # node -> its first output: a value returned twice comes back as one array
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            outputs.append(leaf.id)
            slots.append(("out", first.setdefault(leaf.id, len(outputs) - 1)))
        elif isinstance(leaf, (bool, int, float, str)):
            slots.append(("static", leaf))
        else:
            raise UnsupportedError(f"cannot return a {type(leaf).__name__} from a jitted function "
                                   "(tensors, None, scalars, strings and pytrees of them: tuples, lists, "
                                   "dicts, named tuples, dataclasses)", loc=user_location(), op="return")
    return Template(treedef, tuple(slots))


def unflatten_result(template: Template, results: list) -> Any:
    return template.rebuild(results)
