"""The memory budget's inputs: sizes and counts from the environment, and the largest context under a budget."""

from __future__ import annotations

import pytest

from gguf_provider.runtime import budget


@pytest.mark.parametrize(("text", "expected"), [
    ("6GiB", 6 * 2**30), ("6 gib", 6 * 2**30), ("1.5GB", 1_500_000_000), ("512MiB", 512 * 2**20),
    ("123456", 123456), ("8G", 8 * 10**9), ("2TiB", 2 * 2**40),
])
def test_sizes_parse(text: str, expected: int) -> None:
    assert budget.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "6 gigs", "-1GiB", "1e9"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a memory size"):
        budget.parse_size(text)


def test_the_environment_sets_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(budget.LIMIT_ENV, raising=False)
    monkeypatch.delenv(budget.MAX_MODELS_ENV, raising=False)
    assert budget.memory_limit() is None and budget.max_models() is None
    monkeypatch.setenv(budget.LIMIT_ENV, "6GiB")
    monkeypatch.setenv(budget.MAX_MODELS_ENV, "2")
    assert budget.memory_limit() == 6 * 2**30 and budget.max_models() == 2
    monkeypatch.setenv(budget.LIMIT_ENV, "six")
    with pytest.raises(ValueError, match="GGUF_PROVIDER_MEMORY_LIMIT"):
        budget.memory_limit()
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(budget.MAX_MODELS_ENV, bad)
        with pytest.raises(ValueError, match="GGUF_PROVIDER_MAX_MODELS"):
            budget.max_models()


def test_largest_context_under_a_budget() -> None:
    def need(n_ctx: int) -> int:
        return 100_000 + 10 * n_ctx

    assert budget._largest_context(need, 100_000 + 10 * 5000, 2048, 8192) == 4864  # a multiple of 256 below
    assert budget._largest_context(need, 100_000 + 10 * 2048, 2048, 8192) == 2048
    assert budget._largest_context(need, 100_000 + 10 * 2000, 2048, 8192) is None  # under the floor
