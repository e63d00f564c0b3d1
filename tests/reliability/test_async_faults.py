"""A server killed under ``ainvoke``/``astream`` (LangChain) and ``achat``/``astream_chat`` (LlamaIndex) raises
exactly what the sync paths raise: :class:`ServerCrashedError` with the log tail, and the next call answers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF, ServerCrashedError
from gguf_provider.llama_index import GGUF
from tests.support.runtime import RuntimeEnv, wait_until

LONG = "Write a very long story about a dragon who learns to sail."


async def _kill_during(pid: int, call: Callable[[], Awaitable[Any]]) -> BaseException | None:
    """Run ``call`` and kill -9 the server 0.5 s after it started; return what it raised."""
    task = asyncio.ensure_future(call())
    await asyncio.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(task, 30)
    except BaseException as exc:  # the test inspects it
        return exc
    return None


@pytest.mark.timeout(180)
async def test_langchain_async_paths_raise_server_crashed(rt: RuntimeEnv) -> None:
    llm = ChatGGUF(model_path=str(rt.model), n_ctx=2048, max_tokens=400, max_retries=0)
    try:
        async def stream() -> None:
            async for _ in llm.astream(LONG):
                pass

        for call in (lambda: llm.ainvoke(LONG), stream):
            pid = llm.load().engine.info.pid
            err = await _kill_during(pid, call)
            assert isinstance(err, ServerCrashedError), repr(err)
            assert f"pid {pid}" in str(err) and err.log_tail
        assert (await llm.ainvoke("Say hi", max_tokens=4)).content  # a fresh server answers
    finally:
        llm.unload()
    wait_until(lambda: rt.servers() == [], 5)


@pytest.mark.timeout(180)
async def test_llama_index_async_paths_raise_server_crashed(rt: RuntimeEnv) -> None:
    llm = GGUF(model_path=str(rt.model), n_ctx=2048, max_tokens=400, max_retries=0)
    messages = [ChatMessage(role="user", content=LONG)]
    try:
        async def stream() -> None:
            async for _ in await llm.astream_chat(messages):
                pass

        for call in (lambda: llm.achat(messages), stream):
            pid = llm.load().engine.info.pid
            err = await _kill_during(pid, call)
            assert isinstance(err, ServerCrashedError), repr(err)
        assert (await llm.achat([ChatMessage(role="user", content="Say hi")], max_tokens=4)).message.content
    finally:
        llm.unload()
    wait_until(lambda: rt.servers() == [], 5)
