"""`gguf-provider ps` shows each server's live numbers from its /metrics (servers start with --metrics): a real
server after one request, and a paused one, which accepts connections and never answers: it shows "–" within the
bound instead of blocking `ps`."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from gguf_provider import chat
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime import default as runtime
from gguf_provider.runtime._common import process
from gguf_provider.runtime._serve import metrics
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow

def test_ps_shows_live_metrics_after_a_request(rt: RuntimeEnv, smollm2_path: Path) -> None:
    engine = Engine(EngineConfig(model_path=str(smollm2_path), n_ctx=1024, keep_alive=300))
    info = engine.load()
    assert "--metrics" in process.log_tail(info.log_path, 10_000).splitlines()[0]  # our command line, first line
    reply = chat.complete(engine, chat.ChatRequest(messages=[{"role": "user", "content": "Name three colours."}],
                                                   params={"max_tokens": 24, "temperature": 0}))
    assert reply.content
    ps = json.loads(rt.gguf_cli("ps", "--json").stdout)
    row = next(r for r in ps["servers"] if r["pid"] == info.pid)
    m = row["metrics"]
    assert m is not None, row
    assert set(m) == {f for f in metrics.ServerMetrics.__dataclass_fields__}
    assert m["tokens_predicted"] > 0 and m["prompt_tokens"] > 0
    assert m["generation_tps"] > 0 and m["prompt_tps"] > 0
    assert m["requests_processing"] >= 0 and m["requests_deferred"] >= 0
    assert m["kv_size"] >= 1024 and 0 < m["kv_tokens"] <= m["kv_size"] and 0 < m["kv_use"] <= 1
    assert m["spec_drafted"] >= m["spec_accepted"] >= 0  # speculative="auto": n-gram drafts, maybe none here
    assert row["log"] == str(info.log_path)
    text = rt.gguf_cli("ps").stdout
    assert "live: gen " in text and " tok/s" in text and "KV " in text and f"log: {info.log_path}" in text
    engine.unload()


def test_a_server_that_never_answers_shows_a_dash_within_the_bound(rt: RuntimeEnv, smollm2_path: Path,
                                                                   qwen_path: Path) -> None:
    """A second real server (another model), paused (SIGSTOP): the kernel still accepts connections on its socket, and nothing
    answers them, as a wedged llama-server does."""
    engine = Engine(EngineConfig(model_path=str(smollm2_path), n_ctx=1024, keep_alive=300))
    info = engine.load()
    wedged = Engine(EngineConfig(model_path=str(qwen_path), n_ctx=512, keep_alive=300))  # another model: its own server
    paused = wedged.load()
    assert paused.pid != info.pid
    # The same two reads with both servers answering, timed here: the paused one may add `TOTAL_TIMEOUT`, no more.
    t0 = time.monotonic()
    assert all(r.metrics is not None for r in runtime().status(live=True).servers)
    live_s = time.monotonic() - t0
    t0 = time.monotonic()
    assert "live: gen " in rt.gguf_cli("ps").stdout
    ps_s = time.monotonic() - t0  # with the interpreter's start and imports
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        rows = runtime().status(live=True).servers
        took = time.monotonic() - t0
        by_pid = {r.pid: r for r in rows}
        assert by_pid[paused.pid].metrics is None and by_pid[paused.pid].describe_metrics() == "–"
        assert by_pid[info.pid].metrics is not None  # the healthy one still answers
        assert took < metrics.TOTAL_TIMEOUT + 10 * live_s, (took, live_s)
        t0 = time.monotonic()
        text = rt.gguf_cli("ps").stdout
        assert time.monotonic() - t0 < metrics.TOTAL_TIMEOUT + 10 * ps_s, ps_s
        assert "live: –" in text and "live: gen " in text
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    wedged.unload()
    engine.unload()
