"""Healing on a real llama-server: a Qwen3-Coder XML call that the server's own parser leaves as text becomes a
tool call in ChatGGUF (whole and streamed) and GGUF.

SmolLM2's chat template has no tool-call format, so llama-server's parser returns whatever the model writes as
content. The reply is made the call for real, by the server: the assistant turn is prefilled with it (llama-server
continues a last assistant message and returns it whole as the reply's content) and ``logit_bias`` on
``<|im_end|>`` makes the one token generated after it the end. A ``grammar`` cannot force it: llama-server refuses
a custom grammar with tools bound ("Cannot use custom grammar constraints with tools.").
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure

CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = "What is the weather in Paris?"

pytestmark = pytest.mark.slow


def _forced(llm: ChatGGUF) -> dict[str, Any]:
    (end,) = llm.engine.tokenize("<|im_end|>")
    return {"logit_bias": [[end, 100.0]], "max_tokens": 1, "temperature": 0}


@pytest.mark.speed_timeout("smollm2", tokens=8, starts=2)
def test_a_qwen3_coder_call_left_as_text_becomes_a_tool_call() -> None:
    llm = ChatGGUF(model=str(ensure("smollm2")))
    messages = [HumanMessage(ASK), AIMessage(CALL)]
    try:
        forced = _forced(llm)
        raw = llm.model_copy(update={"auto_heal_tool_calls": False}).bind_tools(TOOLS).invoke(messages, **forced)
        assert raw.content == CALL and raw.tool_calls == []  # the server's parser left it as text
        bound = llm.bind_tools(TOOLS)
        for reply in (bound.invoke(messages, **forced), _joined(bound.stream(messages, **forced))):
            assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]
            assert reply.content == ""
        li = GGUF(model=str(ensure("smollm2")))
        try:
            response = li.chat([ChatMessage(role="user", content=ASK), ChatMessage(role="assistant", content=CALL)],
                               tools=TOOLS, **forced)
            calls = li.get_tool_calls_from_response(response)
            assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("get_weather", {"city": "Paris"})]
        finally:
            li.unload()
    finally:
        llm.unload()


def _joined(chunks: Any) -> Any:
    chunks = list(chunks)
    out = chunks[0]
    for c in chunks[1:]:
        out += c
    return out
