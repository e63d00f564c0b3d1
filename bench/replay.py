"""Client CPU per token without the server: a recorded llama-server SSE stream replayed through httpx.MockTransport.

The live benchmark (P2) measures CPU per token against the real server; on a busy 2-core machine that figure is
inflated by contention (context switches, cold caches). Replaying the exact bytes the server sent isolates the
client's own per-token work, deterministically, for profiling: ``.venv/bin/python bench/replay.py [--profile NAME]``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.run import N_TOKENS, PROMPT, SEED

PROPS = {"default_generation_settings": {"n_ctx": 8192}, "model_alias": "bench", "model_path": "/m/bench.gguf",
         "chat_template_caps": {}, "total_slots": 4}


def recorded_stream(n_tokens: int = N_TOKENS) -> bytes:
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


def transport(body: bytes) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/props"):
            return httpx.Response(200, json=PROPS)
        # many small pieces, as the socket delivers them (one SSE event per read)
        pieces = [p + b"\n\n" for p in body.split(b"\n\n") if p]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(b"")
                              if not pieces else _Pieces(pieces))
    return httpx.MockTransport(handler)


class _Pieces(httpx.SyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces


def clients(body: bytes) -> dict[str, Callable[[], Iterator[str]]]:
    from langchain_llama_cpp import ChatLlama
    from langchain_openai import ChatOpenAI

    from gguf_provider import ChatGGUF

    url = "http://127.0.0.1:1"
    raw_client = httpx.Client(base_url=url, transport=transport(body))

    def raw() -> Iterator[str]:
        payload = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N_TOKENS, "stream": True}
        with raw_client.stream("POST", "/v1/chat/completions", json=payload) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                for choice in json.loads(data).get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text

    gguf = ChatGGUF(base_url=url, transport=transport(body), temperature=0, seed=SEED, max_tokens=N_TOKENS)
    gguf.load()  # reads the replayed /props once, as a real attach does
    unguarded = ChatGGUF(base_url=url, transport=transport(body), temperature=0, seed=SEED, max_tokens=N_TOKENS,
                         loop_guard=False).load()  # the loop guard's own cost = ChatGGUF − this
    openai = ChatOpenAI(base_url=f"{url}/v1", api_key="x", model="bench", temperature=0, seed=SEED,
                        max_tokens=N_TOKENS, max_retries=0, http_client=httpx.Client(transport=transport(body)))
    llama = ChatLlama(model="bench", base_url=url, http_client=httpx.Client(transport=transport(body)),
                      temperature=0, seed=SEED, max_tokens=N_TOKENS, max_retries=0)

    def lc(model: Any) -> Callable[[], Iterator[str]]:
        def run() -> Iterator[str]:
            for chunk in model.stream(PROMPT):
                if chunk.content:
                    yield chunk.content
        return run

    return {"raw httpx": raw, "ChatGGUF": lc(gguf), "ChatGGUF, loop_guard off": lc(unguarded),
            "ChatOpenAI": lc(openai), "ChatLlama": lc(llama)}


def cpu_per_token(fn: Callable[[], Iterator[str]], requests: int = 20) -> float:
    for _ in fn():
        pass
    best = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        for _ in range(requests):
            n = sum(1 for _ in fn())
        best = min(best, (time.process_time() - c0) / (requests * n) * 1e6)
    return best


def replay_cpu() -> dict[str, float]:
    """Best-of-3 CPU µs per token of each client on the replayed stream."""
    cs = clients(recorded_stream())
    return {name: cpu_per_token(fn) for name, fn in cs.items()}


def main() -> None:
    body = recorded_stream()
    cs = clients(body)
    if len(sys.argv) > 2 and sys.argv[1] == "--profile":
        from pyinstrument import Profiler

        fn = cs[sys.argv[2]]
        for _ in fn():
            pass
        with Profiler(interval=0.0002) as p:
            for _ in range(30):
                for _ in fn():
                    pass
        print(p.output_text(unicode=True, color=False))
        return
    for name, fn in cs.items():
        print(f"{name:24s} {cpu_per_token(fn):7.1f} µs CPU per token (replayed {N_TOKENS}-token stream)")


if __name__ == "__main__":
    main()
