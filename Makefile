# The two set-up commands of the README. Both create .venv and install pinned dependencies.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: train test clean

$(VENV)/.installed-core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-core
	$(PY) -m pip install --quiet -e ".[test,cuda]"
	touch $@

train: $(VENV)/.installed-core
	$(PY) examples/mlp.py

# The simulator tests need their own process: numba reads NUMBA_ENABLE_CUDASIM at import.
test: $(VENV)/.installed-test
	$(PY) -m pytest -q
	PYTHON=$(PY) tests/cuda/run_simulator.sh

clean:
	rm -rf $(VENV)
