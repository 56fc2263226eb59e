"""The compiler's commands of the ``bendc`` command line: ``compile``, ``ir`` and ``report``.

bendc/cli.py parses the command line and imports this module only when one of
these commands is dispatched (``bendc run`` never imports the compiler).
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
import time
from typing import Any, Sequence, TextIO

from bendc.errors import BendcError, SignatureError, UnsupportedError
from bendc.function import JitFunction, jit
from bendc.ir.dot import format_dot
from bendc.ir.parser import parse_graph
from bendc.ir.types import TensorType
from bendc import tree
from bendc.spec import is_tree_spec, parse_spec, spec_shapes
from runtime.artifact import is_artifact, read_manifest, type_text
from runtime.cli import describe_template
from runtime.cuda import numba_cuda_installed

def load_function(target: str, shapes: str | None) -> tuple[JitFunction, str | dict]:
    """``path/to/module.py:function`` -> (jitted function, SPEC to lower it with: a flat SPEC string,
    or parameter name -> pytree of type texts where the SPEC has dotted pytree entries or the module's
    EXAMPLE_SHAPES is such a dict)."""
    path, _, name = target.rpartition(":")
    if not path or not name:
        raise BendcError(f"expected MODULE.py:FUNCTION, got {target!r}", op="cli")
    if not os.path.isfile(path):
        raise BendcError(f"no such file {path!r}", op="cli")
    module_name = "bendc_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    function = getattr(module, name, None)
    if function is None:
        raise BendcError(f"{path} has no function {name!r}", op="cli")
    if shapes is None:
        shapes = getattr(module, "EXAMPLE_SHAPES", None)
        if shapes is None:
            raise BendcError(f"{path} defines no EXAMPLE_SHAPES; pass --shapes", op="cli")
    if not isinstance(shapes, (str, dict)):
        raise BendcError(f"{path}: EXAMPLE_SHAPES must be a SPEC string or a dict of parameter shapes "
                         f"(pytrees of 'f32[64,784]' texts), got {type(shapes).__name__}", op="cli")
    marked: tuple[str, ...]
    if isinstance(shapes, str) and is_tree_spec(shapes):
        marked = spec_shapes(shapes)[1]  # lowering reads the pytrees (JitFunction._example_binding)
    elif isinstance(shapes, str):
        marked = tuple(n for n, (_, leaf) in parse_spec(shapes).items() if leaf)
    else:
        marked = tuple(name for name, value in shapes.items()
                       if any(isinstance(leaf, str) and leaf.endswith(":leaf") for leaf in tree.leaves(value)))
    if not isinstance(function, JitFunction):
        function = jit(function, leaves=marked, target="reference")
    elif isinstance(shapes, dict):
        unmarked = [name for name in marked if name not in function.leaves]
        if unmarked:
            raise SignatureError(f"{unmarked[0]!r} is marked :leaf but the function's leaves are "
                                 f"{function.leaves}", op="spec")
    return function, shapes


def parse_static(entries: Sequence[str]) -> dict[str, Any]:
    """``--static lr=0.05 --static steps=3`` -> {"lr": 0.05, "steps": 3} (ints, floats, bools)."""
    static: dict[str, Any] = {}
    for entry in entries:
        name, equals, text = entry.partition("=")
        if not equals or not name.isidentifier():
            raise SignatureError(f"--static {entry!r}: write name=value, e.g. --static lr=0.05", op="compile")
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, (bool, int, float)):
            raise SignatureError(f"--static {entry!r}: the value must be a Python int, float or bool",
                                 op="compile")
        static[name] = value
    return static


def check_static(function: JitFunction, shapes: str | dict, static: dict[str, Any]) -> None:
    """Each --static names a parameter of the function that the SPEC gives no shape."""
    shaped = {name.split(".")[0] for name in parse_spec(shapes)} if isinstance(shapes, str) else set(shapes)
    for name in static:
        if name not in function.signature.parameters:
            raise SignatureError(f"--static {name}: {function.__name__}{function.signature} has no parameter "
                                 f"{name!r}", op="compile")
        if name in shaped:
            raise SignatureError(f"--static {name}: {name!r} is an array with a shape in the SPEC; --static "
                                 "sets Python scalar parameters", op="compile")


# ------------------------------------------------------------------ compile
class Progress:
    """``compiling kernel 3/19 k2 ...`` on a stream: one line redrawn in place on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.interactive = stream.isatty()
        self.drawn = False

    def kernel(self, number: int, count: int, name: str) -> None:
        if not self.interactive:  # quiet in pipes, files and tests
            return
        self.stream.write(f"\rcompiling kernel {number}/{count} {name} ...\x1b[K")
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.interactive and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def check_replaceable(folder: str) -> None:
    """OUT may be new, an empty folder, or an artifact (replaced whole); nothing else is overwritten."""
    if not os.path.exists(folder):
        return
    if not os.path.isdir(folder):
        raise BendcError(f"{folder} exists and is not a folder; choose another -o", op="compile")
    if os.listdir(folder) and not is_artifact(folder):
        raise BendcError(f"{folder} exists and is not a bendc artifact; refusing to replace it "
                         "(choose another -o or remove it)", op="compile")


