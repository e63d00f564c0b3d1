"""Agents on the 0.5B model as users build them (no max_tokens): LangChain v1 ``create_agent`` and LlamaIndex
``FunctionAgent``, at temperature 0 (at the server's default 0.8 whether the tiny model calls the tool at all is a
coin toss, which would make the test a lottery). The tool is called with the right arguments and the run ends
with a text answer: no exception, and no raw tool-call JSON as the final answer (the 0.5B model likes to repeat its
call as text after the result; chat.py asks it once more without tools when the call was already answered)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gguf_provider import ChatGGUF
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

QUESTION = "What is the weather in Paris?"


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny and 21 degrees Celsius in {city}."


def _looks_like_a_call(text: str) -> bool:
    s = text.strip().strip("`").removeprefix("json").strip()
    for line in s.splitlines() or [s]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "name" in value:
            return True
    return "<tool_call>" in text


@pytest.fixture(scope="module")
def qwen() -> Iterator[str]:
    path = str(ensure("qwen"))
    keep = ChatGGUF(model=path).load()  # one server for the module (the session runs with keep_alive 0)
    yield path
    keep.unload()


def test_langchain_create_agent_calls_the_tool_and_answers(qwen: str) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    agent = create_agent(ChatGGUF(model=qwen, temperature=0), tools=[tool(get_weather)])
    result = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]}, {"recursion_limit": 12})
    messages: list[Any] = result["messages"]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls and calls[0]["name"] == "get_weather" and "paris" in calls[0]["args"]["city"].lower(), calls
    assert any(isinstance(m, ToolMessage) and "sunny" in str(m.content) for m in messages)
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert str(final.content).strip() and not _looks_like_a_call(str(final.content)), final.content


async def test_llama_index_function_agent_calls_the_tool_and_answers(qwen: str) -> None:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.tools import FunctionTool

    agent = FunctionAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=GGUF(model=qwen, temperature=0))
    handler = agent.run(user_msg=QUESTION)
    calls = [ev async for ev in handler.stream_events() if isinstance(ev, ToolCallResult)]
    output = await handler
    assert calls and calls[0].tool_name == "get_weather" and "paris" in str(calls[0].tool_kwargs).lower(), calls
    answer = str(output.response.content or "")
    assert answer.strip() and not _looks_like_a_call(answer), answer
