"""Low-level llama-server process control: environment, ports, spawn, health wait, identity, stop."""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import psutil

from ...errors import ServerStartError
from ...lazy import LazyModule
from . import threads
from .progress import Progress

if TYPE_CHECKING:
    import httpx
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

LOG_TAIL_LINES = 50


@dataclass(frozen=True)
class Address:
    """Where a server listens: a Unix socket path or a loopback http URL, with an optional API key."""

    socket: str | None = None
    url: str | None = None
    api_key: str | None = None
    # Carries the requests instead of the network (replayed streams in unit tests); not part of the identity.
    injected: httpx.BaseTransport | httpx.AsyncBaseTransport | None = field(default=None, compare=False, repr=False)

    @property
    def base_url(self) -> str:
        return self.url if self.url else "http://llama-server"

    def describe(self) -> str:
        return f"unix:{self.socket}" if self.socket else str(self.url)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def verify(self) -> bool:
        """Whether a client needs the CA bundle: not for a Unix socket or an http:// URL, which carry no TLS. httpx
        loads the bundle for every transport it makes, verified or not used (~25 ms each, several per cold start:
        bench P3), unless told there is nothing to verify."""
        return not (self.socket or (self.url or "").startswith("http://"))

    def transport(self) -> httpx.BaseTransport | None:
        if isinstance(self.injected, httpx.BaseTransport):
            return self.injected
        return httpx.HTTPTransport(uds=self.socket, verify=False) if self.socket else None

    def async_transport(self) -> httpx.AsyncBaseTransport | None:
        if isinstance(self.injected, httpx.AsyncBaseTransport):
            return self.injected
        return httpx.AsyncHTTPTransport(uds=self.socket, verify=False) if self.socket else None

    def client(self, timeout: float = 5.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, transport=self.transport(), headers=self.headers(),
                            timeout=timeout, verify=self.verify)


def clean_env() -> dict[str, str]:
    """Our environment minus every ``LLAMA_ARG_*`` twin of a flag (and LLAMA_API_KEY): they change a server silently.
    ``GGML_NO_BACKTRACE`` is set: an aborting server (e.g. an RPC worker went away) would otherwise attach gdb, when
    installed, for seconds before it exits, and the client's typed error would wait for it. ``GOMP_SPINCOUNT``:
    llama.cpp's threads spin only briefly at their barrier (runtime/_common/threads.py), unless the user chose a spin or
    a wait policy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_") and k != "LLAMA_API_KEY"}
    env.setdefault("GGML_NO_BACKTRACE", "1")
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", str(threads.GOMP_SPINCOUNT))
    return env


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when ``port`` on loopback can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --- spawning --------------------------------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1


def _pdeathsig(parent: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect: nobody would signal us
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def dies_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send ``sig`` (SIGKILL) to the child when the thread that forks it exits,
    however that happens (kill -9, a crash): Linux's PR_SET_PDEATHSIG. Fork from a thread that lives as long as the
    process (the main thread, or :class:`_Spawner`). None elsewhere: no other platform offers it, so there the
    caller's signal handlers are all that stop the child."""
    return _pdeathsig(os.getpid(), sig) if sys.platform.startswith("linux") else None


class Outliving(subprocess.Popen):  # type: ignore[type-arg]
    """A child meant to outlive this object: a shared server and the watchdog outlive their client process, a
    private server is stopped by its owner or dies with it. Collected while the child runs, it is left to be reaped
    as ``Popen.__del__`` leaves it, without that method's ResourceWarning ("subprocess N is still running")."""

    def __del__(self) -> None:
        active = getattr(subprocess, "_active", None)  # Popen's own list of children to reap (None on Windows)
        if self.returncode is None and active is not None and self.poll() is None:
            active.append(self)
            return
        if self.returncode is None and active is None:
            return
        super().__del__()


