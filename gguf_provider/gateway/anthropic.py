"""The Anthropic wire protocol: ``/v1/messages`` (streamed or not: text, tools, thinking, images) and
``/v1/messages/count_tokens``: messages translated into the chat layer's (OpenAI-shaped) ones, its events into
Anthropic's content blocks and stream events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import chat
from ..events import Completion, Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from .common import (
    WAITING,
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
    open_events,
    reading,
    report,
    streaming,
)

if TYPE_CHECKING:
    from .state import Gateway

STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "repetition": "max_tokens"}
ERROR_TYPES = {"not_found": "not_found_error", "bad_request": "invalid_request_error",
               "context_length_exceeded": "invalid_request_error", "overloaded": "overloaded_error",
               "server_error": "api_error", "internal": "api_error", "unavailable": "api_error", "unauthorized": "authentication_error",
               "forbidden": "permission_error", "too_large": "request_too_large"}
# The request fields, each honoured, accepted and ignored, or refused when set (docs/gateway.md has the table).
# Honoured: read below. A field in none of these sets goes to llama-server as it is (its own sampling fields:
# temperature, top_p, top_k, min_p, repeat_penalty, ...).
HONOURED = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "tools", "tool_choice",
                      "thinking", "output_config", "output_format", "max_time", "loop_guard"})
# Ignored: they change nothing a local model answers (caching is llama-server's own prompt cache; the context is
# what the request holds, so context_management's edits are the client's to make).
IGNORED = frozenset({"metadata", "service_tier", "context_management", "cache_control", "inference_geo"})
# Refused when set: each would change the answer, and nothing here can do it.
REFUSED = {"container": "code execution containers run on Anthropic's servers",
           "mcp_servers": "remote MCP servers are called by Anthropic's servers; connect them in your client"}
# Content blocks that cannot be honoured: what to send instead.
_NOT_TAKEN = {"document": "send the document's text as a text block",
              "search_result": "send the result's text as a text block",
              "server_tool_use": "server tools are not run here", "web_search_tool_result": "server tools are not "
              "run here", "web_fetch_tool_result": "server tools are not run here",
              "code_execution_tool_result": "server tools are not run here",
              "container_upload": "code execution containers are not run here"}
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


def error(exc: BaseException) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=kind_of(exc)[0])


def error_body(exc: BaseException) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES[kind_of(exc)[1]], "message": message_of(exc)}}


def stream_error(exc: BaseException) -> bytes:
    """The error event that ends a stream already started."""
    return _event("error", {"error": error_body(exc)["error"]})


# --- requests ----------------------------------------------------------------------------------------------------


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text":
                raise BadRequest(f"{where}: only text blocks are taken here, not {_kind(block)}"
                                 + _instead(block))
            parts.append(str(block.get("text", "")))
        return "\n".join(parts)
    raise BadRequest(f"{where} must be a string or a list of text blocks")


def _kind(block: Any) -> str:
    return repr(block.get("type")) if isinstance(block, dict) else type(block).__name__


def _instead(block: Any) -> str:
    hint = _NOT_TAKEN.get(str(block.get("type"))) if isinstance(block, dict) else None
    return f" ({hint})" if hint else ""


def _image(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        return {"type": "image_url", "image_url": {"url": f"data:{source.get('media_type')};base64,{source.get('data')}"}}
    if source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url")}}
    raise BadRequest(f"an image's source must be base64 or url, not {source.get('type')!r}")


# Claude Code's first system block: Anthropic's billing tag, not an instruction; it changes with each prompt, so as
# the prompt's first tokens it would keep llama-server's prompt cache from reusing the long prefix after it.
_BILLING = "x-anthropic-billing-header:"


def _billed(system: Any) -> Any:
    """``system`` without Claude Code's billing block."""
    if isinstance(system, list):
        return [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(_BILLING))]
    return system


