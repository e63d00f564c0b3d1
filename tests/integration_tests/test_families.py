"""The family table (gguf_provider/families.py, docs/models.md), row by row, through a real llama-server.

Each row loads SmolLM2 under the family's chat template (``chat_template_file``, the file from the pinned llama.cpp
tree in tests/unit_tests/data/templates), so llama-server detects the family's format and runs its own parser.
A 135M model does not write those formats by itself; the server is made to produce them for real:

* a tool call or a reply with reasoning is the **prefilled** assistant turn: llama-server continues a last assistant
  message and parses prefill + generated text with the family's parser; ``logit_bias`` on ``<|im_end|>`` (the
  model's end token) makes the one generated token the end;
* gpt-oss is the exception: llama-server continues a prefilled gpt-oss turn in its ``final`` channel
  (common/parsers/gpt-oss.cpp), so a prefilled call stays text. There the call is **generated**: the server's own
  tool-call grammar (``tool_choice: "required"``, sent as a raw llama-server field through ``extra_body``) with a
  one-value enum for the argument and a bias on the token `` to`` that opens gpt-oss's ``to=functions.NAME``;
* the thinking switch is read from the prompt the server renders (``/apply-template``) for our request body, and
  for families whose prompt opens thinking, from a real reply;
* a tool result is rendered by the server from the adapter's own messages (and answered, with the reply's length
  bounded).

No replay is used. Mistral Small 3.2's tool-call rows are strict expected failures: the pinned server's parser for its
template wants ``[ARGS]`` twice (its generated grammar says so), so a call as the model writes it is refused.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ThinkingBlock

from gguf_provider import ChatGGUF, families
from gguf_provider.chat import family_of
from gguf_provider.errors import APIError, ReasoningWarning
from gguf_provider.langchain._utils import to_openai
from gguf_provider.limits import template_payload
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure
from tests.support.templates import template_path

pytestmark = pytest.mark.slow

ASK = "What is the weather in Paris?"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}]
REASONING, ANSWER = "The user asks about Paris.", "It is sunny."
CALL_ID = "call_7f3a9c2e41b84d0e9a6b5c1d2e3f4a5b"  # as servers write them: Mistral's templates refuse it as is
ROWS = [*families.FAMILIES, *(families.by_name(n) for n in families.TESTED_AS.values())]
FILES = [f.template for f in families.FAMILIES] + list(families.TESTED_AS)


def _row_ids() -> list[str]:
    return [f"{f.name}:{t}" for f, t in zip(ROWS, FILES, strict=True)]


@pytest.fixture(scope="module", params=list(zip(ROWS, FILES, strict=True)), ids=_row_ids())
def row(request: pytest.FixtureRequest) -> Iterator[tuple[families.Family, ChatGGUF, GGUF]]:
    family, name = request.param
    options: dict[str, Any] = {"model": str(ensure("smollm2")), "chat_template_file": str(template_path(name)),
                               "n_ctx": 2048, "keep_alive": 0}
    llm, li = ChatGGUF(**options), GGUF(**options)
    try:
        yield family, llm, li
    finally:
        llm.unload()
        li.unload()


def _end(llm: ChatGGUF) -> dict[str, Any]:
    """The one generated token is the model's end: the reply is exactly the prefilled turn."""
    (end,) = llm.engine.tokenize("<|im_end|>")
    return {"logit_bias": [[end, 100.0]], "max_tokens": 1, "temperature": 0}


def _joined(chunks: Iterator[Any]) -> Any:
    out = None
    for c in chunks:
        out = c if out is None else out + c
    return out


def _last(responses: Iterator[Any]) -> Any:
    out = None
    for out in responses:  # noqa: B007 - the last one holds the whole message
        pass
    return out


def _calls_lc(msg: AIMessage) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["args"]) for c in msg.tool_calls]


WANT = [("get_weather", {"city": "Paris"})]
# Mistral Small 3.2's call is refused by the pinned llama-server: its parser for the template wants [ARGS] twice
# (the grammar it generates says so) and answers HTTP 500 "does not match the expected peg-native format", an
# APIError (a UsageError in the magics). Strict: the day an upstream fix lands, the test reports it.
ARGS_TWICE = ("the pinned llama-server's parser for Mistral Small 3.2's template wants [ARGS] twice (upstream): "
              "it answers the call as the model writes it with HTTP 500")


