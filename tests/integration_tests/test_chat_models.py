"""ChatGGUF behaviours beyond the standard suite, against real llama-servers.

Qwen2.5-Coder-0.5B (template with tools) for tools and structured output; SmolLM2-135M where speed matters
(metadata, cancellation, concurrency, context overflow, reasoning with a ``<think>`` template).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from gguf_provider.langchain import ChatGGUF
from gguf_provider.langchain._utils import to_openai
from gguf_provider.runtime._serve.health import props_n_ctx
from gguf_provider.tools import answered_calls, heal_tool_calls, only_repeats
from tests.support import slots

pytestmark = pytest.mark.slow

QWEN_CTX = 3072  # the same spec as test_chat_models_standard.py
SMOL_CTX = 1536  # a spec of this module's own: /slots below must see only this module's requests


@pytest.fixture(scope="module")
def qwen(qwen_path: Path) -> Iterator[ChatGGUF]:
    llm = ChatGGUF(model=str(qwen_path), n_ctx=QWEN_CTX, temperature=0, max_tokens=80).load()
    yield llm
    llm.unload()


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[ChatGGUF]:
    llm = ChatGGUF(model=str(smollm2_path), n_ctx=SMOL_CTX, temperature=0, max_tokens=40).load()
    yield llm
    llm.unload()


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny and 21 degrees Celsius in {city}."


@tool
def magic_function(input: int) -> int:
    """Apply a magic function to an input."""
    return input + 2


def _collect(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    return full


# --- metadata ---------------------------------------------------------------------------------------------------


def test_stream_metadata_on_exactly_one_chunk(smol: ChatGGUF) -> None:
    chunks = list(smol.stream("Count from one to five."))
    with_usage = [c for c in chunks if c.usage_metadata]
    with_model = [c for c in chunks if c.response_metadata.get("model_name")]
    with_finish = [c for c in chunks if c.response_metadata.get("finish_reason")]
    assert len(with_usage) == len(with_model) == len(with_finish) == 1
    last = chunks[-1]
    assert last is with_usage[0] is with_model[0]
    assert last.chunk_position == "last"
    assert all(c.chunk_position is None for c in chunks[:-1])
    full = _collect(chunks)
    usage = full.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert isinstance(usage.get("input_token_details", {}).get("cache_read"), int)
    meta = full.response_metadata
    assert meta["model_name"] == "SmolLM2-135M-Instruct.Q4_1.gguf"  # not concatenated across chunks
    assert meta["finish_reason"] in ("stop", "length")
    assert meta["timings"]["predicted_n"] == usage["output_tokens"]
    assert meta["tokens_per_second"] > 0
    assert full.content


def test_invoke_metadata_and_cache_read(smol: ChatGGUF) -> None:
    prompt = "Repeat after me: " + "the quick brown fox jumps over the lazy dog. " * 20
    first = smol.invoke(prompt)
    second = smol.invoke(prompt)
    for msg in (first, second):
        assert msg.usage_metadata is not None
        assert msg.response_metadata["model_name"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert msg.response_metadata["finish_reason"] in ("stop", "length")
        assert msg.response_metadata["tokens_per_second"] > 0
    assert second.usage_metadata is not None
    assert second.usage_metadata["input_token_details"]["cache_read"] > 0  # type: ignore[typeddict-item]
    assert second.usage_metadata["input_tokens"] == first.usage_metadata["input_tokens"]  # type: ignore[index]


def test_exact_token_counts(smol: ChatGGUF) -> None:
    assert smol.get_num_tokens("hello world") == len(smol.get_token_ids("hello world")) == 2
    messages: list[BaseMessage] = [SystemMessage("You are terse."), HumanMessage("Name a colour.")]
    counted = smol.get_num_tokens_from_messages(messages)
    usage = smol.invoke(messages, max_tokens=3).usage_metadata
    assert usage is not None and counted == usage["input_tokens"]


def test_profile_matches_server_context(smol: ChatGGUF, qwen: ChatGGUF) -> None:
    for llm, n_ctx in ((smol, SMOL_CTX), (qwen, QWEN_CTX)):
        props = llm.engine.client.get_json("/props")
        assert llm.profile is not None
        # The context asked for; the server may be a shared one with a larger context (the runtime reuses it).
        assert llm.profile["max_input_tokens"] == n_ctx <= props_n_ctx(props)
    assert qwen.profile is not None and qwen.profile["tool_calling"] is True


def test_per_call_model_runs_on_that_model(smol: ChatGGUF, smollm2_path: Path) -> None:
    """``invoke(model=...)`` runs on that model (here the same file by its models-dir name, so the runtime attaches
    to the running server) and labels traces and metadata with it."""
    name = smollm2_path.stem
    assert smol._get_ls_params(model=name)["ls_model_name"] == name
    seen: list[Any] = []
    from langchain_core.callbacks import BaseCallbackHandler

    class Spy(BaseCallbackHandler):
        def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
            seen.append(kwargs.get("metadata", {}).get("ls_model_name"))

    msg = smol.invoke("hi", model=name, max_tokens=2, config={"callbacks": [Spy()]})
    assert seen == [name]
    assert msg.response_metadata["model_name"] == name
    assert smol._engines[name].info.pid == smol.engine.info.pid  # one server: same spec, shared
    assert smol.invoke("hi", max_tokens=2).response_metadata["model_name"] == smollm2_path.name


def test_per_call_unknown_model_is_a_typed_error(smol: ChatGGUF) -> None:
    from gguf_provider.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        smol.invoke("hi", model="no-such-model", max_tokens=2)


def test_anthropic_style_history(qwen: ChatGGUF) -> None:
    """The standard suite's Anthropic-input history minus its image: an Anthropic-format tool, ``tool_use`` and
    ``thinking`` content blocks, ``cache_control`` marks."""
    color_picker = {"name": "color_picker", "description": "Input your fav color and get a random fact about it.",
                    "input_schema": {"type": "object", "properties": {"fav_color": {"type": "string"}},
                                     "required": ["fav_color"]}, "cache_control": {"type": "ephemeral"}}
    messages: list[BaseMessage] = [
        SystemMessage("you're a good assistant"),
        HumanMessage([{"type": "text", "text": "what's your favorite color?", "cache_control": {"type": "ephemeral"}}]),
        AIMessage([{"type": "text", "text": "Hmm let me think about that"},
                   {"type": "tool_use", "input": {"fav_color": "purple"}, "id": "foo", "name": "color_picker"}],
                  tool_calls=[{"name": "color_picker", "args": {"fav_color": "purple"}, "id": "foo",
                               "type": "tool_call"}]),
        ToolMessage("That's a great pick!", tool_call_id="foo"),
    ]
    sent = to_openai(messages, keep_reasoning=False)
    assert sent[1]["content"] == "what's your favorite color?"
    assert sent[2]["content"] == "Hmm let me think about that"
    assert sent[2]["tool_calls"][0]["function"] == {"name": "color_picker", "arguments": '{"fav_color": "purple"}'}
    reply = qwen.bind_tools([color_picker]).invoke(messages)
    assert isinstance(reply, AIMessage) and (reply.content or reply.tool_calls)
    thinking = AIMessage([{"type": "thinking", "thinking": "A greeting.", "signature": "sig"},
                          {"type": "text", "text": "Hello, how are you?"}])
    assert to_openai([thinking], keep_reasoning=False)[0]["content"] == "Hello, how are you?"
    reply = qwen.invoke([HumanMessage([{"type": "text", "text": "Hello"}]), thinking,
                         HumanMessage([{"type": "text", "text": "Well, thanks."}])])
    assert isinstance(reply, AIMessage) and reply.content


# --- context overflow -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ctx(smollm2_path: Path) -> Iterator[ChatGGUF]:
    llm = ChatGGUF(model=str(smollm2_path), n_ctx=512, temperature=0, max_tokens=20).load()
    yield llm
    llm.unload()


async def test_context_overflow(tiny_ctx: ChatGGUF) -> None:
    long = "word " * 2000
    with pytest.raises(ContextOverflowError, match="context"):
        tiny_ctx.invoke(long)
    with pytest.raises(ContextOverflowError):
        list(tiny_ctx.stream(long))
    with pytest.raises(ContextOverflowError):
        await tiny_ctx.ainvoke(long)
    # A prompt that fits still works, and max_tokens is capped to the room left.
    msg = tiny_ctx.invoke("word " * 400, max_tokens=400)
    assert msg.usage_metadata is not None and msg.usage_metadata["total_tokens"] <= 512


# --- cancellation and concurrency -------------------------------------------------------------------------------


def _busy_slots(llm: ChatGGUF) -> int:
    return slots.busy(llm.engine.client)


LONG = 1000  # tokens asked for with ignore_eos: a request that was not cancelled generates all of them
STORY = "Write a very long story about a lighthouse keeper, in many chapters."


@pytest.mark.speed_timeout("smollm2", tokens=LONG)
def test_break_out_of_stream_frees_slot(smol: ChatGGUF) -> None:
    before = slots.generated(smol.engine.client)
    for n, _chunk in enumerate(smol.stream(STORY, max_tokens=LONG, ignore_eos=True)):
        if n == 0:
            assert _busy_slots(smol) == 1  # it is generating
        if n >= 5:
            break
    slots.assert_stopped_early(smol.engine.client, before, LONG)


@pytest.mark.speed_timeout("smollm2", tokens=LONG)
async def test_break_out_of_astream_frees_slot(smol: ChatGGUF) -> None:
    from contextlib import aclosing

    before = await asyncio.to_thread(slots.generated, smol.engine.client)
    async with aclosing(smol.astream(STORY, max_tokens=LONG, ignore_eos=True)) as stream:
        n = 0
        async for _ in stream:
            n += 1
            if n >= 5:
                break
    # LangChain's astream does not close our _astream itself; the event loop finalizes it: wait in a thread.
    await asyncio.to_thread(slots.assert_stopped_early, smol.engine.client, before, LONG)


async def test_four_concurrent_ainvoke(smol: ChatGGUF) -> None:
    questions = ["Name a fruit.", "Name a colour.", "Name an animal.", "Name a country."]
    busy: list[int] = []

    async def watch() -> None:
        while True:
            busy.append(await asyncio.to_thread(_busy_slots, smol))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(*(smol.ainvoke(q, max_tokens=30, ignore_eos=True) for q in questions))
    finally:
        watcher.cancel()
    assert all(isinstance(r, AIMessage) and r.content for r in results)
    assert all(r.usage_metadata and r.usage_metadata["output_tokens"] == 30 for r in results)
    assert max(busy, default=0) >= 2  # served side by side, not one after another


# --- reasoning --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinker(smollm2_path: Path, llama_src: Path) -> Iterator[ChatGGUF]:
    """SmolLM2 (ChatML) with Qwen3.5's template: its generation prompt opens ``<think>``."""
    template = llama_src / "models" / "templates" / "Qwen3.5-4B.jinja"
    llm = ChatGGUF(model=str(smollm2_path), n_ctx=1024, chat_template_file=str(template), temperature=0,
                   max_tokens=30).load()
    yield llm
    llm.unload()


