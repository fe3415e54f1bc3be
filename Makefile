# depthprobe: `make demo` runs the main job, `make test` runs the test suite.
# Both create the virtual environment in .venv from nothing when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (no CUDA packages). On a GPU machine: make TORCH=torch==2.13.0 ... with
# the CUDA index, or install torch first and the ranges in pyproject.toml will keep it.
TORCH ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast check bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

demo: install
	$(BIN)/probe run --model minilm --task attention-stats

test: install
	bash scripts/install-chromium.sh || echo "chromium could not be installed: the browser tests will be skipped"
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

check: install
	$(BIN)/python scripts/check_imports.py

bench: install
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
