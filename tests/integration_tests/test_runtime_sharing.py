"""Several client processes share one llama-server, and nothing is left once they are gone (real llama-server)."""

from __future__ import annotations

import json

import pytest

from tests.support.runtime import RuntimeEnv, pid_alive, wait_until
from tests.support.timing import REACT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_two_processes_share_one_server_and_leave_nothing(rt: RuntimeEnv) -> None:
    a, b = rt.child(), rt.child()
    ra, rb = a.read_json(), b.read_json()
    assert "error" not in ra and "error" not in rb, (ra, rb)
    assert ra["server_pid"] == rb["server_pid"]
    assert ra["answer"].strip() and rb["answer"].strip()
    assert len(rt.servers(ra["alias"])) == 1
    entry = rt.registry()[ra["key"]]
    assert set(entry["leases"]) == {str(ra["client_pid"]), str(rb["client_pid"])}

    assert a.finish() == 0
    assert pid_alive(ra["server_pid"]), "the server must outlive its first client while the second holds it"
    assert set(rt.registry()[ra["key"]]["leases"]) == {str(rb["client_pid"])}
    assert b.finish() == 0

    # keep_alive=0: the server, its registry entry, its socket and its watchdog are all gone within seconds.
    wait_until(lambda: not pid_alive(ra["server_pid"]), REACT)
    wait_until(lambda: not rt.watchdogs(), REACT)
    assert rt.registry() == {}
    assert not list(rt.run_dir.glob("*.sock"))
    assert rt.servers() == []


@pytest.mark.timeout(180)
def test_eight_racing_processes_start_exactly_one_server(rt: RuntimeEnv) -> None:
    children = [rt.child(chat=False, wait_go=True) for _ in range(8)]
    for c in children:
        assert "ready" in c.read_json(timeout=60)
    for c in children:  # all imports done: release them at once
        c.send("go")
    results = [c.read_json(timeout=120) for c in children]
    assert all("error" not in r for r in results), results
    assert len({r["server_pid"] for r in results}) == 1
    assert len({r["key"] for r in results}) == 1
    alias = results[0]["alias"]
    assert [p.pid for p in rt.servers(alias)] == [results[0]["server_pid"]]
    assert len(rt.servers()) == 1
    entry = rt.registry()[results[0]["key"]]
    assert set(entry["leases"]) == {str(r["client_pid"]) for r in results}

    for c in children:
        assert c.finish() == 0
    wait_until(lambda: not pid_alive(results[0]["server_pid"]), REACT)
    assert rt.registry() == {}


@pytest.mark.timeout(240)  # typical ~17 s on a loaded 2-core machine (6 s of it keep_alive); 14x
def test_keep_alive_keeps_the_server_warm_then_stops_it(rt: RuntimeEnv) -> None:
    """keep_alive > 0: after the last lease goes the server stays for the next client, then stops by itself."""
    a = rt.child(keep_alive=6, chat=False)
    ra = a.read_json()
    b = rt.child(keep_alive=6, chat=False, wait_go=True)  # its start (imports: seconds under load) before a goes
    assert "ready" in b.read_json()
    assert a.finish() == 0
    entry = rt.registry()[ra["key"]]
    assert entry["leases"] == {} and entry.get("idle_since"), entry
    assert pid_alive(ra["server_pid"]), "keep_alive=6 must not stop the server at once"
    b.send("go")  # an acquire within keep_alive: typical ~0.45 s on a loaded 2-core machine; 6 s is 13x
    rb = b.read_json()
    assert rb["server_pid"] == ra["server_pid"], "a client within keep_alive reuses the warm server"
    assert b.finish() == 0
    wait_until(lambda: not pid_alive(ra["server_pid"]), 6 + REACT)  # keep_alive, then the watchdog's stop
    wait_until(lambda: not rt.watchdogs(), REACT)
    assert rt.registry() == {}


@pytest.mark.timeout(120)
def test_keep_alive_forever_survives_a_killed_client_until_stopped(rt: RuntimeEnv) -> None:
    """keep_alive=-1: the server outlives even a kill -9 of its only client; `gguf-provider stop --all` ends it."""
    a = rt.child(keep_alive=-1, chat=False)
    ra = a.read_json()
    a.kill9()
    assert not rt.watchdogs(), "keep_alive=-1 gets no watchdog: only a sweep could act on the dead client"
    assert pid_alive(ra["server_pid"])
    ps = rt.gguf_cli("ps", "--json")  # the CLI sweeps first: the dead client's lease is pruned, the server kept
    rows = [r for r in json.loads(ps.stdout)["servers"] if r["pid"] == ra["server_pid"]]
    assert len(rows) == 1 and rows[0]["leases"] == 0, ps
    assert pid_alive(ra["server_pid"])
    out = rt.gguf_cli("stop", "--all")
    assert out.returncode == 0 and f"stopped pid {ra['server_pid']}" in out.stdout, out
    wait_until(lambda: not pid_alive(ra["server_pid"]), REACT)
    assert rt.registry() == {}
