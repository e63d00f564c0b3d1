"""A server held still mid-reply: what a slow or overloaded machine looks like to a client, on any machine."""

from __future__ import annotations

import os
import signal
import threading
import time

from gguf_provider.engine import Engine

# What a max_time cut may take past its bound: a timer thread's (or the event loop's) wake-up and a socket's
# shutdown, a few ms idle; 5 s is far above that on a loaded machine and far below the minutes (or the hang, for a
# paused server) that counting tokens between readings of the clock took.
CUT_SLACK = 5.0


class Pauser(threading.Thread):
    """Holds the server still (SIGSTOP) once its slot has decoded a token: for good (``period=None``), or for
    ``period`` seconds at a time with short runs between (tokens then come seconds apart). Resumes it when
    stopped. ``paused_at``: when it first held it."""

    def __init__(self, engine: Engine, period: float | None) -> None:
        super().__init__(daemon=True, name="pauser")
        self.client, self.pid, self.period = engine.client, engine.info.pid, period
        self.done = threading.Event()
        self.paused_at: float | None = None

    def run(self) -> None:
        while not self.done.is_set() and not self._decoding():
            time.sleep(0.01)
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.paused_at = self.paused_at or time.monotonic()
            if self.period is None or self.done.wait(self.period):
                break
            os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.03)  # a token or two
        os.kill(self.pid, signal.SIGCONT)

    def _decoding(self) -> bool:
        for slot in self.client.get_json("/slots"):
            token = slot.get("next_token")
            token = token[0] if isinstance(token, list) and token else token  # a list in newer builds
            if slot.get("is_processing") and isinstance(token, dict) and token.get("n_decoded", 0) > 0:
                return True
        return False

    def stop(self) -> None:
        self.done.set()
        self.join()