def _expect_upstream_failure(family: families.Family, request: pytest.FixtureRequest,
                             raises: type[BaseException]) -> None:
    if family.name == "Mistral Small 3.2":
        request.applymarker(pytest.mark.xfail(reason=ARGS_TWICE, raises=raises, strict=True))


def test_the_server_runs_the_familys_template(row: tuple[families.Family, ChatGGUF, GGUF]) -> None:
    family, llm, _ = row
    assert family_of(llm.engine) == family


def _tool_call_cases(family: families.Family, llm: ChatGGUF, li: GGUF) -> tuple[
        list[BaseMessage], list[ChatMessage], dict[str, Any], ChatGGUF, GGUF]:
    """The conversation, per-call fields and adapters that make the server produce the family's call."""
    if family.name == "gpt-oss":
        (to,) = llm.engine.tokenize(" to")
        raw = {"tool_choice": "required", "parallel_tool_calls": False, "logit_bias": [[to, 50.0]]}
        settings = {"temperature": 0, "max_tokens": 200}
        return ([HumanMessage(ASK)], [ChatMessage(role="user", content=ASK)], {},
                llm.model_copy(update={"model_kwargs": raw, **settings}),
                li.model_copy(update={"additional_kwargs": raw, **settings}))
    lc: list[BaseMessage] = [HumanMessage(ASK), AIMessage(family.call)]
    li_msgs = [ChatMessage(role="user", content=ASK), ChatMessage(role="assistant", content=family.call)]
    return lc, li_msgs, _end(llm), llm, li


def test_a_call_in_the_familys_format_is_a_tool_call_in_every_adapter(
        row: tuple[families.Family, ChatGGUF, GGUF], request: pytest.FixtureRequest) -> None:
    family, llm, li = row
    _expect_upstream_failure(family, request, APIError)
    lc_msgs, li_msgs, forced, chat_llm, li_llm = _tool_call_cases(family, llm, li)
    bound = chat_llm.bind_tools(TOOLS)
    whole = bound.invoke(lc_msgs, **forced)
    streamed = _joined(bound.stream(lc_msgs, **forced))
    for reply in (whole, streamed):
        assert _calls_lc(reply) == WANT, (family.name, reply)
        assert reply.content == "" and reply.tool_calls[0]["id"]
    if family.parsed:  # the server's parser made it a call, not our healing
        raw = chat_llm.model_copy(update={"auto_heal_tool_calls": False}).bind_tools(TOOLS).invoke(lc_msgs, **forced)
        assert _calls_lc(raw) == WANT
    response = li_llm.chat(li_msgs, tools=TOOLS, **forced)
    last = _last(li_llm.stream_chat(li_msgs, tools=TOOLS, **forced))
    for r in (response, last):
        assert r is not None
        calls = li_llm.get_tool_calls_from_response(r, error_on_no_tool_call=True)
        assert [(c.tool_name, c.tool_kwargs) for c in calls] == WANT, (family.name, r)


def test_reasoning_arrives_as_reasoning(row: tuple[families.Family, ChatGGUF, GGUF]) -> None:
    family, llm, li = row
    if family.thinking == "none":  # no thinking: nothing the model writes is reported as reasoning
        reply = llm.invoke([HumanMessage(ASK)], max_tokens=8, temperature=0)
        assert not reply.additional_kwargs.get("reasoning_content")
        return
    forced = _end(llm)
    prefilled = [HumanMessage(ASK), AIMessage(ANSWER, additional_kwargs={"reasoning_content": REASONING})]
    for reply in (llm.invoke(prefilled, **forced), _joined(llm.stream(prefilled, **forced))):
        assert reply.additional_kwargs["reasoning_content"].strip() == REASONING, (family.name, reply)
        assert reply.content.strip() == ANSWER
    li_msgs = [ChatMessage(role="user", content=ASK),
               ChatMessage(role=MessageRole.ASSISTANT, blocks=[ThinkingBlock(content=REASONING),
                                                               TextBlock(text=ANSWER)])]
    last = _last(li.stream_chat(li_msgs, **forced))
    for r in (li.chat(li_msgs, **forced), last):
        assert r is not None
        thinking = "".join(b.content or "" for b in r.message.blocks if isinstance(b, ThinkingBlock))
        assert thinking.strip() == REASONING and (r.message.content or "").strip() == ANSWER, (family.name, r)