class _Spawner:
    """Spawns private servers from one long-lived thread.

    Linux's PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so private servers are forked
    from a thread that lives as long as the process: the server then dies with its owner, even on ``kill -9``.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], queue.Queue[object]]]
        self._requests = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="gguf-provider-spawner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, reply = self._requests.get()
            try:
                reply.put(fn())
            except BaseException as exc:  # handed back to the caller
                reply.put(exc)

    def call(self, fn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        reply: queue.Queue[object] = queue.Queue()
        self._requests.put((fn, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        assert isinstance(result, subprocess.Popen)
        return result


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(argv: list[str], log_path: Path, *, private: bool) -> subprocess.Popen[bytes]:
    """Start llama-server with a scrubbed environment, output to ``log_path``.

    Shared servers get their own session (a Ctrl-C in one client's terminal must not kill everyone's server);
    private ones are tied to our lifetime (see :class:`_Spawner`).
    """
    global _spawner
    log = open(log_path, "ab")

    def start() -> subprocess.Popen[bytes]:
        return Outliving(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
            start_new_session=True, preexec_fn=dies_with_parent() if private else None, close_fds=True,
        )

    try:
        if private and sys.platform.startswith("linux"):
            with _spawner_lock:
                if _spawner is None:
                    _spawner = _Spawner()
            return _spawner.call(start)
        return start()
    finally:
        log.close()


HealthOutcome = Literal["healthy", "exited", "timeout"]
# /health every 5 ms for the first seconds (a small model is ready in under one: a slower poll was cold-start
# latency, bench P3), then backing off to 50 ms for the long loads of big models.
FAST_POLL, FAST_POLL_FOR = 0.005, 3.0


def _accepts(address: Address) -> bool:
    """Whether the server's Unix socket takes a connection (always True for TCP: httpcore closes those itself)."""
    if not address.socket:
        return True
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(address.socket)
        except OSError:
            return False
    return True


def poll_health(address: Address, *, timeout: float, exited: Callable[[], bool],
                waiting: Callable[[float], None] | None = None) -> HealthOutcome:
    """Poll ``/health`` until it answers 200, ``exited()`` says the server is gone, or ``timeout`` seconds pass.
    ``waiting`` gets the seconds waited so far after each try. The caller turns the outcome into its own error."""
    start = time.monotonic()
    delay = FAST_POLL
    with address.client(timeout=2.0) as client:
        while True:
            if exited():
                return "exited"
            try:
                # httpcore leaves the socket of a refused Unix connect to the garbage collector (a ResourceWarning):
                # ask only once the server accepts
                if _accepts(address) and client.get("/health").status_code == 200:
                    return "healthy"
            except httpx.TransportError:
                pass
            elapsed = time.monotonic() - start
            if waiting is not None:
                waiting(elapsed)
            if elapsed > timeout:
                return "timeout"
            time.sleep(delay)
            if elapsed > FAST_POLL_FOR:
                delay = min(delay * 1.5, 0.05)


def wait_healthy(proc: subprocess.Popen[bytes] | None, pid: int, address: Address, log_path: Path, *,
                 timeout: float, progress: Progress | None = None) -> None:
    """Poll ``/health`` until 200; raise ServerStartError with the log tail if the process exits or time runs out."""
    if progress is not None:
        progress("loading", 0, 0)

    def exited() -> bool:
        return proc.poll() is not None if proc is not None else not psutil.pid_exists(pid)

    def waiting(elapsed: float) -> None:
        if progress is not None:
            progress("loading", int(elapsed * 1000), 0)

    outcome = poll_health(address, timeout=timeout, exited=exited, waiting=waiting)
    if outcome == "exited" and proc is not None:
        raise ServerStartError(
            f"llama-server exited with code {proc.returncode} while starting. Check the model file and the "
            f"server arguments", log_tail(log_path), log_path)
    if outcome == "exited":
        raise ServerStartError("llama-server exited while starting", log_tail(log_path), log_path)
    if outcome == "timeout":
        raise ServerStartError(
            f"llama-server did not become healthy within {timeout:.0f} s (raise start_timeout for big "
            f"models)", log_tail(log_path), log_path)


