# depthprobe: `make demo` runs the main job, `make test` runs the test suite, `make check` the static checks.
# Both create the virtual environment in .venv from nothing when it is missing, with the versions
# of constraints.txt (the lock: what the test suite passed with). pyproject.toml keeps the ranges a
# user's own install resolves; `make upgrade-check` tries the newest versions in them and `make lock`
# moves the lock to them, deliberately (README, "Installing and testing").
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (no CUDA packages). On a GPU machine: make TORCH=torch==2.13.0 ... with
# the CUDA index, or install torch first and the ranges in pyproject.toml will keep it.
TORCH ?= torch==2.13.0
# the lock; `make install LOCK=` installs from the ranges alone
LOCK ?= constraints.txt
PIN = $(if $(LOCK),-c $(LOCK))
# the upgrade check's scratch environment, and what it runs (default: the whole suite)
UPGRADE_VENV ?= build/upgrade-venv
PYTEST_ARGS ?=
# the environment `make lock` freezes (default: the upgrade check's)
LOCK_FROM ?= $(UPGRADE_VENV)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast check check-types wheel-check upgrade-check lock bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PIN) "$(TORCH)"
	$(BIN)/pip install --quiet $(PIN) -e ".[test,ray]"
	touch $@

# the atlas: what depth buys, on one page (docs/results.md has each finding at full scale); rerun to continue
ATLAS ?= artifacts/atlas
demo: install
	$(BIN)/probe atlas --jobs 2 --out $(ATLAS)
	@echo "open $(ATLAS)/atlas.html in a browser (offline; atlas.csv beside it)"

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

# what a user installs: a wheel built from this checkout, in a new virtual environment (the
# locked versions), run from outside
wheel-check:
	PYTHON=$(PYTHON) TORCH="$(TORCH)" LOCK="$(LOCK)" scripts/wheel-smoke.sh

# the newest versions inside pyproject.toml's ranges (torch: TORCH), in a scratch environment made
# anew, and the suite on them; PYTEST_ARGS="tests/hooks/test_cache.py" runs part of it. Lists what differs
# from the lock. Nothing here changes the lock: `make lock` does, after this passed.
upgrade-check:
	rm -rf $(UPGRADE_VENV)
	$(PYTHON) -m venv $(UPGRADE_VENV)
	$(UPGRADE_VENV)/bin/pip install --quiet --upgrade pip
	$(UPGRADE_VENV)/bin/pip install --quiet "$(TORCH)"
	$(UPGRADE_VENV)/bin/pip install --quiet -e ".[test,ray]"
	$(UPGRADE_VENV)/bin/pip freeze --exclude-editable | $(UPGRADE_VENV)/bin/python scripts/lock.py diff $(or $(LOCK),constraints.txt)
	bash scripts/install-chromium.sh || echo "chromium could not be installed: the browser tests will be skipped"
	$(UPGRADE_VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

# write the lock from LOCK_FROM (default: the upgrade check's environment), to commit with the
# suite's result on it
lock:
	test -x $(LOCK_FROM)/bin/pip || { echo "make lock: no environment at $(LOCK_FROM); run make upgrade-check first"; exit 2; }
	$(LOCK_FROM)/bin/pip freeze --exclude-editable | $(LOCK_FROM)/bin/python scripts/lock.py write $(LOCK)

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
