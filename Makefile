# depthprobe: `make demo` runs the main job, `make test` runs the test suite, `make check` the static checks.
# Both create the virtual environment in .venv from nothing when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (no CUDA packages). On a GPU machine: make TORCH=torch==2.13.0 ... with
# the CUDA index, or install torch first and the ranges in pyproject.toml will keep it.
TORCH ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast check check-types wheel-check bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test,ray]"
	touch $@

demo: install
	$(BIN)/probe run --model minilm --task attention-stats

test: install
	bash scripts/install-chromium.sh || echo "chromium could not be installed: the browser tests will be skipped"
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# mypy checks the folders under their installed names, linked in build/typecheck
TYPECHECK = mkdir -p build/typecheck/depthprobe && \
	for p in probes tasks cli; do ln -sfn ../../../$$p build/typecheck/depthprobe/$$p; done && \
	$(BIN)/mypy -p depthprobe.probes -p depthprobe.tasks -p depthprobe.cli

# lint, format, types, the folder floors (scripts/check_imports.py) and sizes (scripts/check_sizes.py)
check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(TYPECHECK)
	$(BIN)/python scripts/check_imports.py
	$(BIN)/python scripts/check_sizes.py

# what a user installs: a wheel built from this checkout, in a new virtual environment, run from outside
wheel-check:
	PYTHON=$(PYTHON) TORCH="$(TORCH)" scripts/wheel-smoke.sh

check-types: install
	$(TYPECHECK)

bench: install
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info

# On a machine with CUDA, about 5 minutes, one summary file (README "GPU"); without CUDA one line, exit 0.
# No install step: a GPU image brings its own torch (PY=..., WHEELS=dir for what it lacks).
.PHONY: gpu-check
gpu-check:
	bash scripts/gpu-check.sh
