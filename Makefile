# The two commands of the quickstart: `make demo` and `make test`. Each does its own set-up, idempotently:
# a venv at .venv/, the package, a llama-server build and the models, all cached (a second run downloads nothing).

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
CLI    := $(VENV)/bin/gguf-provider

.PHONY: demo test setup-demo setup-test bench lint clean-venv

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(VENV)/.stamp-demo: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[langchain]"
	touch $@

$(VENV)/.stamp-test: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[all,test]"
	touch $@

setup-demo: $(VENV)/.stamp-demo
	$(CLI) server install
	$(VPY) tests/support/test_models.py smollm2

setup-test: $(VENV)/.stamp-test
	$(CLI) server install
	$(VPY) tests/support/test_models.py all

demo: setup-demo
	$(VPY) integrations/langchain_chat.py

test: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

$(VENV)/.stamp-bench: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[all,test,bench]"
	touch $@

# Benchmarks (not part of `make test`): writes docs/benchmarks.md, docs/benchmarks.png and bench/results.json.
bench: $(VENV)/.stamp-bench
	$(CLI) server install
	$(VPY) tests/support/test_models.py smollm2 qwen
	$(VPY) bench/run.py

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean-venv:
	rm -rf $(VENV)
