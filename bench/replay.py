"""Client CPU per token without the server: a llama-server SSE stream replayed through ``httpx.MockTransport``.

The live benchmark (P2) measures CPU per token against the real server, where every token is a wake-up of the
client process. Replaying the same bytes isolates the client's own per-token work, deterministically:
``.venv/bin/python bench/replay.py [--profile NAME]``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

if not __package__:  # run as a script: the repository root, for ``bench``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.clients import SEED, Client, make
from bench.config import TOKENS, Config

URL = "http://127.0.0.1:1"
PROPS = {"default_generation_settings": {"n_ctx": 8192}, "model_alias": "bench", "model_path": "/m/bench.gguf",
         "chat_template_caps": {}, "total_slots": 4}


def recorded_stream(n_tokens: int = TOKENS) -> bytes:
    """A stream shaped like llama-server's (one chunk per token, then finish+timings, usage, [DONE])."""
    words = ("Once upon a time, the keeper of the lighthouse climbed the stairs to light the lamp and "
             "watched the sea. ").split(" ")
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "bench",
            "system_fingerprint": "b0-unknown"}
    out = [json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None},
                                            "finish_reason": None}]})]
    pick = random.Random(SEED).choice  # not periodic: the loop guard must not stop the replayed reply
    for _ in range(n_tokens):
        out.append(json.dumps({**base, "choices": [{"index": 0, "delta": {"content": " " + pick(words)},
                                                    "finish_reason": None}]}))
    timings = {"cache_n": 20, "prompt_n": 1, "prompt_ms": 5.0, "predicted_n": n_tokens, "predicted_ms": 2000.0,
               "predicted_per_second": 128.0}
    out.append(json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                           "timings": timings}))
    out.append(json.dumps({**base, "choices": [], "usage": {"completion_tokens": n_tokens, "prompt_tokens": 21,
                                                            "total_tokens": n_tokens + 21}}))
    out.append("[DONE]")
    return "".join(f"data: {x}\n\n" for x in out).encode()


class _Pieces(httpx.SyncByteStream, httpx.AsyncByteStream):
    """One SSE event per read, as the socket delivers them live."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


def transport(body: bytes) -> httpx.MockTransport:
    pieces = [p + b"\n\n" for p in body.split(b"\n\n") if p]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/props"):
            return httpx.Response(200, json=PROPS)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Pieces(pieces))
    return httpx.MockTransport(handler)


def clients(n_tokens: int = TOKENS, only: set[str] | None = None) -> dict[str, Client]:
    return make(URL, transport=transport(recorded_stream(n_tokens)), only=only, tokens=n_tokens)


def drain(client: Client, loop: asyncio.AbstractEventLoop | None = None) -> int:
    """Consume one stream; the number of deltas."""
    if not client.is_async:
        return sum(1 for _ in client.fn())

    async def consume() -> int:
        return sum([1 async for _ in client.fn()])
    if loop is None:
        return asyncio.run(consume())
    return loop.run_until_complete(consume())


def cpu_per_token(client: Client, loop: asyncio.AbstractEventLoop, requests: int = 20) -> float:
    """Best of 3 batches: CPU µs per delta."""
    drain(client, loop)
    best = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        n = sum(drain(client, loop) for _ in range(requests))
        best = min(best, (time.process_time() - c0) / n * 1e6)
    return best


def replay_cpu(only: set[str] | None = None, n_tokens: int = TOKENS) -> dict[str, float]:
    """CPU µs per token of each client on a replayed stream of ``n_tokens`` tokens."""
    loop = asyncio.new_event_loop()
    try:
        return {name: cpu_per_token(c, loop) for name, c in clients(n_tokens, only=only).items()}
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())  # streams a framework left open: closed, not destroyed
        loop.close()


def main() -> None:
    n_tokens = Config.from_env().tokens
    if len(sys.argv) > 2 and sys.argv[1] == "--profile":
        from pyinstrument import Profiler

        client = clients(n_tokens)[sys.argv[2]]
        loop = asyncio.new_event_loop()
        drain(client, loop)
        with Profiler(interval=0.0002) as p:
            for _ in range(30):
                drain(client, loop)
        print(p.output_text(unicode=True, color=False))
        return
    for name, v in replay_cpu(n_tokens=n_tokens).items():
        print(f"{name:26s} {v:7.1f} µs CPU per token (replayed {n_tokens}-token stream)")


if __name__ == "__main__":
    main()
