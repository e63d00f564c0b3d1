"""runtime/_common/process.py's shared helpers: the health wait both server starts and the install's smoke run use,
free ports, and stopping a child."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from gguf_provider.errors import ServerStartError
from gguf_provider.runtime._common import process
from tests.support.timing import REACT


def _answers(*codes: int) -> tuple[process.Address, list[int]]:
    """An address whose /health answers ``codes`` in turn (a refused connection for 0), then 200."""
    asked: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        code = codes[len(asked)] if len(asked) < len(codes) else 200
        asked.append(code)
        if code == 0:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(code)

    return process.Address(url="http://127.0.0.1:1", injected=httpx.MockTransport(handler)), asked


def test_poll_health_waits_through_refusals_and_503s() -> None:
    address, asked = _answers(0, 503, 0)
    waited: list[float] = []
    assert process.poll_health(address, timeout=30, exited=lambda: False, waiting=waited.append) == "healthy"
    assert asked == [0, 503, 0, 200] and len(waited) == 3


def test_poll_health_says_when_the_server_is_gone_or_late() -> None:
    address, asked = _answers(503)
    assert process.poll_health(address, timeout=30, exited=lambda: True) == "exited" and asked == []
    address, _ = _answers(*[503] * 1000)
    assert process.poll_health(address, timeout=0.05, exited=lambda: False) == "timeout"


def test_poll_health_polls_fast_while_a_small_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 5 ms for the first seconds (a slower poll was cold-start latency, bench P3), then backing off."""
    slept: list[float] = []
    monkeypatch.setattr(process.time, "sleep", slept.append)
    clock = iter(range(0, 10_000))  # one second a call: the fast phase ends after 3
    monkeypatch.setattr(process.time, "monotonic", lambda: float(next(clock)))
    address, _ = _answers(*[503] * 6)
    assert process.poll_health(address, timeout=60, exited=lambda: False) == "healthy"
    assert slept[:3] == [process.FAST_POLL] * 3 and slept[3] == process.FAST_POLL and slept[4] > slept[3]


def test_plain_http_addresses_load_no_ca_bundle() -> None:
    """A Unix socket or an http:// URL carries no TLS: httpx must not load the CA bundle for each client (~25 ms a
    client, several per cold start); an https:// base URL keeps verification."""
    assert not process.Address(socket="/tmp/x.sock").verify
    assert not process.Address(url="http://127.0.0.1:8080").verify
    assert process.Address(url="https://models.example.com").verify


def test_wait_healthy_raises_with_the_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("loading\nerror: out of memory\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    address, _ = _answers(0)
    with pytest.raises(ServerStartError, match="exited with code 3") as err:
        process.wait_healthy(proc, proc.pid, address, log, timeout=30)
    assert "out of memory" in err.value.log_tail


def test_free_port_is_free_until_someone_binds_it() -> None:
    port = process.free_port()
    assert process.port_is_free(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not process.port_is_free(port)


def test_stop_child_kills_what_ignores_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    process.stop_child(proc, grace=0.2)
    assert proc.returncode == -9
    proc.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_forked_with_dies_with_parent_dies_with_it() -> None:
    """A parent forks a sleeper with dies_with_parent() and is SIGKILLed: the kernel kills the sleeper too (what
    keeps `rpc-worker`'s rpc-server and private llama-servers from outliving us)."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from gguf_provider.runtime._common.process import dies_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], preexec_fn=dies_with_parent())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, start_new_session=True)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait(REACT)
    parent.stdout.close()
    deadline = time.monotonic() + REACT
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its SIGKILLed parent"
        time.sleep(0.05)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil reads the boot time of /proc/stat on Linux")
def test_a_process_is_known_by_its_start_when_the_wall_clock_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's start time is /proc/stat's boot time plus the ticks since boot, and that boot time follows the wall
    clock: a step of it (NTP, a VM resumed) moves every process's start for whoever reads it after. CI met one: the
    test process's leases were then taken for dead by every newer process and servers with keep_alive 0 were
    stopped as they started. Ours is the ticks since boot: after a 10 s step one process is still the same; one
    that started 10 s apart is not."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marker = "import time; time.sleep(60)"  # one word of its command line, as our servers' alias
        start = process.create_time(child.pid)
        p = psutil.Process(child.pid)
        # seen once in a make test run here, not reproduced: what each check saw, for the next time
        assert process.process_matches(child.pid, start, marker), (start, p.create_time(), p.status(), p.cmdline(),
                                                                  psutil.boot_time())
        real_boot = psutil.boot_time()
        assert abs(p.create_time() - real_boot - start) <= 1.0  # psutil's, the boot time's whole second apart
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real_boot + 10.0)  # the clock stepped 10 s
        assert abs(psutil.Process(child.pid).create_time() - real_boot - start - 10.0) <= 1.0  # psutil's moved
        assert process.create_time(child.pid) == start
        assert process.process_matches(child.pid, start, marker)
        assert not process.process_matches(child.pid, start - 10.0, marker)
        assert not process.process_matches(child.pid, start, "another marker")
    finally:
        child.kill()
        child.wait()


def test_a_command_line_read_mid_exec_is_read_again() -> None:
    """/proc/PID/cmdline reads empty while a just-spawned child execs (seen in make test here: the boot-time test's
    child taken for another process); the read is tried again for EXEC_SETTLE, and a line that stays empty is
    given up after it."""

    class Execing:
        def __init__(self, empty_reads: int) -> None:
            self.left = empty_reads

        def cmdline(self) -> list[str]:
            self.left -= 1
            return [] if self.left >= 0 else ["llama-server", "--alias", "m"]

    assert process._cmdline(Execing(3)) == ["llama-server", "--alias", "m"]  # type: ignore[arg-type]
    t0 = time.monotonic()
    assert process._cmdline(Execing(10**6)) == []  # type: ignore[arg-type]
    assert process.EXEC_SETTLE <= time.monotonic() - t0 < process.EXEC_SETTLE + 1.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil reads the boot time of /proc/stat on Linux")
def test_a_live_clients_lease_outlives_a_step_of_the_wall_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What CI met: a lease this process took, read by a process started after the clock stepped 10 s (a watchdog's
    first look at a server starting with keep_alive 0), is still this live process's."""
    from gguf_provider.runtime._serve import registry

    me = os.getpid()
    lease = {str(me): process.create_time(me)}
    entry = registry.Entry(pid=me, create_time=lease[str(me)], alias="x", socket="/s", leases=lease, keep_alive=0)
    real_boot = psutil.boot_time()
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real_boot + 10.0)
    reg = registry.Registry(home=tmp_path)
    assert reg.live_leases(entry) == lease
    # and its server (here this process, known by a word of its command line) is still alive for it
    _, remove = reg.sweep_entry(replace(entry, alias=psutil.Process(me).cmdline()[0]), time.time())
    assert not remove
