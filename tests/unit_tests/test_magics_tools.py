"""The magics' tool pieces that need no server: a function's tool schema (``--tools`` without LangChain), what a
``--tools`` variable may hold, and how a reply shows its tool calls (text and Markdown)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from IPython.core.error import UsageError

from gguf_provider.jupyter.commands import _cell_parser, notebook_tools
from gguf_provider.jupyter.display import GGUFReply, _LiveOutput
from gguf_provider.tools import function_tool


def search(query: str, top_k: int = 3, lang: Literal["en", "fr"] = "en", tags: list[str] | None = None,
           strict=False, *args: Any, **kwargs: Any) -> list[str]:
    """Search the notes.

    Looks in every notebook.

    Args:
        query: What to look for.
        top_k (int): How many results.
    """
    return []


def test_function_tool_reads_the_signature_and_docstring() -> None:
    assert function_tool(search) == {"type": "function", "function": {
        "name": "search", "description": "Search the notes. Looks in every notebook.",
        "parameters": {"type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "top_k": {"type": "integer", "description": "How many results."},
            "lang": {"enum": ["en", "fr"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "strict": {"type": "boolean"}}}}}


def test_tools_values_functions_dicts_and_lists() -> None:
    bare = {"name": "ping", "parameters": {"type": "object", "properties": {}}}
    wrapped = {"type": "function", "function": bare}
    ns = {"search": search, "bare": bare, "wrapped": wrapped, "both": [search, bare], "n": 3}
    assert notebook_tools("search, bare,wrapped", ns) == [function_tool(search), wrapped, wrapped]
    assert notebook_tools("both", ns) == [function_tool(search), wrapped]
    with pytest.raises(UsageError, match="n is a int"):
        notebook_tools("n", ns)
    with pytest.raises(UsageError, match="nope is not defined"):
        notebook_tools("nope", ns)


def test_tool_flags_parse() -> None:
    ns = _cell_parser().parse_args(["m", "--tools", "a,b", "--tool-choice", "a"])
    assert (ns.name, ns.tools, ns.tool_choice, ns.tool_result) == ("m", "a,b", "a", None)
    assert _cell_parser().parse_args(["--tool-result", "-n", "5"]).tool_result == ""  # the one waiting call
    assert _cell_parser().parse_args(["--tool-result", "call_1"]).tool_result == "call_1"


CALLS = [{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}},
         {"id": "call_2", "name": "get_weather", "arguments": {"city": "Zürich"}}]


def test_reply_shows_its_tool_calls() -> None:
    reply = GGUFReply(text="Let me check.", tool_calls=CALLS, model="m", done=True)
    assert repr(reply) == ('Let me check.\n[tool call] get_weather({"city": "Paris"})  # id: call_1\n'
                           '[tool call] get_weather({"city": "Zürich"})  # id: call_2\n[m]')
    md = reply._repr_markdown_() or ""
    assert '**tool call** `get_weather({"city": "Paris"})` · id `call_1`' in md and md.endswith("<sub>m</sub>")
    assert repr(GGUFReply(tool_calls=CALLS[:1])) == '[tool call] get_weather({"city": "Paris"})  # id: call_1'


def test_terminal_prints_tool_calls_before_the_footer(capsys: pytest.CaptureFixture[str]) -> None:
    reply = GGUFReply(model="m")
    out = _LiveOutput(object(), reply)  # no kernel: plain prints
    reply.tool_calls, reply.done = CALLS[:1], True
    out.finish()
    assert capsys.readouterr().out == '[tool call] get_weather({"city": "Paris"})  # id: call_1\n[m]\n'
    reply = GGUFReply(model="m")
    out = _LiveOutput(object(), reply)
    out.delta("Sure.", "Sure.", "")
    reply.text, reply.tool_calls, reply.done = "Sure.", CALLS[:1], True
    out.finish()
    assert capsys.readouterr().out == 'Sure.\n[tool call] get_weather({"city": "Paris"})  # id: call_1\n[m]\n'
