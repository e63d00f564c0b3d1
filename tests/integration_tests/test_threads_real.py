"""Threads that add up, on this machine's real cores: two models gguf-provider starts (SmolLM2, then
Qwen2.5-Coder-0.5B) generate at once, and each keeps at least 0.3 of its speed alone, both measured here (no fixed
tokens/s); `ps` shows each server's threads, the split of runtime/threads.py. Each figure is llama-server's own
decode timing of a reply with ``ignore_eos`` (nothing depends on the text). The goals against llama.cpp's default
threads: bench P19 (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime import threads
from scripts.test_models import ensure
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow

BESIDE_FLOOR = 0.3  # of the speed alone (issue 45; before the rule, 0.23-0.25 here)
TOKENS = 96
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def _decode_speed(engine: Engine) -> float:
    reply = engine.chat({"messages": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True},
                        loop_guard=False)
    return float(reply.timings["predicted_per_second"])


@contextmanager
def _generating(engine: Engine) -> Iterator[None]:
    """``engine`` writes a long reply all along the block (its stream is closed at the end: the server stops)."""
    started, done = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            for _ in engine.stream({"messages": PROMPT, "max_tokens": 100_000, "temperature": 0.8,
                                    "ignore_eos": True}, loop_guard=False):
                started.set()
                if done.is_set():
                    return
        except BaseException as exc:  # reported below
            failed.append(exc)
        finally:
            started.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    started.wait()
    try:
        yield
    finally:
        done.set()
        t.join()
    assert not failed, failed


@pytest.mark.speed_timeout("qwen", tokens=10 * TOKENS, starts=2)
def test_two_servers_generating_at_once_each_keep_their_speed(rt: RuntimeEnv) -> None:
    cores = threads.physical_cores()
    first = Engine(EngineConfig(model=str(rt.model), speculative=False, n_ctx=2048))
    second = Engine(EngineConfig(model=str(ensure("qwen")), speculative=False, n_ctx=2048))
    try:
        first.load()
        second.load()
        ps = json.loads(subprocess.run([sys.executable, "-m", "gguf_provider.cli", "ps", "--json"], check=True,
                                       capture_output=True, text=True).stdout)
        shown = {s["pid"]: s["threads"] for s in ps["servers"]}
        # The first alone gets every core; the second, its share beside it (`ps` shows what the registry holds).
        assert shown == {first.info.pid: cores, second.info.pid: threads.share(cores, 1)}, shown

        alone = {e: max(_decode_speed(e), _decode_speed(e)) for e in (first, second)}
        beside: dict[Engine, float] = {}
        for engine, other in ((first, second), (second, first)):
            with _generating(other):
                beside[engine] = _decode_speed(engine)
        ratios = {Path(e.info.model).name: round(beside[e] / alone[e], 2) for e in (first, second)}
        print(f"decode tok/s alone {[round(alone[e], 1) for e in alone]}, beside the other "
              f"{[round(beside[e], 1) for e in alone]}: {ratios}")
        assert all(r >= BESIDE_FLOOR for r in ratios.values()), ratios
    finally:
        second.unload()
        first.unload()
