"""Shared fixtures: the real test models, the runtime fixtures, and a clean server state around the session.

tests/unit_tests run offline (no llama-server, no models; their conftest refuses these fixtures). The integration
and reliability tests run against a real llama-server (built by `make test`'s set-up) and real GGUF models fetched
by scripts/test_models.py.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Servers started by the tests stop as soon as their last client lets go, unless a test asks otherwise.
os.environ.setdefault("GGUF_PROVIDER_KEEP_ALIVE", "0")
# No test installs llama-server on first use (a source build takes minutes): tests that install say so.
os.environ.setdefault("GGUF_PROVIDER_AUTO_INSTALL", "0")
for _k in [k for k in os.environ if k.startswith("LLAMA_ARG_")]:
    del os.environ[_k]
# Under `nohup` SIGHUP is ignored, and an ignored signal stays ignored through exec in every child, so the kill
# matrix's SIGHUP cases would find their scripts immune. A handler is reset to the default by exec: the suite still
# outlives a hang-up, the processes it starts get the disposition a user's script has.
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda _sig, _frame: None)
# The same for SIGINT, which a shell without job control ignores in a background job (`make test &`, a CI runner):
# Python's own handler (KeyboardInterrupt) here, the default in what the suite starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Shared fixtures and hooks: `rt` (a private home and runtime dir around the installed llama-server), the guard
# that keeps tests/unit_tests offline, the skip (or, under `make test`, the error) when the integration tests' server
# or models are missing, and timeouts from the test models' measured speed.
pytest_plugins = ["tests.support.runtime", "tests.support.offline", "tests.support.needs", "tests.support.speed"]

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1"
QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"
GEMMA = "gemma-3-270m.Q4_K_M"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from scripts.test_models import ensure

    return ensure("smollm2")


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    from scripts.test_models import ensure

    return ensure("qwen")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from scripts.test_models import ensure

    return ensure("gemma")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2 (a real BERT embedder, 384 dims) as F16, converted by llama.cpp's own converter."""
    from scripts.test_models import ensure

    return ensure("minilm")


@pytest.fixture(scope="session")
def projector_path() -> Path:
    """A seeded random vision projector (mmproj) for SmolLM2, in the models dir beside ``smollm2_path``."""
    from scripts.test_models import ensure

    return ensure("projector")


@pytest.fixture(scope="session")
def reranker_path() -> Path:
    """all-MiniLM-L6-v2 plus a seeded one-label classifier head: a real reranker GGUF whose scores mean nothing."""
    from scripts.test_models import ensure

    return ensure("reranker")


@pytest.fixture(scope="session")
def llama_src() -> Path:
    """The llama.cpp source tree of the installed build (its models/templates/*.jinja are real templates)."""
    from gguf_provider.runtime._install import install

    return install.fetch_source()


@pytest.fixture(scope="session", autouse=True)
def _release_servers_at_end() -> Iterator[None]:
    yield
    # Only a manager some test made has servers to release (making one here would touch the home for nothing).
    manager = sys.modules.get("gguf_provider.runtime._serve.manager")
    if manager is not None and getattr(manager, "_manager", True) is not None:
        manager.get_manager().release_all()


@pytest.fixture(autouse=True)
def _close_test_clients() -> Iterator[None]:
    """The clients a test made with tests.support.clients.closed_after_test are closed when it ends."""
    yield
    from tests.support.clients import close_all

    close_all()
