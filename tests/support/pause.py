"""A server held still mid-reply: what a slow or overloaded machine looks like to a client, on any machine."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gguf_provider.deadline import Deadline
from gguf_provider.engine import Engine

# What a max_time cut may take past its bound: a timer thread's (or the event loop's) wake-up and a socket's
# shutdown, a few ms idle; 5 s is far above that on a loaded machine and far below the minutes (or the hang, for a
# paused server) that counting tokens between readings of the clock took.
CUT_SLACK = 5.0


class Armed:
    """When the client's max_time timer was armed: its first token arrived (``Deadline.arm``, wrapped by
    :func:`watch_arming`). The bound runs from here, so a pause starts only after it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.at: float | None = None


def watch_arming(monkeypatch: pytest.MonkeyPatch) -> Armed:
    armed = Armed()
    real = Deadline.arm

    def arm(self: Deadline) -> None:
        real(self)
        if armed.at is None:
            armed.at = time.monotonic()
        armed.event.set()

    monkeypatch.setattr(Deadline, "arm", arm)
    return armed


class Pauser(threading.Thread):
    """Holds the server still (SIGSTOP) once the client got its first token (``armed``): for good (``period=None``), or for
    ``period`` seconds at a time with short runs between (tokens then come seconds apart). Resumes it when
    stopped. ``paused_at``: when it first held it."""

    def __init__(self, engine: Engine, period: float | None, armed: Armed) -> None:
        super().__init__(daemon=True, name="pauser")
        self.client, self.pid, self.period, self.armed = engine.client, engine.info.pid, period, armed
        self.done = threading.Event()
        self.paused_at: float | None = None

    def run(self) -> None:
        while not self.done.is_set() and not self.armed.event.wait(0.01):
            pass
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.paused_at = self.paused_at or time.monotonic()
            if self.period is None or self.done.wait(self.period):
                break
            os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.03)  # a token or two
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.done.set()
        self.join()
