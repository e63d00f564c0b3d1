"""OpenAI's Responses API: ``POST /v1/responses`` (streamed or not: text, function tools, structured output,
reasoning, images), ``GET`` and ``DELETE /v1/responses/{id}``. Input items are translated into the chat layer's
(OpenAI chat-shaped) messages, its events into Response output items and stream events; ``store`` keeps a response
in the gateway's :class:`~.responses_store.ResponseStore`, which ``previous_response_id`` continues.

:data:`FIELDS` says what becomes of each request field; docs/gateway.md has it in brief.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import chat
from ..events import Completion, Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from ..tools import tool_name
from . import openai
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
from .responses_store import Missing, Record, owner_of

if TYPE_CHECKING:
    from .state import Gateway

log = logging.getLogger(__name__)

# Every request field of the Responses API (and the gateway's own), and what becomes of it: honoured, accepted and
# ignored, or refused (a 400) when set. A field in none of these goes to llama-server as it is (its own sampling
# fields: top_k, min_p, repeat_penalty, seed, ...).
FIELDS: dict[str, tuple[str, str]] = {
    "model": ("honoured", "the local model (or an alias)"),
    "input": ("honoured", "a text, or items: messages (user, assistant, system, developer; text, images, audio), "
                          "function_call, function_call_output, reasoning"),
    "instructions": ("honoured", "the leading system message, before the leading system/developer items; not "
                                 "carried over by previous_response_id"),
    "stream": ("honoured", "server-sent events"),
    "tools": ("honoured", "function tools, and namespace tools' functions (offered by their own names); web_search "
                          "accepted and not offered (Codex always sends it); any other hosted tool refused"),
    "tool_choice": ("honoured", "auto, none, required, {type: function, name}, {type: allowed_tools}"),
    "parallel_tool_calls": ("honoured", "passed to llama-server (default true)"),
    "text": ("honoured", "format: text, json_object, json_schema (the reply is constrained); verbosity ignored"),
    "reasoning": ("honoured", "effort: none/minimal off, low/medium/high, any other on; summary ignored: the "
                              "reasoning is given whole, as reasoning_text"),
    "max_output_tokens": ("honoured", "max_tokens"),
    "temperature": ("honoured", "passed to llama-server"),
    "top_p": ("honoured", "passed to llama-server"),
    "store": ("honoured", "default true: kept in the gateway's store (bounded)"),
    "previous_response_id": ("honoured", "the stored conversation, then this input"),
    "metadata": ("honoured", "kept with the response and returned"),
    "max_time": ("honoured", "the gateway's time bound on the reply (seconds, null, \"auto\")"),
    "loop_guard": ("honoured", "the gateway's loop guard (default true)"),
    "include": ("ignored", "nothing is encrypted or held back: reasoning items carry their text"),
    "user": ("ignored", "returned only"),
    "safety_identifier": ("ignored", "returned only"),
    "prompt_cache_key": ("ignored", "llama-server reuses a cached prefix by itself"),
    "prompt_cache_retention": ("ignored", "llama-server reuses a cached prefix by itself"),
    "prompt_cache_options": ("ignored", "llama-server reuses a cached prefix by itself"),
    "service_tier": ("ignored", "one tier"),
    "truncation": ("ignored", "nothing is truncated: a prompt over the context is refused (context_length_exceeded)"),
    "context_management": ("ignored", "nothing is compacted: a prompt over the context is refused"),
    "stream_options": ("ignored", "no obfuscation padding is sent"),
    "max_tool_calls": ("ignored", "it bounds hosted tools' calls, and none run here"),
    "client_metadata": ("ignored", "Codex's session ids"),
    "background": ("refused", "background responses are not run here; send the request and wait"),
    "conversation": ("refused", "the Conversations API is not served here; continue with previous_response_id"),
    "prompt": ("refused", "stored prompt templates live on OpenAI's servers; send the text as input"),
    "moderation": ("refused", "no moderation model runs here"),
    "top_logprobs": ("refused", "token log-probabilities are not returned here"),
    "n": ("refused", "one response per request"),
}
# Hosted tools a client sends whatever the model: accepted and left out of the prompt (noted in the log once).
_PASSED = frozenset({"temperature", "top_p"})  # honoured fields that go to llama-server as they are
NOT_OFFERED = {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
_noted: set[str] = set()


class Invalid(BadRequest):
    """A request error in OpenAI's shape with its ``param`` and ``code`` (``status``: 400, or 404 for an id)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


