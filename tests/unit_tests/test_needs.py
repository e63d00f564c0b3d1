"""What the integration tests require of the machine (tests/support/needs.py) is what `make setup-test` provides."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.test_models import BENCH_ONLY, MODELS, TEST_KEYS
from tests.support.needs import missing


def test_only_the_models_make_setup_test_fetches_are_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean home lacks every test model; a model only `make bench` fetches (coder15) is not one of them, or a
    fresh clone's `make test` would stop at its check after setting everything up."""
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path))
    absent = " ".join(missing())
    assert BENCH_ONLY and all(f"test model {k} (" not in absent for k in BENCH_ONLY)
    assert all(f"test model {k} (" in absent for k in MODELS if k in TEST_KEYS)
