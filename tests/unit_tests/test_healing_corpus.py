"""Healing's two corpora (tests/unit_tests/data/healing): replies that must be healed into tool calls — each family's
text format as llama-server's own parser may leave it in the content (Qwen3-Coder / Qwen3.5 XML with and without
closing tags, a call after prose, several calls, leaked tags; Hermes/Qwen2.5 JSON) — and replies that must never be
(prose and code about functions, JSON and XML that are no call of a bound tool, a bound tool's name in a sentence,
calls to unbound tools, plus every recorded reply of the loop guard's corpus). Each goes through
``heal_tool_calls`` and through the chat layer: the reply streamed (in 3-character chunks, as tokens arrive) into
ChatGGUF and GGUF over the recorded Qwen exchange (tests/support/replay.py ``with_reply``), streamed and whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF
from gguf_provider.chat import ChatRequest, EventProcessor
from gguf_provider.events import Collector, Completion, Finish, LoopStopped, TextDelta, ToolCallDelta
from gguf_provider.llama_index import GGUF
from gguf_provider.tools import heal_reply, heal_tool_calls
from tests.support.replay import BASE_URL, load_replay, with_reply

DATA = Path(__file__).parent / "data"
MUST = json.loads((DATA / "healing" / "must_heal.json").read_text())
NEVER = sorted((DATA / "healing" / "never_heal").glob("*.txt"))
RECORDED = sorted((DATA / "loops").glob("*/*.txt"))  # real replies of both test models: no call among them


def _fn(name: str, props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name.replace("_", " "),
                                             "parameters": {"type": "object", "properties": props}}}


TOOLS = [_fn("get_weather", {"city": {"type": "string"}, "unit": {"type": "string"}}),
         _fn("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
         _fn("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
         _fn("search", {"query": {"type": "string"}, "filters": {"type": "object"}, "limit": {"type": "integer"}})]
NAMES = {t["function"]["name"] for t in TOOLS}


def _expected(case: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(name, args) for name, args in case["calls"]]


@pytest.mark.parametrize("case", MUST, ids=[c["id"] for c in MUST])
def test_must_heal(case: dict[str, Any]) -> None:
    calls = heal_tool_calls(case["text"], NAMES, TOOLS)
    assert calls is not None, case["source"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == _expected(case)
    healed = heal_reply(case["text"], NAMES, TOOLS)
    assert healed is not None and healed.content == case["content"]
    assert "<tool_call>" not in healed.content and "<function=" not in healed.content


def _text(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize("path", NEVER + RECORDED, ids=[f"{p.parent.name}/{p.stem}" for p in NEVER + RECORDED])
def test_never_heal(path: Path) -> None:
    assert heal_tool_calls(_text(path), NAMES, TOOLS) is None
    assert heal_tool_calls(_text(path), NAMES) is None  # nor without the schemas


def _processed(text: str, piece: int, finish: str = "stop") -> Completion:
    proc, col = EventProcessor(ChatRequest(messages=[], tools=TOOLS, tool_choice="auto")), Collector()
    for ev in [*(TextDelta(text[i:i + piece]) for i in range(0, len(text), piece)), Finish(finish)]:
        for out in proc.feed(ev):
            col.add(out)
    return col.done()


@pytest.mark.parametrize("piece", [1, 3, 1000])
@pytest.mark.parametrize("case", MUST, ids=[c["id"] for c in MUST])
def test_must_heal_streamed_through_the_event_processor(case: dict[str, Any], piece: int) -> None:
    done = _processed(case["text"], piece)
    assert [(c.name, c.args()) for c in done.tool_calls] == _expected(case)
    assert done.content.strip() == case["content"] and done.finish_reason == "tool_calls"


@pytest.mark.parametrize("piece", [1, 3])
@pytest.mark.parametrize("path", NEVER + RECORDED, ids=[f"{p.parent.name}/{p.stem}" for p in NEVER + RECORDED])
def test_never_heal_streamed_text_comes_back_whole(path: Path, piece: int) -> None:
    done = _processed(_text(path), piece)
    assert done.tool_calls == [] and done.content == _text(path) and done.finish_reason == "stop"


def test_prose_streams_before_the_call_is_known() -> None:
    """The sentence before a call is shown as it arrives; from the call's first tag on, the text is held."""
    proc = EventProcessor(ChatRequest(messages=[], tools=TOOLS, tool_choice="auto"))
    assert proc.feed(TextDelta("I'll")) == [TextDelta("I'll")]
    assert proc.feed(TextDelta(" check.")) == [TextDelta(" check.")]
    assert proc.feed(TextDelta("\n\n<tool")) == []
    assert proc.feed(TextDelta("_call>\n<function=get_weather>\n<parameter=city>\nParis")) == []
    out = proc.feed(Finish("stop"))
    assert [type(o) for o in out] == [ToolCallDelta, Finish] and out[-1] == Finish("tool_calls")
    # a held " <" (with the space before it) that turns out to be prose is released with the next token
    proc = EventProcessor(ChatRequest(messages=[], tools=TOOLS, tool_choice="auto"))
    assert proc.feed(TextDelta("Say")) == [TextDelta("Say")]
    assert proc.feed(TextDelta(" <")) == [] and proc.feed(TextDelta("b>hi")) == [TextDelta(" <b>hi")]


