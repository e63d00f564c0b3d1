# The two commands of the quickstart: `make demo` and `make test`. Each does its own set-up, idempotently:
# a venv at .venv/, the package, a llama-server build and the models, all cached (a second run downloads nothing).

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
CLI    := $(VENV)/bin/gguf-provider

.PHONY: demo test test-loaded unit setup-demo setup-test setup-vulkan test-vulkan bench bench-gpu-prepare bench-gpu lint clean-venv

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(VENV)/.stamp-demo: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[langchain]"
	touch $@

$(VENV)/.stamp-test: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[all,test]"
	touch $@

# A llama.cpp already on the machine (llama-server or the unified llama, docs/install.md) is used as it is.
setup-demo: $(VENV)/.stamp-demo
	@$(CLI) server path 2>/dev/null || $(CLI) server install
	$(VPY) scripts/test_models.py smollm2

setup-test: $(VENV)/.stamp-test
	$(CLI) server install
	$(VPY) scripts/test_models.py all
	$(VPY) scripts/test_tools.py all
	$(VPY) scripts/old_llama_server.py

demo: setup-demo
	$(VPY) integrations/langchain_chat.py

# Lint, then the unit tests on a machine state with no llama-server and no models (run before any set-up, in a fresh
# empty home), then the set-up and the integration and reliability tests against the real server and models.
test: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory setup-test
	GGUF_PROVIDER_TESTS_STRICT=1 $(VENV)/bin/pytest tests/integration_tests tests/reliability --durations=20

# The integration and reliability tests beside a busy loop on every core (scripts/cpu_hog.py): the check to run
# before changing a time bound in tests/ (not part of `make test`). 34 min on the 2-core dev machine (the suite
# alone: 25): with the short OpenMP spin of runtime/_common/threads.py, generation beside the loops is ~3x slower, not ~15x.
test-loaded: setup-test
	GGUF_PROVIDER_TESTS_STRICT=1 $(VPY) scripts/cpu_hog.py -- \
	    $(VENV)/bin/pytest tests/integration_tests tests/reliability --durations=20

# tests/unit_tests alone, offline, in seconds: an empty temp dir as home, no configured llama-server, no index.
unit: $(VENV)/.stamp-test
	@tmp=$$(mktemp -d) && echo "unit tests: empty home $$tmp, no llama-server, no models, offline" && \
	env -u GGUF_PROVIDER_LLAMA_SERVER -u LLAMA_SERVER_PATH -u GGUF_PROVIDER_MODELS -u GGUF_PROVIDER_RUNTIME_DIR \
	    HOME=$$tmp GGUF_PROVIDER_HOME=$$tmp/gguf-provider HF_HOME=$$tmp/hf HF_HUB_OFFLINE=1 PIP_NO_INDEX=1 \
	    $(CURDIR)/$(VENV)/bin/pytest -q tests/unit_tests; \
	rc=$$?; rm -rf $$tmp; exit $$rc

# A real Vulkan device without a GPU (Mesa's lavapipe) and the Vulkan build of llama-server: not part of `make test`
# (the build takes long on 2 cores); docs/gpu.md says what it shows.
setup-vulkan: setup-test
	PY=$(VPY) scripts/setup_vulkan.sh

test-vulkan: setup-vulkan
	GGUF_PROVIDER_TESTS_STRICT=1 $(VENV)/bin/pytest tests/vulkan_tests -s

# The peers (llama-cpp-python from our pinned sdist, sentence-transformers on CPU torch) go in before the extra,
# so that pip finds them satisfied rather than building or fetching its own.
$(VENV)/.stamp-bench: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[all,test]"
	$(VPY) scripts/bench_peers.py
	$(VPY) -m pip install -q -e ".[all,test,bench]"
	touch $@

# Benchmarks (not part of `make test`): writes docs/benchmarks.md, docs/benchmarks.png and bench/results.json.
bench: $(VENV)/.stamp-bench
	$(CLI) server install
	$(VPY) scripts/test_models.py smollm2 qwen minilm coder15
	$(VPY) scripts/bench_peers.py minilm
	$(VPY) bench/run.py

# On a machine with an NVIDIA GPU (issue 51; bench/gpu.py says what and why): one run under 8 minutes that builds
# the CUDA server and measures the plan against llama.cpp's allocation, P1, P7 and P16 (bench/gpu-results.json, the
# table in docs/gpu.md). `make bench-gpu-prepare` first, here: it packs bench/gpu-cache/carry/ (~19 MiB: the pinned
# llama.cpp source, the models' headers, wheels), all that machine gets. `BENCH_GPU_BACKEND=cpu make bench-gpu`:
# the dry run on this machine's CPU build (~90 s). Without make: `python3 bench/gpu.py run`.
bench-gpu-prepare: $(VENV)/.stamp-test
	$(VPY) scripts/test_models.py smollm2 qwen
	$(VPY) bench/gpu.py prepare

bench-gpu:
	$(if $(wildcard $(VPY)),$(VPY),$(PYTHON)) bench/gpu.py run

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean-venv:
	rm -rf $(VENV)
