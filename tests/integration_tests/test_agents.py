"""Agents on the 0.5B model as users build them (no max_tokens): LangChain v1 ``create_agent`` and LlamaIndex
``FunctionAgent``, at temperature 0. Whether a tiny model calls a tool unasked, and with which words, differs between
CPUs (the greedy text does), so each agent forces its first call with its framework's own option (a LangChain
middleware setting ``tool_choice``; LlamaIndex's ``initial_tool_choice``) and the tests assert structure: the tool
is called with a string ``city`` (the schema fixes types, not values), its result goes back to the model, and the
run ends with a non-empty text answer that is not a repeat of an answered call (the 0.5B model likes to repeat its
call as text after the result; chat.py asks it once more without tools, and if it repeats again the tool results
are the answer)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gguf_provider import ChatGGUF
from gguf_provider.llama_index import GGUF
from gguf_provider.tools import call_key, heal_tool_calls, only_repeats
from scripts.test_models import ensure

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the slower agent takes ~55 s under load; 10x

QUESTION = "What is the weather in Paris?"


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny and 21 degrees Celsius in {city}."


def _is_a_repeat(text: str, calls: list[tuple[str, dict[str, Any]]]) -> bool:
    """Whether the answer is (only) a call of the tool, written as text, or a repeat of an answered call."""
    answered = {call_key(name, json.dumps(args)) for name, args in calls}
    return heal_tool_calls(text, {"get_weather"}) is not None or only_repeats(text, answered)


@pytest.fixture(scope="module")
def qwen() -> Iterator[str]:
    path = str(ensure("qwen"))
    keep = ChatGGUF(model=path).load()  # one server for the module (the session runs with keep_alive 0)
    yield path
    keep.unload()


def test_langchain_create_agent_calls_the_tool_and_answers(qwen: str) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    @wrap_model_call
    def call_the_tool_first(request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            request = request.override(tool_choice="get_weather")
        return handler(request)

    agent = create_agent(ChatGGUF(model=qwen, temperature=0), tools=[tool(get_weather)],
                         middleware=[call_the_tool_first])
    result = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]}, {"recursion_limit": 12})
    messages: list[Any] = result["messages"]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls and calls[0]["name"] == "get_weather" and isinstance(calls[0]["args"].get("city"), str), calls
    results = {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}
    assert results[calls[0]["id"]] == get_weather(calls[0]["args"]["city"])
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    answer = str(final.content)
    assert answer.strip() and not _is_a_repeat(answer, [(c["name"], c["args"]) for c in calls]), answer


async def test_llama_index_function_agent_calls_the_tool_and_answers(qwen: str) -> None:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.tools import FunctionTool

    agent = FunctionAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=GGUF(model=qwen, temperature=0),
                          initial_tool_choice="get_weather")
    handler = agent.run(user_msg=QUESTION)
    calls = [ev async for ev in handler.stream_events() if isinstance(ev, ToolCallResult)]
    output = await handler
    assert calls and calls[0].tool_name == "get_weather", calls
    city = calls[0].tool_kwargs.get("city")
    assert isinstance(city, str) and calls[0].tool_output.content == get_weather(city)
    answer = str(output.response.content or "")
    assert answer.strip() and not _is_a_repeat(answer, [(c.tool_name, c.tool_kwargs) for c in calls]), answer
