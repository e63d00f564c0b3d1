"""A reply's wall-clock bound, kept by a timer rather than by counting tokens.

:class:`Deadline` is armed when a reply's first token arrives (``chat.py``); when it fires it shuts down the
socket of the response it watches (:meth:`Deadline.watch`, called by the client), so a read that waits for the
next token returns at once however slow the server is, or if it is paused. The client then ends the stream
quietly and the caller reports a reply cut by ``max_time``. Sync streams use a timer thread, async ones the
event loop's ``call_later``; closing the socket makes llama-server cancel the generation, as a ``break`` does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

log = logging.getLogger(__name__)


class Deadline:
    """Fires ``seconds`` after :meth:`arm`; once fired, :attr:`fired` is true and the watched socket is shut."""

    __slots__ = ("seconds", "loop", "fired", "_lock", "_sock", "_handle")

    def __init__(self, seconds: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.seconds = seconds
        self.loop = loop  # None: a sync stream (a timer thread); else the loop the async stream runs on
        self.fired = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._handle: threading.Timer | asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    @property
    def watching(self) -> bool:
        """Whether a socket is watched: firing then ends a read that waits, with no check per event."""
        return self._sock is not None

    def arm(self) -> None:
        """Start the clock (once)."""
        if self._handle is not None:
            return
        if self.loop is not None:
            self._handle = self.loop.call_later(self.seconds, self.fire)
        else:
            timer = threading.Timer(self.seconds, self.fire)
            timer.daemon = True
            timer.name = "gguf-provider-max-time"
            self._handle = timer
            timer.start()

    def watch(self, response: Any) -> None:
        """The httpx response whose socket :meth:`fire` shuts (none found: the bound is checked at each event)."""
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with self._lock:
            self._sock = sock if isinstance(sock, socket.socket) else None
            if self.fired:
                self._shut()

    def unwatch(self) -> None:
        """Before the response goes back to the connection pool: the socket is no longer ours to shut."""
        with self._lock:
            self._sock = None

    def cancel(self) -> None:
        """The reply ended: the timer will not fire."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        self.unwatch()

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is None:
            return
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already closed: the stream is over anyway
            log.debug("max_time: shutting the stream's socket: %s", exc)
        self._sock = None
