"""The one engine client: llama-server's OpenAI-compatible API, sync and async, parsed into normalized events.

Every adapter (LangChain, LlamaIndex, magics, CLI) consumes these events; none of them parses SSE itself.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import math
import weakref
from collections.abc import AsyncGenerator, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _json
from .deadline import Deadline
from .errors import APIError
from .events import Event, Finish, ReasoningDelta, TextDelta, Timings, ToolCallDelta, Usage
from .lazy import LazyModule
from .runtime._common.process import Address
from .runtime._serve.diagnose import bounded_repr as _short
from .runtime._serve.diagnose import error_from_body, transport_error

if TYPE_CHECKING:
    import httpx
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

# --- errors ----------------------------------------------------------------------------------------------------
JSON = {"content-type": "application/json"}  # a body encoded by _json (orjson where installed: bench P21)

# What a failure means is runtime/_serve/diagnose.py's table; error_from_body stays importable from here.


def _raise_for_status(r: httpx.Response, body: bytes) -> None:
    if r.status_code < 400:
        return
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = body.decode("utf-8", "replace")
    raise error_from_body(r.status_code, data)


# --- SSE -------------------------------------------------------------------------------------------------------


class StreamParser:
    """Turns chat.completion.chunk payloads into events. Tracks which tool-call indexes were already announced."""

    __slots__ = ("_seen_tools",)

    def __init__(self) -> None:
        self._seen_tools: set[int] = set()

    def feed_line(self, line: str) -> list[Event] | None:
        """Events of one SSE line; None at ``[DONE]``. Raises the typed error of an in-stream error event."""
        if not line.startswith("data:"):
            if line.startswith("error:"):
                raise error_from_body(None, _loads(line[6:]))
            return []
        payload = line[5:].strip()
        if payload == "[DONE]":
            return None
        if not payload:
            return []
        try:  # ``feed`` inlined: this runs once per token
            chunk = _json.loads(payload)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise APIError(f"malformed stream payload from llama-server: {payload[:200]!r}") from exc
        if type(chunk) is not dict or "error" in chunk:
            return self.feed(chunk)
        try:
            return self._events(chunk)
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:
            raise APIError(f"malformed stream chunk from llama-server ({exc}): {_short(chunk)}") from exc

    def feed(self, chunk: Any) -> list[Event]:
        """Events of one chunk. A chunk of the wrong shape raises :class:`APIError`, never a TypeError."""
        if not isinstance(chunk, dict):
            raise APIError(f"unexpected stream payload: {_short(chunk)}")
        if "error" in chunk:
            raise error_from_body(None, chunk)
        try:
            return self._events(chunk)
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:
            raise APIError(f"malformed stream chunk from llama-server ({exc}): {_short(chunk)}") from exc

    def _events(self, chunk: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            # The type checks are inline: this runs once per token (``_opt_str`` as a call cost ~5% of it).
            text = delta.get("reasoning_content")
            if text is not None:
                if type(text) is not str:
                    raise TypeError(f"reasoning_content is a {type(text).__name__}")
                if text:
                    events.append(ReasoningDelta(text))
            text = delta.get("content")
            if text is not None:
                if type(text) is not str:
                    raise TypeError(f"content is a {type(text).__name__}")
                if text:
                    events.append(TextDelta(text))
            for tc in delta.get("tool_calls") or ():
                idx = tc.get("index", 0)
                if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < 1 << 16:
                    raise ValueError(f"tool call index {idx!r}")
                fn = tc.get("function") or {}
                call_id, name, args = _opt_str(tc.get("id")), _opt_str(fn.get("name")), _opt_str(fn.get("arguments"))
                first = idx not in self._seen_tools
                if first:
                    self._seen_tools.add(idx)
                events.append(ToolCallDelta(idx, call_id if first else None, name if first else None, args or ""))
            reason = choice.get("finish_reason")
            if reason is not None and _opt_str(reason):
                model = chunk.get("model")
                events.append(Finish(reason, model if isinstance(model, str) else None))
        usage = chunk.get("usage")
        if usage:
            events.append(_usage(usage))
        timings = chunk.get("timings")
        if timings:
            if not isinstance(timings, dict):
                raise TypeError(f"timings is a {type(timings).__name__}")
            events.append(Timings({k: v for k, v in timings.items()  # numbers only: adapters call float() on them
                                   if isinstance(v, (int, float)) and not isinstance(v, bool)}))
        return events


def _opt_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {type(value).__name__}")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise APIError(f"malformed stream payload from llama-server: {text[:200]!r}") from exc


def _usage(u: dict[str, Any]) -> Usage:
    details = u.get("prompt_tokens_details") or {}
    return Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0),
                 int(u.get("total_tokens") or 0), int(details.get("cached_tokens") or 0))


# --- client ----------------------------------------------------------------------------------------------------


async def _closed_with_the_loop(client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    """Closes ``client`` when its event loop ends: a loop closes the async generators it runs before it stops
    (``loop.shutdown_asyncgens``, which ``asyncio.run`` calls), so the client's connections are closed, not left to
    the garbage collector (a ResourceWarning for each socket)."""
    try:
        yield
    finally:
        await client.aclose()


_OPEN: weakref.WeakSet[EngineClient] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Connections closed at exit, not left to the interpreter's teardown (a ResourceWarning for each socket)."""
    for client in list(_OPEN):
        client.close()


