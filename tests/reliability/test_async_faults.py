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
from gguf_provider.engine import Engine
from gguf_provider.llama_index import GGUF
from tests.support.runtime import RuntimeEnv, wait_until

LONG = "Write a very long story about a dragon who learns to sail."


def _processing(engine: Engine) -> bool:
    return any(s.get("is_processing") for s in engine.client.get_json("/slots"))


async def _kill_during(engine: Engine, call: Callable[[], Awaitable[Any]]) -> BaseException | None:
    """Run ``call``, kill -9 the server once it works on the request (a slot is processing: LONG keeps it busy for
    seconds), and return what the call raised."""
    pid = engine.info.pid
    task = asyncio.ensure_future(call())
    while not await asyncio.to_thread(_processing, engine):
        if task.done():
            pytest.fail(f"the call ended before the server was seen working on it: {task!r}")
        await asyncio.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    try:
        # The error comes as the connection drops (ms); without that the call would wait for its 600 s timeout.
        await asyncio.wait_for(task, 60)
    except BaseException as exc:  # the test inspects it
        return exc
    return None


@pytest.mark.speed_timeout("smollm2", tokens=8, starts=3)  # a start per kill, one more for the answer
async def test_langchain_async_paths_raise_server_crashed(rt: RuntimeEnv) -> None:
    llm = ChatGGUF(model_path=str(rt.model), n_ctx=2048, max_tokens=400, max_retries=0)
    try:
        async def stream() -> None:
            async for _ in llm.astream(LONG):
                pass

        for call in (lambda: llm.ainvoke(LONG), stream):
            engine = llm.load().engine
            pid = engine.info.pid
            err = await _kill_during(engine, call)
            assert isinstance(err, ServerCrashedError), repr(err)
            assert f"pid {pid}" in str(err) and err.log_tail
        assert (await llm.ainvoke("Say hi", max_tokens=4)).content  # a fresh server answers
    finally:
        llm.unload()
    wait_until(lambda: rt.servers() == [], 60)  # unload stops it before returning (SIGKILL after 5 s); 10x


@pytest.mark.speed_timeout("smollm2", tokens=8, starts=3)  # a start per kill, one more for the answer
async def test_llama_index_async_paths_raise_server_crashed(rt: RuntimeEnv) -> None:
    llm = GGUF(model_path=str(rt.model), n_ctx=2048, max_tokens=400, max_retries=0)
    messages = [ChatMessage(role="user", content=LONG)]
    try:
        async def stream() -> None:
            async for _ in await llm.astream_chat(messages):
                pass

        for call in (lambda: llm.achat(messages), stream):
            err = await _kill_during(llm.load().engine, call)
            assert isinstance(err, ServerCrashedError), repr(err)
        assert (await llm.achat([ChatMessage(role="user", content="Say hi")], max_tokens=4)).message.content
    finally:
        llm.unload()
    wait_until(lambda: rt.servers() == [], 60)  # unload stops it before returning (SIGKILL after 5 s); 10x
