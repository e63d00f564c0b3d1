"""``max_time`` on a real llama-server: SmolLM2 told to ignore its end-of-sequence token (``ignore_eos``, a
llama-server request field, through ``model_kwargs`` / ``additional_kwargs``) would write to the end of its context;
``max_time=1`` ends the reply after about a second — llama-server's ``t_max_predict_ms`` at the first newline past
it, or our close when no newline comes within ``MAX_TIME_GRACE`` x + 1 s — with finish reason ``length`` and a
``GenerationTimeWarning``, in ChatGGUF and GGUF, whole and streamed. Nothing depends on the text the model writes:
only on when and how it ends.

A slow or paused server is cut by our timer (gguf_provider/deadline.py) whatever the speed: the server is held
still with SIGSTOP right after its first token, or paused and resumed so that its tokens come seconds apart; the
reply still ends ``MAX_TIME_GRACE`` x ``max_time`` + 1 s after its first token, in every adapter, sync and async
(the magics: tests/integration_tests/test_magics.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF
from gguf_provider.chat import MAX_TIME_GRACE
from gguf_provider.errors import GenerationTimeWarning
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure
from tests.support import speed
from tests.support.pause import CUT_SLACK, Pauser, watch_arming

PROMPT = "Write a long story about a lighthouse keeper."
BOUND = 1.0
EXTRA: dict[str, Any] = {"ignore_eos": True}

pytestmark = pytest.mark.slow


def latest() -> float:
    """The most generation time the server may report: our own close (``MAX_TIME_GRACE`` x + 1 s), then the
    tokens until the server sees the close (two), at a tenth of the measured speed. A reply to the end of
    SmolLM2's context (thousands of tokens) takes far longer."""
    return BOUND * MAX_TIME_GRACE + 1 + 10 * 2 / speed.measure("smollm2").tokens_per_s


def _generated_s(timings: dict[str, Any]) -> float:
    return float(timings["predicted_ms"]) / 1000 if timings.get("predicted_ms") else 0.0


@pytest.mark.speed_timeout("smollm2", tokens=400)
def test_chatgguf_reply_is_cut_by_max_time() -> None:
    llm = ChatGGUF(model=str(ensure("smollm2")), temperature=0.8, seed=1, max_time=BOUND, loop_guard=False,
                   model_kwargs=EXTRA)
    try:
        with pytest.warns(GenerationTimeWarning, match="max_time=1 s"):
            reply = llm.invoke(PROMPT)
        assert reply.response_metadata["finish_reason"] == "length" and str(reply.content)
        timings = reply.response_metadata.get("timings") or {}
        assert _generated_s(timings) < latest(), timings  # 0 when we closed it: the server sent no timings
        with pytest.warns(GenerationTimeWarning):
            chunks = list(llm.stream(PROMPT))
        assert chunks[-1].response_metadata["finish_reason"] == "length"
        assert "".join(str(c.content) for c in chunks)
        assert "t_max_predict_ms" not in llm.chat_request([], {"max_tokens": 5, "max_time": "auto"}).payload()
    finally:
        llm.unload()


@pytest.mark.speed_timeout("smollm2", tokens=400)
async def test_gguf_reply_is_cut_by_max_time() -> None:
    llm = GGUF(model=str(ensure("smollm2")), temperature=0.8, seed=2, max_time=BOUND, loop_guard=False,
               additional_kwargs=EXTRA)
    messages = [ChatMessage(role="user", content=PROMPT)]
    try:
        with pytest.warns(GenerationTimeWarning):
            response = llm.chat(messages)
        assert response.raw and response.raw["finish_reason"] == "length" and response.message.content
        with pytest.warns(GenerationTimeWarning):
            last = [r async for r in await llm.astream_chat(messages)][-1]
        assert last.raw and last.raw["finish_reason"] == "length"
    finally:
        llm.unload()


# --- a server that is really slow ----------------------------------------------------------------------------

SLOW_BOUND = 2.0
CUT_AT = SLOW_BOUND * MAX_TIME_GRACE + 1  # seconds after the first token


@pytest.fixture(scope="module")
def slow_llms() -> Iterator[tuple[ChatGGUF, GGUF]]:
    # One server for both (same model and options); a context of its own so no other test's server is paused.
    kw: dict[str, Any] = {"temperature": 0.8, "max_time": SLOW_BOUND, "loop_guard": False, "n_ctx": 1536}
    lc = ChatGGUF(model=str(ensure("smollm2")), model_kwargs=EXTRA, **kw)
    li = GGUF(model=str(ensure("smollm2")), additional_kwargs=EXTRA, **kw)
    try:
        assert lc.engine.info.pid == li.engine.info.pid
        yield lc, li
    finally:
        lc.unload()
        li.unload()


def _langchain_invoke(lc: ChatGGUF, li: GGUF) -> str | None:
    return str(lc.invoke(PROMPT).response_metadata["finish_reason"])


def _langchain_astream(lc: ChatGGUF, li: GGUF) -> str | None:
    async def run() -> str | None:
        chunks = [c async for c in lc.astream(PROMPT)]
        return str(chunks[-1].response_metadata.get("finish_reason"))
    return asyncio.run(run())


def _llama_index_chat(lc: ChatGGUF, li: GGUF) -> str | None:
    raw = li.chat([ChatMessage(role="user", content=PROMPT)]).raw
    return str(raw["finish_reason"]) if raw else None


def _llama_index_astream(lc: ChatGGUF, li: GGUF) -> str | None:
    async def run() -> str | None:
        last = [r async for r in await li.astream_chat([ChatMessage(role="user", content=PROMPT)])][-1]
        return str(last.raw["finish_reason"]) if last.raw else None
    return asyncio.run(run())


CALLS: dict[str, Callable[[ChatGGUF, GGUF], str | None]] = {
    "ChatGGUF.invoke": _langchain_invoke, "ChatGGUF.astream": _langchain_astream,
    "GGUF.chat": _llama_index_chat, "GGUF.astream_chat": _llama_index_astream,
}


@pytest.mark.timeout(300)  # a start (~2 s) and a cut at 3.5 s; a reply that is not cut hangs until this
@pytest.mark.parametrize("period", [None, 1.5], ids=["paused", "tokens-seconds-apart"])
@pytest.mark.parametrize("call", list(CALLS))
def test_a_slow_server_is_cut_at_the_bound(slow_llms: tuple[ChatGGUF, GGUF], call: str, period: float | None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    lc, li = slow_llms
    armed = watch_arming(monkeypatch)
    pauser = Pauser(lc.engine, period, armed)
    pauser.start()
    try:
        with pytest.warns(GenerationTimeWarning, match="max_time=2 s"):
            reason = CALLS[call](lc, li)
        ended = time.monotonic()
    finally:
        pauser.stop()
    assert reason == "length"
    assert armed.at is not None and pauser.paused_at is not None  # held after the first token arrived
    assert ended - armed.at < CUT_AT + CUT_SLACK, ended - armed.at
