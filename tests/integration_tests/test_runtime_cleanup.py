"""Orphaned servers are cleaned up after `kill -9` of their clients; servers we did not start are never touched."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import httpx
import pytest

from gguf_provider.runtime._common import process
from gguf_provider.runtime._serve import manager as mgr
from gguf_provider.runtime._serve import registry
from gguf_provider.runtime._serve.server_options import ServerSpec
from tests.support.runtime import RuntimeEnv, pid_alive, wait_until
from tests.support.timing import REACT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_kill9_of_only_client_watchdog_stops_shared_server(rt: RuntimeEnv) -> None:
    c = rt.child(chat=False)
    r = c.read_json()
    assert "error" not in r, r
    assert rt.watchdogs(), "a shared server gets a watchdog"
    c.kill9()
    # The watchdog polls once a second: the dead lease is pruned and keep_alive=0 has run out.
    took = wait_until(lambda: not pid_alive(r["server_pid"]), REACT)
    print(f"server gone {took:.1f} s after kill -9 of its only client")
    wait_until(lambda: not rt.watchdogs(), REACT)
    assert rt.registry() == {}
    assert not list(rt.run_dir.glob("*.sock"))


@pytest.mark.timeout(120)
def test_kill9_of_only_client_next_manager_start_sweeps_orphan(rt: RuntimeEnv) -> None:
    c = rt.child(chat=False)
    r = c.read_json()
    assert "error" not in r, r
    for w in rt.watchdogs():  # take the watchdog out of the picture: the sweep alone must do it
        w.kill()
    wait_until(lambda: not rt.watchdogs(), REACT)
    c.kill9()
    # Right before the manager starts: the orphan and its dead client's lease are still there (no watchdog runs,
    # nothing else prunes or stops), so what stops it below is the manager's sweep.
    assert pid_alive(r["server_pid"]), "without a watchdog the orphan stays until the next manager start"
    assert str(c.proc.pid) in rt.registry()[r["key"]]["leases"]

    manager = mgr.ServerManager()
    lease = manager.acquire(ServerSpec(model=rt.model, n_ctx=2048))
    try:
        assert not pid_alive(r["server_pid"]), "the sweep at the manager's first acquire stops the orphan"
        assert lease.info.pid != r["server_pid"]
        assert list(rt.registry()) == [lease.info.key]
        assert [p.pid for p in rt.servers()] == [lease.info.pid]
    finally:
        lease.release()
    wait_until(lambda: not pid_alive(lease.info.pid), REACT)
    assert rt.registry() == {}


@pytest.mark.timeout(120)
def test_kill9_of_private_server_owner_kills_server(rt: RuntimeEnv) -> None:
    c = rt.child(chat=False, shared=False)
    r = c.read_json()
    assert "error" not in r, r
    assert not rt.watchdogs(), "a private server needs no watchdog: it dies with its owner"
    t0 = time.monotonic()
    c.proc.send_signal(signal.SIGKILL)
    wait_until(lambda: not pid_alive(r["server_pid"]), REACT)  # the kernel's SIGKILL (PR_SET_PDEATHSIG)
    print(f"private server gone {time.monotonic() - t0:.2f} s after kill -9 of its owner")
    c.proc.wait(REACT)
    removed = registry.sweep()  # its stale entry goes with the next sweep
    assert [e.pid for e in removed] == [r["server_pid"]]
    assert rt.registry() == {}


@pytest.mark.timeout(120)
def test_foreign_server_survives_sweeps_and_stop_all(rt: RuntimeEnv) -> None:
    sock = rt.run_dir / "foreign.sock"
    foreign = subprocess.Popen(
        [str(rt.binary), "-m", str(rt.model), "-c", "512", "--alias", "foreign-server", "--host", str(sock)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def healthy() -> bool:
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=REACT) as h:
                    return h.get("http://x/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, 0.1)  # a start: typical ~3 s on a loaded 2-core machine; 20x
        fctime = process.create_time(foreign.pid)

        # A managed server (keep_alive so it outlives its client) that `stop --all` must stop.
        c = rt.child(chat=False, keep_alive=300)
        r = c.read_json()
        assert "error" not in r, r
        c.finish()
        # Forged entries naming the foreign pid, as after a pid reuse: wrong alias, and right alias + wrong time.
        with registry.locked() as data:
            base: dict[str, Any] = {"model": str(rt.model), "socket": str(sock), "url": None, "api_key_file": None,
                    "log": "/dev/null", "n_ctx": 512, "shared": True, "keep_alive": 0, "leases": {},
                    "idle_since": 0.0}
            data["forged-alias"] = registry.Entry(**{**base, "pid": foreign.pid, "create_time": fctime,
                                                      "alias": "gguf-provider-x"})
            data["forged-time"] = registry.Entry(**{**base, "pid": foreign.pid, "create_time": fctime - 100,
                                                     "alias": "foreign-server"})

        removed = registry.sweep()
        assert {e.pid for e in removed} == {foreign.pid}  # the forged entries are dropped ...
        assert healthy() and foreign.poll() is None  # ... but the process is not touched
        assert pid_alive(r["server_pid"])

        # A new manager's start sweeps too.
        manager = mgr.ServerManager()
        with manager.acquire(ServerSpec(model=rt.model, n_ctx=1024)) as lease:
            assert lease.info.pid != foreign.pid
        assert healthy()

        out = rt.gguf_cli("stop", "--all")
        assert out.returncode == 0, out.stderr
        assert f"stopped pid {r['server_pid']}" in out.stdout
        wait_until(lambda: not pid_alive(r["server_pid"]), REACT)
        assert rt.registry() == {}
        assert healthy() and foreign.poll() is None, "stop --all must never touch a server it did not start"
        assert sock.exists()
    finally:
        foreign.terminate()
        foreign.wait(REACT)
