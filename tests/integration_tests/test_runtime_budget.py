"""Many models on one machine: the count limit and the memory budget across processes, least-recently-used eviction
of idle servers, never of held ones, a smaller automatic context instead of a failure, and reuse of a running
server whose context is large enough. Real servers and models; the budgets are simulated with
$GGUF_PROVIDER_MAX_MODELS and $GGUF_PROVIDER_MEMORY_LIMIT."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import InsufficientMemoryError, MemoryBudgetWarning
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._memory import fit
from gguf_provider.runtime._serve import budget
from tests.support.runtime import RuntimeEnv, pid_alive, wait_until
from tests.support.timing import REACT

pytestmark = pytest.mark.slow


def _engine(path: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(model_path=str(path), **{"n_ctx": 1024, "keep_alive": 300, **kw}))  # type: ignore[arg-type]


def test_max_models_stops_the_least_recently_used_idle_server(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, gemma_path: Path,
        minilm_path: Path) -> None:
    monkeypatch.setenv(budget.MAX_MODELS_ENV, "2")
    pids = {}
    for name, path in (("smollm2", smollm2_path), ("gemma", gemma_path), ("minilm", minilm_path)):
        engine = _engine(path, n_ctx=512, embedding=name == "minilm")
        pids[name] = engine.load().pid
        engine.unload()  # idle now, kept alive for 300 s
    entries = rt.registry()
    assert sorted(Path(e["model"]).name for e in entries.values()) == sorted([gemma_path.name, minilm_path.name])
    wait_until(lambda: not pid_alive(pids["smollm2"]), REACT)  # the LRU idle one went
    assert pid_alive(pids["gemma"]) and pid_alive(pids["minilm"])
    # Using gemma again makes minilm the least recently used one.
    again = _engine(gemma_path, n_ctx=512)
    assert again.load().pid == pids["gemma"]
    again.unload()
    third = _engine(smollm2_path, n_ctx=512)
    third.load()
    third.unload()
    wait_until(lambda: not pid_alive(pids["minilm"]), REACT)
    assert pid_alive(pids["gemma"])


def test_a_held_server_is_never_stopped_and_the_refusal_names_it(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch, gemma_path: Path) -> None:
    monkeypatch.setenv(budget.MAX_MODELS_ENV, "1")
    holder = rt.child(chat=False)  # SmolLM2, held by another process
    held = holder.read_json(timeout=120)
    t0 = time.monotonic()
    with pytest.raises(InsufficientMemoryError) as info:
        _engine(gemma_path).load()
    took = time.monotonic() - t0
    assert took < 60  # typical ~0.15 s on a loaded 2-core machine
    message = str(info.value)
    assert "GGUF_PROVIDER_MAX_MODELS=1" in message
    assert f"pid {held['server_pid']}" in message and f"held by pid {held['client_pid']}" in message
    assert "SmolLM2-135M-Instruct" in message and f"gguf-provider stop {held['key'][:12]}" in message
    assert "keep_alive=0" in message
    assert pid_alive(held["server_pid"])
    assert [Path(e["model"]).name for e in rt.registry().values()] == [rt.model.name]
    holder.finish()


def test_a_memory_limit_shrinks_the_automatic_context_with_a_warning(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path) -> None:
    header = gguf.read_header(smollm2_path)
    size = smollm2_path.stat().st_size
    assert header.context_length == 8192
    limit = budget.charge(header, size, 4096) + 2**20

    def charged(n_ctx: int) -> int:  # the server and the host-RAM prompt cache it is given (--cache-ram)
        return budget.charge(header, size, n_ctx) + budget.prompt_ram(header, n_ctx, pool=limit)

    expected = max(c for c in range(2048, 8193, fit.CONTEXT_STEP) if charged(c) <= limit)
    assert 2048 < expected < 4096  # the prompt cache takes its share of the room
    monkeypatch.setenv(budget.LIMIT_ENV, str(limit))
    engine = _engine(smollm2_path, n_ctx=None)
    with pytest.warns(MemoryBudgetWarning, match=r"shrunk from 8192 to \d+ tokens"):
        info = engine.load()
    assert info.n_ctx == expected
    entry = rt.registry()[info.key]
    assert entry["charge"] == charged(info.n_ctx) and entry["rss"] > 0
    ps = json.loads(rt.gguf_cli("ps", "--json").stdout)
    row = next(r for r in ps["servers"] if r["pid"] == info.pid)
    assert row["charge"] == entry["charge"] and row["memory"] >= row["charge"] and row["last_used"] > 0
    assert ps["budget"]["limit"] == limit
    assert ps["budget"]["used"] >= row["memory"] and ps["budget"]["servers"] == 1
    text = rt.gguf_cli("ps").stdout
    assert "memory budget:" in text and "MiB used /" in text and "last used" in text
    engine.unload()
    assert "stopped pid" in rt.gguf_cli("stop", "--all").stdout
    # Below the floor context (2048 tokens) it is refused, fast and typed.
    monkeypatch.setenv(budget.LIMIT_ENV, str(budget.charge(header, size, 1024)))
    t0 = time.monotonic()
    with pytest.raises(InsufficientMemoryError, match="floor context of 2048 tokens"):
        _engine(smollm2_path, n_ctx=None, keep_alive=0).load()
    took = time.monotonic() - t0
    assert took < 10  # typical ~0.04 s on a loaded 2-core machine


def test_idle_servers_make_room_under_a_memory_limit(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, gemma_path: Path) -> None:
    """A limit with room for one model at 1024 tokens: the second model stops the idle first one."""
    sizes = {p: budget.charge(gguf.read_header(p), p.stat().st_size, 1024) for p in (smollm2_path, gemma_path)}
    monkeypatch.setenv(budget.LIMIT_ENV, str(int(max(sizes.values()) * 1.5)))
    first = _engine(smollm2_path)
    pid = first.load().pid
    first.unload()
    second = _engine(gemma_path)
    second.load()
    wait_until(lambda: not pid_alive(pid), REACT)
    assert [Path(e["model"]).name for e in rt.registry().values()] == [gemma_path.name]
    second.unload()


def test_eight_processes_race_for_two_models_under_a_count_limit_of_one(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, gemma_path: Path) -> None:
    monkeypatch.setenv(budget.MAX_MODELS_ENV, "1")
    children = [rt.child(model=str(p), chat=False, wait_go=True, n_ctx=512)
                for p in [smollm2_path, gemma_path] * 4]
    for c in children:
        c.read_json()  # ready
    for c in children:
        c.send()
    results = [c.read_json(timeout=120) for c in children]
    ok = [r for r in results if "server_pid" in r]
    errors = [r for r in results if "error" in r]
    assert ok and len(ok) + len(errors) == 8
    assert len({r["server_pid"] for r in ok}) == 1, results  # exactly one server
    assert all(r["error"] == "InsufficientMemoryError" for r in errors), errors
    assert len(rt.servers()) == 1 and len(rt.registry()) == 1
    for c in children:
        c.finish()
    wait_until(lambda: not rt.servers(), REACT)  # keep_alive 0: the last lease stopped it; no orphan
    wait_until(lambda: not rt.watchdogs(), REACT)
    assert rt.registry() == {}


def test_a_running_server_with_enough_context_is_reused(rt: RuntimeEnv, smollm2_path: Path) -> None:
    auto = _engine(smollm2_path, n_ctx=None)
    info = auto.load()
    assert info.n_ctx == 8192
    for n_ctx in (2048, 8192):  # equal to or below the running one: the same server
        engine = _engine(smollm2_path, n_ctx=n_ctx)
        assert engine.load().pid == info.pid
        assert engine.n_ctx == n_ctx  # its requests still get the context asked for (max_tokens, overflow)
        engine.unload()
    bigger = _engine(smollm2_path, n_ctx=16384)  # more than it has: another server
    assert bigger.load().pid != info.pid
    assert len(rt.registry()) == 2
    bigger.unload()
    auto.unload()
