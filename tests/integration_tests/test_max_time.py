"""``max_time`` on a real llama-server: SmolLM2 told to ignore its end-of-sequence token (``ignore_eos``, a
llama-server request field, through ``model_kwargs`` / ``additional_kwargs``) would write to the end of its context;
``max_time=1`` ends the reply after about a second — llama-server's ``t_max_predict_ms`` at the first newline past
it, or our close when no newline comes within ``MAX_TIME_GRACE`` x + 1 s — with finish reason ``length`` and a
``GenerationTimeWarning``, in ChatGGUF and GGUF, whole and streamed. Nothing depends on the text the model writes:
only on when and how it ends."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF
from gguf_provider.chat import MAX_TIME_GRACE, TICKS
from gguf_provider.errors import GenerationTimeWarning
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure
from tests.support import speed

PROMPT = "Write a long story about a lighthouse keeper."
BOUND = 1.0
EXTRA: dict[str, Any] = {"ignore_eos": True}

pytestmark = pytest.mark.slow


def latest() -> float:
    """The most generation time the server may report: our own close (``MAX_TIME_GRACE`` x + 1 s), then the
    ``TICKS`` + 1 tokens until we read the clock and the server sees the close, at a tenth of the measured speed.
    A reply to the end of SmolLM2's context (thousands of tokens) takes far longer."""
    return BOUND * MAX_TIME_GRACE + 1 + 10 * (TICKS + 1) / speed.measure("smollm2").tokens_per_s


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
