"""llama.cpp RPC end to end: real `gguf-provider rpc-worker` processes (rpc-server from our install) on loopback,
SmolLM2 spread over two of them, a worker killed mid-stream, a worker that is not there, and the non-loopback guard.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import RPCWorkerLostError, RPCWorkerUnreachableError
from gguf_provider.events import TextDelta
from gguf_provider.runtime._common.process import free_port
from gguf_provider.runtime._memory import rpc
from tests.support.probs import assert_same_distribution, next_token_probs
from tests.support.runtime import ROOT, RuntimeEnv, reap, wait_until
from tests.support.timing import REACT

pytestmark = pytest.mark.timeout(300)  # a hang guard: the slowest test takes ~12 s under load; 25x

QUESTION = {"messages": [{"role": "user", "content": "Name three colors of the rainbow."}], "temperature": 0,
            "max_tokens": 40}
LONG = {"messages": [{"role": "user", "content": "Count from 1 to 300, one number per line."}], "temperature": 0,
        "max_tokens": 400}


class Worker:
    """One `gguf-provider rpc-worker` process and the lines it printed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "rpc-worker", "--port", str(port),
                                      "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=ROOT, start_new_session=True)
        self.lines: list[str] = []
        self._seen: queue.Queue[str] = queue.Queue()
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            self._seen.put(line)

    def wait_listening(self, timeout: float = 30.0) -> None:  # ~0.7 s under load; 40x
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if rpc.reachable(self.endpoint, timeout=0.5) and any("listening on" in ln for ln in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"rpc-worker on {self.endpoint} did not start: {self.lines}")

    def rpc_server(self) -> psutil.Process:
        (child,) = psutil.Process(self.proc.pid).children()
        return child

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)  # SIGKILLed: it exits at once
        self._pumping.join(10)  # the group is gone: its output ends
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def workers(rt: RuntimeEnv) -> Iterator[list[Worker]]:
    started = [Worker(free_port()), Worker(free_port())]
    try:
        for w in started:
            w.wait_listening()
        yield started
    finally:
        for w in started:
            w.stop()


def _reply(engine: Engine) -> str:
    return engine.chat(QUESTION).content


def test_a_model_spread_over_two_workers_answers_like_one_machine(rt: RuntimeEnv, workers: list[Worker]) -> None:
    """Over two CPU workers the model computes what it computes without them: the same next-token distribution
    within rounding (tests/support/probs.py), and a reply. (Not the same greedy text: a near tie may part them.)"""
    w1, w2 = workers
    assert any("offers" in ln and "MiB free" in ln for ln in w1.lines), w1.lines  # it says what it offers
    local = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024))
    try:
        expected = next_token_probs(local)
        assert _reply(local).strip()
    finally:
        local.unload()
    wait_until(lambda: not rt.servers(), 15)  # unload stopped it before returning: ~0.01 s under load

    rss_before = [w.rpc_server().memory_info().rss for w in workers]
    spread = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, rpc_servers=(w1.endpoint, w2.endpoint)))
    try:
        got = next_token_probs(spread)
        (server,) = rt.servers()
        argv = server.cmdline()
        assert argv[argv.index("--rpc") + 1] == f"{w1.endpoint},{w2.endpoint}"
        # The memory plan puts every layer and the output head on the workers, split by their free memory.
        from gguf_provider.runtime._common.gguf import read_header

        assert argv[argv.index("-ngl") + 1] == str((read_header(rt.model).block_count or 0) + 1)
        assert "--tensor-split" in argv and argv[argv.index("--fit") + 1] == "off"
        # The weights went to both workers: each one's memory grew by a share of the model file.
        share = rt.model.stat().st_size / 2
        for w, before in zip(workers, rss_before, strict=True):
            grown = w.rpc_server().memory_info().rss - before
            assert grown > 0.3 * share, (w.endpoint, grown, share)
            assert any("Accepted client connection" in ln for ln in w.lines)
        assert_same_distribution(got, expected)
        assert _reply(spread).strip()

        # `ps` shows the server's workers, as text and JSON.
        ps = rt.gguf_cli("ps", "--json")
        rows = json.loads(ps.stdout)["servers"]
        assert [r["workers"] for r in rows] == [[w1.endpoint, w2.endpoint]]
        assert f"workers {w1.endpoint},{w2.endpoint}" in rt.gguf_cli("ps").stdout
        # The registry charged only what stays local: every layer is on the workers.
        entry = rt.registry()[spread.info.key]
        assert entry["rpc_servers"] == [w1.endpoint, w2.endpoint]
    finally:
        spread.unload()


