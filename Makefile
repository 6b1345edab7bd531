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
# Force a hardware kind instead of detecting it (a100, h100, h200, mi300x, mi355x, cpu):
#   make bench HARDWARE=mi300x   (sets BENCH_HARDWARE for python -m bench)
HARDWARE ?=
RUN_ENV = $(if $(HARDWARE),BENCH_HARDWARE=$(HARDWARE) )
comma := ,
empty :=
space := $(empty) $(empty)

# Which GPU software stack to install for: rocm or nvidia (CPU machines get nvidia's extras,
# as before). Detected from the installed torch's torch.version.hip / .cuda (read from
# torch/version.py, without importing torch), else from a ROCm install at ROCM_PATH.
# Override: make install GPU_STACK=rocm
ROCM_PATH ?= /opt/rocm
DETECT_PY ?= $(firstword $(wildcard $(BIN)/python) $(PY))
TORCH_STACK_PY := import importlib.util as u, pathlib as p; s = u.find_spec("torch"); g = {}; \
  s and s.origin and exec(p.Path(s.origin).with_name("version.py").read_text(), g); \
  print("rocm" if g.get("hip") else "nvidia" if g.get("cuda") else "")
ifndef GPU_STACK
GPU_STACK := $(shell s=$$($(DETECT_PY) -c '$(TORCH_STACK_PY)' 2>/dev/null); \
  if [ -n "$$s" ]; then echo $$s; elif [ -d $(ROCM_PATH) ]; then echo rocm; else echo nvidia; fi)
endif

