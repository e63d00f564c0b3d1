"""`gguf-provider serve` with each of its requests to llama-server timed where it leaves the gateway's process: P21's
measure of the time the gateway adds with all of the server's own time taken out, not only its prompt time.

Run as ``python -m bench.boundary LOG serve ...`` (the CLI's arguments after LOG). Before the CLI runs,
``httpx.AsyncHTTPTransport.handle_async_request`` (the transport under every engine client's connection) is wrapped:
for each ``POST /v1/chat/completions`` it appends one JSON line to LOG, ``{"sent": t0, "first": t1}``: ``t0`` when
the request is handed to the transport (its body not yet written), ``t1`` when the first body chunk holding reply
text (``"content":"`` and a character) comes back. Both are ``time.perf_counter()``, CLOCK_MONOTONIC on Linux: one
clock for every process, so the bench's own request times compare with them. ``t1 - t0`` is then the server's whole
time to its first token for that request (the upload of the body, its template, tokenization, grammar, the prompt,
the first token), as the gateway sees it.

Why (bench/NOTES.md, P21): llama-server's own work before its prompt timer starts on Claude Code's 76 KB request
(template ~23 ms, tokenization ~43 ms, the tools' grammar) moves by ~33 ms from one request to the next, so a pair of
replies, one each way, cannot resolve a few ms added by the gateway; timing the same request at the gateway's
boundary can. The wrapper's own cost (a regex over each chunk until the first match) is the gateway's, counted in.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

TEXT = re.compile(rb'"content":"[^"]')


def install(path: str) -> Callable[[], None]:
    """Times the requests from now on; returns what undoes it (and closes the file)."""
    original = httpx.AsyncHTTPTransport.handle_async_request
    out = open(path, "a", buffering=1)  # a line per request, until uninstall()

    async def timed(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or request.url.path != "/v1/chat/completions":
            return await original(self, request)
        sent = time.perf_counter()
        response = await original(self, request)
        inner = response.stream
        assert isinstance(inner, httpx.AsyncByteStream)

        class Timed(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                seen = False
                async for chunk in inner:
                    if not seen and TEXT.search(chunk):
                        seen = True
                        out.write(json.dumps({"sent": sent, "first": time.perf_counter()}) + "\n")
                    yield chunk

            async def aclose(self) -> None:
                await inner.aclose()

        response.stream = Timed()
        return response

    httpx.AsyncHTTPTransport.handle_async_request = timed  # type: ignore[method-assign]

    def uninstall() -> None:
        httpx.AsyncHTTPTransport.handle_async_request = original  # type: ignore[method-assign]
        out.close()

    return uninstall


# A server that costs nothing: it reads a request whole and answers at once with the head of an Anthropic stream
# (message_start, content_block_start). A reply timed from it is the client's own time to first token, the part of
# a straight request's TTFT that is not the server's, which the boundary's figure cannot take out by itself.
NULL_SERVER = r"""
import asyncio, sys
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
EVENTS = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{}}}\n\n'
          b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
          b'"content_block":{"type":"text","text":""}}\n\n')
def chunk(b): return b"%x\r\n" % len(b) + b + b"\r\n"
async def serve(r, w):
    while True:
        try:
            head = await r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:  # the client closed the connection
            return
        n = next(int(l.split(b":")[1]) for l in head.lower().split(b"\r\n") if l.startswith(b"content-length:"))
        await r.readexactly(n)
        w.write(HEAD + chunk(EVENTS) + chunk(b""))
        await w.drain()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(s.sockets[0].getsockname()[1], flush=True)
    await s.serve_forever()
asyncio.run(main())
"""


def read(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The lines written since ``offset``, and the new offset."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line], offset + end


if __name__ == "__main__":
    install(sys.argv[1])
    sys.argv = ["gguf-provider", *sys.argv[2:]]
    runpy.run_module("gguf_provider.cli", run_name="__main__")
