"""The wire checks for the tests with real coding tools (tests/integration_tests/tools/): a reply is read as its
protocol says, event by event, and each event is validated by the protocol's own SDK types (``anthropic``,
``openai``); and a recording proxy that stands between a tool and the gateway and keeps every exchange whole, so
that each reply the tool got can be checked the same way.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

ANTHROPIC_STOPS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
OPENAI_FINISHES = {"stop", "length", "tool_calls", "content_filter", "function_call"}


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each server-sent event; a comment line (``:``) is skipped."""
    events: list[tuple[str | None, str]] = []
    text = raw.decode("utf-8")
    assert "\r" not in text or "\r\n" in text, "stray carriage returns in the stream"
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
            else:
                raise AssertionError(f"not a server-sent event line: {line!r}")
        if data:
            events.append((name, "\n".join(data)))
    return events


@dataclass
class Reply:
    """What a checked reply held: how it stopped, its usage, its content blocks (Anthropic) or message (OpenAI)."""

    stop: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


# --- Anthropic ---------------------------------------------------------------------------------------------------


def check_anthropic_stream(raw: bytes) -> Reply:
    """The Messages stream: message_start, then each content block's start, deltas and stop, then message_delta with
    the stop reason and usage, then message_stop (pings anywhere); or an ``error`` event, the stream's last."""
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    events = sse_events(raw)
    assert events, "an empty stream"
    reply = Reply()
    open_block: int | None = None
    partial: dict[int, str] = {}
    state = "start"
    for i, (name, data) in enumerate(events):
        obj = json.loads(data)
        kind = obj.get("type")
        assert name == kind, f"event {name!r} carries data of type {kind!r}"
        if kind == "ping":
            continue
        if kind == "error":
            assert i == len(events) - 1, "events after an error event"
            assert isinstance(obj.get("error"), dict) and obj["error"].get("type") and obj["error"].get("message"), obj
            reply.error = obj["error"]
            return reply
        adapter.validate_python(obj)
        if state == "start":
            assert kind == "message_start", f"the stream starts with {kind}"
            msg = obj["message"]
            assert msg["role"] == "assistant" and msg["content"] == [] and msg["usage"]["input_tokens"] >= 0
            reply.usage.update(msg["usage"])
            state = "blocks"
        elif state == "blocks" and kind == "content_block_start":
            assert open_block is None, "a block started before the last one stopped"
            assert obj["index"] == len(reply.blocks), f"block index {obj['index']} after {len(reply.blocks)} blocks"
            open_block = obj["index"]
            reply.blocks.append(dict(obj["content_block"]))
            partial[open_block] = ""
        elif state == "blocks" and kind == "content_block_delta":
            assert obj["index"] == open_block, f"a delta for block {obj['index']}, open: {open_block}"
            delta, block = obj["delta"], reply.blocks[obj["index"]]
            expected = {"text": "text_delta", "tool_use": "input_json_delta", "thinking": "thinking_delta"}
            assert delta["type"] in (expected.get(block["type"]), "signature_delta"), (block["type"], delta["type"])
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[open_block] += delta["partial_json"]
        elif state == "blocks" and kind == "content_block_stop":
            assert obj["index"] == open_block, f"stop for block {obj['index']}, open: {open_block}"
            block = reply.blocks[open_block]
            if block["type"] == "tool_use":
                block["input"] = json.loads(partial[open_block] or "{}")
                assert isinstance(block["input"], dict), block
                assert block["id"] and block["name"], block
            open_block = None
        elif state == "blocks" and kind == "message_delta":
            assert open_block is None, "message_delta with a block still open"
            reply.stop = obj["delta"]["stop_reason"]
            assert reply.stop in ANTHROPIC_STOPS, reply.stop
            reply.usage.update(obj["usage"])
            state = "delta"
        elif state == "delta" and kind == "message_stop":
            state = "stopped"
        else:
            raise AssertionError(f"event {kind} where {state} was due")
    assert state == "stopped", f"the stream ended at {state}, without message_stop"
    assert (reply.stop == "tool_use") == any(b["type"] == "tool_use" for b in reply.blocks), reply
    assert reply.usage.get("output_tokens", 0) >= 0 and "input_tokens" in reply.usage, reply.usage
    return reply


