# Two commands set everything up on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

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
	$(BIN)/python -m pytest

test-slow: $(VENV)/.installed  ## only the slow tests (real servers, DDP searches, sweeps); CI runs them after `test`
	$(BIN)/python -m pytest -m "slow and not gpu"

test-all: $(VENV)/.installed  ## test and test-slow in one session (GPU tests need a CUDA machine: pytest -m gpu)
	$(BIN)/python -m pytest -m "not gpu"

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean-outputs:  ## deletes every run under outputs/
	rm -rf outputs
