"""The manager's sharing races, driven with fakes: no process, no sleep, each test in milliseconds.

The registry is the real one (a file in a temporary directory, real file locks) over fake processes; the launcher,
health check, clock, budget and installer are fakes. Each "process" is a ServerManager with its own client pid,
all sharing one registry, as separate Python processes share the registry file. The tests assert what happened:
which server each lease is on, how many were spawned, which processes were stopped and which were left alone.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import httpx
import psutil
import pytest

from gguf_provider.errors import LoadCancelled, ServerConnectionError, ServerStartError
from gguf_provider.runtime._common.cancel import Cancel
from gguf_provider.runtime._common.gguf import GGUFHeader
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._common.progress import Progress
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._memory import fit
from gguf_provider.runtime._memory.devices import Device
from gguf_provider.runtime._serve import budget as budget_mod
from gguf_provider.runtime._serve import manager as mgr
from gguf_provider.runtime._serve import registry, watchdog
from gguf_provider.runtime._serve.registry import Entry, Registry
from gguf_provider.runtime._serve.server_options import ServerSpec
from tests.support.gguf_bytes import STANDINS

# --- fakes ---------------------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeProcess:
    create_time: float
    cmdline: list[str]


class FakeProcesses:
    """The machine's process table: what registry.Processes sees."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.table: dict[int, FakeProcess] = {}
        self.started: dict[int, float] = {}  # every pid's start time, kept after it exits (as a zombie's is)
        self.stopped: list[int] = []  # pids stopped through the registry
        self._next = 5000
        self._lock = threading.Lock()

    def start(self, cmdline: list[str]) -> int:
        with self._lock:
            self._next += 1
            self.table[self._next] = FakeProcess(self.clock.time() + self._next / 1000, cmdline)
            self.started[self._next] = self.table[self._next].create_time
            return self._next

    def alive(self, pid: int) -> bool:
        return pid in self.table

    def die(self, pid: int) -> None:
        self.table.pop(pid, None)

    def reuse(self, pid: int, cmdline: list[str]) -> None:
        """``pid`` ends and the system hands it to another program, started later."""
        self.table[pid] = FakeProcess(self.clock.time() + 777.0, cmdline)

    # registry.Processes
    def matches(self, pid: int, create_time: float, marker: str | None = None) -> bool:
        p = self.table.get(pid)
        return p is not None and abs(p.create_time - create_time) <= 0.05 and (
            marker is None or marker in p.cmdline)

    def create_time(self, pid: int) -> float:
        return self.started[pid]

    def stop(self, pid: int, create_time: float, marker: str) -> bool:
        assert self.matches(pid, create_time, marker), f"asked to stop pid {pid}, which is not provably ours"
        self.stopped.append(pid)
        self.die(pid)
        return True


@dataclass
class FakeServer:
    pid: int
    alias: str
    model: str
    n_ctx: int
    healthy: bool = False


class FakeProc:
    def __init__(self, procs: FakeProcesses, pid: int) -> None:
        self._procs, self.pid = procs, pid

    def poll(self) -> int | None:
        return None if self._procs.alive(self.pid) else 1


class FakeLauncher:
    def __init__(self, procs: FakeProcesses, servers: dict[str, FakeServer]) -> None:
        self.procs, self.servers = procs, servers
        self.spawned: list[int] = []
        self.argvs: list[list[str]] = []  # each spawn's command line
        self.watchdogs: list[tuple[str, Entry]] = []

    def spawn(self, argv: list[str], log_path: Path, *, private: bool) -> mgr.Proc:
        pid = self.procs.start(argv)
        arg = dict(zip(argv, argv[1:], strict=False))
        where = f"http://{arg['--host']}:{arg['--port']}" if "--port" in arg else f"unix:{arg['--host']}"
        self.servers[where] = FakeServer(pid, arg["--alias"], arg["-m"], int(arg["-c"]))
        self.spawned.append(pid)
        self.argvs.append(list(argv))
        return FakeProc(self.procs, pid)

    def watchdog(self, key: str, entry: Entry, home: Path) -> None:
        self.watchdogs.append((key, entry))


