"""`ps`'s live numbers: llama-server's Prometheus /metrics and /slots parsed from a real captured body
(tests/unit_tests/data/metrics/README.md says where it came from), read over httpx, and the bound on a server that
accepts and never answers."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._serve import metrics
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec

DATA = Path(__file__).parent / "data" / "metrics"
BODY = (DATA / "llama-server-metrics.prom").read_text()
SLOTS = json.loads((DATA / "llama-server-slots.json").read_text())


def test_the_captured_body_parses_to_its_samples() -> None:
    samples = metrics.parse_prometheus(BODY)
    assert samples["llamacpp:tokens_predicted_total"] == 300
    assert samples["llamacpp:tokens_predicted_seconds_total"] == pytest.approx(3.26567)
    assert samples["llamacpp:prompt_tokens_total"] == 199 and samples["llamacpp:prompt_tokens_cached_total"] == 197
    assert samples["llamacpp:requests_processing"] == 0 and samples["llamacpp:requests_deferred"] == 0
    assert samples['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == 7  # labelled series
    assert not any(k.startswith("#") for k in samples)


def test_the_numbers_ps_shows() -> None:
    m = metrics.from_samples(metrics.parse_prometheus(BODY), metrics.kv_from_slots(SLOTS))
    assert m.generation_tps == round(300 / 3.26567, 1)  # counters over the server's life, not the scrape window
    assert m.prompt_tps == round(199 / 0.899393, 1)
    assert (m.tokens_predicted, m.prompt_tokens, m.prompt_tokens_cached) == (300, 199, 197)
    assert (m.spec_drafted, m.spec_accepted) == (352, 204) and m.spec_acceptance == round(204 / 352, 4)
    assert (m.kv_tokens, m.kv_size) == (347, 4096) and m.kv_use == round(347 / 4096, 4)  # 4 slots, one cache
    line = m.describe()
    assert "gen 91.9 tok/s" in line and "KV 8% (347/4096)" in line and "drafts 58% accepted" in line
    assert "requests 0 running, 0 waiting" in line


def test_an_idle_new_server_has_no_speeds_yet() -> None:
    m = metrics.from_samples({"llamacpp:tokens_predicted_total": 0.0, "llamacpp:requests_processing": 0.0})
    assert m.generation_tps is None and m.prompt_tps is None and m.spec_acceptance is None and m.kv_use is None
    assert m.describe().startswith("gen – tok/s, prompt – tok/s, KV –")


def test_kv_size_with_split_slots_and_odd_answers() -> None:
    assert metrics.kv_from_slots(SLOTS, unified=False) == (347, 4 * 4096)
    assert metrics.kv_from_slots([]) is None and metrics.kv_from_slots({"error": 1}) is None
    assert metrics.kv_from_slots([{"id": 0}]) is None  # no n_ctx: no size to compare with
    assert metrics.unified_cache([]) and metrics.unified_cache(["-np", "2", "--kv-unified"])
    assert not metrics.unified_cache(["-np", "2"]) and not metrics.unified_cache(["--parallel=3"])


def test_garbage_lines_are_skipped() -> None:
    text = "# HELP x\nllamacpp:a 1\nnot a number here\nllamacpp:b{l=\"1\"} 2 1700000000\nllamacpp:c{broken 3\n"
    assert metrics.parse_prometheus(text) == {"llamacpp:a": 1.0, 'llamacpp:b{l="1"}': 2.0}


def _served(metrics_status: int = 200, slots: object = SLOTS) -> Address:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.headers.get("authorization") == "Bearer k3y"
        if request.url.path == "/metrics":
            return httpx.Response(metrics_status, text=BODY if metrics_status == 200 else "{}")
        return httpx.Response(200, json=slots)
    return Address(url="http://127.0.0.1:1", api_key="k3y", injected=httpx.MockTransport(handle))


def test_read_over_http_and_a_server_without_metrics() -> None:
    assert metrics.read(_served()).kv_tokens == 347
    assert metrics.read(_served(slots={"error": "slots disabled"})).kv_use is None  # /metrics alone still counts
    with pytest.raises(httpx.HTTPStatusError):
        metrics.read(_served(501))  # started without --metrics (before this release): ps shows "–"


@pytest.fixture
def hanging_socket() -> Iterator[str]:
    """A Unix socket that accepts connections and never answers (a stopped or wedged server)."""
    d = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    path = f"{d}/hang.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


def test_a_server_that_never_answers_shows_nothing_within_the_bound(hanging_socket: str) -> None:
    # A request timeout far past `total`: the answer comes by `total` (it waits that long for the hung server, never
    # less), not by the request's own timeout. The good (in-process) server answers in ~ms, 100x+ within `total`.
    request_timeout, total = 60.0, 1.5
    t0 = time.monotonic()
    got = metrics.read_all({"good": (_served(), True), "hung": (Address(socket=hanging_socket), True),
                            "gone": (Address(socket="/nonexistent/x.sock"), True)}, timeout=request_timeout, total=total)
    took = time.monotonic() - t0
    assert got["hung"] is None and got["gone"] is None
    assert got["good"] is not None and got["good"].tokens_predicted == 300
    assert total <= took < request_timeout / 2, took  # bounded by `total`, however many servers hang


def test_servers_are_started_with_metrics_when_the_build_has_it() -> None:
    spec = ServerSpec(model=Path("/m.gguf"))
    caps = ServerCapabilities(path="llama-server", version="t", flags={"--metrics": True})
    assert "--metrics" in build_argv(spec, Path("/b"), caps, "a", 512, Address(socket="/s"), None)
    old = ServerCapabilities(path="llama-server", version="old", flags={})
    assert "--metrics" not in build_argv(spec, Path("/b"), old, "a", 512, Address(socket="/s"), None)
