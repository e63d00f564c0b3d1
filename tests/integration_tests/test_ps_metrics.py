"""`gguf-provider ps` shows each server's live numbers from its /metrics (servers start with --metrics): a real
server after one request, and a registered server that accepts connections and never answers, which shows "–"
within the bound instead of blocking `ps`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_provider import chat
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime import default as runtime
from gguf_provider.runtime._common import process
from gguf_provider.runtime._serve import metrics, registry
from tests.support.runtime import RuntimeEnv, wait_until

pytestmark = pytest.mark.slow

# A process that listens on a Unix socket, accepts every connection and never answers (a wedged server). Its last
# argument is the alias on its command line, which the registry checks before it believes an entry.
HANG = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(16)
held = []
while True:
    held.append(s.accept()[0])
"""


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


def test_a_server_that_never_answers_shows_a_dash_within_the_bound(rt: RuntimeEnv, smollm2_path: Path) -> None:
    engine = Engine(EngineConfig(model_path=str(smollm2_path), n_ctx=1024, keep_alive=300))
    info = engine.load()
    # The same two reads with only the healthy server, timed here: the hung one may add `TOTAL_TIMEOUT`, no more.
    t0 = time.monotonic()
    assert all(r.metrics is not None for r in runtime().status(live=True).servers)
    live_s = time.monotonic() - t0
    t0 = time.monotonic()
    assert "live: gen " in rt.gguf_cli("ps").stdout
    ps_s = time.monotonic() - t0  # with the interpreter's start and imports
    sock = str(rt.run_dir / "hang.sock")
    alias = "gguf-provider-hangs-on-metrics"
    hang = subprocess.Popen([sys.executable, "-c", HANG, sock, alias])
    try:
        wait_until(lambda: Path(sock).exists(), 60)  # a bare interpreter's start: ~0.1 s idle; 10x+ a loaded one
        entry = registry.Entry(pid=hang.pid, create_time=process.create_time(hang.pid), alias=alias,
                               model=str(rt.home / "hung.gguf"), socket=sock, n_ctx=512, keep_alive=-1,
                               started_at=time.time(), last_used=time.time())
        with registry.locked() as data:
            data["f" * 24] = entry
        t0 = time.monotonic()
        rows = runtime().status(live=True).servers
        took = time.monotonic() - t0
        by_pid = {r.pid: r for r in rows}
        assert by_pid[hang.pid].metrics is None and by_pid[hang.pid].describe_metrics() == "–"
        assert by_pid[info.pid].metrics is not None  # the healthy one still answers
        assert took < metrics.TOTAL_TIMEOUT + 10 * live_s, (took, live_s)
        t0 = time.monotonic()
        text = rt.gguf_cli("ps").stdout
        assert time.monotonic() - t0 < metrics.TOTAL_TIMEOUT + 10 * ps_s, ps_s
        assert "live: –" in text and "live: gen " in text
    finally:
        hang.kill()
        hang.wait(10)
        with registry.locked() as data:
            data.pop("f" * 24, None)
    engine.unload()