class FakeHealth:
    """Answers for the fake servers; a test hooks in what happens while a client waits for an answer."""

    def __init__(self, procs: FakeProcesses, servers: dict[str, FakeServer]) -> None:
        self.procs, self.servers = procs, servers
        self.before_answer: list[Callable[[], None]] = []  # each runs once, at the next /props, before it answers
        self.after_answer: list[Callable[[], None]] = []  # ... after the answer left the server
        self.after_healthy: list[Callable[[], None]] = []  # ... at the next start, once /health said 200
        self.while_loading: list[Callable[[], None]] = []  # ... at the next start, before /health says 200

    def wait_healthy(self, proc: mgr.Proc, address: Address, log_path: Path, *, timeout: float,
                     progress: Progress | None) -> None:
        server = self.servers[address.describe()]
        if self.while_loading:
            self.while_loading.pop(0)()
        if progress is not None:
            progress("loading", 0, 0)  # as the real wait reports at each poll: a cancelled load stops here
        if not self.procs.alive(server.pid):
            raise ServerStartError("llama-server exited with code 1 while starting", "load failed", log_path)
        server.healthy = True
        if self.after_healthy:
            self.after_healthy.pop(0)()

    def props(self, address: Address, *, healthy: bool = False) -> dict[str, Any]:
        if self.before_answer:
            self.before_answer.pop(0)()
        server = self.servers.get(address.describe())
        if server is None or not self.procs.alive(server.pid) or (healthy and not server.healthy):
            raise httpx.ConnectError("connection refused")
        answer = {"model_alias": server.alias, "model_path": server.model,
                  "default_generation_settings": {"n_ctx": server.n_ctx}}
        if self.after_answer:
            self.after_answer.pop(0)()
        return answer

    def speculating(self, address: Address) -> bool | None:
        return None


class FakeLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False

    @property
    def is_locked(self) -> bool:
        return self._held

    def acquire(self) -> object:
        self._lock.acquire()
        self._held = True
        return self

    def release(self) -> None:
        self._held = False
        self._lock.release()


class FakeBudget:
    """Admits everything at the asked context; with ``evict``, first stops every idle server (budget.stop_idle)."""

    def __init__(self) -> None:
        self.lock = FakeLock()
        self.evict = False

    def admission_lock(self) -> mgr.AdmissionLock:
        return self.lock

    def admit(self, header: GGUFHeader, file_bytes: int, *, requested: int | None, n_gpu_layers: int | None,
              memory: Callable[[], fit.MemoryInfo], cache_type: str, draft: GGUFHeader | None,
              local_share: float, reg: Registry,
              cache_ram: Callable[[int], int] | None = None) -> budget_mod.Admission:
        assert self.lock.is_locked, "admission happens under the admission lock"
        if self.evict:
            for key in list(reg.read()):
                budget_mod.stop_idle(key, reg=reg)
        return budget_mod.Admission(requested or 4096, file_bytes, ())

    def memory(self, binary: Path, workers: Any) -> fit.MemoryInfo:
        return fit.MemoryInfo(ram_available=2**34)

    def devices(self, binary: Path, rpc: Any) -> list[Device]:
        return [Device("CPU", "cpu", "host RAM", 2**34, 2**34)]

    def rss(self, pid: int) -> int:
        return 1234


class FakeInstaller:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def find(self, explicit: str | None) -> Path:
        return self.binary

    def capabilities(self, binary: Path) -> discovery.ServerCapabilities:
        return discovery.ServerCapabilities(path=str(binary), version="test")


class World:
    """One machine: a registry, its processes and servers, and client processes (managers) to drive."""

    def __init__(self, tmp: Path, reg: Registry | None = None) -> None:
        self.clock = FakeClock()
        self.procs = FakeProcesses(self.clock)
        self.reg = reg or Registry(tmp / "home", self.procs)
        self.reg.processes = self.procs
        self.servers: dict[str, FakeServer] = {}
        self.launcher = FakeLauncher(self.procs, self.servers)
        self.health = FakeHealth(self.procs, self.servers)
        self.budget = FakeBudget()
        binary = tmp / "llama-server"
        binary.write_bytes(b"#!/bin/sh\n")
        self.installer = FakeInstaller(binary)
        self.models = {name: STANDINS[name].write(tmp / "models") for name in ("smollm2", "qwen")}

    def client(self) -> mgr.ServerManager:
        pid = self.procs.start(["python", "client.py"])
        return mgr.ServerManager(registry=self.reg, launcher=self.launcher, health=self.health, clock=self.clock,
                                 budget=self.budget, installer=self.installer, pid=pid)

    def spec(self, model: str = "smollm2", n_ctx: int = 2048) -> ServerSpec:
        return ServerSpec(model=self.models[model], n_ctx=n_ctx)

    def entry(self, lease: mgr.Lease) -> Entry:
        return self.reg.read()[lease.info.key]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(tmp_path / "run"))
    yield World(tmp_path)


