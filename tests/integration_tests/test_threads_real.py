"""Threads that add up, on this machine's real cores: two models gguf-provider starts (SmolLM2, then
Qwen2.5-Coder-0.5B) generate at once, and each keeps at least 0.3 of its speed alone, both measured here (no fixed
tokens/s); `ps` shows each server's threads, the split of runtime/_common/threads.py. Each figure is the decode speed
of a reply with ``ignore_eos``, as bench P19 takes it (nothing depends on the text). The goals against llama.cpp's
default threads: bench P19 (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scenarios.threads import decode_speed, generating
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime._common import threads
from scripts.test_models import ensure
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow

BESIDE_FLOOR = 0.3  # of the speed alone (issue 45; llama.cpp's defaults: 0.01-0.25, bench P19)
TOKENS = 128  # bench/scenarios/threads.py's reply (its decode_speed: tokens/s as the stream arrives, <= 12 s)


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

        alone = {e: max(decode_speed(e), decode_speed(e)) for e in (first, second)}
        beside: dict[Engine, float] = {}
        for engine, other in ((first, second), (second, first)):
            with generating(other):
                beside[engine] = decode_speed(engine)
        ratios = {Path(e.info.model).name: round(beside[e] / alone[e], 2) for e in (first, second)}
        print(f"decode tok/s alone {[round(alone[e], 1) for e in alone]}, beside the other "
              f"{[round(beside[e], 1) for e in alone]}: {ratios}")
        assert all(r >= BESIDE_FLOOR for r in ratios.values()), ratios
    finally:
        second.unload()
        first.unload()
