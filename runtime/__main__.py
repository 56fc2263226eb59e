"""``python -m runtime OUT (--inputs FILE.npz | --random-inputs) ...``: ``bendc run`` without the front door."""
import sys

from runtime.cli import run_main

sys.exit(run_main(sys.argv[1:], prog="python -m runtime"))