def check_anthropic_message(obj: dict[str, Any]) -> Reply:
    from anthropic.types import Message

    msg = Message.model_validate(obj)
    assert msg.role == "assistant" and msg.stop_reason in ANTHROPIC_STOPS, obj
    return Reply(stop=msg.stop_reason, usage=obj["usage"], blocks=obj["content"])


def check_anthropic_error(status: int, obj: Any) -> Reply:
    assert 400 <= status < 600, status
    assert obj.get("type") == "error" and obj["error"].get("type") and obj["error"].get("message"), obj
    return Reply(error=obj["error"])


# --- OpenAI ------------------------------------------------------------------------------------------------------


def check_openai_stream(raw: bytes, include_usage: bool) -> Reply:
    """Chat completion chunks ending in ``[DONE]``: one choice, one finish reason, tool call deltas that add up to
    JSON arguments; a last chunk with ``usage`` and no choices when ``stream_options.include_usage`` asked for it."""
    from openai.types.chat import ChatCompletionChunk

    events = sse_events(raw)
    assert events and events[-1][1] == "[DONE]", f"the stream does not end in [DONE]: {events[-1:]}"
    reply = Reply(blocks=[{"role": "assistant", "content": "", "tool_calls": {}}])
    message = reply.blocks[0]
    usage_chunks = 0
    for name, data in events[:-1]:
        assert name is None, f"an event name {name!r} in a chat completions stream"
        obj = json.loads(data)
        if "error" in obj:  # an error after the headers went out: the last thing before [DONE]
            assert obj["error"].get("message"), obj
            reply.error = obj["error"]
            continue
        chunk = ChatCompletionChunk.model_validate(obj)
        assert chunk.object == "chat.completion.chunk" and reply.error is None, obj
        if chunk.usage is not None:
            reply.usage = obj["usage"]
        if not chunk.choices:
            assert chunk.usage is not None, f"a chunk with neither choices nor usage: {obj}"
            usage_chunks += 1
            continue
        assert len(chunk.choices) == 1 and chunk.choices[0].index == 0, obj
        choice = chunk.choices[0]
        assert reply.stop is None, f"a chunk after the finish reason: {obj}"
        message["content"] += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            slot = message["tool_calls"].setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            if call.id:
                slot["id"] = call.id
            if call.function is not None:
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
        if choice.finish_reason is not None:
            reply.stop = choice.finish_reason
    if reply.error is not None:
        return reply
    assert reply.stop in OPENAI_FINISHES, f"no finish reason: {reply.stop!r}"
    for slot in message["tool_calls"].values():
        assert slot["id"] and slot["name"], slot
        assert isinstance(json.loads(slot["arguments"] or "{}"), dict), slot
    assert (reply.stop == "tool_calls") == bool(message["tool_calls"]), reply
    if include_usage:
        assert usage_chunks == 1, f"{usage_chunks} usage chunks"
        assert reply.usage["prompt_tokens"] > 0 and reply.usage["completion_tokens"] >= 0, reply.usage
    return reply


def check_openai_completion(obj: dict[str, Any]) -> Reply:
    from openai.types.chat import ChatCompletion

    done = ChatCompletion.model_validate(obj)
    assert done.object == "chat.completion" and len(done.choices) == 1, obj
    assert done.choices[0].finish_reason in OPENAI_FINISHES and done.usage is not None, obj
    return Reply(stop=done.choices[0].finish_reason, usage=obj["usage"], blocks=[obj["choices"][0]["message"]])


def check_openai_error(status: int, obj: Any) -> Reply:
    assert 400 <= status < 600, status
    assert isinstance(obj.get("error"), dict) and obj["error"].get("message"), obj
    return Reply(error=obj["error"])


