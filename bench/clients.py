"""The streaming clients P1/P2 compare, built the same way against a live server or a replayed stream.

Each client is a zero-argument function returning an iterator (sync) or async iterator (async) of content deltas,
for the same request: seed, temperature 0, ``ignore_eos``, a fixed number of tokens (``tokens``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from bench.config import TOKENS

SEED = 42
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def raw_body(max_tokens: int = TOKENS, stream: bool = True) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "seed": SEED, "ignore_eos": True, "stream": stream}


@dataclass(frozen=True)
class Client:
    name: str
    fn: Callable[[], Any]  # -> Iterator[str] or AsyncIterator[str]
    is_async: bool = False
    floor_of: str | None = None  # "langchain" / "llama_index": the framework whose floor this is
    framework: str | None = None  # the framework this provider client runs on


def make(url: str, api_key: str | None = None, transport: httpx.MockTransport | None = None,
         only: set[str] | None = None, tokens: int = TOKENS) -> dict[str, Client]:
    """The clients, over ``url`` or, with ``transport``, over a replayed stream (no server; no bare socket), each
    asking for ``tokens`` tokens."""
    from langchain_core.messages import HumanMessage
    from llama_index.core.base.llms.types import ChatMessage

    from bench.floors import FloorChat, FloorLLM, araw_deltas, raw_deltas
    from gguf_provider import GGUF, ChatGGUF

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    kw: dict[str, Any] = {"base_url": url, "headers": headers, "timeout": 600}
    if transport is not None:
        kw["transport"] = transport
    http, ahttp = httpx.Client(**kw), httpx.AsyncClient(**kw)
    body = raw_body(tokens)
    extra = {k: v for k, v in body.items() if k not in ("messages", "stream")}
    # loop_guard off: ignore_eos makes every client generate ``tokens``, loop or not; the guard would stop early.
    common: dict[str, Any] = {"base_url": url, "api_key": api_key, "temperature": 0, "seed": SEED,
                              "max_tokens": tokens, "loop_guard": False, "transport": transport}
    gguf = ChatGGUF(**common)
    li = GGUF(**common)
    floor = FloorChat(client=http, aclient=ahttp, body=extra)
    li_floor = FloorLLM(http, ahttp, body=extra)
    li_messages = [ChatMessage(role="user", content=PROMPT)]
    lc_messages = [HumanMessage(PROMPT)]

    def lc(model: Any, **kwargs: Any) -> Callable[[], Iterator[str]]:
        def run() -> Iterator[str]:
            for chunk in model.stream(lc_messages, **kwargs):
                if chunk.content:
                    yield chunk.content
        return run

    def alc(model: Any, **kwargs: Any) -> Callable[[], AsyncIterator[str]]:
        async def run() -> AsyncIterator[str]:
            async for chunk in model.astream(lc_messages, **kwargs):
                if chunk.content:
                    yield chunk.content
        return run

    def lli(model: Any, **kwargs: Any) -> Callable[[], Iterator[str]]:
        def run() -> Iterator[str]:
            for r in model.stream_chat(li_messages, **kwargs):
                if r.delta:
                    yield r.delta
        return run

    def alli(model: Any, **kwargs: Any) -> Callable[[], AsyncIterator[str]]:
        async def run() -> AsyncIterator[str]:
            async for r in await model.astream_chat(li_messages, **kwargs):
                if r.delta:
                    yield r.delta
        return run

    clients = [
        Client("raw httpx", lambda: raw_deltas(http, body)),
        Client("raw httpx async", lambda: araw_deltas(ahttp, body), is_async=True),
        Client("LangChain floor", lc(floor), floor_of="langchain"),
        Client("ChatGGUF", lc(gguf, ignore_eos=True), framework="langchain"),
        Client("LangChain floor async", alc(floor), is_async=True, floor_of="langchain"),
        Client("ChatGGUF async", alc(gguf, ignore_eos=True), is_async=True, framework="langchain"),
        Client("LlamaIndex floor", lli(li_floor), floor_of="llama_index"),
        Client("GGUF (LlamaIndex)", lli(li, ignore_eos=True), framework="llama_index"),
        Client("LlamaIndex floor async", alli(li_floor), is_async=True, floor_of="llama_index"),
        Client("GGUF (LlamaIndex) async", alli(li, ignore_eos=True), is_async=True, framework="llama_index"),
    ]
    try:
        from langchain_openai import ChatOpenAI

        openai = ChatOpenAI(base_url=f"{url}/v1", api_key=api_key or "x", model="bench", temperature=0, seed=SEED,
                            max_tokens=tokens, extra_body={"ignore_eos": True}, max_retries=0,
                            http_client=httpx.Client(**kw), http_async_client=httpx.AsyncClient(**kw))
        clients.append(Client("ChatOpenAI", lc(openai)))
    except ImportError:  # the bench extra is not installed: the reference is left out
        pass
    if transport is None:
        clients.append(Client("bare socket", _bare_socket(url, api_key, body)))
    out = {c.name: c for c in clients}
    return {n: c for n, c in out.items() if only is None or n in only}


def _bare_socket(url: str, api_key: str | None, body: dict[str, Any]) -> Callable[[], Iterator[str]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()

    def run() -> Iterator[str]:
        """One recv per server write, no HTTP or JSON parsing (counts content fields): the wake-up floor."""
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head + data)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                for _ in range(chunk.count(b'"content":"')):
                    yield "x"
                if b"[DONE]" in chunk:
                    break
    return run