# --- identity and stopping ---------------------------------------------------------------------------------------


# How far a process's start time, as two processes read it, may differ: none (the kernel's clock ticks since boot on
# Linux, a start time the kernel keeps elsewhere), plus a tick. A pid reused within this of its predecessor's start
# (and, for a server, with our marker on its command line) is no risk to meet.
CREATE_TIME_SLACK = 0.05

_LINUX = sys.platform.startswith("linux")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if _LINUX else 100


def start_time(pid: int) -> float:
    """When ``pid`` started, as the identity of a process we started (with its pid). On Linux, seconds since boot
    from /proc/PID/stat: psutil's ``create_time`` adds the boot time as the wall clock puts it *now*, so a step of
    the clock (NTP, a VM resumed: CI met one) moved every process's start for whoever read it after, and leases of
    live clients were taken for dead (servers with keep_alive 0 stopped as they started). Elsewhere psutil's, which
    the kernel keeps fixed. Raises psutil.NoSuchProcess when there is no such process."""
    if not _LINUX:
        return float(psutil.Process(pid).create_time())
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    # pid (comm) state ppid ...: starttime is field 22; comm may hold spaces and parentheses, so count from the last ')'
    return int(stat[stat.rindex(b")") + 2:].split()[19]) / _CLOCK_TICKS


create_time = start_time  # the name the registry's entries and leases give it


def from_wall_clock(t: float) -> float:
    """A start time an older version wrote (psutil's, seconds since the epoch) as :func:`start_time` gives it."""
    return t - psutil.boot_time() if _LINUX else t


def process_matches(pid: int, create_time: float, marker: str | None = None) -> bool:
    """True only if ``pid`` is alive, was created at ``create_time`` (within :data:`CREATE_TIME_SLACK`) and (if
    given) has ``marker`` on its cmdline."""
    try:
        p = psutil.Process(pid)
        if abs(start_time(pid) - create_time) > CREATE_TIME_SLACK:
            return False
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if marker is not None and marker not in _cmdline(p):
            return False
        return True
    except (psutil.Error, OSError):
        return False


EXEC_SETTLE = 0.1  # s: how long a command line read as empty is read again (a process in the middle of its exec)


def _cmdline(p: psutil.Process) -> list[str]:
    """``p``'s command line. Read as a process is exec'ing (the moment vfork's parent runs on, as a spawn's caller
    does), /proc/PID/cmdline is empty: seen in make test here (test_process.py), a just-started child taken for
    another process. It is read again for up to :data:`EXEC_SETTLE`."""
    deadline = time.monotonic() + EXEC_SETTLE
    while True:
        cmd = p.cmdline()
        if cmd or time.monotonic() > deadline:
            return list(cmd)
        time.sleep(0.002)


class _Stoppable(Protocol):  # subprocess.Popen and psutil.Process both
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> Any: ...


def _terminate(proc: _Stoppable, expired: type[Exception], grace: float) -> None:
    """SIGTERM, then SIGKILL when it has not exited after ``grace`` s (``expired``: the wait's timeout error)."""
    proc.terminate()
    try:
        proc.wait(grace)
    except expired:
        proc.kill()
        proc.wait(grace)


def stop_child(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """Stop a child this process started and still holds (SIGTERM, then SIGKILL after ``grace`` s), and reap it."""
    if proc.poll() is None:
        _terminate(proc, subprocess.TimeoutExpired, grace)


def stop_process(pid: int, ctime: float, marker: str, *, grace: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds, a process we can prove we started. Returns True if it's gone."""
    if not process_matches(pid, ctime, marker):
        return not psutil.pid_exists(pid) or not process_matches(pid, ctime)
    try:
        _terminate(psutil.Process(pid), psutil.TimeoutExpired, grace)
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return False
    return True