def test_reasoning_content(thinker: ChatGGUF) -> None:
    # cache_prompt off: the two runs are computed alike, so the greedy text is the same on any CPU.
    msg = thinker.invoke("What is 2 + 2?", cache_prompt=False)
    assert msg.additional_kwargs.get("reasoning_content")
    assert any(b["type"] == "reasoning" for b in msg.content_blocks)
    full = _collect(list(thinker.stream("What is 2 + 2?", cache_prompt=False)))
    assert full.additional_kwargs.get("reasoning_content") == msg.additional_kwargs["reasoning_content"]


def test_reasoning_false_turns_thinking_off(thinker: ChatGGUF) -> None:
    msg = thinker.invoke("What is 2 + 2?", reasoning=False)
    assert "reasoning_content" not in msg.additional_kwargs
    assert msg.content
    off = thinker.model_copy(update={"reasoning": False})
    assert "reasoning_content" not in off.invoke("What is 2 + 2?").additional_kwargs


# --- tools ------------------------------------------------------------------------------------------------------


def test_tool_choice_none(qwen: ChatGGUF) -> None:
    msg = qwen.bind_tools([get_weather], tool_choice="none").invoke("What's the weather in Paris?")
    assert not msg.tool_calls and msg.content


@pytest.mark.parametrize("choice", ["any", "required", True])
def test_tool_choice_forced(qwen: ChatGGUF, choice: Any) -> None:
    msg = qwen.bind_tools([get_weather, magic_function], tool_choice=choice).invoke("Hello!")
    assert len(msg.tool_calls) == 1
    assert msg.tool_calls[0]["name"] in ("get_weather", "magic_function")
    assert msg.response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("choice", ["magic_function", {"type": "function", "function": {"name": "magic_function"}}])