def client_pid(m: mgr.ServerManager) -> str:
    return str(m._pid)


# --- two processes, one server -------------------------------------------------------------------------------------


class _SignallingRegistry(Registry):
    """Tells the test when a client is about to take a server key's lock."""

    def __init__(self, home: Path, processes: registry.Processes) -> None:
        super().__init__(home, processes)
        self.taking_key_lock = threading.Event()

    def key_lock(self, key: str) -> filelock.FileLock:
        if threading.current_thread() is not threading.main_thread():
            self.taking_key_lock.set()
        return super().key_lock(key)


def test_two_processes_acquiring_at_once_share_one_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(tmp_path / "run"))
    w = World(tmp_path, _SignallingRegistry(tmp_path / "home", registry.OSProcesses()))
    assert isinstance(w.reg, _SignallingRegistry)
    a, b = w.client(), w.client()
    leases: dict[str, mgr.Lease] = {}

    def b_acquires() -> None:
        leases["b"] = b.acquire(w.spec())

    thread = threading.Thread(target=b_acquires)

    def b_starts_while_a_waits_for_health() -> None:
        thread.start()  # B arrives while A's server is registered but not yet healthy
        assert w.reg.taking_key_lock.wait(5)  # type: ignore[attr-defined]

    w.health.after_healthy.append(b_starts_while_a_waits_for_health)
    leases["a"] = a.acquire(w.spec())
    thread.join(5)
    assert not thread.is_alive()

    assert len(w.launcher.spawned) == 1
    assert leases["a"].info.pid == leases["b"].info.pid == w.launcher.spawned[0]
    assert set(w.entry(leases["a"]).leases) == {client_pid(a), client_pid(b)}
    leases["a"].release()
    assert set(w.entry(leases["b"]).leases) == {client_pid(b)}
    assert w.procs.stopped == []


def test_one_process_acquiring_twice_holds_one_lease_until_both_are_released(world: World) -> None:
    a = world.client()
    first, second = a.acquire(world.spec(), keep_alive=0), a.acquire(world.spec(), keep_alive=0)
    assert first.info.pid == second.info.pid and len(world.launcher.spawned) == 1
    first.release()
    assert world.entry(second).leases.keys() == {client_pid(a)} and world.procs.stopped == []
    second.release()
    assert world.reg.read() == {} and world.procs.stopped == world.launcher.spawned


# --- attach while the last lease ends --------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before_answer", "after_answer"])
def test_attach_while_the_last_lease_ends_starts_a_new_server(world: World, when: str) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec(), keep_alive=0)
    first = lease_a.info.pid
    # B has found A's server in the registry and asks it /props: A lets go (keep_alive=0 stops the server at once),
    # before the server answers B, or after it answered but before B's lease is written.
    getattr(world.health, when).append(lease_a.release)
    lease_b = b.acquire(world.spec(), keep_alive=0)

    assert world.procs.stopped == [first]
    assert len(world.launcher.spawned) == 2 and lease_b.info.pid == world.launcher.spawned[1] != first
    assert world.procs.alive(lease_b.info.pid)
    assert list(world.reg.read()) == [lease_b.info.key]
    assert dict(world.entry(lease_b).leases).keys() == {client_pid(b)}
    lease_b.release()
    assert world.reg.read() == {} and not world.procs.alive(lease_b.info.pid)


def test_a_lease_added_before_the_last_one_ends_keeps_the_server(world: World) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec(), keep_alive=0)
    lease_b = b.acquire(world.spec(), keep_alive=0)
    lease_a.release()
    assert world.procs.stopped == [] and lease_b.info.pid == lease_a.info.pid
    assert dict(world.entry(lease_b).leases).keys() == {client_pid(b)}


# --- the server dies between health and first request ----------------------------------------------------------------


def test_a_server_dying_right_after_health_is_a_typed_start_error_and_leaves_nothing(world: World) -> None:
    a = world.client()
    world.health.after_healthy.append(lambda: world.procs.die(world.launcher.spawned[-1]))
    with pytest.raises(ServerStartError, match="right after it became healthy"):
        a.acquire(world.spec())
    assert world.reg.read() == {} and world.procs.stopped == []
    # The next acquire starts afresh.
    lease = a.acquire(world.spec())
    assert len(world.launcher.spawned) == 2 and lease.info.pid == world.launcher.spawned[1]


