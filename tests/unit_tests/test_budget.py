"""The memory budget's inputs: sizes and counts from the environment, and the largest context under a budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.errors import InsufficientMemoryError
from gguf_provider.runtime._common.gguf import GGUFHeader, read_header
from gguf_provider.runtime._memory import fit
from gguf_provider.runtime._serve import budget
from tests.support.gguf_bytes import STANDINS


@pytest.mark.parametrize(("text", "expected"), [
    ("6GiB", 6 * 2**30), ("6 gib", 6 * 2**30), ("1.5GB", 1_500_000_000), ("512MiB", 512 * 2**20),
    ("123456", 123456), ("8G", 8 * 10**9), ("2TiB", 2 * 2**40),
])
def test_sizes_parse(text: str, expected: int) -> None:
    assert fit.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "6 gigs", "-1GiB", "1e9"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a memory size"):
        fit.parse_size(text)


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


def _holder(key: str, last_used: float, *, held_by: tuple[int, ...] = (), size: int = 2**30) -> budget.Holder:
    return budget.Holder(key=key, model=f"/m/{key}.gguf", pid=1000 + int(last_used), charge=size, rss=size // 2,
                         holders=held_by, last_used=last_used)


class _FakeMachine:
    """``admit`` over fake servers whose memory comes back when they are stopped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, running: list[budget.Holder], free: int) -> None:
        self.running, self.free, self.stopped = running, free, []
        monkeypatch.setattr(budget, "holders", lambda data: list(running))
        monkeypatch.setattr(budget.registry, "read", dict)
        monkeypatch.setattr(budget, "_wait_freed", lambda h: None)
        monkeypatch.setattr(budget, "stop_idle", self.stop)

    def stop(self, key: str, *, reg: object = None) -> bool:
        h = next(h for h in self.running if h.key == key)
        if h.holders:
            return False
        self.stopped.append(key)
        return True

    def memory(self) -> fit.MemoryInfo:
        return fit.MemoryInfo(ram_available=self.free + sum(h.held for h in self.running if h.key in self.stopped))

    def admit(self, model: tuple[GGUFHeader, int]) -> budget.Admission:
        return budget.admit(model[0], model[1], requested=None, n_gpu_layers=None, memory=self.memory)


@pytest.fixture
def smollm2(tmp_path: Path) -> tuple[GGUFHeader, int]:
    standin = STANDINS["smollm2"]
    return read_header(standin.write(tmp_path)), standin.size


@pytest.fixture
def no_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(budget.LIMIT_ENV, raising=False)
    monkeypatch.delenv(budget.MAX_MODELS_ENV, raising=False)


@pytest.mark.usefixtures("no_limits")
def test_without_a_limit_idle_servers_are_reclaimed_lru_first_until_the_model_gets_its_context(
        monkeypatch: pytest.MonkeyPatch, smollm2: tuple[GGUFHeader, int]) -> None:
    running = [_holder("held", 0.5, held_by=(42,)), _holder("old", 1.0), _holder("new", 2.0)]
    machine = _FakeMachine(monkeypatch, running, free=600 * 2**20)  # too little beside the fit's 512 MiB margin
    admitted = machine.admit(smollm2)
    assert machine.stopped == ["old"]  # the held one (older still) is never stopped; one idle server was enough
    assert admitted.n_ctx == 8192 and [h.key for h in admitted.evicted] == ["old"]


@pytest.mark.usefixtures("no_limits")
def test_without_a_limit_nothing_is_stopped_when_the_model_fits(
        monkeypatch: pytest.MonkeyPatch, smollm2: tuple[GGUFHeader, int]) -> None:
    machine = _FakeMachine(monkeypatch, [_holder("a", 1.0)], free=16 * 2**30)
    assert machine.admit(smollm2).n_ctx == 8192 and machine.stopped == []


def test_a_count_limit_with_every_server_held_refuses_naming_them(
        monkeypatch: pytest.MonkeyPatch, smollm2: tuple[GGUFHeader, int]) -> None:
    monkeypatch.setenv(budget.MAX_MODELS_ENV, "1")
    monkeypatch.delenv(budget.LIMIT_ENV, raising=False)
    machine = _FakeMachine(monkeypatch, [_holder("busy", 1.0, held_by=(77, 78))], free=16 * 2**30)
    with pytest.raises(InsufficientMemoryError, match=r"busy.gguf \(pid 1001, .*held by pid 77, 78") as info:
        machine.admit(smollm2)
    assert "gguf-provider stop busy" in str(info.value) and "keep_alive=0" in str(info.value)
    assert machine.stopped == []
