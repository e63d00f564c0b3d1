"""A long prompt's KV survives a stop (runtime/_serve/prompt_cache.py), against real llama-servers and SmolLM2.

Each stop path saves the idle slots (keep_alive=0 release, `gguf-provider stop`, LRU eviction, keep_alive's
watchdog), and the next server of the same model and options restores the saved prompt on its first request: the
server's own timings show that only the tokens after the shared prefix were processed (``prompt_n``) and the rest
came from the cache (``cache_n``), as many as llama-server's own prompt cache reuses for the same two turns on a
server that never stopped. The replies' words are not compared: greedy text may differ between two servers
(llama.cpp's logits depend on the batch a token is processed in, tools/server/README.md, ``cache_prompt``), and the
test prints whether it did.

Save limits (the :data:`~prompt_cache.MIN_TOKENS` floor, longest first, :data:`~prompt_cache.SAVE_BUDGET`) are
checked on a real server with three slots here, and in every branch with a fake server in
tests/unit_tests/test_prompt_cache.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import PromptCacheWarning
from gguf_provider.events import Completion
from gguf_provider.runtime._serve import prompt_cache
from tests.support.runtime import RuntimeEnv, pid_alive, wait_until

pytestmark = pytest.mark.slow

WORDS = ("river stone lamp harbor winter garden signal copper ladder forest quiet engine letter morning shadow "
         "market thunder velvet island bridge candle orchard silver meadow anchor compass lantern marble").split()


def system_prompt(seed: int, words: int = 450) -> str:
    """About 600 SmolLM2 tokens of reference text (over prompt_cache.MIN_TOKENS)."""
    rnd = random.Random(seed)
    return "You are a careful assistant. Reference notes: " + " ".join(rnd.choice(WORDS) for _ in range(words))


def payload(system: str, question: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "temperature": 0, "seed": 7, "max_tokens": 12}


Q1, Q2 = "Which word comes first in the notes?", "Name three words from the notes."
# Work for speed_timeout, in tokens: a turn whose ~490-token system prompt is processed (counted as if generated;
# under load processing is no faster) and its 12-token reply, or a turn that finds that prompt cached.
TURN, CACHED_TURN = 500 + 12, 40 + 12


def engine(rt: RuntimeEnv, **kw: Any) -> Engine:
    return Engine(EngineConfig(model_path=str(rt.model), n_ctx=4096, **kw))


def ask(eng: Engine, body: dict[str, Any]) -> Completion:
    return eng.chat(body)


async def aask(eng: Engine, body: dict[str, Any]) -> Completion:
    from gguf_provider.events import Collector

    col = Collector()
    async for ev in eng.astream(body):
        col.add(ev)
    return col.done()


def saved_files(rt: RuntimeEnv) -> list[Path]:
    return sorted((rt.home / "prompt-cache").glob("*/*.bin"))


def assert_restored(reply: Completion, first: Completion) -> None:
    """The server processed only what follows the shared prefix; the prefix came from the restored slot."""
    t = reply.timings
    print(f"uncached first turn: prompt_n {first.timings.get('prompt_n')}, {first.timings.get('prompt_ms'):.0f} ms; "
          f"restored: prompt_n {t.get('prompt_n')}, cache_n {t.get('cache_n')}, {t.get('prompt_ms'):.0f} ms")
    assert t.get("cache_n", 0) >= prompt_cache.MIN_TOKENS, t
    assert t["prompt_n"] < 40 < first.timings["prompt_n"], (t, first.timings)


def assert_reused_as_reference(reply: Completion, ref2: Completion) -> None:
    """The restored prompt gave the second turn the prefix llama-server's own cache gives it (the same prompt
    tokens, the same split between cached and processed), and a reply."""
    t, r = reply.timings, ref2.timings
    assert (t["cache_n"], t["prompt_n"]) == (r["cache_n"], r["prompt_n"]), (t, r)
    assert reply.content and reply.finish_reason in ("stop", "length")
    print(f"restored reply {'==' if reply.content == ref2.content else '!='} the reference server's")


def cycle_and_reference(rt: RuntimeEnv) -> tuple[str, Completion]:
    """The reference: a server without the cache, first turn Q1, then Q2 from llama-server's own cache."""
    system = system_prompt(1)
    ref = engine(rt, keep_alive=0, prompt_cache=False)
    ask(ref, payload(system, Q1))
    ref2 = ask(ref, payload(system, Q2))
    assert ref2.timings.get("cache_n", 0) >= prompt_cache.MIN_TOKENS
    ref.unload()
    assert saved_files(rt) == []  # prompt_cache=False: nothing saved
    return system, ref2