def compile_command(args: argparse.Namespace) -> int:
    if args.target == "cuda":
        if not numba_cuda_installed():
            raise UnsupportedError("--target cuda needs the numba-cuda package: pip install 'bendc[cuda]'")
    elif args.arch is not None:
        raise UnsupportedError(f"--arch applies to --target cuda only (got --target {args.target})")
    static = parse_static(args.static)
    check_replaceable(args.output)
    function, shapes = load_function(args.function, args.shapes)
    check_static(function, shapes, static)
    # Tracing and the passes run as for cpu; --target cuda then renders and compiles cuda kernels.
    function = jit(function.fn, leaves=function.leaves, target="cpu", cache_dir=function.cache_dir,
                   passes=function.passes, donate=_donations(args, function))
    from bendc.progress import CompileWatch

    progress = Progress(sys.stderr)  # cuda: per launch compiled to PTX; cpu: numba's compiles, counted
    start = time.perf_counter()
    try:
        with CompileWatch() as watch:
            executable = function.export(args.output, shapes, static,
                                         progress.kernel if args.target == "cuda" else None,
                                         target=args.target, arch=args.arch or "sm_90",
                                         sign_with=args.sign_with)
    except OSError as error:
        raise BendcError(f"cannot write {args.output}: {error.strerror or error}", op="compile") from None
    finally:
        progress.finish()
    elapsed = time.perf_counter() - start
    for line in compile_summary(args.output, read_manifest(args.output, trust=True), executable.stats, elapsed, watch):
        print(line)
    return 0


def _donations(args: argparse.Namespace, function: JitFunction) -> tuple[str, ...]:
    """--donate a,b (each a parameter of the function), else the function's own donations."""
    names = tuple(name for name in (part.strip() for part in getattr(args, "donate", "").split(",")) if name)
    for name in names:
        if name not in function.signature.parameters:
            raise SignatureError(f"--donate {name}: {function.__name__}{function.signature} has no parameter "
                                 f"{name!r}", op="compile")
    return names or function.donate


def compile_summary(folder: str, manifest: dict, stats: dict[str, int], elapsed: float,
                    watch: Any = None) -> list[str]:
    """What ``bendc compile`` wrote, and how to run it."""
    inputs = []
    for spec in manifest["inputs"]:
        text = f"{spec['name']}={type_text(spec)}" + (":leaf" if spec["leaf"] else "")
        if "index_bound" in spec:
            text += f" (indices < {spec['index_bound']})"
        inputs.append(text)
    kernels = sorted(name for name in manifest["files"] if name.startswith("kernels/"))
    static = ", ".join(f"{name}={value!r}" for name, value in manifest.get("static", {}).items())
    lines = [
        f"compiled {manifest['function']} for {manifest['target']} into {folder} in {elapsed:.2f} s",
        f"  inputs   {' '.join(inputs)}",
        f"  static   {static or '(none)'}",
        f"  returns  {describe_template(manifest['template'])}: "
        + ", ".join(f"out{index} {type_text(spec)}" for index, spec in enumerate(manifest["outputs"])),
        f"  kernels  {len(kernels)} modules, {stats.get('launches', 0)} launches per call; temporaries "
        f"{stats.get('planned_bytes', 0)} bytes (naive plan {stats.get('naive_bytes', 0)})",
        *([f"  compile  {watch.functions} of the kernels' {_functions(manifest)} functions compiled now"
           + (" (the others came compiled from the kernel cache)" if watch.functions < _functions(manifest) else "")]
          if watch is not None and manifest["target"] == "cpu" else []),
        f"  files    manifest.json, plan.json, {len(kernels)} kernels/*.py, {len(manifest['stages'])} ir/*.ir, "
        "report.txt, tape.txt" + _binary_files(manifest),
        *([f"  feeds    " + ", ".join(f"out{index}->{name}" for name, index in manifest["feeds"].items())]
          if manifest.get("feeds") else []),
        *([f"  consts   " + ", ".join(f"{spec['file']} ({type_text(spec)})" for spec in manifest["constants"])
           + " (lifted: passed after the inputs)"] if manifest.get("constants") else []),
        *([f"  machine  code for {manifest['machine']['cpu']} in numba/ ({_functions(manifest)} functions)"]
          if manifest.get("machine") else []),
        f"run it with: bendc run {folder} --random-inputs",
    ]
    return lines


