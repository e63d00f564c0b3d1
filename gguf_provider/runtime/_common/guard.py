"""Run a command as a process group that ends with whoever started it: ``python -m gguf_provider.runtime._common.guard CMD``.

A source build is cmake, then ninja, then a compiler per file: a tree of processes. Killing the installer (SIGTERM,
SIGINT, SIGHUP, or SIGKILL, which no handler sees) would leave that tree compiling on into the build dir. The
installer runs the build through this guard, started with PR_SET_PDEATHSIG = SIGTERM (Linux): the guard puts the
command in a process group of its own and, when it is told to stop or its parent dies, stops the whole group
(SIGTERM, which ninja passes on to the compilers it runs in groups of their own; then SIGKILL) before it exits. Elsewhere the installer's own handling (it terminates the guard on an exception) is what stops it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE = 3.0  # seconds the group has to stop on SIGTERM before it is SIGKILLed


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left, reaping our child (the group's leader) once it has exited."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m gguf_provider.runtime._common.guard COMMAND [ARG...]", file=sys.stderr)
        return 2
    child: subprocess.Popen[bytes] | None = None
    early: list[int] = []  # a stop signal that came while the command was being started

    def stop(signum: int, frame: FrameType | None) -> None:
        if child is None:
            early.append(signum)
            return
        # SIGTERM first: ninja runs each compiler in a process group of its own and stops them all when it is told
        # to stop (a SIGKILL would orphan them to finish their files); then SIGKILL for whatever is left. No
        # child.wait() here: the main code is inside it, holding the lock it takes.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and _group_alive(child.pid):
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        os._exit(128 + signum)

    # The handlers come first: a signal sent once the command's children exist (as soon as it started them) must
    # find them installed, however late this process is scheduled after the fork.
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    try:
        child = subprocess.Popen(argv, start_new_session=True)  # its own group: cmake, ninja and every compiler
    except OSError as exc:
        print(f"guard: could not run {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    if early:
        stop(early[0], None)
    return child.wait()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
