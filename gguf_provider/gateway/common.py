"""What the three wire protocols share: reading a JSON body, an error's HTTP status and kind, a reply's id.

Each protocol module (:mod:`.openai`, :mod:`.anthropic`, :mod:`.ollama`) translates its requests into a
:class:`~gguf_provider.chat.ChatRequest` (or an embedding or rerank call) and the events back into its own shapes;
the errors below become each protocol's error body (``Protocol.error``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, contextmanager
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from .. import _json
from ..engine import Engine
from ..errors import (
    APIError,
    ContextOverflowError,
    GGUFProviderError,
    InsufficientMemoryError,
    LoadCancelled,
    MediaFetchError,
    ModelError,
    ModelNotFoundError,
    ServerError,
    UnsupportedInputError,
)
from .lifeline import Stopping

log = logging.getLogger("gguf_provider.gateway")


class BadRequest(Exception):
    """A request the gateway cannot read: bad JSON, a missing or mistyped field (HTTP 400)."""


class Refused(Exception):
    """A request the gateway's guard turns away: 401 (API key), 403 (Host, Origin), 413 (body size)."""

    KINDS = {401: "unauthorized", 403: "forbidden", 413: "too_large"}

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def kind_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status of ``exc`` and its kind: ``bad_request``, ``not_found``, ``context_length_exceeded``,
    ``overloaded`` (no memory for the model), ``server_error`` (llama-server failed), ``unavailable`` (the gateway is
    stopping), ``internal`` (a bug: any other exception), or the guard's ``unauthorized``, ``forbidden``,
    ``too_large``. Only typed errors caused by the request are 4xx: a ``ValueError`` is one only when it was raised
    while the request was read (:func:`reading` makes it a :class:`BadRequest`)."""
    if isinstance(exc, Refused):
        return exc.status, Refused.KINDS[exc.status]
    if isinstance(exc, ModelNotFoundError):
        return 404, "not_found"
    if isinstance(exc, ContextOverflowError):
        return 400, "context_length_exceeded"
    if isinstance(exc, (BadRequest, UnsupportedInputError, MediaFetchError, ModelError)):
        return 400, "bad_request"
    if isinstance(exc, Stopping):
        return 503, "unavailable"
    if isinstance(exc, InsufficientMemoryError):
        return 503, "overloaded"
    if isinstance(exc, APIError):
        status = exc.status_code if exc.status_code and 400 <= exc.status_code < 500 else 502
        return status, "bad_request" if status < 500 else "server_error"
    if isinstance(exc, (ServerError, LoadCancelled)):
        return 502, "server_error"
    if isinstance(exc, GGUFProviderError):
        return 500, "internal"
    return 500, "internal"


def report(exc: BaseException, where: str) -> None:
    """Log a request's failure: a bug (kind ``internal``) at ERROR with its traceback, the rest at INFO."""
    if kind_of(exc)[1] == "internal":
        log.error("gateway: %s: unexpected %s", where, type(exc).__name__, exc_info=exc)
    else:
        log.info("gateway: %s: %s: %s", where, type(exc).__name__, exc)


@contextmanager
def reading() -> Iterator[None]:
    """Reading a request into the chat layer's: a ``ValueError`` raised here is the request's (a 400)."""
    try:
        yield
    except BadRequest:
        raise
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


