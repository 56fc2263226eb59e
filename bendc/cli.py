"""The ``bendc`` command line: ``compile``, ``run``, ``ir`` and ``report``.

    bendc compile MODULE.py:FUNCTION [--shapes SPEC] --target cpu -o OUT [--static name=value ...]
    bendc run OUT (--inputs FILE.npz | --random-inputs [--seed N]) [--outputs FILE.npz]
              [--steps N --feed-outputs [OUT=INPUT,...]]
    bendc ir MODULE.py:FUNCTION [--shapes SPEC] [--stage NAME] [--dot FILE]
    bendc report MODULE.py:FUNCTION [--shapes SPEC]
    bendc profile MODULE.py:FUNCTION [--shapes SPEC] [--runs N] [--chrome TRACE.json]
    bendc cache [list | clear] [--dir DIR]
    bendc minify MODULE.py:FUNCTION [--shapes SPEC] [-o REPRO.py]

This module is the console script's entry (and ``python -m bendc``'s): the
parser and the dispatch. ``run`` is the runtime's (runtime/cli.py: numpy,
numba and the runtime only); the compiler's commands live in
bendc/commands.py, imported only when one of them is dispatched.

Exit code 0 on success, 1 on a user error (one clear line; the traceback
only with --verbose).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from bendc.errors import BendcError
from runtime.cli import RUN_DESCRIPTION, Parser, add_run_arguments, run_command

COMPILE_TARGETS = ("cpu", "cuda")
SPEC_EXAMPLE = "e.g. 'x=f32[64,784] y=i64[64] w=f32[10,784]:leaf' (default: the module's EXAMPLE_SHAPES)"


def _compiler_command(name: str):
    """A handler of bendc/commands.py, imported when dispatched."""
    def handler(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module("bendc.commands"), name)(args)

    return handler


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bendc", description="Compile PyTorch-style training steps ahead of time, run them, "
                                              "and look inside.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks for errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = commands.add_parser("compile", help="build an artifact folder ahead of time",
                                  description="Trace, optimize and generate the kernels of a function, and write "
                                              "them with the IR of every stage, the plan and the report to OUT.")
    build.add_argument("function", metavar="MODULE.py:FUNCTION")
    build.add_argument("--shapes", metavar="SPEC", help=SPEC_EXAMPLE)
    build.add_argument("--target", required=True, choices=COMPILE_TARGETS, help="cpu, or cuda (PTX and cubin per kernel; no GPU needed)")
    build.add_argument("--arch", metavar="SM", help="GPU architecture for --target cuda, e.g. sm_90")
    build.add_argument("-o", "--output", metavar="OUT", required=True,
                         help="the artifact folder to write (replaced whole if it is an artifact)")
    build.add_argument("--static", metavar="NAME=VALUE", action="append", default=[],
                         help="a Python scalar parameter's value, e.g. lr=0.05 (repeatable; default: the "
                              "function's default)")
    build.add_argument("--donate", metavar="NAMES", default="",
                       help="parameters whose arrays the step may overwrite with their updated values "
                            "(comma-separated); each such output is recorded as the feed of that input, "
                            "which `bendc run --feed-outputs` uses")
    build.add_argument("--sign-with", metavar="KEYFILE", default=None,
                       help="sign the artifact with this key file (a team's, mode 0600) instead of your own "
                            "(BENDC_KEY_FILE, else ~/.config/bendc/key); runtimes whose BENDC_KEY_FILE is that "
                            "key run it")
    build.set_defaults(handler=_compiler_command("compile_command"))

    run = commands.add_parser("run", help="run an artifact with the minimal runtime alone",
                              description=RUN_DESCRIPTION)
    add_run_arguments(run)
    run.set_defaults(handler=run_command)

    ir = commands.add_parser("ir", help="print the IR of a function after a stage",
                             description="Print the IR of a function after a stage.")
    ir.add_argument("function", metavar="MODULE.py:FUNCTION")
    ir.add_argument("--shapes", metavar="SPEC", help=SPEC_EXAMPLE)
    ir.add_argument("--stage", default="final", help="traced, autodiff, a pass name, or final (default)")
    ir.add_argument("--dot", metavar="FILE", help="also write the stage's graph to FILE in Graphviz dot format")
    ir.set_defaults(handler=_compiler_command("ir_command"))

    report = commands.add_parser("report", help="print the compile report of a function",
                                 description="Print the fusion, schedule and memory decisions with their reasons.")
    report.add_argument("function", metavar="MODULE.py:FUNCTION")
    report.add_argument("--shapes", metavar="SPEC", help=SPEC_EXAMPLE)
    report.set_defaults(handler=_compiler_command("report_command"))
    profile = commands.add_parser("profile", help="time a function's kernels (cpu)",
                                  description="Compile a function for the cpu, run it on random inputs of the "
                                              "SPEC's shapes and print where its time goes, per kernel, sorted "
                                              "by time.")
    profile.add_argument("function", metavar="MODULE.py:FUNCTION")
    profile.add_argument("--shapes", metavar="SPEC", help=SPEC_EXAMPLE)
    profile.add_argument("--runs", type=int, default=10, metavar="N", help="profiled runs (default 10)")
    profile.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    profile.add_argument("--chrome", metavar="TRACE.json", help="also write a Chrome/Perfetto trace there")
    profile.set_defaults(handler=_compiler_command("profile_command"))
    cache = commands.add_parser("cache", help="list or clear the on-disk cache",
                                description="List the on-disk cache's compiled programs (function, signature, "
                                            "size, age) and its total size, or clear it.")
    cache.add_argument("action", nargs="?", default="list", choices=("list", "clear"),
                       help="list (default) or clear")
    cache.add_argument("--dir", metavar="DIR", help="the cache folder (default: $BENDC_CACHE_DIR or ~/.cache/bendc)")
    cache.set_defaults(handler=_compiler_command("cache_command"))
    minify = commands.add_parser("minify", help="write a standalone repro of a kernel the self-check finds wrong",
                                 description="Run a function once under the self-check (check='reference') on "
                                             "random inputs of the SPEC's shapes and, when a kernel leaves the "
                                             "tolerance, write a standalone repro file of that kernel alone.")
    minify.add_argument("function", metavar="MODULE.py:FUNCTION")
    minify.add_argument("--shapes", metavar="SPEC", help=SPEC_EXAMPLE)
    minify.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    minify.add_argument("-o", "--output", metavar="REPRO.py", default="repro.py", help="default repro.py")
    minify.set_defaults(handler=_compiler_command("minify_command"))
    for command in (build, ir, report, profile, cache, minify):
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks for errors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BendcError as error:
        if args.verbose:
            raise
        print(f"bendc: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
