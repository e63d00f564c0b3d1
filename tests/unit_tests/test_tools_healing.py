"""Tool-call enforcement and healing (gguf_provider/tools.py, chat.py's EventProcessor): no server needed."""

from __future__ import annotations

import json

import pytest

from gguf_provider.chat import ChatRequest, EventProcessor, normalize_tool_choice
from gguf_provider.events import Collector, Finish, TextDelta, ToolCallDelta
from gguf_provider.tools import could_be_tool_call, forced_schema, heal_tool_calls, parse_forced

NAMES = {"get_weather", "add"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def _one(text: str) -> tuple[str, dict[str, object]]:
    calls = heal_tool_calls(text, NAMES)
    assert calls is not None and len(calls) == 1, text
    assert calls[0].id.startswith("call_")
    return calls[0].name, json.loads(calls[0].arguments)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',  # unterminated (stopped at EOS)
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '  {"name": "get_weather", "parameters": {"city": "Paris"}}  ',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '```\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n```',
    '{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
    '<function=get_weather>{"city": "Paris"}</function>',
    '<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>',
])
def test_heals_single_call(text: str) -> None:
    assert _one(text) == ("get_weather", {"city": "Paris"})


def test_function_parameters_are_typed() -> None:
    assert _one("<function=add><parameter=a>2</parameter><parameter=b>40</parameter></function>") == \
        ("add", {"a": 2, "b": 40})


def test_heals_several_calls() -> None:
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    calls = heal_tool_calls(text, NAMES)
    assert calls is not None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2}),
                                                                  ("get_weather", {"city": "Oslo"})]
    assert len({c.id for c in calls}) == 2
    listed = heal_tool_calls('[{"name": "add", "arguments": {"a": 1, "b": 2}}, '
                             '{"name": "add", "arguments": {"a": 3, "b": 4}}]', NAMES)
    assert listed is not None and len(listed) == 2


@pytest.mark.parametrize("text", [
    "",
    "The weather in Paris is sunny.",
    '{"name": "unknown_tool", "arguments": {}}',  # not a bound tool
    '{"city": "Paris"}',  # JSON, but not a call
    '{"name": "get_weather", "arguments": [1, 2]}',
    "<function=unknown>{}</function>",
    "<tool_call>not json</tool_call>",
    '```python\nprint("hi")\n```',
    '{"name": "get_weather", "arguments": {"city": "Paris"}} and then some prose',
])
def test_leaves_non_calls_alone(text: str) -> None:
    assert heal_tool_calls(text, NAMES) is None


def test_could_be_tool_call_prefixes() -> None:
    for prefix in ("", " ", "{", "[", "`", "```", "<", "<tool", "<tool_call>{", "<fun", "<function=add>"):
        assert could_be_tool_call(prefix), prefix
    for prose in ("Hello", "The answer", "<b>bold</b>", "1, 2"):
        assert not could_be_tool_call(prose), prose


def test_forced_schema_admits_only_named_tools() -> None:
    fmt = forced_schema([WEATHER, ADD], ["add"])
    schema = fmt["json_schema"]["schema"]
    assert fmt["type"] == "json_schema"
    assert schema["properties"]["name"] == {"const": "add"}
    assert schema["properties"]["arguments"] == ADD["function"]["parameters"]
    both = forced_schema([WEATHER, ADD])["json_schema"]["schema"]
    assert [o["properties"]["name"]["const"] for o in both["anyOf"]] == ["get_weather", "add"]
    with pytest.raises(ValueError, match="tool_choice"):
        forced_schema([WEATHER], ["nope"])


def test_parse_forced() -> None:
    call = parse_forced('{"name": "add", "arguments": {"a": 1, "b": 2}}')
    assert call is not None and call.name == "add" and call.args() == {"a": 1, "b": 2}
    assert parse_forced("not json") is None
    assert parse_forced('{"arguments": {}}') is None


