# Everything a fresh clone needs. `make demo` runs the main job and `make test` the test suite
# (pytest-xdist: one worker per core, at most 4), both in .venv, set up at the versions locked in
# requirements/test-lock.txt. `make test-fast` is the quick tier, `make lint` (ruff and the import
# contracts in pyproject.toml), `make typecheck` (mypy) and `make docs` (the site, strictly) are
# the gates .ci/run applies; `make test-latest`, `make test-lowest` and `make test-hub-versions`
# try other versions of the dependencies in venvs of their own; `make lock` writes the lock anew.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
LOCK := requirements/test-lock.txt
# What the tests and the gates use: the dev extra (it includes every optional part but flair),
# flair (tests/integrations/test_flair.py and the flair pages of the docs) and the docs site.
EXTRAS := dev,flair,docs
# The slow tests (pytest marker `slow`, set in tests/conftest.py) are left to the full suite.
FAST := -m "not slow"
PYTEST := -m pytest -q -n auto --maxprocesses 4

.PHONY: install demo test test-fast test-latest test-lowest test-hub-versions test-engines lock lint typecheck docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed explicitly first so that pip never resolves a multi-GB CUDA build; the
# project is then installed at the locked versions, with the locked setuptools as its build backend.
$(VENV)/.installed: $(BIN)/python pyproject.toml $(LOCK)
	@echo "Setting up $(VENV), about two minutes, at the versions in $(LOCK):"
	@echo "  1/3 pip, setuptools and setuptools-scm (packages built from source, as seqeval is, need it)"
	@$(BIN)/pip install --quiet --upgrade pip setuptools setuptools-scm --constraint $(LOCK)
	@echo "  2/3 torch $(TORCH_VERSION) (the CPU build)"
	@$(BIN)/pip install --quiet torch==$(TORCH_VERSION)
	@echo "  3/3 elmokit[$(EXTRAS)] and what it needs (about 140 packages)"
	@$(BIN)/pip install --quiet --no-build-isolation -e ".[$(EXTRAS)]" --constraint $(LOCK)
	@touch $@
	@echo "$(VENV) is ready"

install: $(VENV)/.installed

demo: install
	$(BIN)/elmokit demo

test: install
	$(BIN)/python $(PYTEST)

test-fast: install
	$(BIN)/python $(PYTEST) $(FAST)

# A venv at the newest versions pyproject.toml allows (torch stays at TORCH_VERSION): what each
# package drifted from the lock, then the whole suite. `make lock` takes the same versions.
define newest_venv
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip setuptools setuptools-scm
	$(1)/bin/pip install --quiet torch==$(TORCH_VERSION)
	echo torch==$(TORCH_VERSION) > $(1)/torch.txt
	$(1)/bin/pip install --quiet -e ".[$(EXTRAS)]" --constraint $(1)/torch.txt
endef

test-latest:
	$(call newest_venv,.venv-latest)
	.venv-latest/bin/python scripts/lock_drift.py $(LOCK)
	.venv-latest/bin/python $(PYTEST)

lock:
	$(call newest_venv,.venv-lock)
	.venv-lock/bin/python scripts/lock_drift.py $(LOCK) --write

# The library's own lower bounds: [project] dependencies at the lowest versions pyproject.toml
# allows (uv's lowest-direct resolution; torch stays at TORCH_VERSION, the one on this disk), the
# test runner at the lock's versions, and the tests that need no optional part.
test-lowest:
	rm -rf .venv-lowest
	$(PYTHON) -m venv .venv-lowest
	.venv-lowest/bin/pip install --quiet --upgrade pip setuptools --constraint $(LOCK)
	.venv-lowest/bin/pip install --quiet torch==$(TORCH_VERSION)
	.venv-lowest/bin/pip install --quiet uv pytest pytest-xdist sybil --constraint $(LOCK)
	echo torch==$(TORCH_VERSION) > .venv-lowest/torch.txt
	.venv-lowest/bin/uv pip compile --quiet pyproject.toml --resolution lowest-direct --no-header \
	  --python .venv-lowest/bin/python --override .venv-lowest/torch.txt -o .venv-lowest/lowest.txt
	.venv-lowest/bin/pip install --quiet -e . --constraint .venv-lowest/lowest.txt
	.venv-lowest/bin/pip freeze | grep -iE '^(numpy|h5py|tqdm|platformdirs|filelock|torch)=='
	.venv-lowest/bin/python $(PYTEST) $(FAST) -p no:cacheprovider

# The hub extra at its lower bound and at 2.x (the suite itself runs the locked 0.36, as flair
# caps it below 1.0), each on top of .venv, its hf:// tests against the stand-in Hub.
HUB_VERSIONS := 0.17.0 2.4.0
test-hub-versions: install
	@set -e; grep -v '^huggingface' $(LOCK) > $(VENV)/lock-but-hub.txt; for v in $(HUB_VERSIONS); do \
	  rm -rf .venv-hub-$$v; \
	  $(BIN)/pip install --quiet --target .venv-hub-$$v "huggingface_hub==$$v" --constraint $(VENV)/lock-but-hub.txt; \
	  echo "huggingface_hub $$v:"; \
	  PYTHONPATH=.venv-hub-$$v $(BIN)/python -m pytest -q -n 0 -p no:cacheprovider \
	    tests/hub/test_hub.py tests/compat/test_specs.py -k hf; \
	done

# The dataflow engines, which the lock leaves out (ray is large): ray[data] and pyspark[sql] at their
# tested versions in .venv-engines on top of .venv (as test-hub-versions does), and the tests of Ray
# Data (tests/integrations/test_ray.py: a two-node cluster on 127.0.0.1 and one ray.init of 2 CPUs, about two
# minutes), of Spark (tests/integrations/test_spark.py: local[2], about a minute; Spark runs on Java, a headless
# JRE from Debian is installed when no `java` is on PATH), the Parquet tests and the pages that
# show them (docs/ray.md, docs/spark.md, docs/embedding.md).
RAY_VERSION := 2.60.0
SPARK_VERSION := 4.3.0
test-engines: install
	rm -rf .venv-engines
	@command -v java >/dev/null 2>&1 || { echo "Spark needs Java: installing a headless JRE (Debian)"; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }
	$(BIN)/pip install --quiet --target .venv-engines "ray[data]==$(RAY_VERSION)" "pyspark[sql]==$(SPARK_VERSION)" \
	  --constraint $(LOCK)
	PATH=$(CURDIR)/.venv-engines/bin:$$PATH PYTHONPATH=$(CURDIR)/.venv-engines $(BIN)/python -m pytest -q -n 0 -p no:cacheprovider \
	  tests/integrations/test_ray.py tests/integrations/test_spark.py tests/embed/test_parquet_file.py tests/test_docs.py -k "ray or spark or parquet or embedding.md"

lint: install
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/python -m mypy

docs: install
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .venv-latest .venv-lock .venv-lowest .venv-hub-* .venv-engines build src/*.egg-info site
