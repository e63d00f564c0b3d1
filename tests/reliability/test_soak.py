"""Soak (issue 8): 200 sequential and 50 concurrent ChatGGUF requests on one real SmolLM2 server, about 20% of them
cancelled at random. Every request that was not cancelled must be answered with content; afterwards this process's
file descriptors, threads and sockets are back at their baseline, the server's RSS has not grown, and every slot
is idle. Figures go to ``<home>/reports/reliability-soak.json`` (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gguf_provider.langchain import ChatGGUF
from tests.reliability.report import write_report

pytestmark = pytest.mark.slow

SEQUENTIAL, CONCURRENT = 200, 50
CANCEL_RATE = 0.2
N_PARALLEL, MAX_TOKENS = 4, 8  # short answers: the soak counts requests, not tokens
FD_TOLERANCE, THREAD_TOLERANCE, SOCKET_TOLERANCE = 2, 0, 0
RSS_GROWTH = 0.10  # server RSS after the soak vs after the warm-up
# What a slot may still be doing after the last request: a cancelled request's last few of MAX_TOKENS tokens (~2 ms
# measured idle; ~0.3 s at 30 tokens/s). Asserted; the measured time is reported (target: 1 s).
SLOTS_IDLE_S = 5.0
# For closed connections and ended threads to show in the counts: a 0.5 s sleep sufficed idle; 60x.
SETTLE_S = 30.0
# Each test's timeout (speed_timeout) counts a request as this many tokens: its MAX_TOKENS and its ~40-token prompt
# and round trip, which took about as long again (15.0 s idle for the 200 sequential requests); 2x that.
TOKENS_PER_REQUEST = 4 * MAX_TOKENS

TOPICS = ["the sea", "a cat", "bread", "trains", "rain", "music", "the moon", "chess", "tea", "snow", "maps",
          "bees", "a clock", "paper", "gardens", "salt", "bridges", "owls", "glass", "wind"]

REPORT: dict[str, Any] = {"phases": {}, "resources": {}}


def prompt(rng: random.Random, i: int) -> str:
    return f"In five words, say something about {rng.choice(TOPICS)} (request {i})."


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[ChatGGUF]:
    t0 = time.perf_counter()
    m = ChatGGUF(model_path=str(smollm2_path), n_ctx=2048, n_parallel=N_PARALLEL, max_tokens=MAX_TOKENS,
                 temperature=0, shared=False)
    m.load()
    yield m
    REPORT.update(model=smollm2_path.name, n_parallel=N_PARALLEL, max_tokens=MAX_TOKENS,
                  wall_s=round(time.perf_counter() - t0, 1))
    write_report("soak", REPORT)
    m.unload()


class Resources:
    """This process's fds, threads and Unix sockets, and the server's RSS and sockets."""

    def __init__(self, model: ChatGGUF) -> None:
        self.me = psutil.Process()
        self.server = psutil.Process(model.engine.info.pid)

    def snapshot(self) -> dict[str, int]:
        return {"client fds": self.me.num_fds(), "client threads": threading.active_count(),
                "client OS threads": self.me.num_threads(),
                "client sockets": len(self.me.net_connections(kind="all")),
                "server sockets": len(self.server.net_connections(kind="all")),
                "server RSS MiB": self.server.memory_info().rss // 2**20}


def settle() -> None:
    gc.collect()
    time.sleep(0.5)
    gc.collect()


def settled(res: Resources, before: dict[str, int]) -> dict[str, int]:
    """The snapshot once this process's fds, threads and sockets are back within tolerance of ``before``, or after
    ``SETTLE_S`` (:func:`check_resources` then says what leaked)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        gc.collect()
        after = res.snapshot()
        if not leaks(before, after) or time.monotonic() > deadline:
            return after
        time.sleep(0.1)


def slots_idle_after(model: ChatGGUF, limit: float = SLOTS_IDLE_S) -> float:
    """Seconds until /slots shows no slot processing (asserted below ``limit``)."""
    t0 = time.perf_counter()
    while True:
        slots = model.engine.client.get_json("/slots")
        busy = [s.get("id") for s in slots if s.get("is_processing")]
        elapsed = time.perf_counter() - t0
        if not busy:
            return elapsed
        assert elapsed < limit, f"slots {busy} still processing {elapsed:.1f} s after the last request"
        time.sleep(0.05)


def record(name: str, requests: int, answered: int, cancelled: int, failed: int, wall: float,
           idle_s: float) -> None:
    REPORT["phases"][name] = {"requests": requests, "answered": answered, "cancelled": cancelled, "failed": failed,
                              "wall_s": round(wall, 1), "slots_idle_after_s": round(idle_s, 3)}


TOLERANCE = {"client fds": FD_TOLERANCE, "client threads": THREAD_TOLERANCE, "client OS threads": THREAD_TOLERANCE,
             "client sockets": SOCKET_TOLERANCE, "server sockets": SOCKET_TOLERANCE}


def leaks(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] - tol for key, tol in TOLERANCE.items() if after[key] - before[key] > tol}


def check_resources(name: str, before: dict[str, int], after: dict[str, int]) -> None:
    leaked = leaks(before, after)
    for key, tol in TOLERANCE.items():
        REPORT["resources"][f"{key} ({name})"] = {"before": before[key], "after": after[key], "tolerance": tol,
                                                  "leaked": leaked.get(key, 0)}
    problems = [f"{key}: {before[key]} -> {after[key]}" for key in leaked]
    assert not problems, f"{name}: leaked {problems}"