def test_a_cut_reply_heals_only_a_closed_call() -> None:
    """A reply stopped by max_tokens (finish reason length) in an open value would heal into a truncated argument."""
    cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    assert heal_tool_calls(cut, NAMES, TOOLS) is not None  # at EOS: the model just left the tags out
    assert heal_reply(cut, NAMES, TOOLS, cut=True) is None
    done = _processed(cut, 3, finish="length")
    assert done.tool_calls == [] and done.content == cut and done.finish_reason == "length"
    closed = cut + "is\n</parameter>\n</function>\n</tool_call>"
    assert _processed(closed, 3, finish="length").tool_calls[0].args() == {"city": "Paris"}


def test_a_call_that_loops_after_prose_is_no_call() -> None:
    proc, col = EventProcessor(ChatRequest(messages=[], tools=TOOLS, tool_choice="auto")), Collector()
    text = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n" + "Paris Paris " * 5
    for ev in (TextDelta(text), LoopStopped("content", 60, 6), Finish("repetition")):
        for out in proc.feed(ev):
            col.add(out)
    done = col.done()
    assert done.tool_calls == [] and done.content == text[:60] and done.finish_reason == "repetition"


def _messages() -> list[ChatMessage]:
    return [ChatMessage(role="user", content="Weather in Paris?")]


@pytest.mark.parametrize("case", MUST, ids=[c["id"] for c in MUST])
def test_must_heal_in_both_adapters(case: dict[str, Any]) -> None:
    replay = with_reply(load_replay("qwen_tool_call"), case["text"])
    llm = ChatGGUF(base_url=BASE_URL, transport=replay.transport).bind_tools(TOOLS)
    reply = llm.invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == _expected(case)
    assert str(reply.content).strip() == case["content"]
    chunks = list(llm.stream("Weather in Paris?"))
    joined = chunks[0]
    for c in chunks[1:]:
        joined += c
    assert [(c["name"], c["args"]) for c in joined.tool_calls] == _expected(case)  # type: ignore[attr-defined]
    assert str(joined.content).strip() == case["content"]
    li = GGUF(base_url=BASE_URL, transport=replay.transport)
    response = li.chat(_messages(), tools=TOOLS)
    assert [(s.tool_name, s.tool_kwargs) for s in li.get_tool_calls_from_response(response)] == _expected(case)
    assert (response.message.content or "").strip() == case["content"]
    last = list(li.stream_chat(_messages(), tools=TOOLS))[-1]
    assert [(s.tool_name, s.tool_kwargs) for s in li.get_tool_calls_from_response(last)] == _expected(case)


@pytest.mark.parametrize("path", NEVER, ids=[p.stem for p in NEVER])
def test_never_heal_in_both_adapters(path: Path) -> None:
    replay = with_reply(load_replay("qwen_tool_call"), _text(path))
    llm = ChatGGUF(base_url=BASE_URL, transport=replay.transport).bind_tools(TOOLS)
    reply = llm.invoke("Weather in Paris?")
    assert reply.tool_calls == [] and reply.content == _text(path)
    assert "".join(str(c.content) for c in llm.stream("Weather in Paris?")) == _text(path)
    li = GGUF(base_url=BASE_URL, transport=replay.transport)
    assert li.chat(_messages(), tools=TOOLS).message.content == _text(path)
