# The two set-up commands of the README. Both create .venv and install pinned dependencies.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: train test fuzz clean

$(VENV)/.installed-core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-core
	$(PY) -m pip install --quiet -e ".[test,cuda,distributed]"
	touch $@

train: $(VENV)/.installed-core
	$(PY) examples/mlp.py

# The simulator tests need their own process: numba reads NUMBA_ENABLE_CUDASIM at import.
test: $(VENV)/.installed-test
	$(PY) -m pytest -q
	PYTHON=$(PY) tests/cuda/run_simulator.sh

# Differential fuzzing against torch eager: N random programs per target (reference and cpu).
# `make test` runs a fixed-seed sample of the same test; here the seed is random unless SEED is given.
#   make fuzz N=10000 [SEED=123] [TARGETS=cpu] [STRICT=1: fail on the known bugs of tests/fuzz/fuzz_known.py too]
N ?= 1000
fuzz: $(VENV)/.installed-test
	BENDC_FUZZ_N=$(N) $(if $(SEED),BENDC_FUZZ_SEED=$(SEED)) $(if $(TARGETS),BENDC_FUZZ_TARGETS=$(TARGETS)) \
	$(if $(STRICT),BENDC_FUZZ_STRICT=1) $(PY) -m pytest -q -x tests/fuzz/test_fuzz.py tests/fuzz/test_fuzz_modules.py -k test_programs_match_torch

clean:
	rm -rf $(VENV)
