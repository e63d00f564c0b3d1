"""The kill matrix (docs/reliability.md): `rpc-worker`, `serve`, a script and a Jupyter kernel holding a model, each
a real process killed with each signal once it serves; nothing it started may go on listening or running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from gguf_provider.runtime import registry, rpc
from gguf_provider.runtime.process import free_port
from tests.integration_tests.test_rpc import Worker
from tests.support.runtime import ROOT, RuntimeEnv, pid_alive, serving_line, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

# SIGSEGV stands for a crash of the command itself (no handler, no finally runs).
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL, signal.SIGSEGV]
GONE_WITHIN = 5.0  # seconds


def _gone(p: psutil.Process) -> bool:
    return not pid_alive(p.pid) or not p.is_running()  # a reused pid is another process


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_rpc_worker_leaves_no_rpc_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    worker = Worker(free_port())  # its own session: the signal reaches the command only, not its child
    try:
        worker.wait_listening()
        child = worker.rpc_server()
        os.kill(worker.proc.pid, sig)
        worker.proc.wait(GONE_WITHIN)
        wait_until(lambda: _gone(child), GONE_WITHIN)
        wait_until(lambda: not rpc.reachable(worker.endpoint, timeout=0.5), GONE_WITHIN)
    finally:
        worker.stop()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_serve_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "serve", str(rt.model), "--ctx", "1024",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        line = serving_line(proc.stdout)
        assert line.startswith("serving"), line
        (server,) = rt.servers()
        os.kill(proc.pid, sig)
        proc.wait(GONE_WITHIN)
        # after kill -9 or a crash the watchdog notices the dead lease within its 1 s tick (keep_alive 0)
        wait_until(lambda: _gone(server), GONE_WITHIN)
        wait_until(lambda: not rpc.reachable(f"127.0.0.1:{port}", timeout=0.5), GONE_WITHIN)
        wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for p in rt.servers():
            p.kill()


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "private"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_script_holding_a_model_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals, shared: bool) -> None:
    """A script (tests/support/runtime_child.py: an Engine, as a ChatGGUF holds one) killed while it holds its
    server: a private server dies with it (PR_SET_PDEATHSIG), a shared one is stopped by its watchdog once
    keep_alive (0 here) has run out."""
    child = rt.child(chat=False, shared=shared, keep_alive=0)
    r = child.read_json()
    assert "error" not in r, r
    server = psutil.Process(r["server_pid"])
    os.kill(child.proc.pid, sig)
    child.proc.wait(GONE_WITHIN)
    wait_until(lambda: _gone(server), GONE_WITHIN)
    wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
    if not shared and sig not in (signal.SIGINT,):  # nobody was left to remove a private server's entry
        assert [e.pid for e in registry.sweep()] == [r["server_pid"]]  # the next start's sweep does
    assert rt.registry() == {}


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_jupyter_kernel_with_a_loaded_model_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    """A real ipykernel after `%gguf load`: killed, its server is stopped by the watchdog (keep_alive 0 here).
    SIGINT is Jupyter's "interrupt": the kernel lives on and keeps its model."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive(f"%load_ext gguf_provider\n%gguf load {rt.model} --ctx 1024", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        (server,) = rt.servers()
        kernel = psutil.Process(km.provisioner.pid)  # type: ignore[union-attr]
        os.kill(kernel.pid, sig)
        if sig == signal.SIGINT:
            ok = kc.execute_interactive("%gguf ps", timeout=60)
            assert ok["content"]["status"] == "ok" and not _gone(server) and kernel.is_running()
            return
        wait_until(lambda: _gone(kernel), GONE_WITHIN)
        wait_until(lambda: _gone(server), GONE_WITHIN)
        wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
        assert rt.registry() == {}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
