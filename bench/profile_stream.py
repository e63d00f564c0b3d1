"""Profile the client side of ``ChatGGUF.stream`` (P1/P2) with pyinstrument.

``.venv/bin/python bench/profile_stream.py [CLIENT] [REQUESTS]``: CLIENT is ChatGGUF (default), ChatOpenAI,
ChatLlama or "raw httpx". Attaches to (or starts) the benchmark's shared server, streams REQUESTS requests of
``BENCH_TOKENS`` tokens and prints pyinstrument's call tree of the client process (wall clock: time blocked on the socket shows as the
read frames under httpcore; the rest is the client's CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyinstrument import Profiler

from bench.run import N_CTX, N_PARALLEL, N_TOKENS, PORT, make_clients, measure_stream
from gguf_provider.engine import Engine, EngineConfig
from scripts.test_models import ensure


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "ChatGGUF"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    model = ensure("smollm2")
    engine = Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, n_parallel=N_PARALLEL, port=PORT, keep_alive=0))
    info = engine.load()
    assert info.address.url and info.address.api_key
    fn = make_clients(info.address.url, info.address.api_key)[name]
    measure_stream(fn)  # warm-up
    profiler = Profiler(interval=0.0005)
    cpu = 0.0
    with profiler:
        for _ in range(requests):
            cpu += measure_stream(fn)["cpu"]
    print(f"{name}: {cpu / (requests * N_TOKENS) * 1e6:.1f} µs CPU per token over {requests} x {N_TOKENS} tokens")
    print(profiler.output_text(unicode=True, color=False, show_all=False, short_mode=False))
    engine.unload()


if __name__ == "__main__":
    main()
