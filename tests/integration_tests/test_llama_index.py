"""The LlamaIndex adapters (GGUF, GGUFEmbedding) and the two LlamaIndex examples, against real llama-servers.

Servers: Qwen2.5-Coder-0.5B (template with tools) for the LLM, tools, structured output and the agent; SmolLM2-135M
as the embedding model (--embedding --pooling mean) and, with DeepSeek-R1's template, for the thinking tests.
Module-scoped fixtures keep one server of each up for the whole file.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from llama_index.core.base.llms.types import ThinkingBlock, ToolCallBlock
from llama_index.core.llms import ChatMessage, ChatResponse
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel

from gguf_provider.llama_index import GGUF, GGUFEmbedding
from gguf_provider.tools import heal_tool_calls
from tests.support import slots

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
N_CTX = 4096


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_it_{name}", ROOT / "integrations" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llm(qwen_path: Path) -> Iterator[GGUF]:
    model = GGUF(model=str(qwen_path), n_ctx=N_CTX, temperature=0, seed=0, max_tokens=24).load()
    yield model
    model.unload()


@pytest.fixture(scope="module")
def thinker(smollm2_path: Path, llama_src: Path) -> Iterator[GGUF]:
    template = llama_src / "models" / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
    model = GGUF(model=str(smollm2_path), chat_template_file=str(template), n_ctx=2048, temperature=0,
                 max_tokens=16).load()
    yield model
    model.unload()


@pytest.fixture(scope="module")
def embed(smollm2_path: Path) -> Iterator[GGUFEmbedding]:
    model = GGUFEmbedding(model=str(smollm2_path), n_ctx=2048, embed_batch_size=2).load()
    yield model
    model.unload()


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


MULTIPLY = FunctionTool.from_defaults(multiply)


class City(BaseModel):
    """A city and the country it is in."""

    name: str
    country: str


# Forced calls are grammar-bound JSON that the model likes to pretty-print: give them room.
ROOM = {"max_tokens": 64}

USER = [ChatMessage(role="user", content="Say hello in one short sentence.")]


# --- import and metadata --------------------------------------------------------------------------------------


def test_lazy_top_level_access() -> None:
    import gguf_provider

    assert gguf_provider.GGUF is GGUF
    assert gguf_provider.GGUFEmbedding is GGUFEmbedding
    code = "import sys, gguf_provider; assert 'llama_index' not in sys.modules, 'eager llama_index import'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_metadata_from_server(llm: GGUF) -> None:
    meta = llm.metadata
    props = llm.engine.client.get_json("/props")
    # The context asked for; the server may be a shared one with a larger context (the runtime reuses it).
    assert meta.context_window == N_CTX <= props["default_generation_settings"]["n_ctx"]
    assert meta.num_output == 24
    assert meta.is_chat_model is True
    assert meta.is_function_calling_model is True  # the Qwen template supports tools
    assert "Qwen2.5-Coder-0.5B" in meta.model_name


def test_metadata_follows_the_server(thinker: GGUF) -> None:
    meta = thinker.metadata
    assert meta.context_window == thinker.engine.n_ctx == 2048
    assert meta.num_output == 16 and "SmolLM2" in meta.model_name


def test_function_calling_flag_follows_the_template(smollm2_path: Path) -> None:
    """SmolLM2's own template has no tools: the flag is read from the server's template caps, not assumed."""
    plain = GGUF(model=str(smollm2_path), n_ctx=1024, max_tokens=8).load()
    try:
        caps = plain.engine.client.get_json("/props")["chat_template_caps"]
        assert plain.metadata.is_function_calling_model is bool(caps.get("supports_tools")) is False
    finally:
        plain.unload()


# --- chat and completion --------------------------------------------------------------------------------------


def _check_response(r: ChatResponse) -> None:
    assert r.message.role == "assistant"
    assert r.message.content and r.message.content.strip()
    assert r.raw["finish_reason"] in ("stop", "length")
    assert r.raw["usage"]["completion_tokens"] > 0
    assert r.additional_kwargs["prompt_tokens"] > 0


def test_chat(llm: GGUF) -> None:
    _check_response(llm.chat(USER))


async def test_achat(llm: GGUF) -> None:
    _check_response(await llm.achat(USER))


def test_stream_chat(llm: GGUF) -> None:
    responses = list(llm.stream_chat(USER))
    assert len(responses) > 2
    text = "".join(r.delta or "" for r in responses)
    assert text.strip() and responses[-1].message.content == text
    assert responses[-1].raw["usage"]["completion_tokens"] > 0


async def test_astream_chat(llm: GGUF) -> None:
    responses = [r async for r in await llm.astream_chat(USER)]
    text = "".join(r.delta or "" for r in responses)
    assert text.strip() and responses[-1].message.content == text
    assert responses[-1].raw["finish_reason"] in ("stop", "length")


# Breaking out of a stream stops the generation on the server (no clock: tests/support/slots.py). On the SmolLM2
# server of `thinker`: fast, and no other test of this module uses it meanwhile.
LONG = 1000  # tokens asked for with ignore_eos: a request that was not cancelled generates all of them
STORY = [ChatMessage(role="user", content="Write a very long story about a lighthouse keeper, in many chapters.")]


@pytest.mark.speed_timeout("smollm2", tokens=LONG)
def test_break_out_of_stream_chat_stops_generation(thinker: GGUF) -> None:
    client = thinker.engine.client
    before = slots.generated(client)
    for n, _ in enumerate(thinker.stream_chat(STORY, max_tokens=LONG, ignore_eos=True)):
        if n == 0:
            assert slots.busy(client) == 1  # it is generating
        if n >= 5:
            break
    slots.assert_stopped_early(client, before, LONG)


@pytest.mark.speed_timeout("smollm2", tokens=LONG)
async def test_break_out_of_astream_chat_stops_generation(thinker: GGUF) -> None:
    client = thinker.engine.client
    before = await asyncio.to_thread(slots.generated, client)
    n = 0
    async for _ in await thinker.astream_chat(STORY, max_tokens=LONG, ignore_eos=True):
        n += 1
        if n >= 5:
            break
    # A plain break: the event loop finalizes the abandoned generator, so wait in a thread, not blocking the loop.
    await asyncio.to_thread(slots.assert_stopped_early, client, before, LONG)


PROMPT = "Name the capital of France in one word."
# Prompt caching off: every run computes the prompt from scratch, so the same request gives the same greedy text
# (a cached prompt is evaluated in other batch shapes, whose rounding may differ on some CPUs).
EXACT = {"cache_prompt": False}


@pytest.fixture(scope="module")
def chat_reply(llm: GGUF) -> str:
    """The reply to PROMPT as one user message through chat(): what every completion of it must return, on any
    CPU (completion goes through the chat template; a raw prompt would be merely continued, differently)."""
    reply = llm.chat([ChatMessage(role="user", content=PROMPT)], **EXACT).message.content or ""
    assert reply.strip()
    return reply


def test_complete(llm: GGUF, chat_reply: str) -> None:
    r = llm.complete(PROMPT, **EXACT)
    assert r.text == chat_reply
    assert r.raw["usage"]["prompt_tokens"] > 0


async def test_acomplete(llm: GGUF, chat_reply: str) -> None:
    r = await llm.acomplete(PROMPT, **EXACT)
    assert r.text == chat_reply


def test_stream_complete(llm: GGUF, chat_reply: str) -> None:
    responses = list(llm.stream_complete(PROMPT, **EXACT))
    assert "".join(r.delta or "" for r in responses) == responses[-1].text == chat_reply


async def test_astream_complete(llm: GGUF, chat_reply: str) -> None:
    responses = [r async for r in await llm.astream_complete(PROMPT, **EXACT)]
    assert "".join(r.delta or "" for r in responses) == responses[-1].text == chat_reply


def test_completion_uses_the_chat_template(llm: GGUF) -> None:
    # Through the chat template the instruct model answers; a raw prompt would merely be continued.
    assert llm.count_message_tokens([ChatMessage(role="user", content=PROMPT)]) > llm.count_tokens(PROMPT) + 5


# --- thinking ---------------------------------------------------------------------------------------------------


def test_thinking_block(thinker: GGUF) -> None:
    r = thinker.chat([ChatMessage(role="user", content="What is 2 + 2?")])
    thinking = [b for b in r.message.blocks if isinstance(b, ThinkingBlock)]
    assert thinking and (thinking[0].content or "").strip()
    assert "<think>" not in (r.message.content or "")


def test_thinking_delta_streams(thinker: GGUF) -> None:
    responses = list(thinker.stream_chat([ChatMessage(role="user", content="What is 2 + 2?")]))
    deltas = [r.additional_kwargs["thinking_delta"] for r in responses if "thinking_delta" in r.additional_kwargs]
    assert deltas
    final = [b for b in responses[-1].message.blocks if isinstance(b, ThinkingBlock)]
    assert final and final[0].content == "".join(deltas)


async def test_thinking_delta_astreams_and_reasoning_switch(thinker: GGUF) -> None:
    deltas = [r.additional_kwargs.get("thinking_delta") async for r in
              await thinker.astream_chat([ChatMessage(role="user", content="Hi")])]
    assert any(deltas)
    c = await thinker.acomplete("Hi")
    assert c.additional_kwargs.get("thinking")


# --- tools --------------------------------------------------------------------------------------------------------


def test_chat_with_tools_auto(llm: GGUF) -> None:
    """"auto" leaves the choice to the model, and what it writes differs between CPUs: the same request without
    healing (cache_prompt off: computed alike) shows what it wrote, and the calls are exactly those (a native
    call as parsed by llama-server, or a call written as text, healed), each with a call id and a ToolCallBlock."""
    ask = {"user_msg": "What is 6 times 7? Use the multiply tool.", **ROOM, **EXACT}
    raw = llm.model_copy(update={"auto_heal_tool_calls": False}).chat_with_tools([MULTIPLY], **ask)
    r = llm.chat_with_tools([MULTIPLY], **ask)
    calls = llm.get_tool_calls_from_response(r, error_on_no_tool_call=False)
    native = llm.get_tool_calls_from_response(raw, error_on_no_tool_call=False)
    healed = heal_tool_calls(raw.message.content or "", {"multiply"}) if not native else None
    if native:
        expected = [(c.tool_name, c.tool_kwargs) for c in native]
    else:
        expected = [(c.name, c.args()) for c in healed or ()]
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == expected, raw.message.content
    assert all(c.tool_id for c in calls)
    assert any(isinstance(b, ToolCallBlock) for b in r.message.blocks) == bool(calls)
    if not calls:  # prose: left as it was
        assert r.message.content == raw.message.content


async def test_tool_required_is_enforced(llm: GGUF) -> None:
    # A greeting invites prose; tool_required must still produce a call (constrained decoding).
    r = await llm.achat_with_tools([MULTIPLY], user_msg="Hello! How are you today?", tool_required=True,
                                   **ROOM)
    calls = llm.get_tool_calls_from_response(r)
    assert len(calls) == 1 and calls[0].tool_name == "multiply"
    assert set(calls[0].tool_kwargs) == {"a", "b"}


def test_named_tool_choice_and_no_call(llm: GGUF) -> None:
    def shout(text: str) -> str:
        """Return the text in capital letters."""
        return text.upper()

    tools = [MULTIPLY, FunctionTool.from_defaults(shout)]
    r = llm.chat_with_tools(tools, user_msg="Please shout 'hi'.", tool_choice="multiply", **ROOM)
    assert [c.tool_name for c in llm.get_tool_calls_from_response(r)] == ["multiply"]
    with pytest.raises(ValueError, match="not one of the tools"):
        llm.chat_with_tools(tools, user_msg="x", tool_choice="nope")
    plain = llm.chat(USER)
    assert llm.get_tool_calls_from_response(plain, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError):
        llm.get_tool_calls_from_response(plain)


def test_predict_and_call(llm: GGUF) -> None:
    out = llm.predict_and_call([MULTIPLY], user_msg="Use the multiply tool to compute 3 times 5.",
                               tool_required=True, **ROOM)
    # The grammar fixes the types of the arguments, not their values: the tool ran on the ones the model chose.
    (source,) = out.sources
    a, b = source.raw_input["kwargs"]["a"], source.raw_input["kwargs"]["b"]
    assert isinstance(a, int) and isinstance(b, int) and out.response == str(a * b)


async def test_astream_chat_with_tools(llm: GGUF) -> None:
    ask = {"user_msg": "What is 6 times 7?", "tool_required": True, **ROOM, **EXACT}
    stream = await llm.astream_chat_with_tools([MULTIPLY], **ask)
    last = None
    async for last in stream:
        llm.get_tool_calls_from_response(last, error_on_no_tool_call=False)  # partial responses must parse too
    assert last is not None
    calls = llm.get_tool_calls_from_response(last)
    # The same call as the same request not streamed (the arguments' values are the model's, CPU-dependent).
    whole = llm.get_tool_calls_from_response(await llm.achat_with_tools([MULTIPLY], **ask))
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [(c.tool_name, c.tool_kwargs) for c in whole]
    assert calls[0].tool_name == "multiply" and all(isinstance(calls[0].tool_kwargs[k], int) for k in ("a", "b"))


def test_tool_history_round_trip(llm: GGUF) -> None:
    r = llm.chat_with_tools([MULTIPLY], user_msg="What is 6 times 7?", tool_required=True, **ROOM)
    call = llm.get_tool_calls_from_response(r)[0]
    history = [ChatMessage(role="user", content="What is 6 times 7?"), r.message,
               ChatMessage(role="tool", content="42", additional_kwargs={"tool_call_id": call.tool_id})]
    from gguf_provider.llama_index.llms import to_openai

    sent = to_openai(history, keep_reasoning=False)
    assert sent[1]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": json.dumps(call.tool_kwargs)}
    assert sent[2] == {"role": "tool", "content": "42", "tool_call_id": call.tool_id}
    assert llm.count_message_tokens(history) > 0  # the template renders the exchange


# --- structured output ----------------------------------------------------------------------------------------------

CITY = PromptTemplate("Give the capital city of {country} as JSON.")


# The schema's grammar guarantees a City (both keys, strings); which city the model names differs between CPUs.


def test_structured_predict(llm: GGUF) -> None:
    city = llm.structured_predict(City, CITY, llm_kwargs=ROOM, country="France")
    assert isinstance(city, City) and isinstance(city.name, str) and isinstance(city.country, str)


async def test_astructured_predict(llm: GGUF) -> None:
    city = await llm.astructured_predict(City, CITY, llm_kwargs=ROOM, country="Italy")
    assert isinstance(city, City) and isinstance(city.name, str) and isinstance(city.country, str)


def test_stream_structured_predict(llm: GGUF) -> None:
    kwargs = {**ROOM, **EXACT}
    partials = list(llm.stream_structured_predict(City, CITY, llm_kwargs=kwargs, country="Japan"))
    assert len(partials) > 1
    # The last partial is the whole object: the one the same request gives unstreamed.
    assert partials[-1] == llm.structured_predict(City, CITY, llm_kwargs=kwargs, country="Japan")


async def test_as_structured_llm(llm: GGUF) -> None:
    sllm = llm.as_structured_llm(City)
    r = sllm.chat([ChatMessage(role="user", content="The capital of Germany?")])
    assert isinstance(r.raw, City) and isinstance(r.raw.name, str) and isinstance(r.raw.country, str)
    ar = await sllm.achat([ChatMessage(role="user", content="The capital of Spain?")])
    assert isinstance(ar.raw, City) and isinstance(ar.raw.name, str) and isinstance(ar.raw.country, str)


# --- embeddings ------------------------------------------------------------------------------------------------------


def test_embedding_batched(embed: GGUFEmbedding) -> None:
    texts = ["a cat sat on the mat", "dogs bark", "the stock market fell", "a kitten on a rug", "rain"]
    vectors = embed.get_text_embedding_batch(texts)  # embed_batch_size=2: three requests
    assert len(vectors) == 5 and len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 100
    query = embed.get_query_embedding("a cat sat on the mat")
    assert embed.similarity(query, vectors[0]) > 0.999  # the same text (not which others the model finds near)


async def test_embedding_async(embed: GGUFEmbedding) -> None:
    vectors = await embed.aget_text_embedding_batch(["one", "two", "three"])
    assert len(vectors) == 3
    single = await embed.aget_text_embedding("two")
    query = await embed.aget_query_embedding("two")
    assert embed.similarity(single, vectors[1]) > 0.999 and embed.similarity(query, single) > 0.999


def test_embedding_of_a_long_text(embed: GGUFEmbedding) -> None:
    # Longer than llama-server's default physical batch (512 tokens): must not fail.
    assert len(embed.get_text_embedding("word " * 1200)) > 100


# --- the examples ------------------------------------------------------------------------------------------------------


def test_query_engine_example(llm: GGUF, embed: GGUFEmbedding) -> None:
    from llama_index.core.base.response.schema import StreamingResponse

    qe_mod = _load("llamaindex_query_engine")
    # Three pages of docs/: all of it takes minutes to embed on 2 cores.
    paths: list[Path] = [ROOT / "docs" / name for name in ("index.md", "runtime.md", "security.md")]
    documents = qe_mod.load_documents(paths)
    engine = qe_mod.build_query_engine(documents, llm, embed, top_k=2, chunk_size=200)
    response = engine.query("What is gguf-provider?")
    assert isinstance(response, StreamingResponse)
    tokens = list(response.response_gen)
    assert len(tokens) > 1 and "".join(tokens).strip()
    assert response.source_nodes and len(response.source_nodes) <= 2
    for node in response.source_nodes:
        assert Path(node.metadata["file_path"]).suffix in qe_mod.TEXT_EXTS
        assert node.score is not None


async def test_agent_calls_its_tool(llm: GGUF) -> None:
    from llama_index.core.agent.workflow import ToolCallResult

    agent_mod = _load("llamaindex_agent")
    handler = agent_mod.make_agent(llm).run(user_msg="How much does a kilogram of cherries cost?")
    results = [ev async for ev in handler.stream_events() if isinstance(ev, ToolCallResult)]
    answer = await handler
    # The example forces its first call (initial_tool_choice): the tool runs whatever the CPU; its argument is the
    # model's words, so the answer is checked against the tool's own output for them (return_direct).
    assert results and results[0].tool_name == "fruit_price"
    fruit = results[0].tool_kwargs.get("fruit")
    assert isinstance(fruit, str) and str(answer) == agent_mod.fruit_price(fruit)
