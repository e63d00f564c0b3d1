"""runtime/_common/guard.py: the command it runs, and everything that command starts, stop with the guard or its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gguf_provider.runtime._common import process
from tests.support.timing import REACT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _tree(tmp_path: Path) -> list[str]:
    """A shell that starts two grandchildren (as ninja starts compilers) and says their pids."""
    pids = tmp_path / "pids"
    return ["sh", "-c", f"sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; wait"]


def _pids(tmp_path: Path) -> list[int]:
    deadline = time.monotonic() + REACT
    while time.monotonic() < deadline:
        text = (tmp_path / "pids").read_text() if (tmp_path / "pids").exists() else ""
        if len(text.split()) == 2:
            return [int(p) for p in text.split()]
        time.sleep(0.05)
    raise AssertionError("the command did not start its children")


def _all_gone(pids: list[int], within: float = REACT) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stopped_guard_takes_the_whole_group_down(tmp_path: Path, sig: signal.Signals) -> None:
    guard = subprocess.Popen([sys.executable, "-m", "gguf_provider.runtime._common.guard", *_tree(tmp_path)])
    try:
        grandchildren = _pids(tmp_path)
        os.kill(guard.pid, sig)
        assert guard.wait(REACT) == 128 + sig
        assert _all_gone(grandchildren)
    finally:
        guard.kill()
        _kill_listed(tmp_path)


def _kill_listed(tmp_path: Path) -> None:
    """A failed test's leftovers, so that nothing outlives it."""
    for pid in (tmp_path / "pids").read_text().split() if (tmp_path / "pids").exists() else ():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_guard_stops_the_group_when_its_parent_is_killed(tmp_path: Path) -> None:
    """The installer SIGKILLed: the kernel tells the guard (PR_SET_PDEATHSIG = SIGTERM), the guard ends the group."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import signal, subprocess, sys, time\n"
        "from gguf_provider.runtime._common import process\n"
        f"subprocess.Popen([sys.executable, '-m', 'gguf_provider.runtime._common.guard', *{_tree(tmp_path)!r}],\n"
        "                 preexec_fn=process.dies_with_parent(signal.SIGTERM))\n"
        "time.sleep(300)\n")], cwd=Path(process.__file__).parents[2])
    try:
        grandchildren = _pids(tmp_path)
        parent.kill()
        parent.wait(REACT)
        assert _all_gone(grandchildren)
    finally:
        parent.kill()
        _kill_listed(tmp_path)


def test_a_command_that_cannot_run_is_exit_status_127(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gguf_provider.runtime._common.guard", str(tmp_path / "no-such-cmake")],
                         capture_output=True, text=True, timeout=REACT)
    assert out.returncode == 127 and "could not run" in out.stderr


def test_the_exit_status_is_the_commands() -> None:
    assert subprocess.run([sys.executable, "-m", "gguf_provider.runtime._common.guard", "sh", "-c", "exit 3"],
                          timeout=REACT).returncode == 3
