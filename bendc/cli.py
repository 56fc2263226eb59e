"""The ``bendc`` command line: ``bendc ir`` and ``bendc report``.

Exit code 0 on success, 1 on a user error (one clear line; the traceback
only with --verbose).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Sequence

from bendc.errors import BendcError
from bendc.jit import JitFunction, jit
from bendc.spec import parse_spec


def load_function(target: str, shapes: str | None) -> tuple[JitFunction, str]:
    """``path/to/module.py:function`` -> (jitted function, SPEC to lower it with)."""
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
    if not isinstance(function, JitFunction):
        leaves = tuple(n for n, (_, leaf) in parse_spec(shapes).items() if leaf)
        function = jit(function, leaves=leaves, target="reference")
    return function, shapes


def _ir(args: argparse.Namespace) -> int:
    function, shapes = load_function(args.function, args.shapes)
    function.lower(shapes)
    if args.stage not in function.stages():
        raise BendcError(f"no stage {args.stage!r}; stages are {', '.join(function.stages())}", op="ir")
    print(function.ir(args.stage), end="")
    return 0


def _report(args: argparse.Namespace) -> int:
    function, shapes = load_function(args.function, args.shapes)
    function.lower(shapes)
    print(function.report(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bendc", description="Compile PyTorch-style training steps.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks for errors")
    commands = parser.add_subparsers(dest="command", required=True)

    ir = commands.add_parser("ir", help="print the IR of a function after a stage")
    ir.add_argument("function", metavar="MODULE.py:FUNCTION")
    ir.add_argument("--shapes", metavar="SPEC", help="e.g. 'x=f32[64,784] y=i64[64] w=f32[10,784]:leaf'")
    ir.add_argument("--stage", default="final", help="traced, autodiff, a pass name, or final")
    ir.set_defaults(run=_ir)

    report = commands.add_parser("report", help="print the compile report of a function")
    report.add_argument("function", metavar="MODULE.py:FUNCTION")
    report.add_argument("--shapes", metavar="SPEC")
    report.set_defaults(run=_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BendcError as error:
        if args.verbose:
            raise
        print(f"bendc: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