@pytest.mark.speed_timeout("smollm2", tokens=(5 + 2 * N_PARALLEL) * TOKENS_PER_REQUEST)  # with the module's start
def test_warm_up(model: ChatGGUF) -> None:
    """Both client kinds created and a few requests served, so the baseline includes the pools."""
    for i in range(4):
        assert model.invoke(f"Say hello {i}.").content
    assert "".join(str(c.content) for c in model.stream("Say hi.")).strip()

    async def burst() -> None:  # every slot used once: its share of the KV cache is paged in before the baseline
        await asyncio.gather(*(model.ainvoke(f"Say hello {i}.") for i in range(2 * N_PARALLEL)))

    asyncio.run(burst())
    slots_idle_after(model)  # the /slots poll leaves one keep-alive connection in the sync pool: part of the baseline
    settle()
    REPORT["baseline"] = Resources(model).snapshot()


@pytest.mark.speed_timeout("smollm2", tokens=SEQUENTIAL * TOKENS_PER_REQUEST)
def test_sequential_with_cancellations(model: ChatGGUF) -> None:
    rng = random.Random(8)
    res = Resources(model)
    slots_idle_after(model)
    before = res.snapshot()
    answered = cancelled = 0
    t0 = time.perf_counter()
    for i in range(SEQUENTIAL):
        text = prompt(rng, i)
        if rng.random() < CANCEL_RATE:
            for _chunk in model.stream(text):  # the consumer walks away after the first chunk
                break
            cancelled += 1
        elif i % 2:
            assert str(model.invoke(text).content).strip(), f"request {i} answered with no content"
            answered += 1
        else:
            content = "".join(str(c.content) for c in model.stream(text))
            assert content.strip(), f"streamed request {i} answered with no content"
            answered += 1
    wall = time.perf_counter() - t0
    idle = slots_idle_after(model)
    record("sequential", SEQUENTIAL, answered, cancelled, SEQUENTIAL - answered - cancelled, wall, idle)
    after = settled(res, before)
    REPORT["rss_mib"] = {"warm": REPORT.get("baseline", before)["server RSS MiB"],
                         "after sequential": after["server RSS MiB"]}
    check_resources("sequential", before, after)
    assert answered + cancelled == SEQUENTIAL


async def _concurrent(model: ChatGGUF, rng: random.Random) -> dict[str, int]:
    counts = {"answered": 0, "cancelled": 0, "empty": 0}

    async def one(i: int, how: str) -> None:
        text = prompt(rng, i)
        if how == "invoke" or how == "cancel":
            content = str((await model.ainvoke(text)).content)
        else:
            content = ""
            async for chunk in model.astream(text):
                content += str(chunk.content)
                if how == "break":  # the consumer walks away after the first chunk
                    counts["cancelled"] += 1
                    return
        counts["answered" if content.strip() else "empty"] += 1

    n_cancel = int(CONCURRENT * CANCEL_RATE)  # half cancelled by task.cancel(), half by leaving the stream
    plan = ["cancel"] * (n_cancel // 2) + ["break"] * (n_cancel - n_cancel // 2)
    plan += ["invoke", "stream"] * ((CONCURRENT - len(plan)) // 2) + ["invoke"] * ((CONCURRENT - len(plan)) % 2)
    rng.shuffle(plan)
    tasks = [asyncio.create_task(one(i, how)) for i, how in enumerate(plan)]
    loop = asyncio.get_running_loop()
    for task, how in zip(tasks, plan, strict=True):
        if how == "cancel":
            loop.call_later(rng.uniform(0.05, 0.8), task.cancel)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    counts["cancelled"] += sum(isinstance(r, asyncio.CancelledError) for r in results)
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    assert not failures, failures[:3]
    return counts


@pytest.mark.speed_timeout("smollm2", tokens=CONCURRENT * TOKENS_PER_REQUEST)
def test_concurrent_with_cancellations(model: ChatGGUF) -> None:
    rng = random.Random(50)
    res = Resources(model)
    slots_idle_after(model)
    before = res.snapshot()
    rss_warm = before["server RSS MiB"]
    t0 = time.perf_counter()
    counts = asyncio.run(_concurrent(model, rng))
    wall = time.perf_counter() - t0
    idle = slots_idle_after(model)
    record("concurrent", CONCURRENT, counts["answered"], counts["cancelled"], counts["empty"], wall, idle)
    assert counts["empty"] == 0, counts
    assert counts["answered"] + counts["cancelled"] == CONCURRENT, counts
    after = settled(res, before)
    check_resources("concurrent", before, after)
    warm = REPORT.get("baseline", before)["server RSS MiB"]
    REPORT.setdefault("rss_mib", {"warm": warm})["after concurrent"] = after["server RSS MiB"]
    REPORT["resources"]["server RSS MiB (warm -> end)"] = {
        "before": warm, "after": after["server RSS MiB"], "tolerance": f"+{RSS_GROWTH:.0%}",
        "leaked": max(0, after["server RSS MiB"] - int(warm * (1 + RSS_GROWTH)))}
    assert after["server RSS MiB"] <= warm * (1 + RSS_GROWTH), (warm, rss_warm, after)
