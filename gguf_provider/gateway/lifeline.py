"""Each request's life, tied to its client's and to the gateway's: work stops when the client leaves, and ends in
the protocol's shape when the gateway stops.

Starlette notices a client that left only when it next writes, so a request still loading its model, reading its
prompt or computing a whole reply would run on (llama-server reads a long prompt for minutes). :class:`Lifeline`
runs each HTTP request in a task of its own and reads the client's messages itself: on ``http.disconnect`` it
cancels the task, which closes the request's connection to llama-server, and llama-server cancels that task at its
next batch (FIELD-NOTES §14). When the gateway stops (:meth:`Lifeline.stop`), a request that has sent nothing yet
is answered 503 in its protocol's error shape; a stream that has started gets the protocol's error event and ends.
Either way its task is cancelled, so its upstream request is too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
CANCEL_WAIT = 2.0  # seconds a cancelled request's task gets to unwind before it is answered (and left) anyway


class Stopping(Exception):
    """The gateway is stopping: the request was ended (HTTP 503)."""


class Lifeline:
    """The ASGI middleware; ``answer(path)`` gives the protocol's error response (an ASGI app) for the request at
    ``path``, and ``stream_error(scope, exc)`` its in-stream error event for the request of ``scope`` (the scope the
    app was given: a stream may leave there what its error event needs)."""

    def __init__(self, app: ASGIApp, answer: Callable[[str, BaseException], ASGIApp],
                 stream_error: Callable[[Scope, BaseException], bytes]) -> None:
        self.app = app
        self.answer = answer
        self.stream_error = stream_error
        self.stopped = False
        self.running: set[_Request] = set()

    def stop(self) -> None:
        """End every request in flight now, and refuse any that comes after (call it on the event loop)."""
        self.stopped = True
        for request in self.running:
            request.stopping.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.stopped:
            await self.answer(scope["path"], Stopping("the gateway is stopping"))(scope, receive, send)
            return
        await _Request(self, scope, receive, send).run()


class _Request:
    def __init__(self, line: Lifeline, scope: Scope, receive: Receive, send: Send) -> None:
        self.line, self.scope, self._receive, self._send = line, scope, receive, send
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.gone = asyncio.Event()
        self.stopping = asyncio.Event()
        self.started = self.ended = False
        self.tail = b""  # the last bytes of the body sent: an error event must start on a line of its own

    async def receive(self) -> Message:
        return await self.inbox.get()

    async def send(self, message: Message) -> None:
        if self.ended:
            return
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body:
                self.tail = (self.tail + body)[-2:]
            self.ended = not message.get("more_body", False)
        # uvicorn writes a body at once and then may wait for the client to drain it: a cancel lands after a whole
        # write, never inside one, so an error event can follow it
        await self._send(message)

    async def _pump(self) -> None:
        """The client's messages, read as they come: the body for the app, then a disconnect."""
        while True:
            message = await self._receive()
            await self.inbox.put(message)
            if message["type"] == "http.disconnect":
                if not self.ended:  # after the whole reply, a disconnect is only the end of the exchange
                    self.gone.set()
                return

    async def run(self) -> None:
        line = self.line
        work = asyncio.ensure_future(line.app(self.scope, self.receive, self.send))
        line.running.add(self)
        pump = asyncio.ensure_future(self._pump())
        gone = asyncio.ensure_future(self.gone.wait())
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({work, gone, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                work.result()
                return
            if self.gone.is_set():
                log.info("gateway: the client of %s %s left; its work is cancelled", self.scope["method"],
                         self.scope["path"])
                await _cancel(work)
                return
            await _cancel(work)
            await self._end(Stopping("the gateway is stopping: the request was ended; send it again to another "
                                     "gateway or after a restart"))
        finally:
            line.running.discard(self)
            for task in (pump, gone, stopping):
                task.cancel()
            if not work.done():
                work.cancel()

    async def _end(self, exc: Stopping) -> None:
        """The request ended by a stop: a 503 when nothing was sent, else the protocol's error event."""
        if self.ended:
            return
        with contextlib.suppress(OSError, RuntimeError):  # the client may be gone too
            if not self.started:
                await self.line.answer(self.scope["path"], exc)(self.scope, self.receive, self._send)
                return
            event = self.line.stream_error(self.scope, exc)
            lead = b"" if not self.tail or self.tail.endswith(b"\n\n") or (
                event.startswith(b"{") and self.tail.endswith(b"\n")) else b"\n\n"
            await self._send({"type": "http.response.body", "body": lead + event, "more_body": False})


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and give it ``CANCEL_WAIT`` seconds to unwind (its upstream request closed, its lease given
    back); past that it is left to finish on its own."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=CANCEL_WAIT)
    if not done:
        log.warning("gateway: a cancelled request took over %.0f s to unwind; left to finish", CANCEL_WAIT)
    elif not task.cancelled() and task.exception() is not None:
        log.debug("gateway: a cancelled request ended with %r", task.exception())
