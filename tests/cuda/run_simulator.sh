#!/usr/bin/env bash
# The cuda target under numba's CUDA simulator, in its own pytest process: numba reads
# NUMBA_ENABLE_CUDASIM when it is first imported, so these tests cannot share a process with
# the others (nor with the PTX tests, which need the real numba.cuda). Needs numba-cuda.
#   tests/cuda/run_simulator.sh [pytest options]      (PYTHON=.venv/bin/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
# Every simulator module: tests/cuda/test_*simulator*.py and tests/cuda/test_sim_*.py (each skips
# itself outside this process). The device script's dry run (one test of ~50 s) is named first, so
# that under pytest-xdist a worker starts it at once rather than last (pytest collects a file once).
shopt -s nullglob
NUMBA_ENABLE_CUDASIM=1 exec "$PYTHON" -m pytest -q tests/cuda/test_sim_device_check.py \
    tests/cuda/test_*simulator*.py tests/cuda/test_sim_*.py "$@"