class EngineClient:
    """HTTP client of one llama-server address. Connection failures surface as ``httpx.TransportError``; the
    engine layer above decides whether that means a crashed server."""

    def __init__(self, address: Address, *, timeout: float = 600.0, connect_timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._client: httpx.Client | None = None
        self._client_finalizer: weakref.finalize[Any, Any] | None = None
        _OPEN.add(self)
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._aclients = weakref.WeakKeyDictionary()
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGenerator[None, None]]
        self._closers = weakref.WeakKeyDictionary()

    # clients ------------------------------------------------------------------------------------------------

    @property
    def http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.address.base_url, transport=self.address.transport(),
                                        headers=self.address.headers(), timeout=self.timeout,
                                        verify=self.address.verify)
            # An EngineClient dropped unclosed (a model object gone out of scope) closes its connections then, not
            # the garbage collector later (a ResourceWarning for each socket).
            self._client_finalizer = weakref.finalize(self, self._client.close)
        return self._client

    @property
    def ahttp(self) -> httpx.AsyncClient:
        """One AsyncClient per event loop: a client bound to a closed loop fails with "Event loop is closed"."""
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            client = httpx.AsyncClient(base_url=self.address.base_url, transport=self.address.async_transport(),
                                       headers=self.address.headers(), timeout=self.timeout,
                                       verify=self.address.verify)
            self._aclients[loop] = client
            closer = _closed_with_the_loop(client)
            self._closers[loop] = closer
            asyncio.ensure_future(closer.asend(None))  # runs it to its yield: the loop now knows it
        return client

    def close(self) -> None:
        if self._client_finalizer is not None:
            self._client_finalizer()  # closes the client, once
        self._client = None
        self._aclients.clear()
        self._closers.clear()

    # requests: each written once, async; the sync methods are generated from it (scripts/gen_sync.py) ------------

    # unasync: async source
    async def aget_json(self, path: str) -> Any:
        with _timeouts():
            r = await self.ahttp.get(path)
        _raise_for_status(r, r.content)
        return r.json()

    async def apost_json(self, path: str, payload: dict[str, Any]) -> Any:
        with _timeouts():
            r = await self.ahttp.post(path, json=payload)
        _raise_for_status(r, r.content)
        return r.json()

    async def astream_chat(self, payload: dict[str, Any],
                           deadline: Deadline | None = None) -> AsyncGenerator[Event, None]:
        """Stream events. Closing the generator (``break`` in the consumer) closes the response, which makes
        llama-server stop generating and free the slot. A ``deadline`` that fires shuts the response's socket:
        the stream then ends without a finish (``deadline.fired`` says why)."""
        body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
        parser = StreamParser()
        with _timeouts():
            async with self.ahttp.stream("POST", "/v1/chat/completions", content=_json.dumps(body), headers=JSON) as r:
                if r.status_code >= 400:
                    _raise_for_status(r, await r.aread())
                if deadline is not None:
                    deadline.watch(r)
                try:
                    async for line in r.aiter_lines():
                        events = parser.feed_line(line)
                        if events is None:
                            return
                        for ev in events:
                            yield ev
                except httpx.TransportError:
                    if deadline is None or not deadline.fired:
                        raise
                finally:
                    if deadline is not None:
                        deadline.unwatch()

    async def atokenize(self, text: str, *, special: bool = True) -> list[int]:
        data = await self.apost_json("/tokenize", {"content": text, "add_special": special, "parse_special": special})
        return list(data.get("tokens") or [])

    async def aapply_template(self, payload: dict[str, Any]) -> str:
        return str((await self.apost_json("/apply-template", payload)).get("prompt") or "")

    async def aembed(self, inputs: Sequence[str | list[int]], **extra: Any) -> list[list[float]]:
        """Vectors of ``inputs`` (texts or token ids); ``extra`` fields go into the request body."""
        return _embeddings(await self.apost_json("/v1/embeddings", {**extra, "input": list(inputs)}))

    async def arerank(self, query: str, documents: Sequence[str], **extra: Any) -> list[RerankResult]:
        """A score for each document against ``query`` from ``/v1/rerank`` (a server started with ``--rerank``),
        best first; ``extra`` fields go into the request body."""
        return _reranked(await self.apost_json("/v1/rerank", rerank_body(query, documents, extra)), len(documents))

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def get_json(self, path: str) -> Any:
        with _timeouts():
            r = self.http.get(path)
        _raise_for_status(r, r.content)
        return r.json()

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        with _timeouts():
            r = self.http.post(path, json=payload)
        _raise_for_status(r, r.content)
        return r.json()

    def stream_chat(self, payload: dict[str, Any],
                    deadline: Deadline | None = None) -> Generator[Event, None]:
        """Stream events. Closing the generator (``break`` in the consumer) closes the response, which makes
        llama-server stop generating and free the slot. A ``deadline`` that fires shuts the response's socket:
        the stream then ends without a finish (``deadline.fired`` says why)."""
        body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
        parser = StreamParser()
        with _timeouts():
            with self.http.stream("POST", "/v1/chat/completions", content=_json.dumps(body), headers=JSON) as r:
                if r.status_code >= 400:
                    _raise_for_status(r, r.read())
                if deadline is not None:
                    deadline.watch(r)
                try:
                    for line in r.iter_lines():
                        events = parser.feed_line(line)
                        if events is None:
                            return
                        for ev in events:
                            yield ev
                except httpx.TransportError:
                    if deadline is None or not deadline.fired:
                        raise
                finally:
                    if deadline is not None:
                        deadline.unwatch()

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        data = self.post_json("/tokenize", {"content": text, "add_special": special, "parse_special": special})
        return list(data.get("tokens") or [])

    def apply_template(self, payload: dict[str, Any]) -> str:
        return str((self.post_json("/apply-template", payload)).get("prompt") or "")

    def embed(self, inputs: Sequence[str | list[int]], **extra: Any) -> list[list[float]]:
        """Vectors of ``inputs`` (texts or token ids); ``extra`` fields go into the request body."""
        return _embeddings(self.post_json("/v1/embeddings", {**extra, "input": list(inputs)}))

    def rerank(self, query: str, documents: Sequence[str], **extra: Any) -> list[RerankResult]:
        """A score for each document against ``query`` from ``/v1/rerank`` (a server started with ``--rerank``),
        best first; ``extra`` fields go into the request body."""
        return _reranked(self.post_json("/v1/rerank", rerank_body(query, documents, extra)), len(documents))

    # unasync: end


