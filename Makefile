# DFlash x Liger A/B benchmarking suite.
#   make bench   - detect the hardware and run its sweep (no GPU: the tiny CPU sweep)
#   make test    - install what the tests need and run them (CPU only)
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# To use an environment you already have (e.g. a GPU box's own torch), skip the venv:
#   make bench-h200 INSTALL= PYTHON=python3
PYTHON ?= $(BIN)/python
INSTALL ?= install
# Extras installed into the venv; bench-mi355x adds rocm.
EXTRAS ?= dev,liger,nvidia
# CPU machines get the local CPU build of torch; a machine that already has torch keeps it.
TORCH_CPU ?= torch==2.13.0
comma := ,
STAMP = $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# Default: finish an unfinished sweep, never overwrite a finished one (use SWEEP_FLAGS=--force).
SWEEP_FLAGS ?= --resume
OUT ?=

.PHONY: install test lint format bench bench-cpu bench-a100 bench-h200 bench-mi355x compare clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv --system-site-packages $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q '$(TORCH_CPU)'
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	@touch $@

test: $(INSTALL)
	$(PYTHON) -m pytest -q tests

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# Pick the sweep config from the detected hardware (A100, H100/H200, MI300X/MI355X, none -> CPU).
bench: $(INSTALL)
	$(PYTHON) -m bench sweep $$($(PYTHON) -m bench detect) $(SWEEP_FLAGS) $(if $(OUT),--out $(OUT))

bench-cpu: $(INSTALL)
	$(PYTHON) -m bench sweep configs/cpu.yaml $(SWEEP_FLAGS) $(if $(OUT),--out $(OUT))

bench-a100: $(INSTALL)
	$(PYTHON) -m bench sweep configs/a100.yaml $(SWEEP_FLAGS) $(if $(OUT),--out $(OUT))

bench-h200: $(INSTALL)
	$(PYTHON) -m bench sweep configs/h200.yaml $(SWEEP_FLAGS) $(if $(OUT),--out $(OUT))

bench-mi355x:
	$(if $(INSTALL),$(MAKE) install EXTRAS=dev,liger,rocm)
	$(PYTHON) -m bench sweep configs/mi355x.yaml $(SWEEP_FLAGS) $(if $(OUT),--out $(OUT))

# make compare A=results/a100/summary.csv B=results/h200/summary.csv [OUT=dir]
compare: $(INSTALL)
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make compare A=path/to/summary.csv B=path/to/summary.csv [OUT=dir]" >&2; exit 2; }
	$(PYTHON) -m bench compare $(A) $(B) $(if $(OUT),--out $(OUT))

clean-venv:
	rm -rf $(VENV)