def test_a_server_dead_before_the_first_request_is_replaced_and_the_old_lease_lets_go_harmlessly(
        world: World) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())
    world.procs.die(lease_a.info.pid)  # crashed after acquire returned, before the first request
    lease_b = b.acquire(world.spec())
    assert len(world.launcher.spawned) == 2 and lease_b.info.pid == world.launcher.spawned[1]
    assert list(world.reg.read()) == [lease_b.info.key] and world.entry(lease_b).pid == lease_b.info.pid
    lease_a.release()  # A's lease named the dead server: the new one is not A's to touch
    assert dict(world.entry(lease_b).leases).keys() == {client_pid(b)} and world.procs.alive(lease_b.info.pid)
    # A asks again (as the engine does when its server is gone): it shares B's new server.
    again = a.acquire(world.spec())
    assert again.info.pid == lease_b.info.pid and len(world.launcher.spawned) == 2


def test_a_server_that_exits_while_loading_is_unregistered(world: World) -> None:
    a = world.client()
    original = world.launcher.spawn

    def exits_at_once(argv: list[str], log_path: Path, *, private: bool) -> mgr.Proc:
        proc = original(argv, log_path, private=private)
        world.procs.die(proc.pid)
        return proc

    world.launcher.spawn = exits_at_once  # type: ignore[method-assign]
    with pytest.raises(ServerStartError, match="while starting"):
        a.acquire(world.spec())
    assert world.reg.read() == {}


def test_a_registered_server_that_does_not_answer_is_reported_not_replaced(world: World) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())
    next(iter(world.servers.values())).healthy = False  # alive and ours, but /health does not say 200
    with pytest.raises(ServerConnectionError, match="does not answer"):
        b.acquire(world.spec())
    assert len(world.launcher.spawned) == 1 and world.procs.stopped == []
    assert dict(world.entry(lease_a).leases).keys() == {client_pid(a)}


# --- eviction racing a new lease -------------------------------------------------------------------------------------


def test_eviction_before_the_new_lease_is_written_makes_the_client_start_afresh(world: World) -> None:
    a, b, c = world.client(), world.client(), world.client()
    a.acquire(world.spec("smollm2"), keep_alive=300).release()  # idle, kept alive for 300 s
    idle = world.launcher.spawned[0]
    world.budget.evict = True
    leases: list[mgr.Lease] = []
    # B has its answer from the idle server; before its lease is written, C's admission evicts that server.
    world.health.after_answer.append(lambda: leases.append(c.acquire(world.spec("qwen"))))
    lease_b = b.acquire(world.spec("smollm2"))

    assert world.procs.stopped == [idle]
    assert len(world.launcher.spawned) == 3 and lease_b.info.pid == world.launcher.spawned[2]
    entries = world.reg.read()
    assert {k: dict(e.leases).keys() for k, e in entries.items()} == {
        leases[0].info.key: {client_pid(c)}, lease_b.info.key: {client_pid(b)}}
    assert all(world.procs.alive(e.pid) for e in entries.values())


def test_eviction_after_the_new_lease_is_written_spares_the_server(world: World) -> None:
    a, b, c = world.client(), world.client(), world.client()
    a.acquire(world.spec("smollm2"), keep_alive=300).release()
    idle = world.launcher.spawned[0]
    lease_b = b.acquire(world.spec("smollm2"))  # B's lease is in
    world.budget.evict = True
    lease_c = c.acquire(world.spec("qwen"))  # C's admission finds the server held: nothing to evict
    assert world.procs.stopped == [] and lease_b.info.pid == idle and world.procs.alive(idle)
    assert len(world.launcher.spawned) == 2 and lease_c.info.pid == world.launcher.spawned[1]


# --- keep_alive --------------------------------------------------------------------------------------------------


def _watch(world: World, key: str, last: Entry | None, at: float) -> tuple[bool, Entry | None]:
    world.clock.now = at
    return watchdog.step(world.reg, key, last, at)