# --- OpenAI Responses --------------------------------------------------------------------------------------------

RESPONSES_ENDS = {"response.completed", "response.incomplete", "response.failed"}


def _validate_responses_event(adapter: Any, obj: dict[str, Any]) -> None:
    # the SDK's ResponseError.code lists no context_length_exceeded, which OpenAI sends and Codex reads
    error = (obj.get("response") or {}).get("error") or {}
    if error.get("code") == "context_length_exceeded":
        obj = {**obj, "response": {**obj["response"], "error": {**error, "code": "server_error"}}}
    adapter.validate_python(obj)


def check_responses_stream(raw: bytes) -> Reply:
    """The Responses stream: events numbered 0, 1, ... (keep-alive comments aside), each validated by the openai
    SDK's types; response.created first; each output item added, then its parts' and arguments' deltas, then done
    (one open at a time), the done item holding what its deltas added up to; last, one of response.completed,
    .incomplete or .failed whose response holds the items done, or an ``error`` event."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = sse_events(raw)
    assert events, "an empty stream"
    reply = Reply()
    items: list[dict[str, Any]] = []  # the items done
    open_item: dict[str, Any] | None = None
    text = ""  # the open item's text (a message's, the reasoning's) or arguments, as its deltas added up
    for i, (name, data) in enumerate(events):
        obj = json.loads(data)
        kind = obj.get("type")
        assert name == kind, f"event {name!r} carries data of type {kind!r}"
        assert obj.get("sequence_number") == i, f"event {i} ({kind}) is numbered {obj.get('sequence_number')}"
        if kind == "error":
            assert i == len(events) - 1 and obj.get("message"), "events after an error event"
            reply.error = obj
            return reply
        _validate_responses_event(adapter, obj)
        assert (i == 0) == (kind == "response.created"), f"event {i} is {kind}"
        if kind == "response.output_item.added":
            assert open_item is None and obj["output_index"] == len(items), (obj, len(items))
            open_item, text = obj["item"], ""
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta",
                      "response.function_call_arguments.delta"):
            assert open_item is not None and obj["item_id"] == open_item["id"], obj
            text += obj["delta"]
        elif kind == "response.output_item.done":
            item = obj["item"]
            assert open_item is not None and item["id"] == open_item["id"], obj
            whole = item["arguments"] if item["type"] == "function_call" else \
                "".join(p.get("text", "") for p in item.get("content") or ())
            assert whole == text, (whole, text)
            if item["type"] == "function_call" and item["status"] == "completed":
                assert item["call_id"] and item["name"], item
                assert isinstance(json.loads(item["arguments"] or "{}"), dict), item
            items.append(item)
            open_item = None
        elif kind in RESPONSES_ENDS:
            assert i == len(events) - 1, f"events after {kind}"
            assert open_item is None, f"{kind} with an item still open"
            response = obj["response"]
            assert response["status"] == kind.split(".")[1] and response["output"] == items, response
            reply.stop, reply.blocks = response["status"], items
            reply.usage = response.get("usage") or {}
            reply.error = response.get("error")
        else:
            assert kind in ("response.created", "response.in_progress", "response.content_part.added",
                            "response.content_part.done", "response.output_text.done",
                            "response.reasoning_text.done", "response.function_call_arguments.done"), kind
    assert reply.stop is not None, "the stream ended without response.completed, .incomplete or .failed"
    if reply.stop != "failed":
        assert reply.usage["input_tokens"] > 0 and reply.usage["output_tokens"] >= 0, reply.usage
    return reply


def check_responses_object(obj: dict[str, Any]) -> Reply:
    from openai.types.responses import Response

    r = Response.model_validate(obj)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.usage is not None, obj
    return Reply(stop=r.status, usage=obj["usage"], blocks=obj["output"])


# --- one exchange, any protocol ----------------------------------------------------------------------------------


@dataclass
class Exchange:
    method: str
    path: str
    request: Any
    status: int = 0
    content_type: str = ""
    body: bytes = b""
    complete: bool = False  # the whole reply reached the client
    # The client closed its connection before the whole reply (a broken pipe on our write): it stopped reading, as
    # opencode does with its title request once its answer is done; the proxy then closes its upstream, so the
    # gateway cancels the request. Nothing more of the reply was owed to it.
    left: bool = False


def check_exchange(ex: Exchange) -> Reply | None:
    """The reply as its protocol says (2xx) or a well-formed error (4xx/5xx); None for what is not a chat reply."""
    anthropic = ex.path.startswith("/v1/messages") and not ex.path.endswith("count_tokens")
    chat = ex.path.endswith("/chat/completions")
    responses = ex.path.endswith("/responses") and ex.method == "POST"
    if ex.method == "HEAD" or not (anthropic or chat or responses):
        assert ex.status < 400 or ex.path.endswith("count_tokens"), f"{ex.method} {ex.path}: {ex.status}"
        return None
    if ex.status >= 400:
        obj = json.loads(ex.body)
        return check_anthropic_error(ex.status, obj) if anthropic else check_openai_error(ex.status, obj)
    assert ex.status == 200, f"{ex.path}: {ex.status}"
    streamed = isinstance(ex.request, dict) and bool(ex.request.get("stream"))
    if streamed:
        assert ex.content_type.startswith("text/event-stream"), ex.content_type
        if anthropic:
            return check_anthropic_stream(ex.body)
        if responses:
            return check_responses_stream(ex.body)
        include = bool((ex.request.get("stream_options") or {}).get("include_usage"))
        return check_openai_stream(ex.body, include)
    obj = json.loads(ex.body)
    if responses:
        return check_responses_object(obj)
    return check_anthropic_message(obj) if anthropic else check_openai_completion(obj)


# --- the recording proxy -----------------------------------------------------------------------------------------

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}


class RecordingProxy:
    """``url`` forwards every request to ``upstream`` as it came and the reply back as it goes (streamed); each
    exchange is kept whole in :attr:`exchanges`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.exchanges: list[Exchange] = []
        self.client = httpx.Client(base_url=upstream, timeout=httpx.Timeout(10.0, read=None))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    request = json.loads(raw) if raw else None
                except ValueError:
                    request = None
                ex = Exchange(self.command, self.path.split("?")[0], request)
                proxy.exchanges.append(ex)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                with proxy.client.stream(self.command, self.path, headers=headers, content=raw) as up:
                    ex.status, ex.content_type = up.status_code, up.headers.get("content-type", "")
                    self.send_response(up.status_code)
                    for k, v in up.headers.items():
                        if k.lower() not in HOP and k.lower() != "content-encoding":
                            self.send_header(k, v)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    if self.command == "HEAD":
                        ex.complete = True
                        return
                    try:
                        for chunk in up.iter_raw():
                            ex.body += chunk
                            self.wfile.write(chunk)
                            self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        ex.left = True
                        return
                    ex.complete = True

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

        return Handler

    def __enter__(self) -> RecordingProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


@contextmanager
def recording_proxy(upstream: str) -> Iterator[RecordingProxy]:
    with RecordingProxy(upstream) as proxy:
        yield proxy


def need_tool(key: str) -> Path:
    """The installed tool (scripts/test_tools.py); missing, the test is skipped, or fails under `make test`
    (``GGUF_PROVIDER_TESTS_STRICT=1``, after `make setup-test` installed it: a skip there would hide that it failed)."""
    from scripts.test_tools import TOOLS, tool_path

    exe = tool_path(key)
    if exe is not None:
        return exe
    tool = TOOLS[key]
    why = (f"{tool.package}=={tool.version} is not installed: run `python scripts/test_tools.py {key}` "
           "(`make setup-test` does)")
    if os.environ.get("GGUF_PROVIDER_TESTS_STRICT") == "1":
        pytest.fail(why)
    pytest.skip(why)
