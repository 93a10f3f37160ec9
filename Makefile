# Everything a fresh machine needs: `make demo` runs the main job, `make test` runs the test suite
# (pytest-xdist: one worker per core, at most 4); `make lint` (ruff and the import contracts in
# pyproject.toml) and `make typecheck` (mypy on src/elmokit) are the gates .ci/run applies.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0

.PHONY: install demo test lint typecheck clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed explicitly first so that pip never resolves a multi-GB CUDA build.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/elmokit demo

test: install
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4

lint: install
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) build src/*.egg-info