def _functions(manifest: dict) -> int:
    """The kernel functions whose machine code the artifact holds: numba's (one cache index each) and
    native ones (an object file per specialization, runtime/native)."""
    return sum(1 for name in manifest["files"] if name.endswith((".nbi", ".native.o")))


def _binary_files(manifest: dict) -> str:
    """``, 22 ptx/*.ptx, 22 cubin/*.cubin`` for a cuda artifact."""
    counts = [(folder, sum(1 for name in manifest["files"] if name.startswith(folder + "/")))
              for folder in ("ptx", "cubin")]
    return "".join(f", {count} {folder}/*.{folder}" for folder, count in counts if count)


# ------------------------------------------------------------------ ir and report
def ir_command(args: argparse.Namespace) -> int:
    function, shapes = load_function(args.function, args.shapes)
    function.lower(shapes)
    if args.stage not in function.stages():
        raise BendcError(f"no stage {args.stage!r}; stages are {', '.join(function.stages())}", op="ir")
    text = function.ir(args.stage)
    if args.dot is not None:
        write_text(args.dot, format_dot(parse_graph(text)))
    print(text, end="")
    return 0


def write_text(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
    except OSError as error:
        raise BendcError(f"cannot write {path}: {error.strerror or error}", op="ir") from None


def report_command(args: argparse.Namespace) -> int:
    function, shapes = load_function(args.function, args.shapes)
    function.lower(shapes)
    print(function.report(), end="")
    return 0


# ------------------------------------------------------------------ profile
def _random_call_inputs(function: JitFunction, executable: Any, shapes: str | dict, seed: int) -> list:
    """Random inputs of the compiled signature's array inputs, in order (index inputs within their
    bounds): one per graph parameter, as the program takes them."""
    from bendc.artifact import index_bounds
    from runtime.cli import random_inputs

    bounds = index_bounds(executable.graph)
    specs = []
    constants = set(executable.graph.constant_params())  # the program holds their values
    for param in executable.graph.params:
        if param in constants:
            continue
        node = executable.graph.node(param)
        name = node.attr["name"]
        spec = {"name": name, "dtype": node.type.dtype, "shape": list(node.type.shape)}
        if name in bounds:
            spec["index_bound"] = bounds[name]
        specs.append(spec)
    return random_inputs({"inputs": specs}, seed)


def _call_arguments(function: JitFunction, shapes: str | dict, inputs: list) -> dict[str, Any]:
    """The function's arguments (by name) from the flat inputs of ``_random_call_inputs``: pytree
    parameters rebuilt in their SPEC structure (the binding flattens them in this same order)."""
    if isinstance(shapes, str) and is_tree_spec(shapes):
        shapes = spec_shapes(shapes)[0]
    elif isinstance(shapes, str):
        names = [name for name in function.signature.parameters if name in parse_spec(shapes)]
        return dict(zip(names, inputs))
    flat = iter(inputs)
    return {name: tree.map(lambda leaf: next(flat) if isinstance(leaf, (str, TensorType)) else leaf, shapes[name])
            for name in function.signature.parameters if name in shapes}


def minify_command(args: argparse.Namespace) -> int:
    from bendc.check import KernelMismatchError
    from bendc.minify import write_repro

    function, shapes = load_function(args.function, args.shapes)
    function = jit(function.fn, leaves=function.leaves, target="cpu", cache_dir=function.cache_dir,
                   passes=function.passes, donate=function.donate, check="reference")
    inputs = _random_call_inputs(function, function.lower(shapes), shapes, args.seed)
    try:
        function(**_call_arguments(function, shapes, inputs))
    except KernelMismatchError as error:
        write_repro(error, args.output)
        print(f"kernel {error.step} ({error.op} at {error.loc}) leaves the tolerance; wrote {args.output} "
              f"(run: python {args.output})")
        return 0
    print(f"every kernel of {function.__name__} agrees with the reference interpreter: nothing to minify")
    return 0


def profile_command(args: argparse.Namespace) -> int:
    """Compile for the cpu, run on random inputs of the SPEC's shapes, print the per-kernel table."""
    from bendc.profile import profile_executable

    function, shapes = load_function(args.function, args.shapes)
    function = jit(function.fn, leaves=function.leaves, target="cpu", cache_dir=function.cache_dir,
                   passes=function.passes, donate=function.donate)
    executable = function.lower(shapes)
    table = profile_executable(function.__name__, executable,
                               _random_call_inputs(function, executable, shapes, args.seed), args.runs)
    if args.chrome is not None:
        table.chrome(args.chrome)
    print(table)
    if args.chrome is not None:
        print(f"wrote a Chrome trace of {args.runs} runs to {args.chrome} (chrome://tracing or ui.perfetto.dev)")
    return 0


# ------------------------------------------------------------------ cache
CACHE_FOLDERS = ("programs", "kernels", "aot")  # what bendc writes under its cache folder


def folder_size(path: str) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed meanwhile
    return total


def human_size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def human_age(seconds: float) -> str:
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.0f} {unit}"
    return f"{max(0, seconds):.0f} s"


