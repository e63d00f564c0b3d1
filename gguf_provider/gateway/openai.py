"""The OpenAI wire protocol: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/rerank``,
``/v1/models``: requests translated into the chat layer's, its events into OpenAI's chunks."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import chat
from ..engine import Engine
from ..events import Completion, Event, Finish, ReasoningDelta, TextDelta, Timings, ToolCallDelta, Usage
from .common import (
    BadRequest,
    Waiting,
    dumps,
    field,
    has_media,
    json_body,
    kind_of,
    message_of,
    model_name,
    new_id,
    now,
    open_events,
    reading,
    report,
    streaming,
)

if TYPE_CHECKING:
    from .state import Gateway

# Request fields read here; any other goes to llama-server as it is (top_k, min_p, repeat_penalty, ...).
_READ = frozenset({"model", "messages", "stream", "stream_options", "tools", "tool_choice", "response_format",
                   "max_tokens", "max_completion_tokens", "n", "user", "store", "metadata", "reasoning_effort",
                   "parallel_tool_calls", "max_time", "loop_guard", "service_tier", "modalities", "prediction"})
# Our finish reasons in OpenAI's: a reply the loop guard stopped was cut.
FINISH = {"repetition": "length"}
ERROR_TYPES = {"not_found": "invalid_request_error", "bad_request": "invalid_request_error",
               "context_length_exceeded": "invalid_request_error", "overloaded": "server_error",
               "server_error": "server_error", "internal": "server_error", "unavailable": "server_error", "unauthorized": "invalid_request_error",
               "forbidden": "invalid_request_error", "too_large": "invalid_request_error"}
CODES = {"not_found": "model_not_found", "context_length_exceeded": "context_length_exceeded",
         "unauthorized": "invalid_api_key", "forbidden": "forbidden", "too_large": "request_too_large"}


def error(exc: BaseException) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=kind_of(exc)[0])


def error_body(exc: BaseException) -> dict[str, Any]:
    _, kind = kind_of(exc)
    return {"error": {"message": message_of(exc), "type": ERROR_TYPES[kind], "param": None,
                      "code": CODES.get(kind)}}


def stream_error(exc: BaseException) -> bytes:
    """The error event that ends a stream already started."""
    return f"data: {dumps(error_body(exc))}\n\n".encode()


def chat_request(body: dict[str, Any]) -> chat.ChatRequest:
    messages = field(body, "messages", list, required=True)
    if field(body, "n", int, default=1) != 1:
        raise BadRequest("`n` must be 1: one choice per request")
    params = {k: v for k, v in body.items() if k not in _READ}
    params["max_tokens"] = field(body, "max_completion_tokens", int) or field(body, "max_tokens", int)
    reasoning = reasoning_of(field(body, "reasoning_effort", str))
    return chat.ChatRequest(
        messages=messages, tools=field(body, "tools", list, default=[]),
        tool_choice=chat.normalize_tool_choice(body.get("tool_choice")),
        response_format=_response_format(field(body, "response_format", dict)), params=params, reasoning=reasoning,
        loop_guard=field(body, "loop_guard", bool, default=True), max_time=body.get("max_time", "auto"))


def reasoning_of(effort: str | None) -> chat.Reasoning:
    """OpenAI's reasoning effort as the chat layer's reasoning: none and minimal are off, low/medium/high that
    effort, any other (xhigh, ...) on."""
    if effort is None:
        return None
    return False if effort in ("none", "minimal") else effort if effort in chat.REASONING_EFFORTS else True


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None or fmt.get("type") == "text":
        return None
    return fmt


async def chat_completions(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = model_name(body)
    with reading():
        req = chat_request(body)
        req.time_bound  # noqa: B018 - checks max_time now: a bad one is the request's error
    vision = has_media(req.messages)
    if not field(body, "stream", bool, default=False):
        async with gw.pool.use(name, vision=vision) as engine:
            done = await chat.acomplete(engine, req)
        return JSONResponse(completion_body(done, name))
    usage = bool((field(body, "stream_options", dict) or {}).get("include_usage"))
    opened = await open_events(gw.pool.use(name, vision=vision), lambda engine: chat.astream(engine, req),
                               wait=gw.settings.keepalive)
    return streaming(_sse(opened.events(), name, usage), opened, "text/event-stream")


def completion_body(done: Completion, name: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": done.content or None}
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    if done.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                                "arguments": c.arguments}}
                                 for c in done.tool_calls]
    reason = FINISH.get(done.finish_reason or "stop", done.finish_reason or "stop")
    out: dict[str, Any] = {"id": new_id("chatcmpl-"), "object": "chat.completion", "created": now(), "model": name,
                           "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}]}
    if done.usage is not None:
        out["usage"] = usage_body(done.usage)
    return out


def usage_body(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


class _Stream:
    """What a stream's chunks need besides each event: their common head, the usage and timings seen."""

    def __init__(self, name: str) -> None:
        self.head = f'data: {{"id":"{new_id("chatcmpl-")}","object":"chat.completion.chunk","created":{now()},' \
                    f'"model":{json.dumps(name)},"choices":[{{"index":0,"delta":'
        self.usage: Usage | None = None
        self.timings: dict[str, Any] = {}

    def chunk(self, ev: Event) -> bytes:
        """The chunk of one event (b"" for usage and timings, which the last chunk carries)."""
        head = self.head
        if type(ev) is TextDelta:
            return f'{head}{{"content":{json.dumps(ev.text)}}},"finish_reason":null}}]}}\n\n'.encode()
        if type(ev) is ReasoningDelta:
            return f'{head}{{"reasoning_content":{json.dumps(ev.text)}}},"finish_reason":null}}]}}\n\n'.encode()
        if isinstance(ev, ToolCallDelta):
            call: dict[str, Any] = {"index": ev.index, "function": {"arguments": ev.arguments}}
            if ev.id is not None or ev.name is not None:
                call.update(id=ev.id, type="function")
                call["function"]["name"] = ev.name
            return f'{head}{{"tool_calls":[{dumps(call)}]}},"finish_reason":null}}]}}\n\n'.encode()
        if isinstance(ev, Finish):
            reason = FINISH.get(ev.reason or "stop", ev.reason or "stop")
            return f'{head}{{}},"finish_reason":"{reason}"}}]}}\n\n'.encode()
        if isinstance(ev, Usage):
            self.usage = ev
        elif isinstance(ev, Timings):
            self.timings = ev.data
        return b""


