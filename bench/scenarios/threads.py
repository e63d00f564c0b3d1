"""P19: several models on one CPU (issue 45, runtime/_common/threads.py). Decode speed (tokens per second as the stream
arrives, a reply of :data:`TOKENS` tokens with ``ignore_eos``, at most :data:`WINDOW_S` seconds of it) of:

- one model alone: gguf-provider's start (alone: every core, libgomp's short spin) ÷ llama.cpp's defaults (``-t -1``,
  one thread per physical core, and libgomp's default spin of 300,000 rounds);
- two models at once (SmolLM2 started first, Qwen2.5-Coder-0.5B second), each decoding while the other writes a
  long reply: ÷ its speed alone with llama.cpp's defaults. Once as gguf-provider starts them (the second gets its
  share of the cores), once with llama.cpp's defaults for both (what users had before).

Every server lives in the bench's own home, all at once (an idle server computes nothing); the measurements of a
round are interleaved so that a change in the machine's speed reaches every variant alike.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.config import GOALS, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import summary
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.events import TextDelta
from gguf_provider.runtime._common import threads

TOKENS = 128
WINDOW_S = 12.0  # the longest a measurement runs
N_CTX = 4096
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
LIBGOMP_DEFAULT_SPIN = "300000"  # libgomp's GOMP_SPINCOUNT when neither it nor OMP_WAIT_POLICY is set


def decode_speed(engine: Engine) -> float:
    """Tokens per second between the first token and the last of a reply of :data:`TOKENS` tokens, closed after
    :data:`WINDOW_S` seconds (collapsed servers write a token every few seconds), timed as the stream arrives."""
    times: list[float] = []
    for ev in engine.stream({"messages": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True},
                            loop_guard=False):
        if isinstance(ev, TextDelta):
            times.append(time.perf_counter())
            if times[-1] - times[0] > WINDOW_S:
                break
    if len(times) < 3:
        raise RuntimeError(f"P19: {len(times)} tokens in {WINDOW_S} s")
    return (len(times) - 1) / (times[-1] - times[0])


@contextmanager
def generating(engine: Engine) -> Iterator[None]:
    """``engine`` writes a long reply all along the block (closed at its end: the server stops generating)."""
    started, done = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            for _ in engine.stream({"messages": PROMPT, "max_tokens": 100_000, "temperature": 0.8,
                                    "ignore_eos": True}, loop_guard=False):
                started.set()
                if done.is_set():
                    return
        except BaseException as exc:  # raised in the bench's thread below
            failed.append(exc)
        finally:
            started.set()

    t = threading.Thread(target=run, daemon=True, name="p19-other")
    t.start()
    started.wait()
    try:
        yield
    finally:
        done.set()
        t.join()
    if failed:
        raise failed[0]


def _default_engine(model: Path) -> Engine:
    """A server with llama.cpp's thread defaults: ``-t -1`` (ours are then not written) and libgomp's own spin."""
    before = os.environ.get("GOMP_SPINCOUNT")
    os.environ["GOMP_SPINCOUNT"] = LIBGOMP_DEFAULT_SPIN  # the environment's value wins over ours
    try:
        engine = Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, keep_alive=0, speculative=False,
                                     server_args=["-t", "-1"]))
        engine.load()
    finally:
        if before is None:
            del os.environ["GOMP_SPINCOUNT"]
        else:
            os.environ["GOMP_SPINCOUNT"] = before
    return engine


def bench_threads(cfg: Config, small: Path, large: Path) -> dict[str, Any]:
    cores = threads.physical_cores()
    # Ours first, in the order a user would start them: the first alone gets every core, the second its share
    # (started after them, the servers with llama.cpp's defaults change nothing of theirs).
    ours = {"small": Engine(EngineConfig(model_path=str(small), n_ctx=N_CTX, keep_alive=0, speculative=False))}
    ours["small"].load()
    ours["large"] = Engine(EngineConfig(model_path=str(large), n_ctx=N_CTX, keep_alive=0, speculative=False))
    ours["large"].load()
    default = {"small": _default_engine(small), "large": _default_engine(large)}
    from gguf_provider.runtime._serve import registry

    shown = {e.pid: e.threads for e in registry.read().values()}
    ours_threads = {k: shown.get(e.info.pid, 0) for k, e in ours.items()}
    log(f"P19: {cores} physical cores; gguf-provider's threads: {ours_threads}")
    alone_ratio: list[float] = []
    pair: dict[str, dict[str, list[float]]] = {"ours": {"small": [], "large": []},
                                               "default": {"small": [], "large": []}}
    alone_default: dict[str, list[float]] = {"small": [], "large": []}

    def step(r: int) -> None:
        # Alone: ours and the default back to back, in an order that alternates by round (a server that just
        # finished spins on for a while: whichever runs second pays for it).
        if r % 2 == 0:
            base_small = decode_speed(default["small"])
            mine = decode_speed(ours["small"])
        else:
            mine = decode_speed(ours["small"])
            base_small = decode_speed(default["small"])
        base = {"small": base_small, "large": decode_speed(default["large"])}
        for k in base:
            alone_default[k].append(base[k])
        alone_ratio.append(mine / base["small"])
        variants = ("ours", "default") if r % 2 == 0 else ("default", "ours")
        for variant in variants:
            engines = ours if variant == "ours" else default
            for k, other in (("small", "large"), ("large", "small")):
                with generating(engines[other]):
                    pair[variant][k].append(decode_speed(engines[k]) / base[k])
        log(f"P19 round {r + 1}: alone ours ÷ default {alone_ratio[-1]:.3f}; beside the other ÷ alone: ours "
            f"{pair['ours']['small'][-1]:.2f}/{pair['ours']['large'][-1]:.2f}, llama.cpp's defaults "
            f"{pair['default']['small'][-1]:.2f}/{pair['default']['large'][-1]:.2f}")

    try:
        n = adaptive(replace(cfg, rounds=min(cfg.rounds, 5), max_rounds=min(cfg.max_rounds, 9)), "p19", step,
                     lambda: alone_ratio, GOALS["p19_alone"])
    finally:
        for e in (*ours.values(), *default.values()):
            e.unload()
    return {
        "small": small.name, "large": large.name, "cores": cores, "threads": ours_threads, "tokens": TOKENS,
        "rounds": n, "spin": int(os.environ.get("GOMP_SPINCOUNT", threads.GOMP_SPINCOUNT)),
        "alone": summary(alone_ratio, GOALS["p19_alone"]),
        "alone_default_tps": {k: summary(v) for k, v in alone_default.items()},
        "pair": {variant: {k: summary(v, GOALS["p19_pair"]) for k, v in d.items()} for variant, d in pair.items()},
    }