def messages(system: Any, given: list[Any]) -> list[dict[str, Any]]:
    """Anthropic's ``system`` and ``messages`` as OpenAI-shaped messages (tool results become ``tool`` messages).

    ``system``-role messages inside ``messages`` (Claude Code sends one after the first user message) join
    ``system``, in order, as one leading system message: chat templates take a system message first only."""
    out: list[dict[str, Any]] = []
    systems = [_text(_billed(system), "`system`")] if system else []
    for i, m in enumerate(given):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}] must be an object whose role is user, assistant or system")
        role, content = m["role"], m.get("content")
        if role == "system":
            text = _text(content, f"messages[{i}].content")
            if text:
                systems.append(text)
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages[{i}].content must be a string or a list of blocks")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif kind == "image" and role == "user":
                parts.append(_image(block))
            elif kind == "tool_result" and role == "user":
                result = block.get("content")
                text = "" if result is None else _text(result, f"messages[{i}] tool_result content")
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                            "content": f"Error: {text}" if block.get("is_error") else text})
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": str(block.get("name", "")),
                                           "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "thinking" and role == "assistant":
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "redacted_thinking":
                continue  # encrypted by Anthropic: nothing a local model can read
            else:
                raise BadRequest(f"messages[{i}]: a {_kind(block)} block is not taken in a {role} message"
                                 + _instead(block))
        if not parts and not calls and not reasoning:
            continue  # only tool results
        msg: dict[str, Any] = {"role": role}
        if all(p["type"] == "text" for p in parts):
            msg["content"] = "\n".join(p["text"] for p in parts)
        else:
            msg["content"] = parts
        if calls:
            msg["tool_calls"] = calls
        if reasoning:
            msg["reasoning_content"] = "\n".join(reasoning)
        out.append(msg)
    if systems:
        out.insert(0, {"role": "system", "content": "\n\n".join(systems)})
    return out


def tools(given: list[Any] | None) -> list[dict[str, Any]]:
    """Client tools as OpenAI functions; a server tool (web search, code execution, ...) is refused by name."""
    out = []
    for i, t in enumerate(given or ()):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}] must be an object")
        if t.get("type") not in (None, "custom"):
            raise BadRequest(f"tools[{i}] ({t.get('name')!r}) is the server tool {t['type']!r}, which runs on "
                             "Anthropic's servers; this gateway runs none: leave it out, or declare a client tool "
                             "with a name and an input_schema")
        if "name" not in t or "input_schema" not in t:
            raise BadRequest(f"tools[{i}] needs a name and an input_schema")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                      "parameters": t["input_schema"]}})
    return out


def _tool_choice(choice: dict[str, Any] | None, params: dict[str, Any], has_tools: bool) -> str | None:
    """Anthropic's ``tool_choice`` (auto, any, tool, none; ``disable_parallel_tool_use``) in the chat layer's form;
    parallel calls are allowed unless disabled, as Anthropic's API does."""
    if has_tools:
        params["parallel_tool_calls"] = not (choice or {}).get("disable_parallel_tool_use", False)
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "tool":
        if not isinstance(choice.get("name"), str) or not choice["name"]:
            raise BadRequest("`tool_choice` of type tool needs the tool's `name`")
        return f"name:{choice['name']}"
    if kind in ("auto", "any", "none"):
        return chat.normalize_tool_choice(kind)
    raise BadRequest(f"`tool_choice.type` must be auto, any, tool or none, not {kind!r}")


def _reasoning(body: dict[str, Any]) -> tuple[chat.Reasoning, int | None]:
    """``thinking`` (enabled with a budget, adaptive, disabled) and ``output_config.effort`` (the effort when
    thinking is on; max is high) as the chat layer's reasoning and budget."""
    thinking = field(body, "thinking", dict)
    effort = (field(body, "output_config", dict) or {}).get("effort")
    if effort is not None and effort not in EFFORTS:
        raise BadRequest(f"`output_config.effort` must be one of {', '.join(EFFORTS)}, not {effort!r}")
    if thinking is None:
        return None, None
    kind = thinking.get("type")
    if kind == "disabled":
        return False, None
    if kind not in ("enabled", "adaptive"):
        raise BadRequest(f"`thinking.type` must be enabled, adaptive or disabled, not {kind!r}")
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise BadRequest(f"`thinking.budget_tokens` must be a number of tokens, not {budget!r}")
    return (EFFORTS[effort] if effort else True), budget


def _output_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """Structured output: ``output_config.format`` (or the older ``output_format``), a JSON schema."""
    fmt = (field(body, "output_config", dict) or {}).get("format") or field(body, "output_format", dict)
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest("`output_config.format` must be {\"type\": \"json_schema\", \"schema\": {...}}")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_request(body: dict[str, Any]) -> chat.ChatRequest:
    for name, why in REFUSED.items():
        if body.get(name):
            raise BadRequest(f"`{name}` cannot be honoured by a local model ({why}); leave it out")
    params = {k: v for k, v in body.items() if k not in HONOURED and k not in IGNORED and k not in REFUSED}
    params["max_tokens"] = field(body, "max_tokens", int, required=True)
    stop = field(body, "stop_sequences", list)
    if stop:
        params["stop"] = stop
    reasoning, budget = _reasoning(body)
    given_tools = tools(field(body, "tools", list))
    choice = _tool_choice(field(body, "tool_choice", dict), params, bool(given_tools))
    return chat.ChatRequest(
        messages=messages(body.get("system"), field(body, "messages", list, required=True)),
        tools=given_tools, tool_choice=choice, response_format=_output_format(body),
        params=params, reasoning=reasoning, reasoning_budget=budget,
        loop_guard=field(body, "loop_guard", bool, default=True), max_time=body.get("max_time", "auto"))