def message_of(exc: BaseException) -> str:
    """What the caller is told: the error's own message (a server error's first line; its log stays here)."""
    text = str(exc) or type(exc).__name__
    return text.split("\n", 1)[0] if isinstance(exc, ServerError) else text


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (BadRequest when it is none)."""
    raw = await request.body()
    try:
        body = _json.loads(raw) if raw else None
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False,
          default: Any = None) -> Any:
    """``body[name]`` checked against ``kind`` (BadRequest naming the field when it is missing or mistyped)."""
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"`{name}` is required")
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
        names = " or ".join(t.__name__ for t in _types(kind))
        raise BadRequest(f"`{name}` must be {names}, not {type(value).__name__}")
    return value


def _types(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def model_name(body: dict[str, Any]) -> str:
    name = field(body, "model", str, required=True).strip()
    if not name:
        raise BadRequest("`model` is empty")
    return str(name)


def has_media(messages: list[Any]) -> bool:
    """Whether OpenAI-shaped ``messages`` hold an image or audio part (the model is then started with its
    projector)."""
    return any(isinstance(m, dict) and isinstance(m.get("content"), list) and any(
        isinstance(p, dict) and p.get("type") in ("image_url", "input_audio") for p in m["content"]) for m in messages)


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Waiting:
    """What :meth:`Opened.events` yields while the first event has not come (each :data:`KEEPALIVE` seconds once
    the reply's head was sent): each protocol writes it as its own keep-alive, so that a client that gives up on a
    connection silent for minutes (Node's fetch: 300 s without headers or bytes; Claude Code then sends the whole
    request again) stays while a long prompt is read."""


WAITING = Waiting()
KEEPALIVE = 10.0  # seconds: the longest a stream waits for its head, and then between two keep-alives


class Opened:
    """A model's reply events with the first one at hand (an error before it was raised by :func:`open_events`, so
    it became an HTTP error), or, when it had not come within the wait :func:`open_events` was given, pending:
    then :meth:`events` yields :data:`WAITING` every ``keepalive`` seconds until it comes, and an error before it
    is raised from :meth:`events` (the stream's own error event). Iterating :meth:`events` yields the events and
    then ends the request and gives the model back, as :meth:`close` does (also when the caller left)."""

    def __init__(self, stack: AsyncExitStack, rest: AsyncGenerator[Any, None] | None, first: Any,
                 pending: asyncio.Task[tuple[AsyncGenerator[Any, None], Any]] | None = None,
                 keepalive: float = KEEPALIVE) -> None:
        self._stack, self._rest, self._first = stack, rest, first
        self._pending, self._keepalive = pending, keepalive

    async def events(self) -> AsyncIterator[Any]:
        try:
            if self._pending is not None:
                while not (await asyncio.wait({self._pending}, timeout=self._keepalive))[0]:
                    yield WAITING
                self._rest, self._first = self._pending.result()  # raises what came before the first event
            if self._first is not _END and self._rest is not None:
                yield self._first
                async for ev in self._rest:
                    yield ev
        finally:
            await self.close()

    async def close(self) -> None:
        task = self._pending
        if task is not None:
            if not task.done():
                task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: raised by events() already, or moot once the caller left
        await self._stack.aclose()


_END = object()


async def open_events(use: AbstractAsyncContextManager[Engine], start: Callable[[Engine], AsyncGenerator[Any, None]],
                      *, wait: float | None = None) -> Opened:
    """The events ``start(engine)`` yields on the engine ``use`` lends, once the first has come; with ``wait``, after
    at most ``wait`` seconds (the model's load and the request's checks take less: their errors stay HTTP errors),
    the first event then still pending (:class:`Opened`)."""
    stack = AsyncExitStack()

    async def first() -> tuple[AsyncGenerator[Any, None], Any]:
        engine = await stack.enter_async_context(use)
        gen = start(engine)
        stack.push_async_callback(gen.aclose)
        try:
            return gen, await anext(gen)
        except StopAsyncIteration:
            return gen, _END

    if wait is None:
        try:
            return Opened(stack, *await first())
        except BaseException:
            await stack.aclose()
            raise
    task = asyncio.ensure_future(first())
    try:
        await asyncio.wait({task}, timeout=wait)
    except BaseException:  # the caller left while it waited
        task.cancel()
        await asyncio.wait({task})
        await stack.aclose()
        raise
    if not task.done():
        return Opened(stack, None, None, task, keepalive=wait)
    try:
        return Opened(stack, *task.result())
    except BaseException:
        await stack.aclose()
        raise


class _Streaming(StreamingResponse):
    """A streamed reply whose chunks' generator is closed when the reply ends, also when it is cancelled (the
    client left, the gateway stops): that closes the request to llama-server now, not when the garbage collector
    gets to it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


def streaming(chunks: AsyncIterator[bytes], opened: Opened, media_type: str) -> Response:
    """A streamed reply; the model is given back when it ends, or when the caller leaves."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return _Streaming(chunks, media_type=media_type, headers=headers, background=BackgroundTask(opened.close))
