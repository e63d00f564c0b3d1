"""P4: multi-turn prefix cache: time to first token of turn N, its history cached, ÷ the same prompt cold."""

from __future__ import annotations

import random
import time
from typing import Any

from bench.clients import SEED
from bench.config import GOALS, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import summary

WORDS = ("river stone lamp harbor winter garden signal copper ladder forest quiet engine letter morning shadow "
         "market thunder velvet island bridge candle orchard silver meadow anchor compass lantern marble canyon "
         "feather glacier harvest journey kettle meadow nebula orbit pepper quartz ribbon saddle timber umbrella "
         "valley walnut yonder zephyr").split()


def history(seed: int, turns: int = 6, words: int = 95) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    rnd = random.Random(seed)
    msgs: list[Any] = [SystemMessage(f"Session {seed}. You are a helpful assistant.")]
    for i in range(turns):
        msgs.append(HumanMessage(f"Turn {i}: " + " ".join(rnd.choice(WORDS) for _ in range(words))))
        msgs.append(AIMessage(" ".join(rnd.choice(WORDS) for _ in range(words))))
    msgs.append(HumanMessage("Summarize the conversation so far in one sentence."))
    return msgs


def ttft(llm: Any, msgs: list[Any], **kwargs: Any) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    first = None
    meta: dict[str, Any] = {}
    for chunk in llm.stream(msgs, max_tokens=4, ignore_eos=True, **kwargs):
        if first is None and chunk.content:
            first = time.perf_counter() - t0
        if chunk.response_metadata.get("timings"):
            meta = chunk.response_metadata["timings"]
    return first if first is not None else time.perf_counter() - t0, meta


def bench_multiturn(cfg: Config, url: str, api_key: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    from gguf_provider import ChatGGUF

    llm = ChatGGUF(base_url=url, api_key=api_key, temperature=0, seed=SEED)
    warm: list[float] = []
    cold: list[float] = []
    ratio: list[float] = []
    prompt_tokens: list[int] = []
    timings: list[dict[str, Any]] = []

    def step(r: int) -> None:
        h = history(1000 + r)
        answer = llm.invoke(h, max_tokens=16, ignore_eos=True)  # turn N-1: its prompt and answer are cached
        turn = [*h, answer, HumanMessage("And what was the first word of turn 3?")]
        pair = [("warm", {}), ("cold", {"cache_prompt": False})]
        res = {}
        for kind, kw in pair if r % 2 == 0 else pair[::-1]:
            res[kind] = ttft(llm, turn, **kw)
            if kind == "cold":  # put the cache back where a real turn N would find it
                llm.invoke(h, max_tokens=16, ignore_eos=True)
        if r == 0:  # a warm-up
            prompt_tokens.append(llm.get_num_tokens_from_messages(turn))
            return
        warm.append(res["warm"][0])
        cold.append(res["cold"][0])
        ratio.append(res["warm"][0] / res["cold"][0])
        timings.append({"warm": res["warm"][1], "cold": res["cold"][1]})
        log(f"P4 round {r}: warm {warm[-1] * 1e3:.0f} ms, cold {cold[-1] * 1e3:.0f} ms "
            f"(cache_n {res['warm'][1].get('cache_n')}/{res['cold'][1].get('cache_n')})")
    step(0)
    adaptive(cfg, "P4", lambda r: step(r + 1), lambda: ratio, GOALS["p4"])
    return {"ratio": summary(ratio, GOALS["p4"]), "warm_ms": summary([x * 1e3 for x in warm]),
            "cold_ms": summary([x * 1e3 for x in cold]), "prompt_tokens": prompt_tokens[0], "timings": timings}
