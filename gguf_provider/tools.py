"""Tool calls: the enforcement schema for required/named tool choice, and healing of calls written as text.

llama-server does not enforce ``tool_choice="required"`` or a named choice for every template, but it does enforce
a JSON schema by grammar. So a forced choice becomes a ``response_format`` whose schema only admits
``{"name": <allowed tool>, "arguments": <its parameters>}``; the reply is turned back into a real tool call.
Small models also often write calls as text (``<tool_call>{...}</tool_call>``, Qwen3-Coder XML ``<function=name>``
with or without its closing tags, bare or fenced JSON), or llama-server's parser leaves them there (a template it
has no tool format for); :func:`heal_tool_calls` recovers those when ``tool_choice`` is "auto", also after prose.
:func:`function_tool` makes a tool's schema from a Python function (the magics' ``--tools``).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
import uuid
from collections.abc import Callable
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
_FENCE = re.compile(r"^```(?:json|tool_call|tool_code)?(.*?)```$", re.S)
_FENCE_MARK = re.compile(r"```(?:json|tool_call|tool_code)?")
_PREFIXES = ("{", "[", "```", "<tool_call>", "<function=")
# Qwen3-Coder / Qwen3.5 XML (models/templates/Qwen3-Coder.jinja): ``<tool_call>`` (optional) ``<function=name>``
# ``<parameter=x>value</parameter>`` ``</function></tool_call>``; small models leave any closing tag out, so a
# value ends at its ``</parameter>`` or at the next tag, whichever comes first.
_FUNCTION_TAG = re.compile(r"<function=([\w.\-]+)>")
_PARAMETER = re.compile(r"<parameter=([\w.\-]+)>((?:(?!</?parameter|</function>|<function=|</?tool_call>).)*)"
                        r"(?:</parameter>)?", re.S)
_CALL_TAGS = re.compile(r"</?tool_call>|</function>")
# Where a tagged call may start after prose: at the start of the reply or after whitespace (not in `inline code`).
_MARKER = re.compile(r"(?:(?<=\s)|^)(?:<tool_call>|<function=)")
_HOLD = re.compile(r"(?:(?<=\s)|^)(?:<tool_call>|<function=)|</tool_call>")
_LEAKED = re.compile(r"</?tool_call>|<function=[\w.\-]*>?|</function>|</?parameter(?:=[\w.\-]*)?>")
_MAX_MARKERS = 16  # tagged-call candidates tried after prose (each costs a parse of the rest)


@dataclass
class Healed:
    """A reply split into its prose (leaked call tags removed) and the tool calls written after it as text."""

    content: str
    calls: list[ToolCall]


def could_be_tool_call(text: str) -> bool:
    """While streaming: can text that starts like this still turn out to be a tool call?"""
    s = text.lstrip()
    if not s:
        return True
    return any(s.startswith(p) or p.startswith(s) for p in _PREFIXES)


def marker_start(text: str) -> int:
    """While streaming prose: where a tagged call may begin in ``text`` — a ``<tool_call>`` or ``<function=`` after
    whitespace, a leaked ``</tool_call>`` anywhere, or the start of one cut at the end of ``text`` — with the
    whitespace before it; or -1. Text before that index can be shown; the rest is held until it is known."""
    m = _HOLD.search(text)
    if m:
        return _trailing_space(text, m.start())
    for p in ("<tool_call>", "<function=", "</tool_call>"):
        for k in range(min(len(p) - 1, len(text)), 0, -1):
            start = len(text) - k
            if text.endswith(p[:k]) and (start == 0 or text[start - 1].isspace() or p[1] == "/"):
                return _trailing_space(text, start)
    return _trailing_space(text, len(text)) if text[-1:].isspace() else -1


def _trailing_space(text: str, end: int) -> int:
    start = end
    while start > 0 and text[start - 1].isspace():
        start -= 1
    return start


def heal_tool_calls(text: str, tool_names: set[str], tools: list[dict[str, Any]] | None = None) -> list[ToolCall] | None:
    """Tool calls of bound tools the model wrote as text — the whole reply, or tagged calls after its prose — or
    None. ``tools`` (their JSON schemas) types XML parameter values as llama-server does: a ``string`` parameter
    stays text, others are parsed as JSON; a parameter of unknown type is JSON when it parses, else text."""
    healed = heal_reply(text, tool_names, tools)
    return healed.calls if healed else None


def heal_reply(text: str, tool_names: set[str], tools: list[dict[str, Any]] | None = None, *,
               cut: bool = False, after_prose: bool = False) -> Healed | None:
    """The reply as prose + tool calls (see :func:`heal_tool_calls`), or None when it holds no call of a bound
    tool. A call after prose must be tagged (``<tool_call>``, ``<function=``) and end the reply: prose that
    mentions a call, or shows one and goes on, is left alone. A reply ``cut`` by a limit (finish reason
    ``length``) is healed only when its last XML call is closed: an open value may have lost its end.
    ``after_prose``: ``text`` is what followed the prose of a streamed reply (held from its first tag on)."""
    s = text.strip()
    if not s or (cut and "<function=" in s and not s.endswith(("</function>", "</tool_call>"))):
        return None
    types = _parameter_types(tools)
    calls = _whole(s, tool_names, types, strict=after_prose)
    if calls:
        return Healed("", calls)
    for i, m in enumerate(_MARKER.finditer(s)):
        if i >= _MAX_MARKERS:
            break
        before = s[:m.start()]
        if before.count("```") % 2:  # inside a fenced code block: an example, not a call
            continue
        calls = _tagged(s[m.start():], tool_names, types) if before else []
        if calls:
            return Healed(_LEAKED.sub("", before).strip(), calls)
    return None


def _whole(s: str, tool_names: set[str], types: dict[str, dict[str, str]], strict: bool) -> list[ToolCall]:
    """The calls when the whole (stripped) reply is calls."""
    if s.startswith(("<tool_call>", "<function=")):
        return _tagged(s, tool_names, types, strict=strict)
    m = _FENCE.match(s)
    return _from_json_text(m.group(1) if m else s, tool_names) or []


def _tagged(s: str, tool_names: set[str], types: dict[str, dict[str, str]], strict: bool = True) -> list[ToolCall]:
    """Calls in text that starts with a tag: JSON inside ``<tool_call>`` tags, or XML functions (tagged or not),
    with nothing but call tags and whitespace around them; [] otherwise. Not ``strict`` (a reply that starts with
    the call), ``<tool_call>`` JSON keeps its old leniency: text after the calls, and bodies that are no call, are
    dropped."""
    if "<function=" not in s:
        bodies = [_CALL_TAGS.sub("", b).strip() for b in _TAGGED.findall(s)]
        if strict and (_CALL_TAGS.sub("", _TAGGED.sub("", s)).strip() or not bodies):
            return []
        calls: list[ToolCall] = []
        for body in bodies:
            found = _from_json_text(body, tool_names)
            if not found and strict:
                return []
            calls += found or []
        return _unique(calls)
    parts = _FUNCTION_TAG.split(s)  # [before, name1, body1, name2, body2, ...]
    if _CALL_TAGS.sub("", parts[0]).strip():
        return []
    calls = []
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name not in tool_names:
            return []
        end = _CALL_TAGS.search(body)  # the function ends at its </function>, or at the first call tag
        inner, after = (body[:end.start()], body[end.start():]) if end else (body, "")
        if _CALL_TAGS.sub("", after).strip():
            return []
        args = _xml_arguments(inner, types.get(name, {}))
        if args is None:
            return []
        calls.append(ToolCall(new_call_id(), name, json.dumps(args)))
    return _unique(calls)


def _xml_arguments(body: str, types: dict[str, str]) -> dict[str, Any] | None:
    """A function's arguments from its ``<parameter=…>`` tags (or a JSON object body); None when anything else
    is in it."""
    params = _PARAMETER.findall(body)
    if not params:
        text = body.strip()
        args = _loads(text) if text else {}
        return args if isinstance(args, dict) else None
    if _PARAMETER.sub("", body).strip():
        return None
    return {k: _parameter_value(v, types.get(k)) for k, v in params}


def _parameter_value(raw: str, declared: str | None) -> Any:
    """A parameter's text as its value: one newline around it dropped (the template writes ``>\nvalue\n<``),
    a one-line value stripped; a ``string`` parameter stays text, others are JSON when they parse."""
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    if "\n" not in value:
        value = value.strip()
    if declared == "string":
        return value
    return _scalar(value.strip())


def _parameter_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, str]]:
    """Each bound tool's parameters' JSON types (those with a single declared type)."""
    types: dict[str, dict[str, str]] = {}
    for t in tools or ():
        fn = t.get("function") or t
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(props, dict):
            types[str(fn.get("name"))] = {k: v["type"] for k, v in props.items()
                                          if isinstance(v, dict) and isinstance(v.get("type"), str)}
    return types


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


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
                               tuple: "array", set: "array", dict: "object"}
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def function_tool(fn: Callable[..., Any]) -> dict[str, Any]:
    """An OpenAI-format tool for a Python function, without LangChain: its name; its docstring up to ``Args:`` as
    the description; one parameter per argument, typed from its annotation (``str``, ``int``, ``float``, ``bool``,
    ``list[...]``, ``dict``, ``Literal[...]``, ``X | None``; untyped: its default's type; else any JSON), described
    by its line under ``Args:`` (Google style), required when it has no default."""
    doc = inspect.getdoc(fn) or ""
    head, _, args_doc = doc.partition("Args:")
    described = {}
    for line in args_doc.splitlines():
        m = _ARG_LINE.match(line)
        if m:
            described[m.group(1)] = m.group(2).strip()
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a forward reference it cannot resolve: untyped parameters
        hints = {}
    properties: dict[str, Any] = {}
    required = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        default_type = None if p.default is p.empty or p.default is None else type(p.default)
        schema = _type_schema(hints.get(p.name, default_type))
        if p.name in described:
            schema["description"] = described[p.name]
        properties[p.name] = schema
        if p.default is p.empty:
            required.append(p.name)
    name = getattr(fn, "__name__", type(fn).__name__)
    function: dict[str, Any] = {"name": name, "description": " ".join(head.split()) or name,
                                "parameters": {"type": "object", "properties": properties, "required": required}}
    return {"type": "function", "function": function}


def _type_schema(hint: Any) -> dict[str, Any]:
    origin, params = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(params)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in params if a is not type(None)]
        return _type_schema(rest[0]) if len(rest) == 1 else {"anyOf": [_type_schema(a) for a in rest]}
    kind = _JSON_TYPES.get(origin or hint)
    if kind is None:
        return {}
    if kind == "array" and params:
        return {"type": "array", "items": _type_schema(params[0])}
    return {"type": kind}