@pytest.mark.parametrize(("choice", "expected"), [
    (None, None), ("auto", "auto"), ("none", "none"), ("any", "required"), ("required", "required"),
    (True, "required"), (False, "none"), ("add", "name:add"),
    ({"type": "function", "function": {"name": "add"}}, "name:add"), ({"name": "add"}, "name:add"),
    ({"type": "any"}, "required"), ({"type": "auto"}, "auto"), ({"type": "tool", "name": "add"}, "name:add"),
])
def test_normalize_tool_choice(choice: object, expected: str | None) -> None:
    assert normalize_tool_choice(choice) == expected


def _payload(choice: object) -> dict[str, object]:
    return ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, ADD],
                       tool_choice=normalize_tool_choice(choice)).payload()


def test_payload_per_tool_choice() -> None:
    auto = _payload("auto")
    assert auto["tool_choice"] == "auto" and len(auto["tools"]) == 2 and "response_format" not in auto
    assert "tools" not in _payload("none") and "response_format" not in _payload("none")
    for forced in ("any", "required", True):
        body = _payload(forced)
        assert body["response_format"]["type"] == "json_schema"  # type: ignore[index]
        assert len(body["tools"]) == 2  # type: ignore[arg-type]
    named = _payload({"type": "function", "function": {"name": "add"}})
    assert [t["function"]["name"] for t in named["tools"]] == ["add"]  # type: ignore[attr-defined]
    assert named["response_format"]["json_schema"]["schema"]["properties"]["name"] == {"const": "add"}  # type: ignore[index]


def _run(request: ChatRequest, texts: list[str]) -> tuple[list[object], object]:
    proc, col, out = EventProcessor(request), Collector(), []
    for ev in [*(TextDelta(t) for t in texts), Finish("stop")]:
        for o in proc.feed(ev):
            out.append(o)
            col.add(o)
    return out, col.done()


def test_event_processor_heals_streamed_text() -> None:
    req = ChatRequest(messages=[], tools=[WEATHER], tool_choice="auto")
    out, done = _run(req, ["<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Rome\"}}",
                           "\n</tool_call>"])
    assert not any(isinstance(o, TextDelta) for o in out)
    assert done.finish_reason == "tool_calls"  # type: ignore[attr-defined]
    assert [(c.name, c.args()) for c in done.tool_calls] == [("get_weather", {"city": "Rome"})]  # type: ignore[attr-defined]


def test_event_processor_streams_prose_at_once() -> None:
    req = ChatRequest(messages=[], tools=[WEATHER], tool_choice="auto")
    proc = EventProcessor(req)
    assert proc.feed(TextDelta("Hel")) == [TextDelta("Hel")]  # plainly prose: released, not held back
    assert proc.feed(TextDelta("lo")) == [TextDelta("lo")]
    out, done = _run(req, ["{not", " a call}"])  # looked like JSON, was not: text comes back at the end
    assert done.content == "{not a call}" and done.tool_calls == []  # type: ignore[attr-defined]


def test_event_processor_no_healing_when_disabled_or_none() -> None:
    for req in (ChatRequest(messages=[], tools=[WEATHER], tool_choice="none"),
                ChatRequest(messages=[], tools=[WEATHER], heal_tool_calls=False)):
        _, done = _run(req, ['{"name": "get_weather", "arguments": {"city": "Rome"}}'])
        assert done.tool_calls == [] and done.content.startswith("{")  # type: ignore[attr-defined]


def test_event_processor_forced_reply_becomes_call() -> None:
    req = ChatRequest(messages=[], tools=[WEATHER, ADD], tool_choice="name:add")
    out, done = _run(req, ['{"name": "add", ', '"arguments": {"a": 2, "b": 3}}'])
    assert [type(o) for o in out] == [ToolCallDelta, Finish]
    assert [(c.name, c.args()) for c in done.tool_calls] == [("add", {"a": 2, "b": 3})]  # type: ignore[attr-defined]