# CPU machines get the local CPU build of torch; a machine that already has torch keeps it.
TORCH_CPU ?= torch==2.13.0
LIGER_REQ ?= liger-kernel>=0.6.0
ifeq ($(GPU_STACK),rocm)
# ROCm: liger-kernel is installed without its dependencies (it requires `triton`, which would
# put a CUDA Triton beside torch's pytorch-triton-rocm), and amdsmi is the one matching the
# host's libamd_smi.so: ROCm's own package when ROCm ships it, else PyPI's of the same ROCm
# version (docs/rocm.md).
EXTRAS ?= dev,rocm
TORCH_STEP = $(BIN)/python -c "import torch" 2>/dev/null || { echo "no torch in $(VENV): install a ROCm build of torch first (docs/rocm.md), or run with INSTALL= PYTHON=python3" >&2; exit 1; }
LIGER_STEP = $(BIN)/pip install -q --no-deps '$(LIGER_REQ)'
# ROCm's own amdsmi: share/amd_smi, or the ROCm Core SDK's core-<major>.<minor>/share/amd_smi.
AMDSMI_DIR ?= $(firstword $(wildcard $(ROCM_PATH)/share/amd_smi $(ROCM_PATH)/core-*/share/amd_smi) $(ROCM_PATH)/share/amd_smi)
ROCM_VERSION ?= $(shell cat $(ROCM_PATH)/.info/version 2>/dev/null)
ROCM_MAJOR_MINOR = $(subst $(space),.,$(wordlist 1,2,$(subst ., ,$(firstword $(subst -, ,$(ROCM_VERSION))))))
AMDSMI_PYPI ?= amdsmi$(if $(ROCM_MAJOR_MINOR),==$(ROCM_MAJOR_MINOR).*)
ifneq ($(wildcard $(AMDSMI_DIR)/pyproject.toml $(AMDSMI_DIR)/setup.py),)
# amd-smi-lib layout (ROCm 6.x/7.x): a buildable package; built from a copy (/opt/rocm is read-only).
AMDSMI_STEP = rm -rf $(VENV)/amd_smi && cp -r $(AMDSMI_DIR) $(VENV)/amd_smi && $(BIN)/pip install -q --no-deps $(VENV)/amd_smi
else ifneq ($(wildcard $(AMDSMI_DIR)/amdsmi/__init__.py),)
# ROCm Core SDK layout: the module only, to be put on sys.path (here by a .pth file).
# A PyPI amdsmi in the venv would shadow it, so that one goes.
AMDSMI_STEP = { $(BIN)/pip uninstall -q -y amdsmi 2>/dev/null || true; } && echo $(AMDSMI_DIR) > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/rocm-amdsmi.pth"
else
AMDSMI_STEP = $(BIN)/pip install -q '$(AMDSMI_PYPI)' || echo "warning: could not install $(AMDSMI_PYPI); VRAM polling needs ROCm's amdsmi (docs/rocm.md)" >&2
endif
else
EXTRAS ?= dev,liger,nvidia
TORCH_STEP = $(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q '$(TORCH_CPU)' $(LOGGED)
LIGER_STEP =
AMDSMI_STEP =
endif
STAMP = $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# pip's output (and the warnings a machine's pip configuration prints) goes to the install log,
# shown only when the install fails.
INSTALL_LOG = $(VENV)/install.log
LOGGED = >>$(INSTALL_LOG) 2>&1 || { echo "install failed; the last lines of $(INSTALL_LOG):" >&2; tail -n 40 $(INSTALL_LOG) >&2; exit 1; }
# Default: finish an unfinished sweep, never overwrite a finished one (use SWEEP_FLAGS=--force).
SWEEP_FLAGS ?= --resume
OUT ?=
SWEEP_CMD = $(RUN_ENV)$(PYTHON) -m bench sweep

# Upstream SpecForge (PyPI `specforge`) in an environment of its own, for the tests and for trying
# the SpecForge plug here: make specforge-env, then point the sweep at $(SPECFORGE_VENV)/bin/python.
SPECFORGE_VENV ?= .venv-specforge
SPECFORGE_VERSION ?= 0.2.0
SPECFORGE_STAMP = $(SPECFORGE_VENV)/.installed-specforge-$(SPECFORGE_VERSION)

# make golden: write the fixture sweeps' expected files again (tests/data/sweeps/: each one's CSVs,
# summary.json and report.md rebuilt from its raw.tar.xz; tests/test_results_golden.py holds them)
# after a change to bench/results/ that is meant to move them, and docs/columns.md from the column
# registry (bench/results/columns.py; tests/test_docs_match.py). The committed sweeps under results/
# are published faces stamped with the commit that built them: `make verify-results` names those a
# later change moved, `make republish SWEEP=results/<name>` rebuilds one on purpose, and `make raw
# SWEEP=results/<name>` unpacks its raw records (runs/, ...) to look at them or rebuild by hand.
SWEEP ?=
.PHONY: golden raw verify-results republish history install light-install test test-fast lint format bench bench-cpu bench-a100 bench-h200 bench-mi355x compare clean-venv specforge-env parity-cpu parity-h200 parity-specforge-cpu parity-specforge-h200

# The training side: the `train` extra (torch, transformers, safetensors) and EXTRAS.
install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv --system-site-packages $(VENV)
	@echo "installing the suite into $(VENV) (pip's output: $(INSTALL_LOG)) ..."
	@$(TORCH_STEP)
	$(AMDSMI_STEP)
	@$(BIN)/pip install -q -e '.[train,$(EXTRAS)]' $(LOGGED)
	$(LIGER_STEP)
	@touch $@

# The analysis side only (`pip install .`: report, compare, dry runs; no torch), for `make compare`;
# a venv that already has the training side (its stamp) is used as it is.
LIGHT_STAMP = $(VENV)/.installed-light
COMPARE_INSTALL = $(if $(INSTALL),$(if $(wildcard $(STAMP)),$(INSTALL),light-install))
light-install: $(LIGHT_STAMP)

$(LIGHT_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv --system-site-packages $(VENV)
	@echo "installing the suite's analysis side into $(VENV) (pip's output: $(INSTALL_LOG)) ..."
	@$(BIN)/pip install -q -e . $(LOGGED)
	@touch $@

# Two workers (pytest-xdist, in the dev extra) when available, one a core of the 2-core CI machine.
# worksteal: a worker that runs out of tests takes the other's. Three workers, back to back with two
# on that machine: 268.6 s against 282.8 s of pytest; two are kept (a core each for the tests that
# time their runs; with three, a running CI on 2 CPU pairs once came out ±1.75e4 points).
TEST_WORKERS ?= 2
# -p no:benchmark: a pytest-benchmark of the system's Python, seen through --system-site-packages,
# warns on every run under xdist; the tests use none of it.
PYTEST = $(PYTHON) -m pytest -q -p no:benchmark
# `make test` also installs the trackers extra and TensorBoard's reader (tests/test_export.py writes
# each tracker's files and reads them back with its own reader): ~190 MB, kept out of `make install`.
TRACKERS_STAMP = $(VENV)/.installed-trackers
$(TRACKERS_STAMP): pyproject.toml
	@$(BIN)/pip install -q -e '.[trackers]' 'tensorboard>=2.15' $(LOGGED)
	@touch $@

test: $(INSTALL) $(if $(INSTALL),$(TRACKERS_STAMP))
	$(PYTEST) $$($(PYTHON) -c 'import xdist' 2>/dev/null && echo "-n $(TEST_WORKERS) --dist worksteal") tests

# The edit loop: everything but the end-to-end runs marked slow (pyproject.toml's markers).
test-fast: $(INSTALL)
	$(PYTEST) -m "not slow" $$($(PYTHON) -c 'import xdist' 2>/dev/null && echo "-n $(TEST_WORKERS) --dist worksteal") tests

golden: $(INSTALL)
	$(PYTHON) scripts/published.py golden
	$(PYTHON) -m bench.results.columns_doc docs/columns.md

raw: $(INSTALL)
	$(if $(SWEEP),,$(error name the sweep: make raw SWEEP=results/<name>))
	$(PYTHON) -m bench raw unpack $(SWEEP)

verify-results: $(INSTALL)
	$(PYTHON) scripts/published.py verify $(SWEEP)

republish: $(INSTALL)
	$(if $(SWEEP),,$(error name the sweep: make republish SWEEP=results/<name>))
	$(PYTHON) scripts/published.py republish $(SWEEP)

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# Pick the sweep config from the detected hardware (A100, H100/H200, MI300X/MI355X, none -> CPU);
# when none fits, `bench detect` says why and exits 2, and so does make.
bench: $(INSTALL)
	config=$$($(RUN_ENV)$(PYTHON) -m bench detect) && $(SWEEP_CMD) $$config $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

bench-cpu: $(INSTALL)
	$(SWEEP_CMD) configs/cpu.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

# The named GPU targets install for their vendor's stack, whatever this machine's detection says.
bench-a100:
	$(if $(INSTALL),$(MAKE) --no-print-directory $(INSTALL) GPU_STACK=nvidia)
	$(SWEEP_CMD) configs/a100.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

bench-h200:
	$(if $(INSTALL),$(MAKE) --no-print-directory $(INSTALL) GPU_STACK=nvidia)
	$(SWEEP_CMD) configs/h200.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

bench-mi355x:
	$(if $(INSTALL),$(MAKE) --no-print-directory $(INSTALL) GPU_STACK=rocm)
	$(SWEEP_CMD) configs/mi355x.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

# Training parity: 200+ steps on learnable data, each arm against the A/A floor (docs/method.md).
parity-cpu: $(INSTALL)
	$(SWEEP_CMD) configs/cpu-parity.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

parity-h200:
	$(if $(INSTALL),$(MAKE) --no-print-directory $(INSTALL) GPU_STACK=nvidia)
	$(SWEEP_CMD) configs/h200-parity.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

# The same for the real SpecForge CLI: on the CPU in .venv-specforge (make specforge-env); on a
# GPU in your SpecForge environment ($$SPECFORGE_PYTHON, else the `specforge` on PATH).
parity-specforge-cpu: specforge-env
	SPECFORGE_PYTHON="$(abspath $(SPECFORGE_VENV))/bin/python" $(SWEEP_CMD) configs/cpu-specforge-parity.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

parity-specforge-h200:
	$(if $(INSTALL),$(MAKE) --no-print-directory $(INSTALL) GPU_STACK=nvidia)
	$(SWEEP_CMD) configs/h200-specforge-parity.yaml $(SWEEP_FLAGS) $(if $(OUT),--out "$$OUT")

# make compare A=results/a100/summary.csv B=results/h200/summary.csv [OUT=dir] [FAIL_IF_SLOWER=5]
export A B OUT FAIL_IF_SLOWER FAIL_IF_GAIN_DROPS FORMAT
# The user's values reach the shell as environment variables, quoted there ("$$OUT"): a quote in
# OUT or FAIL_IF_SLOWER is part of the value, never shell syntax.
compare: $(COMPARE_INSTALL)
	@test -n "$$A" -a -n "$$B" || { echo "usage: make compare A=path/to/summary.csv B=path/to/summary.csv [OUT=dir] [FAIL_IF_SLOWER=PCT] [FAIL_IF_GAIN_DROPS=POINTS] [FORMAT=md|json]" >&2; exit 2; }
	$(PYTHON) -m bench compare "$$A" "$$B" $(if $(OUT),--out "$$OUT") $(if $(FAIL_IF_SLOWER),--fail-if-slower "$$FAIL_IF_SLOWER") $(if $(FAIL_IF_GAIN_DROPS),--fail-if-gain-drops "$$FAIL_IF_GAIN_DROPS") $(if $(FORMAT),--format "$$FORMAT")

# The gain over time of the committed sweeps (docs/history/, linked from the README); light install.
history: $(COMPARE_INSTALL)
	$(PYTHON) -m bench history results/h200* results/h100* --arm liger --out docs/history

clean-venv:
	rm -rf $(VENV) $(SPECFORGE_VENV)

specforge-env: $(SPECFORGE_STAMP)

# The .pth file puts $(PYTHON)'s site-packages (our venv's: torch, transformers, liger-kernel,
# triton) after the new venv's own, so the environment reuses them instead of downloading another
# torch (a build of 10-25 s instead of gigabytes; upstream pins torch==2.11.0, which the CPU runs here
# do not need). A .pth line only adds a folder to sys.path: the .pth files inside that folder (our
# editable install's) are not run, so the new environment cannot import our `bench` or `specforge`.
# specforge is installed without its dependencies (sglang, wandb, datasets, ... and that torch pin):
# the second line adds what its training CLI imports (no warning about the ones left out).
$(SPECFORGE_STAMP): | $(INSTALL)
	@test -x $(SPECFORGE_VENV)/bin/python || $(PYTHON) -m venv --system-site-packages $(SPECFORGE_VENV)
	$(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$$($(SPECFORGE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-bench-venv.pth"
	$(SPECFORGE_VENV)/bin/pip install -q --no-deps 'specforge==$(SPECFORGE_VERSION)' yunchang
	$(SPECFORGE_VENV)/bin/pip install -q --no-warn-conflicts pydantic accelerate safetensors pyyaml tokenizers
	@touch $@