@pytest.mark.speed_timeout("smollm2", tokens=3 * TURN + 2 * CACHED_TURN, starts=3)
def test_release_saves_and_the_next_server_restores(rt: RuntimeEnv) -> None:
    system, ref2 = cycle_and_reference(rt)
    first_engine = engine(rt, keep_alive=0)
    first = ask(first_engine, payload(system, Q1))
    pid = first_engine.info.pid
    t0 = time.monotonic()
    first_engine.unload()  # the last lease, keep_alive 0: the manager stops it, saving first
    print(f"release + save + stop: {time.monotonic() - t0:.2f} s")
    assert not pid_alive(pid)
    files = saved_files(rt)
    assert len(files) == 1, files
    side = json.loads(files[0].with_suffix(".json").read_text())
    assert side["n_tokens"] >= first.timings["prompt_n"] and side["build"] and side["identity"] == files[0].parent.name
    assert (files[0].parent.stat().st_mode & 0o777) == 0o700

    second = engine(rt, keep_alive=0)
    reply = ask(second, payload(system, Q2))
    assert second.info.pid != pid
    assert_restored(reply, first)
    assert_reused_as_reference(reply, ref2)
    # Not asserted (see the module docstring): the same turn with nothing cached on the same build.
    fresh = ask(second, {**payload(system, Q2), "cache_prompt": False})
    print(f"restored reply {'==' if fresh.content == reply.content else '!='} the uncached one")
    second.unload()


@pytest.mark.speed_timeout("smollm2", tokens=2 * TURN + 2 * CACHED_TURN, starts=4)  # the CLI's start: one
def test_gguf_provider_stop_saves_and_an_async_first_turn_restores(rt: RuntimeEnv) -> None:
    system, ref2 = cycle_and_reference(rt)
    first_engine = engine(rt, keep_alive=300)
    first = ask(first_engine, payload(system, Q1))
    pid = first_engine.info.pid
    r = rt.gguf_cli("stop", "--all")
    assert r.returncode == 0, r.stderr
    assert not pid_alive(pid)
    first_engine.unload()
    assert len(saved_files(rt)) == 1

    async def run() -> Completion:
        second = engine(rt, keep_alive=0)
        try:
            return await aask(second, payload(system, Q2))
        finally:
            second.unload()

    reply = asyncio.run(run())
    assert_restored(reply, first)
    assert_reused_as_reference(reply, ref2)


