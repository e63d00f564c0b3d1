"""Tool calls: the enforcement schema for required/named tool choice, and healing of calls written as text.

llama-server does not enforce ``tool_choice="required"`` or a named choice for every template, but it does enforce
a JSON schema by grammar. So a forced choice becomes a ``response_format`` whose schema only admits
``{"name": <allowed tool>, "arguments": <its parameters>}``; the reply is turned back into a real tool call.
Small models also often write calls as text (``<tool_call>{...}</tool_call>``, ``<function=name>...``, bare or
fenced JSON); :func:`heal_tool_calls` recovers those when ``tool_choice`` is "auto".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text

    def args(self) -> dict[str, Any]:
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_name(tool: dict[str, Any]) -> str:
    return str((tool.get("function") or tool).get("name"))


def forced_schema(tools: list[dict[str, Any]], names: list[str] | None = None) -> dict[str, Any]:
    """``response_format`` that admits exactly one call of one of ``names`` (default: every tool)."""
    allowed = [t for t in tools if names is None or tool_name(t) in names]
    if not allowed:
        raise ValueError(f"tool_choice names {names}, but the bound tools are {[tool_name(t) for t in tools]}")
    options = []
    for t in allowed:
        fn = t.get("function") or t
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"]})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "strict": True, "schema": schema}}


# Linear-time patterns: no ``\s*`` next to a lazy group (quadratic backtracking on long whitespace runs) and a
# parameter body never crosses the next ``<parameter=`` (quadratic on many unclosed tags); bodies are stripped after.
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_FUNCTION = re.compile(r"<function=([\w.\-]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([\w.\-]+)>((?:(?!<parameter=).)*?)</parameter>", re.S)
_FENCE = re.compile(r"^```(?:json|tool_call|tool_code)?(.*?)```$", re.S)
_FENCE_MARK = re.compile(r"```(?:json|tool_call|tool_code)?")
_PREFIXES = ("{", "[", "```", "<tool_call>", "<function=")


def could_be_tool_call(text: str) -> bool:
    """While streaming: can text that starts like this still turn out to be a tool call?"""
    s = text.lstrip()
    if not s:
        return True
    return any(s.startswith(p) or p.startswith(s) for p in _PREFIXES)


def heal_tool_calls(text: str, tool_names: set[str]) -> list[ToolCall] | None:
    """Tool calls the model wrote as text, or None when ``text`` is not (only) tool calls of bound tools."""
    s = text.strip()
    if not s:
        return None
    calls: list[ToolCall] = []
    if s.startswith("<tool_call>"):
        for body in _TAGGED.findall(s):
            calls += _from_json_text(body.strip(), tool_names) or []
    elif s.startswith("<function="):
        for name, body in _FUNCTION.findall(s):
            if name not in tool_names:
                return None
            body = body.strip()
            params = _PARAMETER.findall(body)
            if params:
                args: Any = {k: _scalar(v.strip()) for k, v in params}
            else:
                args = _loads(body) if body else {}
            if not isinstance(args, dict):
                return None
            calls.append(ToolCall(new_call_id(), name, json.dumps(args)))
    else:
        m = _FENCE.match(s)
        calls = _from_json_text(m.group(1) if m else s, tool_names) or []
    return _unique(calls) or None


def _json_values(text: str) -> list[Any] | None:
    """One JSON value, or several written one after another (JSON lines), or None when the text is not JSON."""
    value = _loads(text)
    if value is not None or text == "null":
        return value if isinstance(value, list) else [value]
    text = _FENCE_MARK.sub("", text)  # a bare call and a fenced copy of it, as small models write them
    values, pos, decoder = [], 0, json.JSONDecoder()
    while pos < len(text):
        try:
            value, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        values.append(value)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
    return values or None


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """What makes two calls the same call: the name and the arguments as canonical JSON."""
    args = _loads(arguments or "{}")
    return name, json.dumps(args, sort_keys=True) if args is not None else arguments


def _from_json_text(text: str, tool_names: set[str]) -> list[ToolCall] | None:
    items = _json_values(text.strip())
    if items is None:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return None
        if "function" in item and isinstance(item["function"], dict):  # OpenAI-shaped
            item = item["function"]
        name = item.get("name")
        args = item.get("arguments", item.get("parameters", {}))
        if not isinstance(name, str) or name not in tool_names:  # a list or dict name is unhashable
            return None
        if isinstance(args, str):
            parsed = _loads(args)
            args = parsed if isinstance(parsed, dict) else None
        if not isinstance(args, dict):
            return None
        calls.append(ToolCall(new_call_id(), str(name), json.dumps(args)))
    return _unique(calls) or None


def _unique(calls: list[ToolCall]) -> list[ToolCall]:
    """Identical calls once (small models write the same call on two lines)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for c in calls:
        key = call_key(c.name, c.arguments)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def answered_calls(messages: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The calls of the conversation whose results are already in it (an assistant call + a tool message)."""
    results = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    keys = set()
    for m in messages:
        for tc in m.get("tool_calls") or () if m.get("role") == "assistant" else ():
            fn = tc.get("function") or {}
            if tc.get("id") in results:
                args = fn.get("arguments")
                keys.add(call_key(str(fn.get("name")), args if isinstance(args, str) else json.dumps(args or {})))
    return keys


def only_repeats(text: str, answered: set[tuple[str, str]]) -> bool:
    """Whether ``text`` is JSON that only repeats answered calls, perhaps with echoes of their results (the 0.5B
    test model writes ``{"name": ..., "arguments": ...}`` then ``{"response": ...}`` after a tool result)."""
    s = text.strip()
    m = _FENCE.match(s)
    values = _json_values((m.group(1) if m else s).strip())
    if not values or not all(isinstance(v, dict) for v in values):
        return False
    calls = [v for v in values if isinstance(v.get("name"), str) and "arguments" in v]
    keys = {call_key(c["name"], c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"]))
            for c in calls}
    return bool(keys) and keys <= answered


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None


def _scalar(text: str) -> Any:
    value = _loads(text)
    return text if value is None and text != "null" else value


def parse_forced(text: str) -> ToolCall | None:
    """The call in a reply produced under :func:`forced_schema`."""
    value = _loads(text.strip())
    if not isinstance(value, dict) or "name" not in value:
        return None
    args = value.get("arguments", {})
    return ToolCall(new_call_id(), str(value["name"]), json.dumps(args if isinstance(args, dict) else {}))
