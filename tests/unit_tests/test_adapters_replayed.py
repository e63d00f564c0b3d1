"""The four adapters end to end over recorded llama-server answers (scripts/capture_replays.py, our build): sync
and async, streamed and whole, plus the one error guard: a transport failure is the same typed error on every
path. No binary, no model."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF, GGUFEmbeddings, ServerConnectionError, ServerTimeoutError
from gguf_provider.llama_index import GGUF, GGUFEmbedding
from tests.support.replay import BASE_URL, Replay, load_replay

USER = [ChatMessage(role="user", content="Say hi")]


@pytest.fixture
def chat_replay() -> Replay:
    return load_replay("smollm2_chat")


def _recorded_text(replay: Replay) -> str:
    """The reply text as the recorded stream carries it."""
    import json

    body = next(ex["body"] for ex in replay.exchanges if ex["path"] == "/v1/chat/completions")
    text = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def test_chatgguf_stream_and_invoke(chat_replay: Replay) -> None:
    llm = ChatGGUF(base_url=BASE_URL, transport=chat_replay.transport)
    chunks = list(llm.stream("Say hi"))
    assert "".join(str(c.content) for c in chunks) == _recorded_text(chat_replay)
    last = chunks[-1]
    assert isinstance(last, AIMessageChunk) and last.chunk_position == "last"
    assert last.usage_metadata and last.usage_metadata["output_tokens"] > 0
    assert last.response_metadata["finish_reason"] in ("stop", "length")
    assert llm.invoke("Say hi").content == _recorded_text(chat_replay)


async def test_chatgguf_astream_and_ainvoke(chat_replay: Replay) -> None:
    llm = ChatGGUF(base_url=BASE_URL, transport=chat_replay.transport)
    text = "".join([str(c.content) async for c in llm.astream("Say hi")])
    assert text == _recorded_text(chat_replay)
    assert (await llm.ainvoke("Say hi")).content == text


def test_gguf_chat_and_stream(chat_replay: Replay) -> None:
    llm = GGUF(base_url=BASE_URL, transport=chat_replay.transport)
    assert llm.chat(USER).message.content == _recorded_text(chat_replay)
    responses = list(llm.stream_chat(USER))
    assert "".join(r.delta or "" for r in responses) == _recorded_text(chat_replay)
    assert responses[-1].raw and responses[-1].raw["finish_reason"] in ("stop", "length")
    assert llm.metadata.context_window > 0 and llm.metadata.is_chat_model


async def test_gguf_achat_and_astream(chat_replay: Replay) -> None:
    llm = GGUF(base_url=BASE_URL, transport=chat_replay.transport)
    assert (await llm.achat(USER)).message.content == _recorded_text(chat_replay)
    text = "".join([r.delta or "" async for r in await llm.astream_chat(USER)])
    assert text == _recorded_text(chat_replay)


def test_tool_call_stream_becomes_tool_calls() -> None:
    """The recorded Qwen reply writes the call as fenced JSON in content (the server parsed no tool call):
    healing turns it into a real one in both adapters."""
    replay = load_replay("qwen_tool_call")

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return "sunny"

    llm = ChatGGUF(base_url=BASE_URL, transport=replay.transport)
    reply = llm.bind_tools([get_weather]).invoke("Weather in Rome?")
    assert [(c["name"], sorted(c["args"])) for c in reply.tool_calls] == [("get_weather", ["city"])]
    li = GGUF(base_url=BASE_URL, transport=replay.transport)
    response = li.chat([ChatMessage(role="user", content="Weather in Rome?")], tools=replay.bodies(
        "/v1/chat/completions")[-1]["tools"])
    assert [s.tool_name for s in li.get_tool_calls_from_response(response)] == ["get_weather"]


async def test_embeddings_sync_and_async() -> None:
    replay = load_replay("smollm2_embeddings")
    lc = GGUFEmbeddings(base_url=BASE_URL, transport=replay.transport)
    li = GGUFEmbedding(base_url=BASE_URL, transport=replay.transport)
    vectors = lc.embed_documents(["hello", "world"])
    assert vectors == await lc.aembed_documents(["hello", "world"])
    assert vectors == li.get_text_embedding_batch(["hello", "world"])
    assert vectors == await li.aget_text_embedding_batch(["hello", "world"])
    assert len(vectors) == 2 and vectors[0] != vectors[1]


# --- one error guard: the same typed error on every path ------------------------------------------------------


def _failing(chat_replay: Replay, exc: Exception) -> httpx.MockTransport:
    """The recorded server for /props, but every generation request fails in the transport."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/v1/chat/completions", "/v1/embeddings", "/apply-template", "/tokenize"):
            raise exc
        return chat_replay(request)

    return httpx.MockTransport(handler)


FAILURES = [(httpx.ConnectError("connection refused"), ServerConnectionError),
            (httpx.RemoteProtocolError("peer closed connection"), ServerConnectionError),
            (httpx.ReadTimeout("timed out"), ServerTimeoutError)]


@pytest.mark.parametrize(("exc", "expected"), FAILURES, ids=lambda v: type(v).__name__)
async def test_langchain_paths_raise_the_same_type(chat_replay: Replay, exc: Exception,
                                                   expected: type[Exception]) -> None:
    llm = ChatGGUF(base_url=BASE_URL, transport=_failing(chat_replay, exc), max_retries=0)
    calls: list[Any] = [lambda: llm.invoke("hi"), lambda: list(llm.stream("hi"))]
    for call in calls:
        with pytest.raises(expected):
            call()
    with pytest.raises(expected):
        await llm.ainvoke("hi")
    with pytest.raises(expected):
        [c async for c in llm.astream("hi")]