def test_json_lines_become_several_calls_identical_ones_once() -> None:
    text = ('{"name": "add", "arguments": {"a": 1, "b": 2}}\n{"name": "add", "arguments": {"b": 2, "a": 1}}\n'
            '{"name": "get_weather", "arguments": {"city": "Rome"}}')
    calls = heal_tool_calls(text, NAMES)
    assert calls is not None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2}),
                                                                    ("get_weather", {"city": "Rome"})]
    assert heal_tool_calls('{"name": "add", "arguments": {}}\nthen some prose', NAMES) is None


def _answered_history() -> list[dict[str, object]]:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


def test_a_reply_that_only_repeats_an_answered_call_is_held_back() -> None:
    from gguf_provider.tools import answered_calls

    history = _answered_history()
    assert answered_calls(history) == {("get_weather", '{"city": "Paris"}')}
    proc = EventProcessor(ChatRequest(messages=history, tools=[WEATHER]))
    repeat = '{"name": "get_weather", "arguments": {"city": "Paris"}}\n' * 2
    assert proc.feed(TextDelta(repeat)) == [] and proc.feed(Finish("stop")) == []
    assert proc.repeated_only


def test_a_new_call_after_an_answered_one_goes_through_alone() -> None:
    proc = EventProcessor(ChatRequest(messages=_answered_history(), tools=[WEATHER]))
    proc.feed(TextDelta('{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                        '{"name": "get_weather", "arguments": {"city": "Rome"}}'))
    out = proc.feed(Finish("stop"))
    calls = [ev for ev in out if isinstance(ev, ToolCallDelta)]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Rome"}] and not proc.repeated_only


def test_the_second_ask_has_no_tools_and_a_nudge() -> None:
    from gguf_provider.chat import ANSWER_NUDGE, _without_tools
    from gguf_provider.errors import RepeatedToolCallWarning

    request = ChatRequest(messages=_answered_history(), tools=[WEATHER], tool_choice="auto")
    with pytest.warns(RepeatedToolCallWarning):
        again = _without_tools(request)
    body = again.payload()
    assert "tools" not in body and "tool_choice" not in body and again.heal_tool_calls
    assert body["messages"][-1] == {"role": "user", "content": ANSWER_NUDGE}
    assert len(request.messages) == 3  # the caller's list is not changed


def test_a_repeated_call_with_an_echoed_result_is_held_back() -> None:
    """What Qwen2.5-Coder-0.5B wrote under create_agent after the tool result: its call again, then the result."""
    proc = EventProcessor(ChatRequest(messages=_answered_history(), tools=[WEATHER]))
    proc.feed(TextDelta('{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                        '{"response": "It is sunny and 21 degrees Celsius in Paris."}'))
    assert proc.feed(Finish("stop")) == [] and proc.repeated_only


def test_the_last_resort_answer_is_the_tool_results() -> None:
    from gguf_provider.chat import _tool_results_answer
    from gguf_provider.errors import RepeatedToolCallWarning

    with pytest.warns(RepeatedToolCallWarning):
        events = _tool_results_answer(ChatRequest(messages=_answered_history(), tools=[WEATHER]))
    assert events == [TextDelta("sunny"), Finish("stop")]


def test_a_call_repeated_into_a_loop_is_cut_before_healing() -> None:
    """At temperature 0 the 0.5B model wrote its call 21 times until the loop guard stopped it."""
    from gguf_provider.events import LoopStopped

    line = '{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
    proc = EventProcessor(ChatRequest(messages=[{"role": "user", "content": "Rome?"}], tools=[WEATHER]))
    assert proc.feed(TextDelta(line * 21)) == []
    assert proc.feed(LoopStopped("content", len(line), len(line))) == []
    out = proc.feed(Finish("repetition"))
    assert [(type(e).__name__) for e in out] == ["ToolCallDelta", "Finish"]