def test_keep_alive_expiry_stops_the_idle_server(world: World) -> None:
    a, b = world.client(), world.client()
    t0 = world.clock.now
    lease = a.acquire(world.spec(), keep_alive=10)
    key, last = world.launcher.watchdogs[0]
    assert key == lease.info.key
    lease.release()
    done, last = _watch(world, key, last, t0 + 9.9)
    assert not done and world.procs.stopped == []
    done, last = _watch(world, key, last, t0 + 10)
    assert done and world.procs.stopped == [lease.info.pid] and world.reg.read() == {}
    # The next client gets a new server.
    again = b.acquire(world.spec(), keep_alive=10)
    assert len(world.launcher.spawned) == 2 and again.info.pid == world.launcher.spawned[1]


def test_a_late_lease_before_keep_alive_runs_out_keeps_the_server(world: World) -> None:
    a, b = world.client(), world.client()
    t0 = world.clock.now
    lease_a = a.acquire(world.spec(), keep_alive=10)
    key, last = world.launcher.watchdogs[0]
    lease_a.release()
    done, last = _watch(world, key, last, t0 + 9)
    assert not done
    lease_b = b.acquire(world.spec(), keep_alive=10)  # late, but in time
    assert lease_b.info.pid == lease_a.info.pid and len(world.launcher.spawned) == 1
    done, last = _watch(world, key, last, t0 + 30)
    assert not done and world.procs.stopped == [] and world.entry(lease_b).idle_since is None
    world.clock.now = t0 + 30
    lease_b.release()
    done, last = _watch(world, key, last, t0 + 39.9)
    assert not done and world.procs.stopped == []
    done, last = _watch(world, key, last, t0 + 40)
    assert done and world.procs.stopped == [lease_a.info.pid] and world.reg.read() == {}


def test_the_watchdog_prunes_a_killed_clients_lease_and_then_stops_the_server(world: World) -> None:
    a = world.client()
    t0 = world.clock.now
    lease = a.acquire(world.spec(), keep_alive=5)
    key, last = world.launcher.watchdogs[0]
    world.procs.die(int(client_pid(a)))  # kill -9 of the client: its lease stays in the registry
    done, last = _watch(world, key, last, t0 + 1)
    assert not done and world.entry(lease).leases == {} and world.entry(lease).idle_since == t0 + 1
    done, last = _watch(world, key, last, t0 + 6)
    assert done and world.procs.stopped == [lease.info.pid]


class _Killed(BaseException):
    """Ends a thread that stood for a killed client."""


def test_a_client_killed_while_its_shared_server_loads_leaves_it_to_the_watchdog(world: World) -> None:
    """kill -9 of the client that is starting a shared server, before /health says 200: the watchdog already runs
    (it is spawned at registration, not once the server is healthy), prunes the dead lease and stops the server."""
    a = world.client()
    loading, forever = threading.Event(), threading.Event()

    def killed_here() -> None:  # the client's code does not go on: its thread blocks until the test ends
        loading.set()
        forever.wait()
        raise _Killed  # ends the thread (its manager holds locks that the session's teardown takes)

    def run() -> None:
        with contextlib.suppress(_Killed):
            a.acquire(world.spec(), keep_alive=0)

    world.health.while_loading.append(killed_here)
    t0 = world.clock.now
    client = threading.Thread(target=run, daemon=True)
    client.start()
    try:
        assert loading.wait(10)
        world.procs.die(int(client_pid(a)))
        (key, last), = world.launcher.watchdogs
        (server_pid,) = world.launcher.spawned
        done, last = _watch(world, key, last, t0 + 1)
        assert done and world.procs.stopped == [server_pid] and world.reg.read() == {}
    finally:
        forever.set()
        client.join(10)


def test_keep_alive_zero_stops_at_the_last_release_and_negative_never(world: World) -> None:
    a = world.client()
    lease = a.acquire(world.spec(), keep_alive=0)
    lease.release()
    assert world.procs.stopped == [lease.info.pid]
    forever = a.acquire(world.spec("qwen"), keep_alive=-1)
    forever.release()
    key = forever.info.key
    assert not _watch(world, key, world.entry(forever), world.clock.now + 10**9)[0]
    assert world.procs.alive(forever.info.pid) and key in world.reg.read()


