"""Artifacts built here and carried to the device machine, so that the device script's first
stage (tests/gpu/test_carried.py) depends on nothing of the device's compiler: cuda artifacts
(cubins for sm_90, from this machine's NVVM and nvJitLink), each with its inputs and the cpu
build's outputs as .npy files.

    PYTHONPATH=. python tests/gpu/carried.py [FOLDER] [--small]   (default tests/gpu/carried: git-ignored)

Then give the folder to the device tool's ``carry``. Each program's folder holds ``cuda/`` (the
artifact), ``inputs/in{k}.npy`` and ``expected/out{k}.npy`` (the cpu build's outputs for those
inputs), and ``carried.json`` lists them with the outputs that must match bit for bit. The grid
probe's tall product carries no inputs (its x is 35 MB): the device draws them with
runtime.cli.random_inputs(manifest, 0) and compares with numpy in float64.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "tests" / "gpu" / "carried"
TINY_MLP = "x=f32[4,8] y=i64[4] w1=f32[8,8]:leaf b1=f32[8]:leaf w2=f32[3,8]:leaf b2=f32[3]:leaf"
# name: (function, shapes, extra options, outputs that must match the cpu bit for bit ("all" or a list))
PROGRAMS = {
    "chain": ("tests/gpu/carried_programs.py:chain", "x=f32[48,33] w=f32[48,33] b=f32[33]", (), "all"),
    "momentum": ("tests/cuda/momentum_program.py:momentum",
                 "w=f32[4,5] m=f32[4,5] g=f32[4,5] b=f32[5] mb=f32[5] gb=f32[5] c=f32[3] gc=f32[3]",
                 ("--donate", "w,m,b,mb,c"), [0, 1, 2, 3, 4]),  # out5, the norm, is a sum: a tolerance
    "mlp": ("tests/flat_mlp.py:train_step", TINY_MLP, (), []),
}
GRID = ("tests/gpu/carried_programs.py:tall_product", "x=f32[1100000,8] w=f32[8,4]")
ARCH = "sm_90"


def compile_artifact(function: str, shapes: str, target: str, folder: Path, options=()) -> None:
    from bendc.cli import main

    command = ["compile", function, "--shapes", shapes, "--target", target, "-o", str(folder), *options]
    if target == "cuda":
        command += ["--arch", ARCH]
    if main(command) != 0:
        raise SystemExit(f"bendc {' '.join(command)} failed")


SMALL_CHAIN = "x=f32[8,33] w=f32[8,33] b=f32[33]"


def build(folder: Path, small: bool = False) -> dict:
    """Build every carried program into ``folder`` (replaced); returns carried.json's content."""
    import runtime
    from runtime.artifact import read_manifest
    from runtime.cli import random_inputs

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    listing: dict = {"arch": ARCH, "programs": {}}
    for name, (function, shapes, options, bitwise) in PROGRAMS.items():
        shapes = SMALL_CHAIN if small and name == "chain" else shapes
        home = folder / name
        compile_artifact(function, shapes, "cuda", home / "cuda", options)
        compile_artifact(function, shapes, "cpu", home / "cpu", options)
        inputs = random_inputs(read_manifest(str(home / "cuda")), 0)
        expected = runtime.load(str(home / "cpu")).run_flat([np.array(a) for a in inputs])
        for kind, arrays in (("inputs", inputs), ("expected", expected)):
            (home / kind).mkdir()
            for index, array in enumerate(arrays):
                np.save(home / kind / f"{'in' if kind == 'inputs' else 'out'}{index}.npy", np.asarray(array))
        shutil.rmtree(home / "cpu")  # only its outputs travel
        count = len(expected)
        listing["programs"][name] = {"inputs": len(inputs), "outputs": count,
                                     "bitwise": list(range(count)) if bitwise == "all" else bitwise}
    compile_artifact(*GRID, "cuda", folder / "grid" / "cuda")
    listing["grid"] = {"function": GRID[0], "shapes": GRID[1]}
    (folder / "carried.json").write_text(json.dumps(listing, indent=1))
    return listing


def main() -> int:
    arguments = [a for a in sys.argv[1:] if a != "--small"]
    folder = Path(arguments[0]) if arguments else DEFAULT
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)  # (read at numba's import) PTX needs the real numba.cuda
    start = time.perf_counter()
    listing = build(folder, small="--small" in sys.argv[1:])
    print(f"carried: {', '.join(listing['programs'])} and grid built into {folder} in "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