def _prompt(llm: ChatGGUF, messages: list[BaseMessage], **kwargs: Any) -> str:
    """The prompt llama-server renders for the body the adapter sends."""
    engine, request = llm._request(messages, None, **kwargs)
    return engine.client.apply_template(template_payload(request.payload(family_of(engine))))


def test_the_thinking_switch(row: tuple[families.Family, ChatGGUF, GGUF]) -> None:
    family, llm, _ = row
    msgs: list[BaseMessage] = [HumanMessage(ASK)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = {r: _prompt(llm, msgs, reasoning=r) for r in (None, True, False, "low", "high")}
    warned = [str(w.message) for w in caught if issubclass(w.category, ReasoningWarning)]
    if family.thinking == "switch":
        assert prompts[False] != prompts[True], "reasoning=False must reach the template"
        assert prompts["low"] == prompts["high"] == prompts[True]  # levels are budgets, not prompt text
        assert prompts[True] == prompts[None] or family.name in ("SmolLM3",)
    elif family.thinking == "effort":
        assert prompts["low"] != prompts["high"] and "low" in prompts["low"] and "high" in prompts["high"]
        assert prompts[False] == prompts["low"]
    else:
        assert len(set(prompts.values())) == 1  # nothing reaches a template that has no switch
    if family.thinking in ("effort", "always"):
        assert any("thinking off" in w or "always thinks" in w for w in warned) or _already_warned(family)
    if family.thinking == "none":
        assert any("no thinking" in w for w in warned) or _already_warned(family)


def _already_warned(family: families.Family) -> bool:
    from gguf_provider.chat import _warned
    return any(family.name in w for w in _warned)


@pytest.mark.parametrize("name", ["Qwen3.5", "DeepSeek R1 (distill)", "DeepSeek V3.1"])
def test_reasoning_false_leaves_no_reasoning_where_the_prompt_opens_it(name: str) -> None:
    """These templates open thinking in the generation prompt: whatever the model writes is reasoning unless the
    switch closed it (the end token ignored, so the reply is never empty)."""
    family = families.by_name(name)
    llm = ChatGGUF(model=str(ensure("smollm2")), chat_template_file=str(template_path(family.template)),
                   n_ctx=2048, keep_alive=0, temperature=0, max_tokens=8, model_kwargs={"ignore_eos": True})
    try:
        assert _opens_thinking(_prompt(llm, [HumanMessage(ASK)]))
        off = llm.invoke([HumanMessage(ASK)], reasoning=False)
        assert not off.additional_kwargs.get("reasoning_content")
        on = llm.invoke([HumanMessage(ASK)])
        assert on.additional_kwargs.get("reasoning_content")
    finally:
        llm.unload()


def _opens_thinking(prompt: str) -> bool:
    return prompt.rstrip().endswith("<think>")


@pytest.mark.parametrize("name", [f.name for f in families.FAMILIES if f.budget])
def test_reasoning_budget_ends_the_thinking(name: str) -> None:
    """``reasoning_budget`` reaches llama-server, which closes the thinking after that many tokens: with the end
    token ignored, the rest of the reply is the answer."""
    family = families.by_name(name)
    llm = ChatGGUF(model=str(ensure("smollm2")), chat_template_file=str(template_path(family.template)),
                   n_ctx=2048, keep_alive=0, temperature=0, max_tokens=24, model_kwargs={"ignore_eos": True})
    try:
        reply = llm.invoke([HumanMessage(ASK)], reasoning_budget=4)
        thinking = reply.additional_kwargs.get("reasoning_content") or ""
        assert thinking and len(llm.engine.tokenize(thinking)) <= 6, thinking
        assert reply.content
    finally:
        llm.unload()


def test_a_tool_result_is_rendered_by_the_familys_template(row: tuple[families.Family, ChatGGUF, GGUF]) -> None:
    family, llm, _ = row
    history: list[BaseMessage] = [
        HumanMessage(ASK),
        AIMessage("", tool_calls=[{"id": CALL_ID, "name": "get_weather", "args": {"city": "Paris"}}]),
        ToolMessage("18 degrees and sunny", tool_call_id=CALL_ID)]
    prompt = _prompt(llm, history, tools=TOOLS)
    after = prompt[prompt.index(ASK) + len(ASK):]
    assert "get_weather" in after and "Paris" in after and "18 degrees and sunny" in after, (family.name, after)
    assert after.index("Paris") < after.index("18 degrees")
    # The server renders it and answers; the answer is prefilled (a free reply of this model is no valid gpt-oss
    # output, which llama-server refuses with HTTP 500).
    reply = llm.bind_tools(TOOLS).invoke([*history, AIMessage(ANSWER)], **_end(llm))
    assert isinstance(reply, AIMessage) and reply.content.strip() == ANSWER and not reply.tool_calls
    if family.ids9:
        assert CALL_ID not in prompt
    # the messages as the adapter sends them keep the caller's ids
    assert to_openai(history, keep_reasoning=False)[1]["tool_calls"][0]["id"] == CALL_ID
    json.dumps(reply.additional_kwargs)


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # None: started by an earlier test
    shell.run_line_magic("load_ext", "gguf_provider")
    yield shell


def test_a_call_in_the_familys_format_reaches_the_magics(
        row: tuple[families.Family, ChatGGUF, GGUF], ip: Any, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    """``%%gguf --tools`` on the family's server (the same options as the row's adapters: the same server); the
    reply is forced as in the adapters' test, by wrapping the chat layer's stream the magics call."""
    from IPython.core.error import UsageError

    from gguf_provider.jupyter import commands

    family, llm, _ = row
    _expect_upstream_failure(family, request, UsageError)
    real = commands.chat.stream

    def forced(engine: Any, request: Any) -> Iterator[Any]:
        if family.name == "gpt-oss":
            (to,) = engine.tokenize(" to")
            params = {**request.params, "tool_choice": "required", "parallel_tool_calls": False,
                      "logit_bias": [[to, 50.0]], "temperature": 0, "max_tokens": 200}
            return real(engine, dataclasses.replace(request, params=params))
        (end,) = engine.tokenize("<|im_end|>")
        return real(engine, dataclasses.replace(
            request, messages=[*request.messages, {"role": "assistant", "content": family.call}],
            params={**request.params, "logit_bias": [[end, 100.0]], "max_tokens": 1, "temperature": 0}))

    monkeypatch.setattr(commands.chat, "stream", forced)
    ip.user_ns["weather_tool"] = TOOLS[0]
    ip.run_line_magic("gguf", f"load {llm.model} --ctx 2048 --as fam --chat-template-file {llm.chat_template_file}")
    try:
        ip.run_cell_magic("gguf", "fam --tools weather_tool", ASK)
        reply = ip.user_ns["_gguf_last"]
        assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == WANT, (family.name, reply)
        assert reply.text == ""
    finally:
        ip.run_line_magic("gguf", "unload fam")


@pytest.mark.parametrize("name", ["Qwen3", "gpt-oss", "Llama 3.1"])
def test_the_magics_reasoning_levels_send_what_the_family_takes(
        name: str, ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``%%gguf --effort LEVEL`` / ``--no-think`` and ``%gguf load --reasoning`` mean what ``reasoning=`` means."""
    from gguf_provider import engine as engine_module

    family = families.by_name(name)
    sent: list[dict[str, Any]] = []
    real = engine_module.Engine.stream

    def spy(self: Any, payload: dict[str, Any], **kwargs: Any) -> Iterator[Any]:
        sent.append(payload)
        (end,) = self.tokenize("<|im_end|>")  # a prefilled answer: any family's parser takes it
        forced = {**payload, "messages": [*payload["messages"], {"role": "assistant", "content": ANSWER}],
                  "logit_bias": [[end, 100.0]], "max_tokens": 1}
        return real(self, forced, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "stream", spy)
    ip.run_line_magic("gguf", f"load {ensure('smollm2')} --ctx 2048 --as lv --reasoning off "
                              f"--chat-template-file {template_path(family.template)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReasoningWarning)
            ip.run_cell_magic("gguf", "lv -n 1 --no-history", ASK)
            ip.run_cell_magic("gguf", "lv -n 1 --no-history --effort low", ASK)
    finally:
        ip.run_line_magic("gguf", "unload lv")
    off, low = sent
    if family.thinking == "switch":
        assert off["reasoning_effort"] == "none" and low["reasoning_budget_tokens"] == 1024
    elif family.thinking == "effort":
        assert off["reasoning_effort"] == "low" and low["reasoning_effort"] == "low"
    else:
        assert "reasoning_effort" not in off and "reasoning_budget_tokens" not in low
