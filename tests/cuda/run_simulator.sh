#!/usr/bin/env bash
# The cuda target under numba's CUDA simulator, in its own pytest process: numba reads
# NUMBA_ENABLE_CUDASIM when it is first imported, so these tests cannot share a process with
# the others (nor with the PTX tests, which need the real numba.cuda). Needs numba-cuda.
#   tests/cuda/run_simulator.sh [pytest options]      (PYTHON=.venv/bin/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
NUMBA_ENABLE_CUDASIM=1 exec "$PYTHON" -m pytest -q tests/cuda/test_simulator.py tests/cuda/test_fuzz_simulator.py tests/cuda/test_sim_conv.py "$@"
