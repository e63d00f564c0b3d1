"""Each framework's floor: the least a chat model built on it can do per streamed token.

The same request, streamed with the bare httpx loop (``raw_deltas``), wrapped in each framework's own streaming
machinery and nothing else: a LangChain ``BaseChatModel`` yielding bare ``AIMessageChunk(content=...)`` chunks and a
LlamaIndex LLM whose ``stream_chat`` (decorated like every LlamaIndex LLM) yields bare ``ChatResponse`` deltas.
What a provider spends above its floor is its own; what the floor spends above raw httpx is the framework's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback
from pydantic import ConfigDict, PrivateAttr

PATH = "/v1/chat/completions"


def _deltas_of(line: str) -> Iterator[str] | None:
    """Content deltas of one SSE line; None at ``[DONE]``."""
    if not line.startswith("data:"):
        return iter(())
    payload = line[5:].strip()
    if payload == "[DONE]":
        return None
    return (text for choice in json.loads(payload).get("choices") or ()
            if (text := (choice.get("delta") or {}).get("content")))


def raw_deltas(client: httpx.Client, body: dict[str, Any]) -> Iterator[str]:
    """The bare httpx loop: stream the request, yield each content delta."""
    with client.stream("POST", PATH, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            deltas = _deltas_of(line)
            if deltas is None:
                return
            yield from deltas


async def araw_deltas(client: httpx.AsyncClient, body: dict[str, Any]) -> AsyncIterator[str]:
    async with client.stream("POST", PATH, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            deltas = _deltas_of(line)
            if deltas is None:
                return
            for text in deltas:
                yield text


def _body(messages: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    return {**extra, "messages": messages, "stream": True}


class FloorChat(BaseChatModel):
    """LangChain's floor: ``_stream``/``_astream`` over the bare httpx loop, one bare chunk per delta."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: httpx.Client
    aclient: httpx.AsyncClient | None = None
    body: dict[str, Any] = {}

    @property
    def _llm_type(self) -> str:
        return "floor"

    @staticmethod
    def _messages(messages: list[BaseMessage]) -> list[dict[str, Any]]:
        return [{"role": "user" if m.type == "human" else m.type, "content": m.content} for m in messages]

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        text = "".join(raw_deltas(self.client, _body(self._messages(messages), self.body)))
        return ChatResult(generations=[ChatGeneration(message=AIMessageChunk(content=text))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for text in raw_deltas(self.client, _body(self._messages(messages), self.body)):
            yield ChatGenerationChunk(message=AIMessageChunk(content=text))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        """Native async (LangChain's default runs ``_generate`` in a thread): the floor of ``ainvoke``/``abatch``."""
        assert self.aclient is not None
        parts = [t async for t in araw_deltas(self.aclient, _body(self._messages(messages), self.body))]
        return ChatResult(generations=[ChatGeneration(message=AIMessageChunk(content="".join(parts)))])

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        assert self.aclient is not None
        async for text in araw_deltas(self.aclient, _body(self._messages(messages), self.body)):
            yield ChatGenerationChunk(message=AIMessageChunk(content=text))


class FloorLLM(CustomLLM):
    """LlamaIndex's floor: ``stream_chat``/``astream_chat`` (with the framework's ``llm_chat_callback``) over the
    bare httpx loop, one bare ``ChatResponse`` per delta (the message so far, LlamaIndex's convention)."""

    body: dict[str, Any] = {}
    _client: httpx.Client = PrivateAttr()
    _aclient: httpx.AsyncClient | None = PrivateAttr(default=None)

    def __init__(self, client: httpx.Client, aclient: httpx.AsyncClient | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client, self._aclient = client, aclient

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=True, model_name="floor")

    @staticmethod
    def _messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        return [{"role": m.role.value, "content": m.content} for m in messages]

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        def gen() -> ChatResponseGen:
            text = ""
            for delta in raw_deltas(self._client, _body(self._messages(messages), self.body)):
                text += delta
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)
        return gen()

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        assert self._aclient is not None
        client = self._aclient

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for delta in araw_deltas(client, _body(self._messages(messages), self.body)):
                text += delta
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)
        return gen()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise NotImplementedError("the floor only streams chat")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        raise NotImplementedError("the floor only streams chat")
