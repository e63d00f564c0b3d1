"""Where the live per-token CPU goes: cProfile of one client streaming from the benchmark's server.

``.venv/bin/python bench/profile_stream.py [CLIENT] [REQUESTS]``: CLIENT is a name from ``bench/clients.py``
(default ChatGGUF; e.g. "LangChain floor", "GGUF (LlamaIndex)", "ChatGGUF async"). Attaches to (or starts) the
benchmark's shared server, pins it and this process to separate cores like the benchmark, streams REQUESTS requests
of ``BENCH_TOKENS`` tokens and prints the functions by own CPU time, grouped by package, per token.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

if not __package__:  # run as a script: the repository root, for ``bench`` and ``scripts``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import machine
from bench.clients import make
from bench.config import N_CTX, N_PARALLEL, Config
from bench.measure import measure
from gguf_provider.engine import Engine, EngineConfig


def package(filename: str) -> str:
    """The package a profiled function belongs to (``~`` are C builtins, attributed to their caller's package by
    cProfile only by name)."""
    for mark, name in (("gguf_provider", "gguf_provider"), ("bench/", "bench (floor)"),
                       ("langchain_core", "langchain_core"), ("llama_index", "llama_index"), ("pydantic", "pydantic"),
                       ("httpx", "httpx"), ("httpcore", "httpcore"), ("/h11/", "h11"), ("json", "json"),
                       ("asyncio", "asyncio"), ("uuid", "uuid"), ("socket", "socket"), ("contextlib", "contextlib"),
                       ("copy.py", "copy")):
        if mark in filename:
            return name
    return "builtins/other" if filename == "~" else Path(filename).name


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "ChatGGUF"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    from scripts.test_models import ensure  # it puts the repository root on sys.path

    cfg = Config.from_env()
    model = ensure("smollm2")
    engine = Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, n_parallel=N_PARALLEL, port=cfg.port,
                                 keep_alive=0, server_args=cfg.server_args, speculative=False))
    info = engine.load()
    assert info.address.url and info.address.api_key
    print(machine.pin(info.pid))
    client = make(info.address.url, info.address.api_key, only={name}, tokens=cfg.tokens)[name]
    loop = asyncio.new_event_loop()
    measure(client, loop)  # warm-up
    profiler = cProfile.Profile(time.process_time)  # CPU time: blocked reads cost nothing
    cpu = 0.0
    profiler.enable()
    for _ in range(requests):
        cpu += measure(client, loop)["cpu"]
    profiler.disable()
    machine.unpin(info.pid)
    engine.unload()
    tokens = requests * cfg.tokens
    print(f"{name}: {cpu / tokens * 1e6:.1f} µs CPU per token over {requests} x {cfg.tokens} tokens")
    stats = pstats.Stats(profiler)
    by_pkg: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_pkg[package(filename)] += tottime
    for pkg, t in sorted(by_pkg.items(), key=lambda x: -x[1])[:16]:
        print(f"  {pkg:24s} {t / tokens * 1e6:7.1f} µs/token")
    stats.sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
