"""P5: ``abatch`` aggregate tok/s, ÷ the LangChain floor's ``abatch`` and ÷ raw httpx's concurrent requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.clients import PROMPT, SEED, raw_body
from bench.config import BATCH, BATCH_TOKENS, GOALS, Config
from bench.log import log
from bench.measure import ServerLog
from bench.rounds import adaptive
from bench.stats import summary


async def raw_batch(url: str, api_key: str) -> float:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=600) as c:
        async def one() -> int:
            r = await c.post("/v1/chat/completions", json=raw_body(BATCH_TOKENS, stream=False))
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(one() for _ in range(BATCH)))
        return sum(tokens) / (time.perf_counter() - t0)


async def floor_batch(url: str, api_key: str) -> float:
    """The LangChain floor's ``abatch`` (native ``_agenerate`` over the bare async loop), same requests."""
    from bench.floors import FloorChat  # LangChain: imported when a scenario needs it

    extra = {k: v for k, v in raw_body(BATCH_TOKENS).items() if k not in ("messages", "stream")}
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=600) as c:
        floor = FloorChat(client=httpx.Client(), aclient=c, body=extra)
        t0 = time.perf_counter()
        out = await floor.abatch([PROMPT] * BATCH)
        elapsed = time.perf_counter() - t0
    # ignore_eos: every reply is BATCH_TOKENS long (checked on ours through usage)
    assert all(o.content for o in out)
    return BATCH * BATCH_TOKENS / elapsed


async def gguf_batch(llm: Any) -> float:
    t0 = time.perf_counter()
    out = await llm.abatch([PROMPT] * BATCH, ignore_eos=True)
    tokens: int = sum(m.usage_metadata["output_tokens"] for m in out)
    return tokens / (time.perf_counter() - t0)


def bench_batch(cfg: Config, url: str, api_key: str, server_log: ServerLog) -> dict[str, Any]:
    from gguf_provider import ChatGGUF

    llm = ChatGGUF(base_url=url, api_key=api_key, temperature=0, seed=SEED, max_tokens=BATCH_TOKENS, loop_guard=False)
    asyncio.run(raw_batch(url, api_key)), asyncio.run(floor_batch(url, api_key)), asyncio.run(gguf_batch(llm))
    raws: list[float] = []
    floors: list[float] = []
    ggufs: list[float] = []
    shares: dict[str, list[float]] = {"raw": [], "floor": [], "abatch": []}  # server time ÷ batch wall time

    def step(r: int) -> None:
        trio: list[tuple[str, list[float], Callable[[], Any]]] = [
            ("raw", raws, lambda: raw_batch(url, api_key)), ("floor", floors, lambda: floor_batch(url, api_key)),
            ("abatch", ggufs, lambda: gguf_batch(llm))]
        for name, dest, fn in trio[r % 3:] + trio[:r % 3]:  # rotated per round
            server_log.mark()
            dest.append(asyncio.run(fn()))
            wall = BATCH * BATCH_TOKENS / dest[-1]  # ignore_eos: every reply is BATCH_TOKENS long
            shares[name].append(server_log.seconds_since_mark(BATCH) / wall)
        log(f"P5 round {r + 1}: raw {raws[-1]:.0f} tok/s, floor abatch {floors[-1]:.0f} tok/s, abatch "
            f"{ggufs[-1]:.0f} tok/s")

    def ratio() -> list[float]:  # the server's drift between batches taken out, as in P1
        return [g / f for f, g in zip(shares["floor"], shares["abatch"], strict=True)]

    adaptive(cfg, "P5", step, ratio, GOALS["p5"])
    return {"floor_ratio": summary(ratio(), GOALS["p5"]),
            "floor_wall_ratio": summary([g / f for f, g in zip(floors, ggufs, strict=True)]),
            "server_share": {n: summary(v) for n, v in shares.items()},
            "ratio": summary([g / r for r, g in zip(raws, ggufs, strict=True)]),
            "floor_raw_ratio": summary([f / r for r, f in zip(raws, floors, strict=True)]),
            "raw_tok_s": summary(raws), "floor_tok_s": summary(floors), "abatch_tok_s": summary(ggufs)}