# --- stale entries -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reused_by", [["vim", "notes.txt"], None])
def test_a_stale_entry_whose_pid_was_reused_is_dropped_and_the_process_left_alone(
        world: World, reused_by: list[str] | None) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())
    pid = lease_a.info.pid
    key, last = world.launcher.watchdogs[0]
    if reused_by is None:  # the same start time (as far as we can tell), but another program's command line
        world.procs.table[pid].cmdline = ["vim"]
    else:
        world.procs.reuse(pid, reused_by)
    lease_b = b.acquire(world.spec())

    assert len(world.launcher.spawned) == 2 and lease_b.info.pid == world.launcher.spawned[1] != pid
    assert world.procs.alive(pid) and world.procs.stopped == []
    assert list(world.reg.read()) == [lease_b.info.key] and world.entry(lease_b).pid == lease_b.info.pid
    # Nothing else that stops servers touches it either.
    world.reg.sweep(now=world.clock.now + 10**6)
    assert watchdog.step(world.reg, key, last, world.clock.now + 10**6) == (True, last)
    world.reg.stop_entry(last)  # as `gguf-provider stop` does with a stale entry
    assert world.procs.alive(pid) and pid not in world.procs.stopped


def test_the_first_acquire_sweeps_entries_of_dead_servers(world: World) -> None:
    a = world.client()
    lease = a.acquire(world.spec("qwen"))
    world.procs.die(lease.info.pid)
    b = world.client()
    b.acquire(world.spec("smollm2"))
    assert lease.info.key not in world.reg.read() and world.procs.stopped == []


# --- the registry file -------------------------------------------------------------------------------------------


def test_a_truncated_registry_file_is_set_aside_and_the_manager_starts_afresh(world: World) -> None:
    a = world.client()
    a.acquire(world.spec())
    path = world.reg.path()
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    assert world.reg.read() == {}
    assert len(list(path.parent.glob("servers.corrupt-*"))) == 1, "the garbage is kept aside"
    lease = world.client().acquire(world.spec())
    assert len(world.launcher.spawned) == 2 and list(world.reg.read()) == [lease.info.key]


@pytest.mark.parametrize("content", ["", "[]", "null", '{"k": 3}', '{"k": {"pid": "x"}}'])
def test_a_registry_file_that_is_not_a_map_of_entries_reads_as_empty(world: World, content: str) -> None:
    world.reg.home.mkdir(parents=True, exist_ok=True)
    world.reg.path().write_text(content)
    assert world.reg.read() == {}


def _rewrite(world: World, edit: Callable[[dict[str, Any]], None]) -> None:
    raw = json.loads(world.reg.path().read_text())
    for value in raw.values():
        edit(value)
    world.reg.path().write_text(json.dumps(raw))


def test_an_entry_from_the_untyped_version_is_read_and_shared(world: World) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())

    def as_version_1(e: dict[str, Any]) -> None:
        for name in ("schema_version", "family", "charge", "rss", "rpc_servers", "started_at", "last_used"):
            e.pop(name)
        _as_wall_clock(e)

    _rewrite(world, as_version_1)
    entry = world.entry(lease_a)
    assert entry.schema_version == registry.SCHEMA_VERSION and entry.charge == 0 and entry.rpc_servers == ()
    lease_b = b.acquire(world.spec())
    assert lease_b.info.pid == lease_a.info.pid and len(world.launcher.spawned) == 1
    saved = json.loads(world.reg.path().read_text())[lease_a.info.key]
    assert saved["schema_version"] == registry.SCHEMA_VERSION and set(saved["leases"]) == {
        client_pid(a), client_pid(b)}


def _as_wall_clock(e: dict[str, Any]) -> None:
    """Start times as versions before 3 wrote them: psutil's (the boot time of now plus the ticks since boot)."""
    boot = psutil.boot_time() if sys.platform.startswith("linux") else 0.0
    e["create_time"] += boot
    e["leases"] = {pid: t + boot for pid, t in e["leases"].items()}


def test_an_entry_of_version_2_with_the_wall_clocks_start_times_names_the_same_server(world: World) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())

    def as_version_2(e: dict[str, Any]) -> None:
        e["schema_version"] = 2
        _as_wall_clock(e)

    _rewrite(world, as_version_2)
    entry = world.entry(lease_a)
    assert abs(entry.create_time - world.procs.create_time(lease_a.info.pid)) < 1.0  # boot time: whole seconds
    lease_b = b.acquire(world.spec())
    assert lease_b.info.pid == lease_a.info.pid and len(world.launcher.spawned) == 1 and world.procs.stopped == []
    saved = json.loads(world.reg.path().read_text())[lease_a.info.key]
    assert saved["schema_version"] == registry.SCHEMA_VERSION == 3
    assert set(saved["leases"]) == {client_pid(a), client_pid(b)}


