#!/usr/bin/env bash
# Regenerates requirements/lock.txt: the exact versions of every dependency and extra
# (test, cuda, distributed, torch, mkl) that make train, make test and CI install, as pip constraints
# (pip install -c requirements/lock.txt -e ".[...]").
#
# pip-compile (pip-tools) resolves pyproject.toml's ranges with pip's own finder, so torch 2.13.0
# comes from the CPU wheel on this machine's disk and no CUDA build is downloaded. It keeps the
# versions already in the lock; to move one: requirements/compile.sh --upgrade-package numpy
# (or --upgrade for all). The local label of torch's CPU build (+cpu) is dropped, so that the pin
# matches PyPI's torch 2.13.0 too.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.venv-tools
if [ ! -x "$TOOLS/bin/pip-compile" ]; then
    "${PYTHON:-python3.11}" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet "pip-tools>=7.5,<8"
fi
CUSTOM_COMPILE_COMMAND="requirements/compile.sh" "$TOOLS/bin/pip-compile" --quiet --strip-extras --no-emit-index-url --no-emit-find-links \
    --extra test --extra cuda --extra distributed --extra torch --extra mkl \
    --output-file requirements/lock.txt "$@" pyproject.toml
sed -i 's/^torch==\([0-9.]*\)+cpu$/torch==\1/' requirements/lock.txt