# --- replies -----------------------------------------------------------------------------------------------------


def message_body(done: Completion, name: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.content:
        content.append({"type": "text", "text": done.content})
    for c in done.tool_calls:
        content.append({"type": "tool_use", "id": c.id or new_id("toolu_"), "name": c.name, "input": _input(c.arguments)})
    u = done.usage
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": name, "content": content,
            "stop_reason": STOP.get(done.finish_reason or "stop", "end_turn"), "stop_sequence": None,
            "usage": usage_body(u)}


def usage_body(u: Usage | None) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are those read for this request, the cached prefix apart (the prompt is
    their sum, as Anthropic counts it)."""
    if u is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens}


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"value": value}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {dumps({'type': kind, **data})}\n\n".encode()


PING = _event("ping", {})  # Anthropic's own keep-alive event


async def _sse(events: AsyncIterator[Event | Waiting], name: str) -> AsyncIterator[bytes]:
    yield _event("message_start", {"message": {
        "id": new_id("msg_"), "type": "message", "role": "assistant", "model": name, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})
    index, block = -1, ""  # the open content block: its index and type ("" none)
    calls: dict[int, int] = {}  # tool call index -> its block's index
    stop, usage = "end_turn", None
    try:
        async for ev in events:
            if ev is WAITING:  # the prompt is still being read
                yield PING
            elif type(ev) is TextDelta or type(ev) is ReasoningDelta:
                want = "text" if type(ev) is TextDelta else "thinking"
                if block != want:
                    if block:
                        yield _event("content_block_stop", {"index": index})
                    index, block = index + 1, want
                    start = {"type": "text", "text": ""} if want == "text" else \
                        {"type": "thinking", "thinking": "", "signature": ""}
                    yield _event("content_block_start", {"index": index, "content_block": start})
                delta = {"type": "text_delta", "text": ev.text} if want == "text" else \
                    {"type": "thinking_delta", "thinking": ev.text}
                yield _event("content_block_delta", {"index": index, "delta": delta})
            elif isinstance(ev, ToolCallDelta):
                if ev.index not in calls:
                    if block:
                        yield _event("content_block_stop", {"index": index})
                    index, block = index + 1, "tool_use"
                    calls[ev.index] = index
                    yield _event("content_block_start", {"index": index, "content_block": {
                        "type": "tool_use", "id": ev.id or new_id("toolu_"), "name": ev.name or "", "input": {}}})
                if ev.arguments:
                    yield _event("content_block_delta", {"index": calls[ev.index], "delta": {
                        "type": "input_json_delta", "partial_json": ev.arguments}})
            elif isinstance(ev, Finish):
                stop = STOP.get(ev.reason or "stop", "end_turn")
            elif isinstance(ev, Usage):
                usage = ev
    except Exception as exc:  # after the first event: an error event in the stream (the status was sent)
        report(exc, "/v1/messages (streaming)")
        yield stream_error(exc)
        return
    if block:
        yield _event("content_block_stop", {"index": index})
    yield _event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage_body(usage)})
    yield _event("message_stop", {})


async def create(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = model_name(body)
    with reading():
        req = chat_request(body)
        req.time_bound  # noqa: B018 - checks max_time now: a bad one is the request's error
    vision = has_media(req.messages)
    if not field(body, "stream", bool, default=False):
        async with gw.pool.use(name, vision=vision) as engine:
            done = await chat.acomplete(engine, req)
        return JSONResponse(message_body(done, name))
    opened = await open_events(gw.pool.use(name, vision=vision), lambda engine: chat.astream(engine, req),
                               wait=gw.settings.keepalive)
    return streaming(_sse(opened.events(), name), opened, "text/event-stream")


async def count_tokens(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = model_name(body)
    payload: dict[str, Any] = {"messages": messages(body.get("system"), field(body, "messages", list, required=True))}
    if body.get("tools"):
        payload["tools"] = tools(field(body, "tools", list))
    async with gw.pool.use(name) as engine:
        n = await engine.acount_prompt_tokens(payload)
    return JSONResponse({"input_tokens": n})