def test_named_tool_choice_calls_exactly_that_tool(qwen: ChatGGUF, choice: Any) -> None:
    # The question is about the weather: only enforcement makes the model call magic_function.
    msg = qwen.bind_tools([get_weather, magic_function], tool_choice=choice).invoke("What's the weather in Paris?")
    assert [tc["name"] for tc in msg.tool_calls] == ["magic_function"]
    assert isinstance(msg.tool_calls[0]["args"].get("input"), int)
    chunks = list(qwen.bind_tools([get_weather, magic_function], tool_choice=choice).stream("Weather in Oslo?"))
    full = _collect(chunks)
    assert [tc["name"] for tc in full.tool_calls] == ["magic_function"]  # not "magic_functionmagic_function"


def test_tool_choice_auto_heals_text_calls(qwen: ChatGGUF) -> None:
    """The same request twice on one server (``cache_prompt`` off: both computed from scratch, so the greedy text
    is the same): without healing, then with it. The healed reply is exactly what ``heal_tool_calls`` makes of the
    raw text, whatever this CPU's text is: the calls it wrote as text (and no text), or, if it wrote none, the raw
    reply unchanged."""
    question = "What's the weather like in Paris right now?"
    exact = {"model_kwargs": {"cache_prompt": False}}
    raw = qwen.model_copy(update={"auto_heal_tool_calls": False, **exact})
    unhealed = raw.bind_tools([get_weather], tool_choice="auto").invoke(question)
    healer = qwen.model_copy(update=exact)
    msg = healer.bind_tools([get_weather], tool_choice="auto").invoke(question)
    if unhealed.tool_calls:  # a native call, parsed by llama-server: nothing to heal, the same call either way
        assert [(tc["name"], tc["args"]) for tc in msg.tool_calls] == \
            [(tc["name"], tc["args"]) for tc in unhealed.tool_calls]
        return
    text = str(unhealed.content)
    expected = heal_tool_calls(text, {"get_weather"})
    if expected:
        assert [(tc["name"], tc["args"]) for tc in msg.tool_calls] == [(c.name, c.args()) for c in expected], text
        assert all(isinstance(tc["args"].get("city"), str) for tc in msg.tool_calls)
        assert msg.content == ""
        assert msg.response_metadata["finish_reason"] == "tool_calls"
    else:  # prose: healing leaves it alone
        assert not msg.tool_calls and msg.content == text