def error(exc: BaseException) -> JSONResponse:
    body = openai.error_body(exc)
    if isinstance(exc, Invalid):
        body["error"].update(param=exc.param, code=exc.code)
        return JSONResponse(body, status_code=exc.status)
    return JSONResponse(body, status_code=kind_of(exc)[0])


SCOPE_KEY = "gguf_provider.responses"  # the ASGI scope's entry holding a stream's numbering (for the stop's event)


def stream_error(exc: BaseException, at: int = 0) -> bytes:
    """The ``error`` event that ends a stream already started (the gateway stops), numbered ``at``."""
    err = openai.error_body(exc)["error"]
    return _event("error", {"sequence_number": at, "code": err["code"] or err["type"], "message": err["message"],
                            "param": None})


# --- requests ----------------------------------------------------------------------------------------------------


def _refused(name: str, value: Any) -> bool:
    if name == "background":
        return value is True
    if name == "top_logprobs":
        return bool(value)
    if name == "n":
        return value not in (None, 1)
    return value is not None


def input_items(given: Any) -> list[dict[str, Any]]:
    """``input`` as a list of items (a text is one user message)."""
    if given is None:
        return []
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    if not isinstance(given, list) or not all(isinstance(i, dict) for i in given):
        raise Invalid("`input` must be a text or a list of items", param="input")
    return given


def _texts(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """The text of a string or of a list of text parts (``kinds``), joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Invalid(f"{where} must be a text or a list of parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise Invalid(f"{where}[{j}]: a {kind!r} part is not taken here (only {', '.join(kinds)})",
                          param=f"{where}[{j}]")
        out.append(str(part.get("refusal" if kind == "refusal" else "text") or ""))
    return "\n".join(out)


_TEXT = ("input_text", "output_text", "text")


def _user_content(content: Any, where: str) -> Any:
    """A user message's content: a text, or chat parts (text, image_url, input_audio)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Invalid(f"{where} must be a text or a list of parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}[{j}]"
        if kind in _TEXT:
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind == "input_image":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str) or not url:
                raise Invalid(f"{at}: an input_image needs its image_url (a data: URL or an http(s) URL); file ids "
                              "are not stored here", param=at)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "input_audio":
            parts.append({"type": "input_audio", "input_audio": part.get("input_audio")})
        else:
            raise Invalid(f"{at}: a {kind!r} part is not taken here" + (
                " (send the file's text as input_text)" if kind == "input_file" else ""), param=at)
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