def test_a_worker_killed_mid_stream_is_a_typed_error_then_named_on_the_next_call(
        rt: RuntimeEnv, workers: list[Worker]) -> None:
    w1, w2 = workers
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, rpc_servers=(w1.endpoint, w2.endpoint)))
    try:
        pid = engine.info.pid
        texts = 0
        killed_at = 0.0
        with pytest.raises(RPCWorkerLostError) as ei:
            for ev in engine.stream(LONG):
                if isinstance(ev, TextDelta):
                    texts += 1
                    if texts == 5:
                        w2.rpc_server().kill()
                        killed_at = time.monotonic()
        took = time.monotonic() - killed_at
        assert killed_at and took < 30, took  # llama-server aborts on the lost worker: ~0.03 s under load
        assert ei.value.workers == (w2.endpoint,)
        assert w2.endpoint in str(ei.value) and "rpc-worker" in str(ei.value)
        # it aborted: gone at the first look under load
        wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, REACT)

        # The next call does not hang on the dead worker: a typed error naming it, in seconds (the probe's
        # refusal, ~0.1 s under load; a hang is the start timeout or the request's, minutes).
        t0 = time.monotonic()
        with pytest.raises(RPCWorkerUnreachableError) as ei2:
            engine.chat(QUESTION)
        assert time.monotonic() - t0 < 10
        assert ei2.value.worker == w2.endpoint and "nothing listens there" in str(ei2.value)
        assert not rt.servers()

        # The surviving worker serves a server without the dead one.
        alone = engine.with_config(rpc_servers=(w1.endpoint,))
        assert alone.chat(QUESTION).content.strip()
        alone.unload()
    finally:
        engine.unload()


def test_a_wrong_port_is_a_typed_error_within_seconds(rt: RuntimeEnv) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(RPCWorkerUnreachableError, match=rf"RPC worker 127\.0\.0\.1:{port} cannot be reached"):
        Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, rpc_servers=(f"127.0.0.1:{port}",))).load()
    assert time.monotonic() - t0 < 10  # the probe's refusal: ~0.1 s under load
    assert not rt.servers()  # nothing was spawned


def test_a_busy_worker_is_named_not_waited_for(rt: RuntimeEnv, workers: list[Worker]) -> None:
    """An rpc-server serves one llama-server at a time: a second server asking for the same worker is told so."""
    w1, _ = workers
    first = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, rpc_servers=(w1.endpoint,)))
    try:
        first.load()
        other = Engine(EngineConfig(model_path=str(rt.model), n_ctx=2048, rpc_servers=(w1.endpoint,), shared=False))
        t0 = time.monotonic()
        with pytest.raises(RPCWorkerUnreachableError, match="busy serving another llama-server"):
            other.load()
        # the probe waits out its answer timeout (5.0 s measured under load): its two timeouts, 10 s of margin
        assert time.monotonic() - t0 < rpc.CONNECT_TIMEOUT + rpc.ANSWER_TIMEOUT + 10
    finally:
        first.unload()


def test_rpc_worker_refuses_a_non_loopback_host_without_the_flag(rt: RuntimeEnv) -> None:
    port = free_port()
    out = rt.gguf_cli("rpc-worker", "--host", "0.0.0.0", "--port", str(port), timeout=30)  # ~0.7 s under load
    assert out.returncode == 2
    assert "no authentication" in out.stderr and "--i-know-rpc-is-unauthenticated" in out.stderr
    assert not rpc.reachable(f"127.0.0.1:{port}", timeout=0.5)


def test_serve_and_magics_take_rpc(rt: RuntimeEnv, workers: list[Worker]) -> None:
    from IPython.testing import globalipapp

    w1, w2 = workers
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "serve", str(rt.model), "--ctx", "1024",
                             "--rpc", f"{w1.endpoint},{w2.endpoint}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"RPC workers {w1.endpoint},{w2.endpoint}" in line, (line, proc.stderr.read() if proc.poll() else "")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)  # serve stops its server and exits: ~0.2 s under load
        reap(proc)
    wait_until(lambda: not rt.servers(), REACT)  # ~0.01 s under load

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # None: started by an earlier test
    shell.run_line_magic("load_ext", "gguf_provider")
    magics = shell.magics_manager.registry["GGUFMagics"]
    try:
        shell.run_line_magic("gguf", f"load {rt.model} --ctx 1024 --as spread --rpc {w1.endpoint}")
        (server,) = rt.servers()
        assert w1.endpoint in server.cmdline()
        assert magics.models["spread"].engine.config.rpc_servers == (w1.endpoint,)
        table = shell.run_line_magic("gguf", "ps")
        assert any(row.get("workers") == w1.endpoint for row in table.rows)
    finally:
        shell.run_line_magic("gguf", "unload --all")


def test_rpc_server_is_installed_beside_llama_server(rt: RuntimeEnv) -> None:
    found = rpc.find_rpc_server(rt.binary)
    assert found == rt.binary.parent / "ggml-rpc-server"
    marker = json.loads((rt.binary.parent / "installed.json").read_text())
    if marker.get("origin", "source") == "source":
        assert "-DGGML_RPC=ON" in marker["cmake_args"] and "ggml-rpc-server" in marker["tools"]
    assert Path(found).stat().st_mode & 0o111