def test_an_entry_from_a_newer_version_keeps_its_fields(world: World) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())

    def as_version_99(e: dict[str, Any]) -> None:
        e["schema_version"] = 99
        e["devices"] = [{"name": "CUDA0", "layers": 30}]

    _rewrite(world, as_version_99)
    lease_b = b.acquire(world.spec())
    assert lease_b.info.pid == lease_a.info.pid
    saved = json.loads(world.reg.path().read_text())[lease_a.info.key]
    assert saved["schema_version"] == 99 and saved["devices"] == [{"name": "CUDA0", "layers": 30}]
    assert set(saved["leases"]) == {client_pid(a), client_pid(b)}


@pytest.mark.parametrize("garble", [
    {"pid": "5001"}, {"create_time": None}, {"alias": ""}, {"socket": None, "url": None},
])
def test_an_entry_that_cannot_prove_its_server_is_dropped_and_the_server_left_alone(
        world: World, garble: dict[str, Any]) -> None:
    a, b = world.client(), world.client()
    lease_a = a.acquire(world.spec())
    _rewrite(world, lambda e: e.update(garble))
    assert world.reg.read() == {}
    lease_b = b.acquire(world.spec())  # starts its own: the old server is not provably ours any more
    assert len(world.launcher.spawned) == 2 and world.procs.alive(lease_a.info.pid) and world.procs.stopped == []
    assert list(world.reg.read()) == [lease_b.info.key]


def test_wrong_typed_optional_fields_fall_back_to_their_defaults(world: World) -> None:
    a = world.client()
    lease = a.acquire(world.spec())
    _rewrite(world, lambda e: e.update(n_ctx="big", leases=[1, 2], keep_alive=True, rpc_servers="x", charge=None))
    entry = world.entry(lease)
    assert (entry.n_ctx, entry.leases, entry.keep_alive, entry.rpc_servers, entry.charge) == (
        0, {}, registry.DEFAULT_KEEP_ALIVE, (), 0)


def test_an_entry_survives_a_round_trip() -> None:
    e = Entry(pid=1, create_time=2.5, alias="gguf-provider-x", model="/m.gguf", socket="/s.sock", log="/l",
              n_ctx=4096, leases={"7": 3.0}, idle_since=None, rpc_servers=("h:1",), charge=9, family="f")
    assert Entry.from_json(json.loads(json.dumps(e.to_json()))) == e
    assert e.to_json()["schema_version"] == registry.SCHEMA_VERSION


# --- the process-wide default -----------------------------------------------------------------------------------------


def test_get_manager_is_one_instance_with_the_real_collaborators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mgr, "_manager", None)
    m = mgr.get_manager()
    assert mgr.get_manager() is m
    assert isinstance(m._launcher, mgr.ProcessLauncher) and isinstance(m._health, mgr.HTTPHealth)
    assert isinstance(m._clock, mgr.SystemClock) and isinstance(m._budget, mgr.MemoryBudget)
    assert isinstance(m._installer, mgr.BinaryInstaller) and m._registry is registry.default()
    assert isinstance(m._registry.processes, registry.OSProcesses)


# --- one process, several models at once; cancelled loads ------------------------------------------------------------