class _Messages:
    """Items folded into chat messages: assistant-side items in a row (reasoning, a message, function calls)
    become one assistant message, as a chat reply holds them."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.systems: list[str] = []  # the leading system/developer items
        self.leading = True
        self.reply: dict[str, Any] | None = None  # the assistant message being put together

    def flush(self) -> None:
        if self.reply is not None:
            self.out.append(self.reply)
            self.reply = None

    def assistant(self, fresh: bool) -> dict[str, Any]:
        """The assistant message to add to; ``fresh``: a new one when the current holds an answer or calls."""
        self.leading = False
        if self.reply is not None and fresh and (self.reply["content"] or "tool_calls" in self.reply):
            self.flush()
        if self.reply is None:
            self.reply = {"role": "assistant", "content": ""}
        return self.reply

    def add(self, item: dict[str, Any], where: str) -> None:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            call = {"id": str(item.get("call_id") or ""), "type": "function",
                    "function": {"name": str(item.get("name") or ""), "arguments": _arguments(item.get("arguments"))}}
            self.assistant(fresh=False).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            self.flush()
            self.leading = False
            out = item.get("output")
            self.out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                             "content": _texts(out if out is not None else "", f"{where}.output", ("input_text",))})
        elif kind == "reasoning":
            text = "\n".join(str(p.get("text") or "") for p in (item.get("content") or item.get("summary") or [])
                             if isinstance(p, dict))
            reply = self.assistant(fresh=True)
            reply["reasoning_content"] = "\n".join(t for t in (reply.get("reasoning_content"), text) if t)
        else:
            raise Invalid(f"{where}: a {kind!r} item is not taken here (messages, function_call, "
                          "function_call_output and reasoning items are)", param=f"{where}.type")

    def _message(self, item: dict[str, Any], where: str) -> None:
        role, content = item.get("role"), item.get("content")
        if role in ("system", "developer"):
            text = _texts(content, f"{where}.content", _TEXT)
            self.flush()
            if self.leading:
                self.systems.append(text)
            else:  # where it was sent: the chat template decides
                self.out.append({"role": "system", "content": text})
        elif role == "user":
            self.flush()
            self.leading = False
            self.out.append({"role": "user", "content": _user_content(content, f"{where}.content")})
        elif role == "assistant":
            text = _texts(content, f"{where}.content", (*_TEXT, "refusal"))
            reply = self.assistant(fresh=True)
            reply["content"] = text
        else:
            raise Invalid(f"{where}.role must be user, assistant, system or developer, not {role!r}",
                          param=f"{where}.role")


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """The items as chat messages: ``instructions`` and the leading system/developer items joined into one
    leading system message (chat templates take it first); the same items always give the same messages, so a
    continued conversation's prompt starts as the last one did (llama-server's prompt cache reuses it)."""
    fold = _Messages()
    for i, item in enumerate(items):
        fold.add(item, f"input[{i}]")
    fold.flush()
    systems = [instructions, *fold.systems] if instructions else fold.systems
    if systems:
        return [{"role": "system", "content": "\n\n".join(systems)}, *fold.out]
    return fold.out


def tools(given: list[Any] | None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Function tools (and namespace tools' functions) as chat tools, with each namespaced function's namespace;
    a hosted tool is refused by its type, except those of :data:`NOT_OFFERED`, left out."""
    out: list[dict[str, Any]] = []
    spaces: dict[str, str] = {}
    for i, t in enumerate(given or ()):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function":
            out.append(_function(t, f"tools[{i}]"))
        elif kind == "namespace" and isinstance(t.get("tools"), list):
            for j, f in enumerate(t["tools"]):
                at = f"tools[{i}].tools[{j}]"
                if not isinstance(f, dict) or f.get("type", "function") != "function":
                    raise Invalid(f"{at}: a namespace holds function tools here", param=f"{at}.type")
                out.append(_function(f, at))
                spaces[out[-1]["function"]["name"]] = str(t.get("name") or "")
        elif kind in NOT_OFFERED:
            if kind not in _noted:
                _noted.add(kind)
                log.info("gateway: /v1/responses: a %s tool was sent; no search runs here, so the model is not "
                         "offered it", kind)
        else:
            raise Invalid(f"tools[{i}] is the hosted tool type {kind!r}, which runs on OpenAI's servers; this "
                          "gateway runs none: leave it out, or declare a function tool", param=f"tools[{i}].type")
    names = [tool_name(t) for t in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Invalid(f"tools: the function name(s) {', '.join(twice)} are declared twice", param="tools")
    return out, spaces


def _function(t: dict[str, Any], where: str) -> dict[str, Any]:
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise Invalid(f"{where} needs a name", param=f"{where}.name")
    params = t.get("parameters")
    return {"type": "function", "function": {"name": name, "description": str(t.get("description") or ""),
                                             "parameters": params if isinstance(params, dict) else
                                             {"type": "object", "properties": {}}}}


def tool_choice(choice: Any, offered: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """``tool_choice`` in the chat layer's form, and the tools it leaves (``allowed_tools`` narrows them)."""
    names = {tool_name(t) for t in offered}
    if choice is None or choice in ("auto", "none", "required"):
        return chat.normalize_tool_choice(choice), offered
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        name = choice.get("name")
        if name not in names:
            raise Invalid(f"tool_choice names the function {name!r}, which is not in tools", param="tool_choice")
        return f"name:{name}", offered
    if kind == "allowed_tools":
        allowed = {t.get("name") for t in choice.get("tools") or () if isinstance(t, dict)}
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required") or not allowed <= names:
            raise Invalid("tool_choice.allowed_tools: mode must be auto or required, and its tools among tools",
                          param="tool_choice")
        return chat.normalize_tool_choice(mode), [t for t in offered if tool_name(t) in allowed]
    if isinstance(choice, str):
        raise Invalid(f"tool_choice must be auto, none, required or an object, not {choice!r}", param="tool_choice")
    raise Invalid(f"tool_choice of type {kind!r} is not a function tool's; this gateway runs function tools only",
                  param="tool_choice")


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` in llama-server's chat-completions ``response_format``."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema: dict[str, Any] = {"name": str(fmt.get("name") or "output"), "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = bool(fmt["strict"])
        return {"type": "json_schema", "json_schema": schema}
    raise Invalid("text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                  "\"json_schema\", \"name\": ..., \"schema\": {...}}", param="text.format")


@dataclass
class Turn:
    """A request read: the chat request, and what its Response object and stored record need."""

    req: chat.ChatRequest
    input: list[dict[str, Any]]  # this request's input items (what is stored)
    echo: dict[str, Any]  # the request's fields the Response object repeats
    spaces: dict[str, str] = dataclass_field(default_factory=dict)  # function name -> its namespace
    store: bool = True


def read(body: dict[str, Any], history: list[dict[str, Any]]) -> Turn:
    """The request ``body`` continuing the conversation ``history`` (its stored items, none for a new one)."""
    for name, (rule, why) in FIELDS.items():
        if rule == "refused" and _refused(name, body.get(name)):
            raise Invalid(f"`{name}` cannot be honoured by a local model ({why}); leave it out", param=name)
    params = {k: v for k, v in body.items() if k not in FIELDS or k in _PASSED}
    params["max_tokens"] = field(body, "max_output_tokens", int)
    given = input_items(body.get("input"))
    instructions = field(body, "instructions", str)
    msgs = messages([*history, *given], instructions)
    if not msgs:
        raise Invalid("`input` is required", param="input")
    offered, spaces = tools(field(body, "tools", list))
    choice, offered = tool_choice(body.get("tool_choice"), offered)
    text = field(body, "text", dict)
    reasoning = field(body, "reasoning", dict) or {}
    if offered:
        params["parallel_tool_calls"] = field(body, "parallel_tool_calls", bool, default=True)
    store = field(body, "store", bool, default=True)
    req = chat.ChatRequest(messages=msgs, tools=offered, tool_choice=choice, response_format=response_format(text),
                           params=params, reasoning=openai.reasoning_of(reasoning.get("effort")),
                           loop_guard=field(body, "loop_guard", bool, default=True),
                           max_time=body.get("max_time", "auto"))
    return Turn(req, given, _echo(body, store), spaces, store)


def _echo(body: dict[str, Any], store: bool) -> dict[str, Any]:
    reasoning = body.get("reasoning") or {}
    text = body.get("text") or {}
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": body.get("safety_identifier"), "service_tier": "default", "store": store,
            "temperature": body.get("temperature"),
            "text": {"format": text.get("format") or {"type": "text"}, "verbosity": text.get("verbosity", "medium")},
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "top_logprobs": 0, "top_p": body.get("top_p"), "truncation": body.get("truncation") or "disabled",
            "user": body.get("user")}


# --- replies -----------------------------------------------------------------------------------------------------


def cut(reason: str | None) -> bool:
    """Whether a reply that ended for ``reason`` was cut (max_output_tokens, the context's end, the loop guard, the
    time bound): the response is then incomplete."""
    return reason in ("length", "repetition")


def response_object(turn: Turn, name: str, rid: str, created: int, *, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    e = turn.echo
    return {"id": rid, "object": "response", "created_at": created, "status": status, "background": False,
            "completed_at": now() if status in ("completed", "incomplete") else None, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": e["instructions"], "max_output_tokens": e["max_output_tokens"],
            "max_tool_calls": e["max_tool_calls"], "model": name, "output": output,
            "parallel_tool_calls": e["parallel_tool_calls"], "previous_response_id": e["previous_response_id"],
            "prompt_cache_key": e["prompt_cache_key"], "reasoning": e["reasoning"],
            "safety_identifier": e["safety_identifier"], "service_tier": e["service_tier"], "store": e["store"],
            "temperature": e["temperature"], "text": e["text"], "tool_choice": e["tool_choice"], "tools": e["tools"],
            "top_logprobs": e["top_logprobs"], "top_p": e["top_p"], "truncation": e["truncation"], "usage": usage,
            "user": e["user"], "metadata": e["metadata"]}


def usage_body(u: Usage | None, reasoning_chars: int = 0, other_chars: int = 0) -> dict[str, Any]:
    """OpenAI's usage. llama-server counts the reply's tokens as one number: ``reasoning_tokens`` is its share
    by characters (an estimate). No prompt is written to a cache here as OpenAI bills it (cache_write_tokens 0)."""
    if u is None:
        u = Usage(0, 0, 0)
    total = reasoning_chars + other_chars
    reasoning = round(u.completion_tokens * reasoning_chars / total) if total else 0
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": u.total_tokens}


def message_item(id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning_item(id: str, text: str, status: str) -> dict[str, Any]:
    """The model's reasoning, whole, as ``reasoning_text`` content (no summary is made)."""
    return {"type": "reasoning", "id": id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(id: str, call_id: str, name: str, arguments: str, status: str, spaces: dict[str, str]) -> dict[str, Any]:
    item = {"type": "function_call", "id": id, "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}
    if name in spaces:
        item["namespace"] = spaces[name]
    return item


def output_items(done: Completion, spaces: dict[str, str]) -> list[dict[str, Any]]:
    """A whole reply's output items: its reasoning, its answer (an empty one when it has neither answer nor
    calls), its function calls; the last is incomplete when the reply was cut."""
    items: list[dict[str, Any]] = []
    if done.reasoning:
        items.append(reasoning_item(new_id("rs_"), done.reasoning, "completed"))
    if done.content or not done.tool_calls:
        items.append(message_item(new_id("msg_"), done.content, "completed"))
    for c in done.tool_calls:
        items.append(call_item(new_id("fc_"), c.id or new_id("call_"), c.name, c.arguments, "completed", spaces))
    if cut(done.finish_reason):
        items[-1]["status"] = "incomplete"
    return items


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {dumps({'type': kind, **data})}\n\n".encode()


class _Stream:
    """One response's stream: its events numbered, its output items as they are built (one open at a time)."""

    def __init__(self, turn: Turn, name: str) -> None:
        self.turn, self.name = turn, name
        self.id, self.created = new_id("resp_"), now()
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.open = ""  # the open item's kind: "message", "reasoning", "call" ("" none)
        self.parts: list[str] = []  # the open message's or reasoning's text
        self.calls: dict[int, int] = {}  # tool call index -> its output index
        self.reasoning_chars = self.other_chars = 0

    def event(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        return _event(kind, {"sequence_number": self.seq - 1, **data})

    def response(self, status: str, **more: Any) -> dict[str, Any]:
        return response_object(self.turn, self.name, self.id, self.created, status=status, output=self.items,
                               **more)

    def start(self) -> bytes:
        return (self.event("response.created", response=self.response("in_progress"))
                + self.event("response.in_progress", response=self.response("in_progress")))

    def text(self, kind: str, delta: str) -> bytes:
        """A text delta of a message (``kind`` "message") or of the reasoning, opening its item first if needed."""
        head = b"" if self.open == kind else self.close() + self.open_item(kind)
        self.parts.append(delta)
        where = len(self.items) - 1
        event = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        more = ',"logprobs":[]' if kind == "message" else ""
        n, self.seq = self.seq, self.seq + 1
        # per token: written here, not through dumps of a dict
        return head + (f'event: {event}\ndata: {{"type":"{event}","sequence_number":{n},"item_id":'
                       f'"{self.items[where]["id"]}","output_index":{where},"content_index":0,"delta":'
                       f'{json.dumps(delta, ensure_ascii=False)}{more}}}\n\n').encode()

    def open_item(self, kind: str) -> bytes:
        """A message's or the reasoning's item added, and its one content part."""
        self.open, self.parts = kind, []
        item = message_item(new_id("msg_"), "", "in_progress") if kind == "message" else \
            reasoning_item(new_id("rs_"), "", "in_progress")
        item["content"] = []
        self.items.append(item)
        where = len(self.items) - 1
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []} if kind == "message" else \
            {"type": "reasoning_text", "text": ""}
        return (self.event("response.output_item.added", output_index=where, item=item)
                + self.event("response.content_part.added", item_id=item["id"], output_index=where, content_index=0,
                             part=part))

    def call(self, ev: ToolCallDelta) -> bytes:
        """A function call's fragment: its item added at the first, its arguments' delta."""
        head = b""
        if ev.index not in self.calls:
            head = self.close()
            name = ev.name or ""
            self.items.append(call_item(new_id("fc_"), ev.id or new_id("call_"), name, "", "in_progress",
                                        self.turn.spaces))
            self.calls[ev.index] = len(self.items) - 1
            self.open = "call"
            head += self.event("response.output_item.added", output_index=len(self.items) - 1, item=self.items[-1])
        if not ev.arguments:
            return head
        where = self.calls[ev.index]
        item = self.items[where]
        item["arguments"] += ev.arguments
        self.other_chars += len(ev.arguments)
        return head + self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=where,
                                 delta=ev.arguments)

    def close(self, status: str = "completed") -> bytes:
        """The open item's done events (b"" when none is open)."""
        kind, self.open = self.open, ""
        if not kind:
            return b""
        where = len(self.items) - 1
        item = self.items[where]
        item["status"] = status
        if kind == "call":
            return (self.event("response.function_call_arguments.done", item_id=item["id"], output_index=where,
                               arguments=item["arguments"], name=item["name"])
                    + self.event("response.output_item.done", output_index=where, item=item))
        text = "".join(self.parts)
        at = {"item_id": item["id"], "output_index": where, "content_index": 0}
        if kind == "message":
            self.other_chars += len(text)
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = self.event("response.output_text.done", **at, text=text, logprobs=[])
        else:
            self.reasoning_chars += len(text)
            part = {"type": "reasoning_text", "text": text}
            done = self.event("response.reasoning_text.done", **at, text=text)
        item["content"] = [part]
        return done + self.event("response.content_part.done", **at, part=part) + \
            self.event("response.output_item.done", output_index=where, item=item)


async def _sse(events: AsyncIterator[Event | Waiting], out: _Stream, gw: Gateway, owner: str) -> AsyncIterator[bytes]:
    yield out.start()
    reason: str | None = None
    usage: Usage | None = None
    try:
        async for ev in events:
            if type(ev) is TextDelta:
                yield out.text("message", ev.text)
            elif type(ev) is ReasoningDelta:
                yield out.text("reasoning", ev.text)
            elif isinstance(ev, ToolCallDelta):
                chunk = out.call(ev)
                if chunk:
                    yield chunk
            elif isinstance(ev, Finish):
                reason = ev.reason
            elif isinstance(ev, Usage):
                usage = ev
            elif isinstance(ev, Waiting):
                # the prompt is still being read: an event, not an SSE comment, for Codex counts only events
                # against its idle timeout (300 s)
                yield out.event("response.in_progress", response=out.response("in_progress"))
    except Exception as exc:  # after the head: the response failed (the status was sent)
        report(exc, "/v1/responses (streaming)")
        yield out.close("incomplete") + out.event("response.failed", response=out.response(
            "failed", error=_failure(exc)))
        return
    status = "incomplete" if cut(reason) else "completed"
    tail = out.close(status)
    if not out.items:  # nothing came: an empty answer, as a whole reply has
        tail += out.open_item("message") + out.close(status)
    done = out.response(status, usage=usage_body(usage, out.reasoning_chars, out.other_chars))
    _keep(gw, owner, out.turn, done)
    yield tail + out.event(f"response.{status}", response=done)


def _failure(exc: BaseException) -> dict[str, str]:
    """A failed response's ``error``: Codex reads context_length_exceeded; the rest it may retry."""
    kind = kind_of(exc)[1]
    code = "context_length_exceeded" if kind == "context_length_exceeded" else \
        "invalid_prompt" if kind == "bad_request" else "server_error"
    return {"code": code, "message": message_of(exc)}


# --- the store ---------------------------------------------------------------------------------------------------


def _owner(gw: Gateway) -> str:
    """The store's owner of this gateway's requests: its API key's hash (the guard let in only that key)."""
    return owner_of(gw.settings.api_key)


def history(gw: Gateway, owner: str, previous: str | None) -> list[dict[str, Any]]:
    """The items of the stored conversation ``previous`` ends: each turn's input items, then its output items."""
    if previous is None:
        return []
    try:
        chain = gw.responses.chain(owner, previous)
    except Missing as exc:
        why = "" if exc.missing == previous else \
            f": the earlier response '{exc.missing}' it continues was evicted or deleted"
        raise Invalid(f"Previous response with id '{previous}' not found.{why}", param="previous_response_id",
                      code="previous_response_not_found") from None
    return [item for rec in chain for item in (*rec.input, *rec.response["output"])]


def _keep(gw: Gateway, owner: str, turn: Turn, response: dict[str, Any]) -> None:
    if turn.store:
        gw.responses.put(Record(response["id"], owner, turn.echo["previous_response_id"], turn.input, response))


# --- endpoints ---------------------------------------------------------------------------------------------------


async def create(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = model_name(body)
    owner = _owner(gw)
    with reading():
        turn = read(body, history(gw, owner, field(body, "previous_response_id", str)))
        turn.req.time_bound  # noqa: B018 - checks max_time now: a bad one is the request's error
    req = turn.req
    vision = has_media(req.messages)
    if not field(body, "stream", bool, default=False):
        async with gw.pool.use(name, vision=vision) as engine:
            done = await chat.acomplete(engine, req)
        calls = sum(len(c.arguments) for c in done.tool_calls)
        response = response_object(turn, name, new_id("resp_"), now(),
                                   status="incomplete" if cut(done.finish_reason) else "completed",
                                   output=output_items(done, turn.spaces),
                                   usage=usage_body(done.usage, len(done.reasoning), len(done.content) + calls))
        _keep(gw, owner, turn, response)
        return JSONResponse(response)
    opened = await open_events(gw.pool.use(name, vision=vision), lambda engine: chat.astream(engine, req),
                               wait=gw.settings.keepalive)
    out = _Stream(turn, name)
    request.scope[SCOPE_KEY] = out  # the stop's error event follows its numbering (app._stream_error)
    return streaming(_sse(opened.events(), out, gw, owner), opened, "text/event-stream")


def _not_found(id: str) -> Invalid:
    return Invalid(f"Response with id '{id}' not found.", param="response_id", code=None, status=404)


async def retrieve(gw: Gateway, request: Request) -> Response:
    id = request.path_params["id"]
    rec = gw.responses.get(_owner(gw), id)
    if rec is None:
        raise _not_found(id)
    return JSONResponse(rec.response)


def listed_item(item: dict[str, Any], response_id: str, index: int) -> dict[str, Any]:
    """An input item as OpenAI lists it: with an id (the client's, else one made from the response's and the item's
    place), a message's text content as parts (``input_text``; an assistant's ``output_text``), a status."""
    out = dict(item)
    kind = out.setdefault("type", "message")
    if not out.get("id"):
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
        out["id"] = f"{prefix}_{hashlib.sha256(f'{response_id}/{index}'.encode()).hexdigest()[:40]}"
    if kind == "message":
        part = "output_text" if out.get("role") == "assistant" else "input_text"
        content = out.get("content")
        if isinstance(content, str):
            out["content"] = [{"type": part, "text": content, **({"annotations": []} if part == "output_text"
                                                                  else {})}]
        out.setdefault("status", "completed")
    return out


async def list_input_items(gw: Gateway, request: Request) -> Response:
    """``GET /v1/responses/{id}/input_items``: the input items of that request, ``order`` (desc by default),
    ``after`` (an item id), ``limit`` (1-100, 20); ``include`` is taken and changes nothing (the items are whole)."""
    id = request.path_params["id"]
    rec = gw.responses.get(_owner(gw), id)
    if rec is None:
        raise _not_found(id)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise Invalid(f"`order` must be 'asc' or 'desc', not {order!r}", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise Invalid(f"`limit` must be a whole number from 1 to 100, not {q.get('limit')!r}", param="limit")
    items = [listed_item(item, id, i) for i, item in enumerate(rec.input)]
    if order == "desc":
        items.reverse()
    after = q.get("after")
    if after:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise Invalid(f"No input item with id '{after}' in response '{id}'.", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})


async def delete(gw: Gateway, request: Request) -> Response:
    id = request.path_params["id"]
    if not gw.responses.delete(_owner(gw), id):
        raise _not_found(id)
    return JSONResponse({"id": id, "object": "response", "deleted": True})
