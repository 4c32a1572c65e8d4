# Two commands set everything up on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The test suites run in parallel pytest-xdist workers, one per CPU core (at most 8: each holds
# torch and Lightning, 1-2 GB): most tests wait on a fresh `python train.py` (the torch import
# alone takes seconds) or on DDP ranks, so two workers on two cores take about half the time of
# one. `worksteal`: each worker takes a contiguous half, and one that ends early takes tests
# from the other, so a test file's module fixtures are seldom built twice.
# TEST_WORKERS=0 runs them one by one in one process, as `python -m pytest` does.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 8 ? n : 8 )))
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

.PHONY: venv train test test-slow test-all lint format clean-outputs

# The environment: made if missing, re-installed when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[dev]"
	touch $@

venv: $(VENV)/.installed  ## only set up the environment

train: $(VENV)/.installed  ## train with the defaults; pass overrides as ARGS="model=cnn trainer.max_epochs=5"
	$(BIN)/python train.py $(ARGS)

test: $(VENV)/.installed  ## the default test suite (CPU, fast); CI runs it first
	$(PYTEST)

test-slow: $(VENV)/.installed  ## only the slow tests (real servers, DDP searches, sweeps); CI runs them after `test`
	$(PYTEST) -m "slow and not gpu"

test-all: $(VENV)/.installed  ## test and test-slow in one session (GPU tests need a CUDA machine: pytest -m gpu)
	$(PYTEST) -m "not gpu"

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean-outputs:  ## deletes every run under outputs/
	rm -rf outputs