@pytest.mark.parametrize(("exc", "expected"), FAILURES, ids=lambda v: type(v).__name__)
async def test_llama_index_paths_raise_the_same_type(chat_replay: Replay, exc: Exception,
                                                     expected: type[Exception]) -> None:
    llm = GGUF(base_url=BASE_URL, transport=_failing(chat_replay, exc), max_retries=0)
    with pytest.raises(expected):
        llm.chat(USER)
    with pytest.raises(expected):
        list(llm.stream_chat(USER))
    with pytest.raises(expected):
        await llm.achat(USER)
    with pytest.raises(expected):
        [r async for r in await llm.astream_chat(USER)]


@pytest.mark.parametrize(("exc", "expected"), FAILURES, ids=lambda v: type(v).__name__)
async def test_embedding_paths_raise_the_same_type(chat_replay: Replay, exc: Exception,
                                                   expected: type[Exception]) -> None:
    for emb in (GGUFEmbeddings(base_url=BASE_URL, transport=_failing(chat_replay, exc), max_retries=0),
                GGUFEmbedding(base_url=BASE_URL, transport=_failing(chat_replay, exc), max_retries=0)):
        with pytest.raises(expected):
            emb.embed_query("hi") if isinstance(emb, GGUFEmbeddings) else emb.get_query_embedding("hi")
        with pytest.raises(expected):
            await (emb.aembed_query("hi") if isinstance(emb, GGUFEmbeddings) else emb.aget_query_embedding("hi"))


def test_retries_repeat_a_failed_call_then_raise(chat_replay: Replay) -> None:
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            attempts.append(1)
            raise httpx.ConnectError("refused")
        return chat_replay(request)

    llm = ChatGGUF(base_url=BASE_URL, transport=httpx.MockTransport(handler), max_retries=2, max_tokens=5)
    with pytest.raises(ServerConnectionError):
        llm.invoke("hi")
    assert len(attempts) == 3  # the call and two retries, all in Engine.retrying


# --- the loop guard, over a real looping reply (SmolLM2 "List facts about the moon." at temperature 0) -----------


def test_loop_guard_stops_a_looping_reply_in_every_adapter() -> None:
    from gguf_provider.errors import LoopWarning

    replay = load_replay("smollm2_loop")
    full = _recorded_text(replay)
    with pytest.warns(LoopWarning, match=r"loop_guard=False"):
        reply = ChatGGUF(base_url=BASE_URL, transport=replay.transport).invoke("List facts about the moon.")
    assert reply.response_metadata["finish_reason"] == "repetition"
    assert full.startswith(str(reply.content)) and len(str(reply.content)) < len(full) // 2
    with pytest.warns(LoopWarning):
        chunks = list(ChatGGUF(base_url=BASE_URL, transport=replay.transport).stream("List facts about the moon."))
    assert chunks[-1].response_metadata["finish_reason"] == "repetition"
    assert len("".join(str(c.content) for c in chunks)) < len(full)  # stopped early, not at max_tokens
    with pytest.warns(LoopWarning):
        li = GGUF(base_url=BASE_URL, transport=replay.transport).chat(
            [ChatMessage(role="user", content="List facts about the moon.")])
    assert li.message.content == reply.content and li.raw and li.raw["finish_reason"] == "repetition"


def test_loop_guard_off_per_call_and_per_model() -> None:
    import warnings

    replay = load_replay("smollm2_loop")
    full = _recorded_text(replay)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ChatGGUF(base_url=BASE_URL, transport=replay.transport).invoke("x", loop_guard=False).content == full
        off = ChatGGUF(base_url=BASE_URL, transport=replay.transport, loop_guard=False).invoke("x")
    assert off.content == full and off.response_metadata["finish_reason"] == "length"


def test_a_structured_reply_that_loops_is_asked_once_more_with_a_repeat_penalty_and_dry() -> None:
    """The replay answers the same loop twice: the second request carries the penalties, then the loop stands."""
    from gguf_provider.errors import LoopWarning

    replay = load_replay("smollm2_loop")
    llm = ChatGGUF(base_url=BASE_URL, transport=replay.transport)
    with pytest.warns(LoopWarning, match="repeat_penalty=1.15, dry_multiplier=0.8"):
        reply = llm.invoke("x", response_format={"type": "json_object"})
    bodies = replay.bodies("/v1/chat/completions")
    assert len(bodies) == 2 and "repeat_penalty" not in bodies[0] and "dry_multiplier" not in bodies[0]
    assert bodies[1]["repeat_penalty"] == 1.15 and bodies[1]["dry_multiplier"] == 0.8
    assert bodies[0]["max_tokens"] == 1024  # JSON mode's bounded default
    assert reply.response_metadata["finish_reason"] == "repetition"
    replay.sent.clear()
    with pytest.warns(LoopWarning):
        llm.invoke("x", response_format={"type": "json_object"}, repeat_penalty=1.0)  # the caller's choice stands
    assert len(replay.bodies("/v1/chat/completions")) == 1
    replay.sent.clear()
    with pytest.warns(LoopWarning, match=r"asking once more with repeat_penalty=1.15$"):
        ChatGGUF(base_url=BASE_URL, transport=replay.transport, model_kwargs={"dry_multiplier": 0.3}).invoke(
            "x", response_format={"type": "json_object"})
    assert [b["dry_multiplier"] for b in replay.bodies("/v1/chat/completions")] == [0.3, 0.3]  # the caller's DRY stands
