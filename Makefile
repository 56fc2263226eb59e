# The two set-up commands of the README. Both create .venv and install the locked versions:
# pyproject.toml gives ranges, requirements/lock.txt the exact versions (requirements/compile.sh).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LOCK := requirements/lock.txt

.PHONY: train test test-long test-bounds fuzz clean

$(VENV)/.installed-core: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) -e ".[mkl]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-core $(LOCK)
	$(PY) -m pip install --quiet -c $(LOCK) -e ".[test,cuda,distributed,mkl]"
	touch $@

train: $(VENV)/.installed-core
	$(PY) examples/mlp.py

# pytest-xdist: one worker per core, each test file on one worker (its module fixtures built once).
# Worker processes share the run's kernel cache (tests/conftest.py), as processes share bendc's.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PARALLEL := -n $(JOBS) --dist loadfile

# Everything that guards correctness at small sizes (<= 12 minutes on a 2-core machine), in two
# pytest runs side by side: the suite, and the simulator tests in a process of their own (numba
# reads NUMBA_ENABLE_CUDASIM at import). The simulator's workers spend about half their time waiting
# (a block's Python threads at each syncthreads): run after the suite it left a core idle for
# minutes; beside it, the suite's workers take that time. Its output is printed when both have
# ended. Native kernels (runtime/native) keep a worker near 1 GiB.
# The two runs share one signing key and kernel cache (BENDC_TEST_ROOT, a folder made for this
# run and removed after it).
test: $(VENV)/.installed-test
	@root=$$(mktemp -d "$${TMPDIR:-/tmp}/bendc-test.XXXXXX") && export BENDC_TEST_ROOT=$$root && \
	{ PYTHON=$(PY) tests/cuda/run_simulator.sh $(PARALLEL) --durations=15 > "$$root/simulator.log" 2>&1 & \
	  simulator=$$!; trap 'kill $$simulator 2>/dev/null; rm -rf "$$root"' INT TERM; \
	  $(PY) -m pytest -q $(PARALLEL) --durations=20; suite=$$?; \
	  echo "== the CUDA simulator tests (tests/cuda/run_simulator.sh), run beside the suite:"; \
	  wait $$simulator; simulated=$$?; cat "$$root/simulator.log"; rm -rf "$$root"; \
	  test $$suite -eq 0 -a $$simulated -eq 0; }

# The tests marked long (make test leaves them out): GPU-sized PTX builds, the larger fixed-seed
# fuzz sample, the transformer's AOT round trip, more kill points, virtual environments built for
# the lowest dependency bounds and for the wheel on each Python installed (tests/test_packaging.py).
# Then the simulator's long tests, in their own process as in make test (outside it they skip themselves).
test-long: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PARALLEL) -m long --durations=0 && \
	PYTHON=$(PY) tests/cuda/run_simulator.sh $(PARALLEL) -m long --durations=0

# The lowest numba, llvmlite, numpy, scipy and networkx that pyproject.toml allows, in .venv-bounds.
test-bounds: $(VENV)/.installed-test
	$(PY) -m pytest -q -m long tests/test_packaging.py -k test_lowest_bounds --durations=0

# Differential fuzzing against torch eager: N random programs per target (reference and cpu).
# `make test` runs a fixed-seed sample of the same test; here the seed is random unless SEED is given.
#   make fuzz N=10000 [SEED=123] [TARGETS=cpu] [STRICT=1: fail on the known bugs of tests/fuzz/fuzz_known.py too]
N ?= 1000
fuzz: $(VENV)/.installed-test
	BENDC_FUZZ_N=$(N) $(if $(SEED),BENDC_FUZZ_SEED=$(SEED)) $(if $(TARGETS),BENDC_FUZZ_TARGETS=$(TARGETS)) \
	$(if $(STRICT),BENDC_FUZZ_STRICT=1) $(PY) -m pytest -q -x tests/fuzz/test_fuzz.py tests/fuzz/test_fuzz_modules.py -k test_programs_match_torch

clean:
	rm -rf $(VENV)