@pytest.mark.speed_timeout("smollm2", tokens=TURN + CACHED_TURN, starts=3)
def test_eviction_saves(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_MAX_MODELS", "1")
    system = system_prompt(2)
    first_engine = engine(rt, keep_alive=300)
    first = ask(first_engine, payload(system, Q1))
    pid = first_engine.info.pid
    first_engine.unload()  # idle, still running
    assert pid_alive(pid) and saved_files(rt) == []
    other = engine(rt, keep_alive=0, speculative=False)  # another identity, another family
    other.load()
    assert not pid_alive(pid), "evicted to make room"
    other.unload()
    assert len(saved_files(rt)) == 1
    again = engine(rt, keep_alive=0)
    assert_restored(ask(again, payload(system, Q2)), first)
    again.unload()


@pytest.mark.speed_timeout("smollm2", tokens=TURN + CACHED_TURN, starts=3)  # keep_alive's wait: one
def test_keep_alive_watchdog_saves(rt: RuntimeEnv) -> None:
    system = system_prompt(3)
    first_engine = engine(rt, keep_alive=1)
    first = ask(first_engine, payload(system, Q1))
    pid = first_engine.info.pid
    first_engine.unload()
    # The watchdog: keep_alive (1 s) runs out, its next tick (1 s) saves (SAVE_BUDGET at most), then stops the
    # server (SIGTERM, SIGKILL after 5 s, 5 s more to reap: process.stop_process); 3x that for a busy machine.
    wait_until(lambda: not pid_alive(pid), 3 * (1 + 1 + prompt_cache.SAVE_BUDGET + 2 * 5))
    assert len(saved_files(rt)) == 1  # saved before the stop
    again = engine(rt, keep_alive=0)
    assert_restored(ask(again, payload(system, Q2)), first)
    again.unload()


@pytest.mark.speed_timeout("smollm2", tokens=2 * TURN + CACHED_TURN, starts=3)
def test_the_disk_bound_keeps_the_most_recently_used(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = []
    for seed in (4, 5):
        eng = engine(rt, keep_alive=0)
        first = ask(eng, payload(system_prompt(seed), Q1))
        eng.unload()
        sizes.append(sum(p.stat().st_size for p in saved_files(rt)))
        if seed == 4:  # room for one file and a half from now on
            monkeypatch.setenv(prompt_cache.ENV, str(int(sizes[0] * 1.5)))
            time.sleep(0.05)  # distinct modification times
    files = saved_files(rt)
    assert len(files) == 1, files  # the older one went
    again = engine(rt, keep_alive=0)
    assert_restored(ask(again, payload(system_prompt(5), Q2)), first)
    again.unload()


class JumpingClock:
    """``time`` as prompt_cache reads it: the real clock, plus ``step`` seconds after each save."""

    def __init__(self) -> None:
        self.offset = self.step = 0.0
        self.time = time.time

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


@pytest.mark.speed_timeout("smollm2", tokens=2 * TURN + CACHED_TURN, starts=1)
def test_a_stop_saves_the_long_slots_longest_first_within_its_budget(rt: RuntimeEnv,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Three slots of one server: ~400, ~60 and ~600 prompt tokens in slots 0, 1, 2. A save whose clock jumps by
    the whole budget at its first save keeps the longest and warns that it skipped the other; a real stop saves
    both long ones, longest first, and never the one under MIN_TOKENS."""
    # --no-cache-idle-slots: else llama-server moves idle slots to its RAM cache (and, with the unified KV cache
    # that n_parallel brings, clears them) whenever a new task starts, and only the last slot would hold a prompt.
    eng = engine(rt, keep_alive=0, n_parallel=3, server_args=("--no-cache-idle-slots",))
    for slot, words in ((0, 300), (1, 40), (2, 450)):
        ask(eng, {**payload(system_prompt(10 + slot, words), Q1), "id_slot": slot})
    held = {s["id"]: s["n_prompt_tokens"] for s in eng.client.get_json("/slots")}
    assert held[1] < prompt_cache.MIN_TOKENS <= held[0] < held[2], held
    [entry] = rt.registry().values()
    directory = Path(entry["prompt_cache"])
    order: list[int] = []
    clock = JumpingClock()
    real_save = prompt_cache._save_one

    def recorded(c: Any, slot: int, *args: Any, **kwargs: Any) -> Any:
        order.append(slot)
        try:
            return real_save(c, slot, *args, **kwargs)
        finally:
            clock.offset += clock.step

    monkeypatch.setattr(prompt_cache, "_save_one", recorded)
    monkeypatch.setattr(prompt_cache, "time", clock)
    clock.step = prompt_cache.SAVE_BUDGET
    skipped = rf"saving took its {clock.step:.0f} s bound; 1 slot\(s\) of .* not saved"
    with pytest.warns(PromptCacheWarning, match=skipped):
        first = prompt_cache.save_slots(eng.info.address, directory, model=str(rt.model))
    assert order == [2] and [s.n_tokens for s in first] == [held[2]]

    clock.step = 0.0
    order.clear()
    pid = eng.info.pid
    eng.unload()  # keep_alive 0: the release saves, then stops the server
    assert not pid_alive(pid)
    assert order == [2, 0]
    kept = sorted(json.loads(p.with_suffix(".json").read_text())["n_tokens"] for p in saved_files(rt))
    assert kept == [held[0], held[2]]  # the longest saved again under the same name (its tokens' hash)


def saved_once(rt: RuntimeEnv, system: str) -> tuple[Path, Completion]:
    eng = engine(rt, keep_alive=0)
    first = ask(eng, payload(system, Q1))
    eng.unload()
    [bin_path] = saved_files(rt)
    return bin_path, first


@pytest.mark.speed_timeout("smollm2", tokens=2 * TURN, starts=2)
def test_a_corrupt_file_is_discarded_with_a_warning_never_served(rt: RuntimeEnv) -> None:
    system = system_prompt(6)
    bin_path, first = saved_once(rt, system)
    data = bytearray(bin_path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one bit pattern changed in the KV: only the checksum can tell
    bin_path.write_bytes(bytes(data))
    again = engine(rt, keep_alive=0)
    with pytest.warns(PromptCacheWarning, match="discarded .*checksum does not match"):
        reply = ask(again, payload(system, Q2))
    assert reply.timings["prompt_n"] >= first.timings["prompt_n"] - 10, "processed again, nothing restored"
    assert saved_files(rt) == []
    again.unload()


@pytest.mark.speed_timeout("smollm2", tokens=3 * TURN, starts=3)
def test_a_file_the_server_cannot_restore_is_discarded_and_the_request_still_answered(rt: RuntimeEnv) -> None:
    """Cut short with its sidecar made to agree (size, checksum): this llama-server aborts on it
    (GGML_ASSERT in llama_state_seq_load_file); the file is discarded and the request runs on a fresh server."""
    system = system_prompt(8)
    bin_path, first = saved_once(rt, system)
    side = bin_path.with_suffix(".json")
    bin_path.write_bytes(bin_path.read_bytes()[:bin_path.stat().st_size // 2])
    side.write_text(json.dumps({**json.loads(side.read_text()), "bytes": bin_path.stat().st_size,
                                "crc32": prompt_cache.checksum(bin_path)}))
    again = engine(rt, keep_alive=0)
    with pytest.warns(PromptCacheWarning, match="discarded .*(crashed|refused)"):
        reply = ask(again, payload(system, Q2))
    assert reply.content and reply.timings["prompt_n"] >= first.timings["prompt_n"] - 10
    assert not bin_path.exists() and not side.exists()
    again.unload()


@pytest.mark.speed_timeout("smollm2", tokens=TURN, starts=1)
def test_size_zero_turns_it_off(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(prompt_cache.ENV, "0")
    eng = engine(rt, keep_alive=0)
    ask(eng, payload(system_prompt(7), Q1))
    [server] = rt.servers()
    assert "--slot-save-path" not in server.cmdline()
    eng.unload()
    assert not (rt.home / "prompt-cache").exists()


