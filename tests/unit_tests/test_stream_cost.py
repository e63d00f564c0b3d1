"""A regression guard on the per-token cost of streaming that cannot flake: function calls, not times.

Each adapter streams a replayed llama-server stream (``bench/replay.py``: the bytes the server sends, through
``httpx.MockTransport``) while ``sys.setprofile`` counts every Python and C function call. The marginal count per
token (the difference between a long and a short stream, so per-request set-up cancels out) is deterministic for
a given set of installed packages. It is compared with the same count for the framework's floor
(``bench/floors.py``: the bare httpx loop wrapped in the framework's own streaming, nothing else), so what is
asserted is what gguf-provider adds per token. Times are the benchmark's business (``make bench``, P2).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from bench.clients import Client
from bench.replay import clients, drain

# Calls per token gguf-provider may add over each framework's floor (measured 13 for LangChain, 12 for LlamaIndex,
# sync and async; the budget leaves room for a new branch, not for a new layer).
EXTRA_CALLS_BUDGET = {"langchain": 15, "llama_index": 15}
OURS_CALLS_BUDGET = 12  # calls per token in gguf_provider's own code (parse, events, adapter)
SHORT, LONG = 32, 160


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def counted(client: Client, loop: asyncio.AbstractEventLoop) -> tuple[int, int, int]:
    """(all calls, calls into gguf_provider code, deltas) of one replayed stream."""
    drain(client, loop)  # warm: imports, caches, connection set-up
    counts = [0, 0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            counts[0] += 1
            if "gguf_provider" in frame.f_code.co_filename:
                counts[1] += 1
        elif event == "c_call":
            counts[0] += 1

    sys.setprofile(profile)
    try:
        n = drain(client, loop)
    finally:
        sys.setprofile(None)
    return counts[0], counts[1], n


def marginal(name: str, loop: asyncio.AbstractEventLoop) -> tuple[float, float]:
    """Calls per extra token (all, ours) between a SHORT- and a LONG-token stream of the same client."""
    short_all, short_ours, n_short = counted(clients(SHORT, {name})[name], loop)
    long_all, long_ours, n_long = counted(clients(LONG, {name})[name], loop)
    assert (n_short, n_long) == (SHORT, LONG), "every replayed token must arrive as one delta"
    span = LONG - SHORT
    return (long_all - short_all) / span, (long_ours - short_ours) / span


CASES = [("ChatGGUF", "LangChain floor", "langchain"),
         ("ChatGGUF async", "LangChain floor async", "langchain"),
         ("GGUF (LlamaIndex)", "LlamaIndex floor", "llama_index"),
         ("GGUF (LlamaIndex) async", "LlamaIndex floor async", "llama_index")]


@pytest.mark.parametrize(("ours", "floor", "framework"), CASES, ids=[c[0] for c in CASES])
def test_calls_per_token_over_the_framework_floor(ours: str, floor: str, framework: str,
                                                  loop: asyncio.AbstractEventLoop) -> None:
    ours_all, ours_own = marginal(ours, loop)
    floor_all, _ = marginal(floor, loop)
    print(f"{ours}: {ours_all:.1f} calls/token ({ours_own:.1f} in gguf_provider); {floor}: {floor_all:.1f}")
    assert ours_own <= OURS_CALLS_BUDGET, f"{ours} makes {ours_own:.1f} calls per token in gguf_provider code"
    assert ours_all - floor_all <= EXTRA_CALLS_BUDGET[framework], (
        f"{ours} makes {ours_all:.1f} calls per token, {ours_all - floor_all:.1f} more than {floor} "
        f"({floor_all:.1f}); the budget is {EXTRA_CALLS_BUDGET[framework]}")


def test_the_count_sees_a_per_token_cost(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard can fail: one extra call per token in the parser shows up as one more call per token."""
    from gguf_provider import client

    before, before_own = marginal("ChatGGUF", loop)
    original = client.StreamParser._events

    def events(self: client.StreamParser, chunk: Any) -> Any:
        return original(self, chunk)

    monkeypatch.setattr(client.StreamParser, "_events", events)
    after, after_own = marginal("ChatGGUF", loop)
    assert after - before == pytest.approx(1.0, abs=0.05)
    assert after_own - before_own == pytest.approx(0.0, abs=0.05)  # the wrapper lives in this test file