def cache_entries(folder: str) -> list[dict[str, Any]]:
    """The cached programs: key, function, signature, size, age (damaged entries say so)."""
    from runtime.artifact import ArtifactInvalid

    programs = os.path.join(folder, "programs")
    entries = []
    for key in sorted(os.listdir(programs)) if os.path.isdir(programs) else []:
        path = os.path.join(programs, key)
        if key.startswith(".") or not os.path.isdir(path):
            continue  # a writer's temporary folder
        try:
            manifest = read_manifest(path)
            inputs = " ".join(f"{s['name']}={type_text(s)}" + (":leaf" if s.get("leaf") else "")
                              for s in manifest["inputs"])
            static = " ".join(f"{k}={v!r}" for k, v in manifest.get("static", {}).items())
            function, signature = manifest["function"], (inputs + (" " + static if static else "")).strip()
        except (ArtifactInvalid, OSError, KeyError):
            function, signature = "?", "(damaged entry: discarded and rebuilt when next used)"
        try:
            age = time.time() - os.stat(os.path.join(path, "manifest.json")).st_mtime
        except OSError:
            age = time.time() - os.stat(path).st_mtime
        entries.append({"key": key, "function": function, "signature": signature, "size": folder_size(path),
                        "age": age})
    return entries


def cache_command(args: argparse.Namespace) -> int:
    from bendc.codegen.cache import default_cache_dir

    folder = args.dir or default_cache_dir()
    if args.action == "clear":
        import shutil
        import tempfile

        removed = 0
        for name in CACHE_FOLDERS:
            path = os.path.join(folder, name)
            if not os.path.isdir(path):
                continue
            removed += folder_size(path)
            trash = tempfile.mkdtemp(dir=folder, prefix=f".{name}.old-")  # renamed away first: readers see it whole
            os.rename(path, os.path.join(trash, name))
            shutil.rmtree(trash, ignore_errors=True)
        print(f"cleared {folder}: removed {human_size(removed)}")
        return 0
    entries = cache_entries(folder)
    print(f"bendc cache {folder}: {len(entries)} programs")
    if entries:
        print(f"  {'key':<12} {'function':<20} {'size':>9} {'age':>7}  signature")
    for entry in sorted(entries, key=lambda e: e["age"]):
        signature = entry["signature"] if len(entry["signature"]) <= 100 else entry["signature"][:97] + "..."
        print(f"  {entry['key'][:12]:<12} {entry['function'][:20]:<20} {human_size(entry['size']):>9} "
              f"{human_age(entry['age']):>7}  {signature}")
    sizes = {name: folder_size(os.path.join(folder, name)) for name in CACHE_FOLDERS}
    print(f"total {human_size(sum(sizes.values()))}: programs {human_size(sizes['programs'])}, kernels "
          f"{human_size(sizes['kernels'])} (sources and numba's machine code), artifacts compiled for this CPU "
          f"{human_size(sizes['aot'])}")
    return 0