def test_healing_turns_a_call_written_as_text_into_a_tool_call(qwen: ChatGGUF) -> None:
    """Healing exercised whatever this CPU's text: a JSON schema constrains the reply to a call of get_weather written
    as JSON text (not the template's ``<tool_call>`` markup, so llama-server does not parse it); the same request
    without healing shows that text, with healing it is that call."""
    call_schema = {"type": "object", "properties": {
        "name": {"type": "string", "enum": ["get_weather"]},
        "arguments": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "required": ["name", "arguments"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "call", "schema": call_schema}}
    question = "What's the weather like in Paris right now?"
    exact = {"response_format": fmt, "cache_prompt": False}
    raw = qwen.model_copy(update={"auto_heal_tool_calls": False})
    unhealed = raw.bind_tools([get_weather], tool_choice="auto").invoke(question, **exact)
    assert not unhealed.tool_calls
    written = json.loads(str(unhealed.content))
    msg = qwen.bind_tools([get_weather], tool_choice="auto").invoke(question, **exact)
    assert [(tc["name"], tc["args"]) for tc in msg.tool_calls] == [("get_weather", written["arguments"])]
    assert msg.content == "" and msg.response_metadata["finish_reason"] == "tool_calls"


def run_agent(llm: ChatGGUF, question: str, tools: list[Any], max_steps: int = 4) -> list[BaseMessage]:
    """A plain tool loop (what LangGraph's ReAct agent does), with the nudge a 0.5B model needs after tool
    results: without it the tiny model repeats its call instead of answering. The first call is forced
    (``tool_choice="required"``: whether a tiny model calls a tool unasked differs between CPUs); after the tool
    results the choice is "auto", where healing and the repeated-call guard of chat.py act."""
    by_name = {t.name: t for t in tools}
    first = llm.bind_tools(tools, tool_choice="required")
    bound = llm.bind_tools(tools, tool_choice="auto")
    messages: list[BaseMessage] = [HumanMessage(question)]
    for step in range(max_steps):
        ai = (first if step == 0 else bound).invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            return messages
        for tc in ai.tool_calls:
            messages.append(ToolMessage(str(by_name[tc["name"]].invoke(tc["args"])), tool_call_id=tc["id"]))
        messages.append(HumanMessage("Answer my question in one sentence using that tool result."))
    raise AssertionError(f"no final answer after {max_steps} steps: {messages}")


def test_agent_loop_with_healing(qwen: ChatGGUF) -> None:
    """Structure, not words: the forced call is a get_weather call with a string city, its ToolMessage carries the
    tool's output, and the loop ends with a non-empty text answer that is not a repeat of an answered call (what
    chat.py guarantees: such a reply is asked again without tools, or the tool results become the answer)."""
    messages = run_agent(qwen, "What's the weather like in Paris right now?", [get_weather])
    first = messages[1]
    assert isinstance(first, AIMessage) and [tc["name"] for tc in first.tool_calls] == ["get_weather"]
    assert isinstance(first.tool_calls[0]["args"].get("city"), str)
    calls = {tc["id"]: tc for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls}
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert tool_messages and len(tool_messages) == len(calls)
    for tm in tool_messages:
        assert tm.content == get_weather.invoke(calls[tm.tool_call_id]["args"])
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    text = str(final.content)
    assert text.strip() and heal_tool_calls(text, {"get_weather"}) is None
    assert not only_repeats(text, answered_calls(to_openai(messages[:-1], keep_reasoning=False)))


# --- structured output ------------------------------------------------------------------------------------------


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(description="the person's first name")
    age: int = Field(description="the person's age in years")


TEXT = "Extract the person: Alice is 31 years old and lives in Lyon."


def _is_person(value: Any) -> bool:
    """What the schema guarantees (types and required keys); the values are the model's, and differ between CPUs."""
    return isinstance(value, Person) and isinstance(value.name, str) and isinstance(value.age, int)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_pydantic(qwen: ChatGGUF, method: str) -> None:
    """Schema-constrained methods: whatever the model writes is a valid Person."""
    result = qwen.with_structured_output(Person, method=method).invoke(TEXT)  # type: ignore[arg-type]
    assert _is_person(result)


def test_structured_output_pydantic_json_mode(qwen: ChatGGUF) -> None:
    """JSON mode constrains the reply to a JSON object, not to the schema: the reply is a JSON object, and the
    parsed result is exactly that object as a Person (or, if the model left a key out, a parsing error)."""
    from pydantic import ValidationError

    prompt = TEXT + ' Reply with JSON: {"name": ..., "age": ...}.'
    out = qwen.with_structured_output(Person, method="json_mode", include_raw=True).invoke(prompt)
    assert isinstance(out, dict)
    if out["raw"].response_metadata["finish_reason"] == "length":  # a JSON object cut by max_tokens: said so
        assert out["parsed"] is None and "max_tokens" in str(out["parsing_error"])
        return
    value = json.loads(str(out["raw"].content))
    assert isinstance(value, dict)
    try:
        expected = Person.model_validate(value)
    except ValidationError:
        assert out["parsed"] is None and out["parsing_error"] is not None
    else:
        assert out["parsing_error"] is None and out["parsed"] == expected


def test_structured_output_default_is_json_schema_and_include_raw(qwen: ChatGGUF) -> None:
    out = qwen.with_structured_output(Person, include_raw=True).invoke(TEXT)
    assert isinstance(out, dict)
    assert out["parsing_error"] is None
    assert isinstance(out["raw"], AIMessage) and not out["raw"].tool_calls  # json_schema: content, not a call
    assert _is_person(out["parsed"]) and out["parsed"] == Person.model_validate_json(str(out["raw"].content))
    dict_out = qwen.with_structured_output(Person.model_json_schema()).invoke(TEXT)
    assert isinstance(dict_out, dict) and _is_person(Person.model_validate(dict_out))
    assert isinstance(dict_out["name"], str) and isinstance(dict_out["age"], int)  # no coercion from "31"


@pytest.mark.parametrize("schema", [Person, Person.model_json_schema()], ids=["pydantic", "dict"])
def test_structured_output_cut_by_max_tokens_is_an_error(qwen: ChatGGUF, schema: Any) -> None:
    """LangChain's JSON parsers would close the cut-off object and hand back a partial one; we say why instead."""
    from langchain_core.exceptions import OutputParserException

    short = ChatGGUF(model=qwen.model, n_ctx=QWEN_CTX, temperature=0, max_tokens=4)  # attaches to qwen's server
    with pytest.raises(OutputParserException, match="max_tokens"):
        short.with_structured_output(schema).invoke(TEXT)
    out = short.with_structured_output(schema, include_raw=True).invoke(TEXT)
    assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)
    assert out["raw"].response_metadata["finish_reason"] == "length"
