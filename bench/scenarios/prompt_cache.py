"""P17: a prompt cache that survives a stop (runtime/_serve/prompt_cache.py): time to first token of the first turn after
the server was stopped and started again, a ~2,000-token system prompt saved at the stop and restored, ÷ the same
turn on a restarted server without the cache.

Each round uses a system prompt of its own. It primes a server (first turn, question 1) and stops it (keep_alive 0:
the stop saves the slot; the stop's time is recorded), then measures both variants on freshly started servers, in
an order that alternates by round: "cached" (the cache on: the saved prompt is restored before the turn runs) and
"cold" (``prompt_cache=False``: nothing restored, nothing saved). The measured turn asks question 2 after the same
system prompt, as an agent's next task would. Server starts are outside the timed part; the restore (a directory
listing, the template applied and tokenized, ``/slots``, the restore itself) is inside it.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from bench.config import GOALS, N_CTX, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import summary
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.events import TextDelta, Timings
from gguf_provider.runtime._common import paths

WORDS = ("river stone lamp harbor winter garden signal copper ladder forest quiet engine letter morning shadow "
         "market thunder velvet island bridge candle orchard silver meadow anchor compass lantern marble canyon "
         "feather glacier harvest journey kettle nebula orbit pepper quartz ribbon saddle timber umbrella").split()
SYSTEM_WORDS = 1900  # ~2,000 SmolLM2 tokens with the template
Q1, Q2 = "Which word comes first in the notes?", "List three words that appear in the notes."


def system_prompt(seed: int) -> str:
    rnd = random.Random(seed)
    return "You are a careful assistant. Reference notes: " + " ".join(
        rnd.choice(WORDS) for _ in range(SYSTEM_WORDS))


def body(system: str, question: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "temperature": 0, "seed": 42, "max_tokens": 4, "ignore_eos": True}


def ttft(engine: Engine, payload: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    first: float | None = None
    timings: dict[str, Any] = {}
    for ev in engine.stream(payload):
        if first is None and isinstance(ev, TextDelta):
            first = time.perf_counter() - t0
        elif isinstance(ev, Timings):
            timings = dict(ev.data)
    return (first if first is not None else time.perf_counter() - t0), timings


def bench_prompt_cache(cfg: Config, model: Path) -> dict[str, Any]:
    base = dict(model_path=str(model), n_ctx=N_CTX, keep_alive=0, server_args=cfg.server_args)
    cached_s: list[float] = []
    cold_s: list[float] = []
    ratio: list[float] = []
    stops: list[float] = []
    info: dict[str, Any] = {}

    def step(r: int) -> None:
        system = system_prompt(5000 + r)
        prime = Engine(EngineConfig(**base))
        prime.chat(body(system, Q1))
        if r == 0:
            info["prompt_tokens"] = prime.count_prompt_tokens(body(system, Q2))
        t0 = time.perf_counter()
        prime.unload()  # keep_alive 0: the manager saves the slot, then stops the server
        stops.append(time.perf_counter() - t0)
        res: dict[str, tuple[float, dict[str, Any]]] = {}
        variants = [("cached", True), ("cold", False)]
        for kind, on in variants if r % 2 == 0 else variants[::-1]:
            engine = Engine(EngineConfig(**base, prompt_cache=on))
            engine.load()  # the start is not timed
            res[kind] = ttft(engine, body(system, Q2))
            engine.unload()
        if r == 0:  # a warm-up
            saved = list((paths.home() / "prompt-cache").glob("*/*.bin"))
            info["file_mb"] = max((p.stat().st_size for p in saved), default=0) / 2**20
            return
        cached_s.append(res["cached"][0])
        cold_s.append(res["cold"][0])
        ratio.append(res["cached"][0] / res["cold"][0])
        log(f"P17 round {r}: cached {cached_s[-1] * 1e3:.0f} ms (prompt_n {res['cached'][1].get('prompt_n')}, "
            f"cache_n {res['cached'][1].get('cache_n')}), cold {cold_s[-1] * 1e3:.0f} ms (prompt_n "
            f"{res['cold'][1].get('prompt_n')}); the stop with its save took {stops[-1] * 1e3:.0f} ms")

    step(0)
    adaptive(cfg, "P17", lambda r: step(r + 1), lambda: ratio, GOALS["p17"])
    return {"ratio": summary(ratio, GOALS["p17"]), "cached_ms": summary([x * 1e3 for x in cached_s]),
            "cold_ms": summary([x * 1e3 for x in cold_s]), "stop_ms": summary([x * 1e3 for x in stops]),
            "prompt_tokens": info.get("prompt_tokens"), "file_mb": info.get("file_mb")}
