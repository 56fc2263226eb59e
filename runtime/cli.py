"""``bendc run``: run a compiled artifact with the minimal runtime alone.

``bendc run`` (bendc/cli.py dispatches it here) imports numpy, numba and this
package only, never the compiler: no tracer, passes or networkx.

    bendc run OUT --inputs FILE.npz [--outputs FILE.npz]
    bendc run OUT --random-inputs [--seed N]
    bendc run --trust OUT ...          (an artifact your key did not sign: hashes checked only)
    python -m runtime OUT ...          (the same, without the front door)

An artifact is code, like a wheel: run only what you built or trust. It must be
signed with your key (runtime/trust.py) unless --trust is given.

Exit code 0 on success, 1 on a user error (one line on stderr; the
traceback only with --verbose).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import zipfile
from typing import Sequence

import numpy as np

from runtime.dtypes import DTYPES
from runtime.files import atomic_write
from runtime.artifact import (CUDA_RUNTIMES, ArtifactInvalid, check_feeds, check_inputs, has_structure,
                              inputs_by_name, load_program, on_host, parse_feeds, type_text)
from runtime.cpu import CpuProgram, KernelError
from runtime.machine import compile_counts
from runtime.trust import InsecurePath

# Integer inputs that no op uses as an index (counts, like an optimizer's step) get values in
# [1, UNBOUNDED_INTEGERS).
UNBOUNDED_INTEGERS = 10
DEFAULT_SEED = 0


class RunError(Exception):
    """A mistake in the ``bendc run`` command line or its files; the message says what."""


class Parser(argparse.ArgumentParser):
    """argparse with bendc's error convention: one line on stderr and exit code 1."""

    def error(self, message: str) -> None:
        print(f"bendc: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(1)


# ------------------------------------------------------------------ command line
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``bendc run`` (shared with bendc.cli, so that ``bendc --help`` lists them)."""
    parser.add_argument("artifact", metavar="OUT", help="an artifact folder written by `bendc compile`")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", metavar="FILE.npz", help="inputs by parameter name (numpy .npz)")
    source.add_argument("--random-inputs", action="store_true",
                        help="random inputs of the recorded shapes and dtypes (float32: standard normal; "
                             "index inputs: valid indices in [0, bound))")
    parser.add_argument("--seed", type=int, default=None, help=f"seed of --random-inputs (default {DEFAULT_SEED})")
    parser.add_argument("--outputs", metavar="FILE.npz",
                        help="write the outputs there as out0, out1, ... (in the order of the summary)")
    parser.add_argument("--steps", type=int, default=1, metavar="N",
                        help="run N steps (default 1); with --feed-outputs each step's updated parameters "
                             "are the next step's inputs")
    parser.add_argument("--feed-outputs", nargs="?", const="", default=None, metavar="OUT=INPUT,...",
                        help="feed outputs back as inputs between steps: the pairs given (e.g. "
                             "out1=w1,out2=b1), or without a value the artifact's recorded feeds "
                             "(bendc compile --donate)")
    parser.add_argument("--trust", action="store_true",
                        help="run an artifact that your key (BENDC_KEY_FILE, else ~/.config/bendc/key) did not "
                             "sign, checking its content hashes only: it is code, so only one you trust")
    # a cuda artifact: which runtime runs it (runtime/artifact.py _load_cuda_program)
    parser.add_argument("--cuda-runtime", choices=CUDA_RUNTIMES, default=None,
                        help="cuda artifacts: graph (its cubins as one CUDA graph), eager (the same launches one "
                             "by one), numba (JIT from the kernel sources), or auto (default: $BENDC_CUDA_RUNTIME, "
                             "else graph on a GPU of the artifact's architecture, else numba)")
    parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks for errors")


RUN_DESCRIPTION = ("Run a compiled artifact with the minimal runtime alone (no tracer, passes or networkx). "
                   "An artifact is code, like a wheel: its kernels are imported and its machine code unpickled, "
                   "so load only what you built or trust. It must be signed with your key (BENDC_KEY_FILE, "
                   "else ~/.config/bendc/key; bendc compile signs with it, or --sign-with KEYFILE) unless "
                   "--trust is given.")


def build_run_parser(prog: str = "bendc run") -> Parser:
    parser = Parser(prog=prog, description=RUN_DESCRIPTION)
    add_run_arguments(parser)
    return parser


def run_main(argv: Sequence[str], verbose: bool = False, prog: str = "bendc run") -> int:
    """``bendc run`` with its arguments (those after the word ``run``)."""
    args = build_run_parser(prog).parse_args(list(argv))
    args.verbose = verbose or getattr(args, "verbose", False)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run the artifact; a user error prints one line and returns 1."""
    try:
        return run_artifact(args)
    except (ArtifactInvalid, KernelError, RunError, InsecurePath) as error:
        if args.verbose:
            raise
        print(f"bendc: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1


# ------------------------------------------------------------------ running
def run_artifact(args: argparse.Namespace) -> int:
    """Verify and load the artifact, make or read the inputs, run once, summarize the outputs."""
    if args.seed is not None and not args.random_inputs:
        raise RunError("--seed applies to --random-inputs only")
    manifest, plan, program = load_program(args.artifact, cuda_runtime=args.cuda_runtime, trust=args.trust)
    if args.inputs is not None:
        inputs = inputs_by_name(manifest, read_npz(args.inputs))
        source = args.inputs
    else:
        seed = DEFAULT_SEED if args.seed is None else args.seed
        inputs = check_inputs(manifest, random_inputs(manifest, seed))
        source = f"random (seed {seed})"
    feeds = step_feeds(manifest, args)
    slots = {spec["name"]: index for index, spec in enumerate(manifest["inputs"])}
    start = time.perf_counter()
    outputs: list = []
    for number in range(1, args.steps + 1):
        outputs = run_program(program, plan, inputs)  # cuda: device arrays, fed back as they are
        if args.steps > 1:
            print(f"step {number}: " + ("out0 " + describe_values(on_host(outputs[0])) if outputs else "no outputs"))
        for name, index in feeds.items():
            inputs[slots[name]] = outputs[index]
    outputs = [on_host(o) for o in outputs]
    elapsed = time.perf_counter() - start
    steps = f"{args.steps} steps" if args.steps > 1 else ""
    print(f"ran {manifest['function']} ({manifest['target']}) from {args.artifact}{' ' + steps if steps else ''} "
          f"in {elapsed:.3f} s; inputs {source}"
          + (f"; fed {len(feeds)} outputs back each step" if feeds else ""))
    if getattr(program, "modules", None):
        counts = compile_counts(program.modules)
        print(f"kernels: {counts['compiled']} functions compiled, {counts['loaded']} loaded as machine code")
    for line in summary_lines(manifest, outputs):
        print(line)
    if args.outputs is not None:
        write_outputs(args.outputs, outputs)
        print(f"wrote {output_names(len(outputs))} to {args.outputs}")
    return 0


def step_feeds(manifest: dict, args: argparse.Namespace) -> dict[str, int]:
    """Input name -> output slot fed back between steps (--feed-outputs), checked against the manifest."""
    if args.steps < 1:
        raise RunError(f"--steps must be at least 1 (got {args.steps})")
    if args.feed_outputs is None:
        return {}
    feeds = parse_feeds(args.feed_outputs) if args.feed_outputs else dict(manifest.get("feeds", {}))
    if not feeds:
        raise RunError(f"{args.artifact} records no feeds (compile it with --donate NAMES); name the pairs: "
                       "--feed-outputs out1=w1,out2=b1")
    return check_feeds(manifest, feeds)


def run_program(program: CpuProgram, plan: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """program.run, with a failed check in a kernel named by the user's line and op."""
    try:
        return program.run(inputs)
    except KernelError as error:
        step = next((s for s in plan["steps"] if s["name"] == error.step), None)
        if step is None or not step.get("loc"):
            raise
        raise RunError(f"{step['loc']}: {step['op']}: {error.detail} (kernel {error.step})") from None


def random_inputs(manifest: dict, seed: int) -> list[np.ndarray]:
    """Inputs of the recorded shapes and dtypes; index inputs lie in [0, index_bound)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in manifest["inputs"]:
        shape = tuple(spec["shape"])
        if spec["dtype"] == "f32":
            array = rng.standard_normal(shape, dtype=np.float32)
        elif spec["dtype"] == "bool":
            array = rng.random(shape) < 0.5
        else:
            dtype = DTYPES[spec["dtype"]]
            if "index_bound" in spec:
                array = random_integers(rng, shape, dtype, spec["index_bound"])
            else:
                array = rng.integers(1, UNBOUNDED_INTEGERS, size=shape, dtype=dtype)
        arrays.append(np.asarray(array))  # a 0-d draw is a numpy scalar: keep it an array
    return arrays


def random_integers(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, bound: int) -> np.ndarray:
    """Integers in [0, bound); zeros where no value is valid (an empty dimension is indexed)."""
    if bound <= 0:
        return np.zeros(shape, dtype)
    return rng.integers(0, bound, size=shape, dtype=dtype)


# ------------------------------------------------------------------ files
def read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name."""
    if not os.path.isfile(path):
        raise RunError(f"no such file {path!r}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise RunError(f"cannot read {path} as a numpy .npz file ({error})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise RunError(f"{path} holds one array; --inputs takes an .npz of arrays named by parameter "
                       "(np.savez(path, x=..., y=...))")
    try:
        with loaded:
            return {name: loaded[name] for name in loaded.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise RunError(f"cannot read {path} as a numpy .npz file ({error})") from None


def write_outputs(path: str, outputs: list[np.ndarray]) -> None:
    """Write out0, out1, ... to ``path`` (an .npz; written beside it and renamed into place)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise RunError(f"cannot write {path}: no folder {folder}")
    atomic_write(path, lambda stream: np.savez(stream, **{f"out{index}": array
                                                          for index, array in enumerate(outputs)}))


# ------------------------------------------------------------------ summary
def output_names(count: int) -> str:
    if count == 0:
        return "no outputs"
    if count == 1:
        return "out0"
    return f"out0..out{count - 1}"


def summary_lines(manifest: dict, outputs: list[np.ndarray]) -> list[str]:
    """What the function returns (outputs named out0, out1, ...) and a few stats of each."""
    lines = [f"returns {describe_template(manifest['template'])}"]
    if has_structure(manifest):  # pytree parameters: which inputs (by name, or dotted path in an .npz) make them
        lines.insert(0, "takes " + ", ".join(f"{name}={describe_template(tree)}"
                                             for name, tree in manifest["parameters"].items()))
    for index, (spec, array) in enumerate(zip(manifest["outputs"], outputs)):
        lines.append(f"  out{index:<3} {type_text(spec):<16} {describe_values(array)}")
    return lines


def describe_template(template: dict) -> str:
    """The return structure with outputs as out0, out1, ...: ``(out0, [out1, None])``."""
    kind = template["kind"]
    if kind == "out":
        return f"out{template['value']}"
    if kind == "input":  # a leaf of a parameter's structure (the manifest's parameters)
        return template["value"]
    if kind == "static":
        return repr(template["value"])
    if kind == "dict":
        items = [f"{key!r}: {describe_template(item)}" for key, item in template["items"].items()]
        return "{" + ", ".join(items) + "}"
    if kind in ("namedtuple", "dataclass"):  # "type" is module:qualname
        items = [f"{key}={describe_template(item)}" for key, item in template["items"].items()]
        return template["type"].rpartition(":")[2] + "(" + ", ".join(items) + ")"
    items = [describe_template(item) for item in template["items"]]
    if kind == "tuple":
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return "[" + ", ".join(items) + "]"


def describe_values(array: np.ndarray) -> str:
    """``value 2.31`` for one element, else mean, std, min and max (and non-finite counts)."""
    if array.size == 0:
        return "empty"
    if array.size == 1:
        return f"value {array.reshape(-1)[0].item():.6g}"
    values = np.asarray(array, dtype=np.float64)
    finite = np.isfinite(values)
    text = (f"mean {values.mean():.6g}  std {values.std():.6g}  "
            f"min {values.min():.6g}  max {values.max():.6g}")
    if not finite.all():
        text += f"  ({int((~finite).sum())} not finite)"
    return text