def _in_thread(call: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_two_models_load_at_once_in_one_process(world: World) -> None:
    """While one model's server loads (its health wait), another model of the same process starts and is served:
    the manager's lock covers one server key, not the process."""
    a = world.client()
    leases: dict[str, mgr.Lease] = {}

    def qwen_starts_meanwhile() -> None:
        t = _in_thread(lambda: leases.setdefault("qwen", a.acquire(world.spec("qwen"), keep_alive=0)))
        t.join(10)
        assert not t.is_alive(), "the second model waited for the first one's load"

    world.health.while_loading.append(qwen_starts_meanwhile)
    leases["smollm2"] = a.acquire(world.spec("smollm2"), keep_alive=0)
    assert len(world.launcher.spawned) == 2
    assert leases["qwen"].info.pid != leases["smollm2"].info.pid
    for lease in leases.values():
        lease.release()
    assert world.reg.read() == {}


def test_a_release_never_waits_for_another_models_load(world: World) -> None:
    a = world.client()
    held = a.acquire(world.spec("qwen"), keep_alive=0)

    def release_meanwhile() -> None:
        t = _in_thread(held.release)
        t.join(10)
        assert not t.is_alive(), "the release waited for another model's load"
        assert held.info.key not in world.reg.read() and world.procs.stopped == [held.info.pid]

    world.health.while_loading.append(release_meanwhile)
    a.acquire(world.spec("smollm2"), keep_alive=0).release()


def test_a_cancelled_load_stops_and_unregisters_the_server_it_was_starting(world: World) -> None:
    a, cancel = world.client(), Cancel()
    world.health.while_loading.append(cancel.set)
    with pytest.raises(LoadCancelled):
        a.acquire(world.spec(), keep_alive=300, cancel=cancel)
    assert world.reg.read() == {}
    assert len(world.launcher.spawned) == 1 and world.procs.stopped == world.launcher.spawned
    assert a._refs == {}


def test_a_load_cancelled_before_it_began_spawns_nothing(world: World) -> None:
    cancel = Cancel()
    cancel.set()
    with pytest.raises(LoadCancelled):
        world.client().acquire(world.spec(), cancel=cancel)
    assert world.launcher.spawned == [] and world.reg.read() == {}


def test_an_abandoned_lease_stops_only_a_server_its_acquire_started(world: World) -> None:
    a, b = world.client(), world.client()
    started = a.acquire(world.spec(), keep_alive=300)
    assert started.started
    attached = b.acquire(world.spec(), keep_alive=300)
    assert not attached.started
    started.abandon()  # b still holds it: it runs on
    assert world.procs.stopped == [] and set(world.entry(attached).leases) == {client_pid(b)}
    attached.abandon()  # not started by this acquire: it lives on for its keep_alive, as after a release
    assert world.procs.stopped == [] and world.entry(attached).leases == {}
    mine = world.client().acquire(world.spec("qwen"), keep_alive=300)
    mine.abandon()  # started, and no one else holds it: stopped now, not after 300 s
    assert world.procs.stopped == [mine.info.pid] and mine.info.key not in world.reg.read()


def test_a_collected_engine_releases_its_lease_off_the_collecting_thread(world: World,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage collection runs in whatever thread allocates (an event loop's): the release it triggers, which may
    stop a server, goes to a thread of its own."""
    import gc

    from gguf_provider.engine import Engine, EngineConfig

    monkeypatch.setattr(mgr, "_manager", world.client())
    engine = Engine(EngineConfig(model_path=str(world.models["smollm2"]), keep_alive=0, speculative=False))
    key = engine.load().key
    assert key in world.reg.read()
    released_in: list[str] = []
    release = mgr.ServerManager._release

    def spy(self: mgr.ServerManager, key: str, **kwargs: Any) -> None:
        released_in.append(threading.current_thread().name)
        release(self, key, **kwargs)

    monkeypatch.setattr(mgr.ServerManager, "_release", spy)
    del engine
    gc.collect()
    for thread in threading.enumerate():
        if thread.name == "gguf-provider-release":
            thread.join(10)
    assert released_in == ["gguf-provider-release"]
    assert world.reg.read() == {} and world.procs.stopped == world.launcher.spawned


def test_a_start_takes_its_port_and_runtime_dir_from_the_injected_collaborators(world: World, tmp_path: Path) -> None:
    """_spawn reaches the machine only through the manager's collaborators: a taken ``port=`` gets another port
    from ``ports``, and the socket, key file and log go to ``runtime_dir``."""
    from dataclasses import replace

    class Ports:
        asked: list[int] = []

        def is_free(self, port: int) -> bool:
            self.asked.append(port)
            return False

        def free(self) -> int:
            return 40123

    run = tmp_path / "elsewhere"
    run.mkdir(mode=0o700)
    ports = Ports()
    m = mgr.ServerManager(registry=world.reg, launcher=world.launcher, health=world.health, clock=world.clock,
                          budget=world.budget, installer=world.installer, pid=world.procs.start(["python"]),
                          ports=ports, runtime_dir=lambda: run)
    lease = m.acquire(replace(world.spec(), port=8080), keep_alive=0)
    assert ports.asked == [8080]
    assert lease.info.address.url == "http://127.0.0.1:40123"
    assert lease.info.log_path.parent == run and len(list(run.glob("*.key"))) == 1
    lease.release()
    assert world.reg.read() == {}