def _embeddings(data: dict[str, Any]) -> list[list[float]]:
    items = sorted(data.get("data") or [], key=lambda d: int(d.get("index", 0)))
    return [list(map(float, d["embedding"])) for d in items]


@dataclass(frozen=True)
class RerankResult:
    """One document's relevance to a query: its position in the list given, and the model's score (higher: more
    relevant; the scale is the model's own, e.g. a logit for bge-reranker, a probability for Qwen3-Reranker)."""

    index: int
    score: float


def rerank_body(query: str, documents: Sequence[str], extra: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/rerank`` request (Jina's shape: ``query``, ``documents``); no ``top_n``: the engine ranks every
    batch's answers together and cuts once."""
    return {**extra, "query": query, "documents": list(documents)}


def _reranked(data: Any, n_documents: int) -> list[RerankResult]:
    """The ``results`` of a ``/v1/rerank`` answer as typed results, checked: one per document, each index once."""
    try:
        results = [RerankResult(int(r["index"]), float(r["relevance_score"])) for r in data["results"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise APIError(f"malformed /v1/rerank answer from llama-server ({exc!r}): {_short(data)}") from exc
    if sorted(r.index for r in results) != list(range(n_documents)) or not all(math.isfinite(r.score)
                                                                               for r in results):
        raise APIError(f"/v1/rerank answered {len(results)} results for {n_documents} documents: {_short(data)}")
    return results


class _timeouts:
    """Turn httpx timeouts into ServerTimeoutError (a hung server must never hang the caller silently); the other
    transport errors go up as they are, for the engine to tell a crashed server from an unreachable one."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        err = transport_error(exc) if isinstance(exc, httpx.TransportError) else None
        if err is not None:
            raise err from exc
