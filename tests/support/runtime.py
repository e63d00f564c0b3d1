"""Helpers of the runtime integration tests: an isolated gguf-provider home per test, client child processes,
process scans, and a safety net that stops whatever a failed test left running.

A pytest plugin (tests/conftest.py's ``pytest_plugins``): tests ask for the ``rt`` fixture by name, without importing
it; the helpers (``pid_alive``, ``wait_until``, ``RuntimeEnv``) are imported as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("runtime_child.py")


class Child:
    """A client process running tests/support/runtime_child.py."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read_json(self, timeout: float = 60.0) -> dict[str, Any]:
        """The next JSON line the child prints; fails the test on EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"child {self.proc.pid} printed nothing within {timeout} s")
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                pytest.fail(f"child {self.proc.pid} exited (rc {self.proc.poll()}) without output: {err[-2000:]}")
            line = line.strip()
            if line.startswith("{"):
                data: dict[str, Any] = json.loads(line)
                return data

    def send(self, line: str = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 20.0) -> int:
        """Let the child exit normally (it releases its lease) and reap it."""
        if self.proc.poll() is None:
            try:
                self.send("exit")
            except (BrokenPipeError, OSError):
                pass
        return self.proc.wait(timeout)

    def wait(self, timeout: float) -> int:
        """Reap the child within ``timeout`` s; fails the test otherwise, with the stacks of all its threads
        (faulthandler, registered on SIGUSR1 by runtime_child.py) and its stderr."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)  # faulthandler writes at once; the read below ends at the kill
        self.proc.kill()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        pytest.fail(f"child {self.proc.pid} did not exit within {timeout} s; its stacks and stderr:\n{err[-8000:]}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)  # reaped: the pid is gone, as after a real crash of an unrelated process

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


@dataclass
class RuntimeEnv:
    """One test's private gguf-provider home, runtime dir and the binary/model it uses."""

    home: Path
    run_dir: Path
    binary: Path
    model: Path
    children: list[Child] = field(default_factory=list)

    def child(self, **config: Any) -> Child:
        config.setdefault("model", str(self.model))
        c = Child(config)
        self.children.append(c)
        return c

    def registry(self) -> dict[str, Any]:
        """The registry's entries as its file stores them (JSON)."""
        from gguf_provider.runtime._serve import registry

        return {key: entry.to_json() for key, entry in registry.read().items()}

    def servers(self, alias: str | None = None) -> list[psutil.Process]:
        """Live llama-server processes of this test (socket or key file in our runtime dir), optionally only those
        with ``--alias alias`` (other tests may run the same model with the same alias meanwhile)."""
        return [p for p in _servers() if str(self.run_dir) in " ".join(_cmdline(p))
                and (alias is None or alias in _cmdline(p))]

    def watchdogs(self) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            cmd = _cmdline(p)
            if "gguf_provider.runtime._serve.watchdog" in cmd and _environ(p).get("GGUF_PROVIDER_HOME") == str(self.home):
                if pid_alive(p.pid):
                    found.append(p)
        return found

    def gguf_cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gguf_provider.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return p.environ()
    except psutil.Error:
        return {}


def _servers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.name().startswith("llama-server") and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def serving_line(stdout: Any) -> str:
    """The first line `gguf-provider serve` prints ("serving ..."), read from its merged stdout and stderr: past the
    one line that says which backend runs (stderr, at a process's first model start)."""
    line: str = stdout.readline()
    if line.startswith("gguf-provider: llama-server:"):
        line = stdout.readline()
    return line


def reap(proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """A child a test started, ended: killed if it still runs, waited for, its pipes closed."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> float:
    """Seconds until ``cond()`` held; fails the test after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - t0


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm2_path: Path) -> Iterator[RuntimeEnv]:
    """A private home, registry and runtime dir; the installed llama-server; a fresh process-wide manager."""
    from gguf_provider.runtime._install import discovery
    from gguf_provider.runtime._serve import manager as mgr

    binary = discovery.find_llama_server()  # evaluated before the home moves
    run_dir = Path(tempfile.mkdtemp(prefix="gpt-", dir="/tmp"))  # short: Unix socket paths are limited
    home = tmp_path / "home"
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(home))
    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(run_dir))
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_SERVER", str(binary))
    monkeypatch.setenv("GGUF_PROVIDER_KEEP_ALIVE", "0")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setattr(mgr, "_manager", None)
    env = RuntimeEnv(home=home, run_dir=run_dir, binary=binary, model=smollm2_path)
    try:
        yield env
    finally:
        if mgr._manager is not None:
            mgr._manager.release_all()
        for c in env.children:
            c.cleanup()
        # Safety net: whatever this test's failure left running.
        for p in env.servers() + env.watchdogs():
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(5)
            except psutil.Error:
                pass
        shutil.rmtree(run_dir, ignore_errors=True)


def socket_dir_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
