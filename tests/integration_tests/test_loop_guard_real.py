"""The loop guard on a real llama-server: SmolLM2-135M at temperature 0 falls into a loop on this prompt ("7. The
moon is a terrestrial planet ..." and on; the line it starts at differs between CPUs). With the defaults (no
max_tokens: up to the whole context) the call ends with finish_reason "repetition" instead of generating for
minutes; the timeout is the bound."""

from __future__ import annotations

import re

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF
from gguf_provider.errors import LoopWarning
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

PROMPT = "List facts about the moon."


def test_a_looping_reply_ends_with_repetition() -> None:
    llm = ChatGGUF(model=str(ensure("smollm2")), temperature=0)
    try:
        with pytest.warns(LoopWarning, match="repeated"):
            reply = llm.invoke(PROMPT)
        assert reply.response_metadata["finish_reason"] == "repetition"
        assert reply.usage_metadata is None or reply.usage_metadata["output_tokens"] < 1000
        text = str(reply.content)
        # Kept up to the end of the loop's first line (a numbered loop: equal but for the numbers, across 9 → 10).
        lines = re.sub(r"\d+", "#", text).splitlines()
        assert lines and lines.count(lines[-1]) == 1, text[-300:]
        with pytest.warns(LoopWarning):
            chunks = list(llm.stream(PROMPT))
        assert chunks[-1].response_metadata["finish_reason"] == "repetition"
    finally:
        llm.unload()


async def test_a_looping_reply_ends_with_repetition_async_llama_index() -> None:
    llm = GGUF(model=str(ensure("smollm2")), temperature=0)
    try:
        with pytest.warns(LoopWarning):
            reply = await llm.achat([ChatMessage(role="user", content=PROMPT)])
        assert reply.raw and reply.raw["finish_reason"] == "repetition"
    finally:
        llm.unload()