async def _sse(events: AsyncIterator[Event | Waiting], name: str, include_usage: bool) -> AsyncIterator[bytes]:
    out = _Stream(name)
    head = out.head
    role = (head + '{"role":"assistant","content":""},"finish_reason":null}]}\n\n').encode()
    try:
        it = aiter(events)
        first = await anext(it, None)
        while isinstance(first, Waiting):  # the prompt is still being read: an SSE comment, which clients skip
            yield b": keep-alive\n\n"
            first = await anext(it, None)
        # The role chunk and the first event's go out in one write: the first token is not a write later.
        yield role + (out.chunk(first) if first is not None else b"")
        async for ev in it:
            if type(ev) is TextDelta:  # per token: the chunk written here, not through a call
                yield f'{head}{{"content":{json.dumps(ev.text)}}},"finish_reason":null}}]}}\n\n'.encode()
            elif not isinstance(ev, Waiting):  # (only the first is ever awaited)
                chunk = out.chunk(ev)
                if chunk:
                    yield chunk
    except Exception as exc:  # after the first event: an error event in the stream (the status was sent)
        report(exc, "/v1/chat/completions (streaming)")
        yield stream_error(exc)
        return
    if include_usage and out.usage is not None:  # with llama-server's own timings, as llama-server sends them
        tail = head.split(',"choices"', 1)[0]
        more = f',"timings":{dumps(out.timings)}' if out.timings else ""
        yield f'{tail},"choices":[],"usage":{dumps(usage_body(out.usage))}{more}}}\n\n'.encode()
    yield b"data: [DONE]\n\n"


async def completions(gw: Gateway, request: Request) -> Response:
    """Text completion (no chat template): llama-server's own ``/v1/completions``, its reply passed on."""
    body = await json_body(request)
    name = model_name(body)
    field(body, "prompt", (str, list), required=True)
    payload = {**body, "model": name}
    if not field(body, "stream", bool, default=False):
        async with gw.pool.use(name) as engine:
            async with engine.aguard():
                data = await engine.client.apost_json("/v1/completions", payload)
        return JSONResponse({**data, "model": name})

    async def start(engine: Engine) -> AsyncGenerator[bytes, None]:
        async with engine.aguard(), engine.client.ahttp.stream("POST", "/v1/completions", json=payload) as r:
            if r.status_code >= 400:
                from ..client import _raise_for_status

                _raise_for_status(r, await r.aread())
            async for chunk in r.aiter_raw():
                yield chunk

    opened = await open_events(gw.pool.use(name), start)
    return streaming(opened.events(), opened, "text/event-stream")


async def embeddings(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = model_name(body)
    given = field(body, "input", (str, list), required=True)
    texts = [given] if isinstance(given, str) else given
    if not all(isinstance(t, str) for t in texts):
        raise BadRequest("`input` must be a text or a list of texts (token ids are not taken)")
    encoding = field(body, "encoding_format", str, default="float")
    if encoding not in ("float", "base64"):
        raise BadRequest(f"`encoding_format` must be \"float\" or \"base64\", not {encoding!r}")
    async with gw.pool.use(name, "embed") as engine:
        vectors = await engine.aembed(texts, truncate=bool(body.get("truncate", False)))
    return JSONResponse({"object": "list", "model": name,
                         "data": [{"object": "embedding", "index": i,
                                   "embedding": _base64(v) if encoding == "base64" else v}
                                  for i, v in enumerate(vectors)],
                         "usage": {"prompt_tokens": 0, "total_tokens": 0}})


def _base64(vector: list[float]) -> str:
    """The vector as the openai SDK asks for it by default: little-endian float32s, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def rerank(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = model_name(body)
    query = field(body, "query", str, required=True)
    docs = field(body, "documents", list, required=True)
    texts = [d if isinstance(d, str) else d.get("text") if isinstance(d, dict) else None for d in docs]
    if not all(isinstance(t, str) for t in texts):
        raise BadRequest("`documents` must be a list of texts")
    documents = [str(t) for t in texts]
    top_n = field(body, "top_n", int)
    async with gw.pool.use(name, "rerank") as engine:
        ranked = await engine.arerank(query, documents, top_n=top_n)
    return JSONResponse({"model": name, "object": "list",
                         "results": [{"index": r.index, "relevance_score": r.score,
                                      **({"document": {"text": documents[r.index]}}
                                         if body.get("return_documents") else {})} for r in ranked]})


async def models(gw: Gateway, request: Request) -> Response:
    listed = await gw.model_list()
    return JSONResponse({"object": "list", "data": [{"id": m.name, "object": "model", "created": m.created,
                                                     "owned_by": m.owner} for m in listed]})

