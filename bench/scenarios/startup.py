"""P3: a fresh process attaching to the shared server and asking once; a cold start to the first token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.clients import raw_body
from bench.config import N_CTX, N_PARALLEL, ROOT, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import Goal, summary
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.events import TextDelta
from gguf_provider.runtime._common import process
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec


def run_child(args: list[str]) -> dict[str, float]:
    """``bench/child.py ARGS`` in a fresh interpreter: its own timings, and the wall from here."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_T0=repr(time.time()))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "child.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed: {proc.stderr[-2000:]}")
    data: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    data["wall"] = wall
    return data


def bench_attach(cfg: Config, model: Path, url: str, api_key: str, goal: Goal) -> dict[str, Any]:
    raw_args = ["raw", url, api_key]
    eng_args = ["engine", str(model), str(N_CTX), str(N_PARALLEL), str(cfg.port), *cfg.server_args]
    run_child(raw_args), run_child(eng_args)  # warm the page cache
    raws: list[dict[str, float]] = []
    engs: list[dict[str, float]] = []

    def step(r: int) -> None:
        pair = [(raws, raw_args), (engs, eng_args)]
        for dest, args in pair if r % 2 == 0 else pair[::-1]:
            dest.append(run_child(args))
        log(f"P3 attach round {r + 1}: raw {raws[-1]['wall'] * 1e3:.0f} ms, "
            f"gguf_provider {engs[-1]['wall'] * 1e3:.0f} ms")

    def ratio() -> list[float]:
        return [e["wall"] / r["wall"] for r, e in zip(raws, engs, strict=True)]

    adaptive(cfg, "P3 attach", step, ratio, goal)
    return {
        "ratio": summary(ratio(), goal),
        "extra_ms": summary([(e["wall"] - r["wall"]) * 1e3 for r, e in zip(raws, engs, strict=True)]),
        "extra_in_process_ms": summary([(e["total"] - r["total"]) * 1e3 for r, e in zip(raws, engs, strict=True)]),
        "raw_ms": summary([r["wall"] * 1e3 for r in raws]), "engine_ms": summary([e["wall"] * 1e3 for e in engs]),
        "engine_split_ms": {k: summary([e[k] * 1e3 for e in engs]) for k in ("startup", "import", "attach",
                                                                               "request")},
        "raw_split_ms": {k: summary([r[k] * 1e3 for r in raws]) for k in ("startup", "import", "attach",
                                                                            "request")},
    }


def first_token_ours(cfg: Config, model: Path) -> float:
    """Private server (fresh key), started by the library, to the first streamed text delta."""
    t0 = time.perf_counter()
    engine = Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, n_parallel=N_PARALLEL, shared=False,
                                 keep_alive=0, server_args=cfg.server_args, speculative=False))
    try:
        for ev in engine.stream(raw_body(max_tokens=4, stream=True)):
            if isinstance(ev, TextDelta):
                return time.perf_counter() - t0
        raise RuntimeError("no text")
    finally:
        engine.unload()


def first_token_bare(cfg: Config, model: Path) -> float:
    """The same llama-server command line spawned by hand, /health polled every 5 ms: the floor."""
    binary = discovery.find_llama_server()
    caps = discovery.probe(binary)
    spec = ServerSpec(model=model, n_ctx=N_CTX, n_parallel=N_PARALLEL, server_args=cfg.server_args)
    port = process.free_port()
    argv = build_argv(spec, binary, caps, "bench-bare", N_CTX, process.Address(url=f"http://127.0.0.1:{port}"),
                              None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=process.clean_env())
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            while True:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("bare llama-server exited")
                time.sleep(0.005)
            with c.stream("POST", "/v1/chat/completions", json=raw_body(max_tokens=4)) as r:
                for line in r.iter_lines():
                    if line.startswith("data:") and '"content":"' in line:
                        return time.perf_counter() - t0
        raise RuntimeError("no text")
    finally:
        proc.terminate()
        proc.wait(10)


def bench_cold(cfg: Config, model: Path, goal: Goal | None = None) -> dict[str, Any]:
    ours: list[float] = []
    bare: list[float] = []

    def step(r: int) -> None:
        pair = [(ours, first_token_ours), (bare, first_token_bare)]
        for dest, fn in pair if r % 2 == 0 else pair[::-1]:
            dest.append(fn(cfg, model))
        log(f"P3 cold round {r + 1}: gguf_provider {ours[-1] * 1e3:.0f} ms, bare {bare[-1] * 1e3:.0f} ms")

    adaptive(cfg, "P3 cold", step, lambda: [o / b for o, b in zip(ours, bare, strict=True)], goal)
    return {"ours_ms": summary([x * 1e3 for x in ours]), "bare_ms": summary([x * 1e3 for x in bare]),
            "extra_ms": summary([(o - b) * 1e3 for o, b in zip(ours, bare, strict=True)]),
            "ratio": summary([o / b for o, b in zip(ours, bare, strict=True)], goal)}


# P3's import times (issue 34): each statement timed inside a fresh interpreter, around the statement alone.
IMPORTS = {
    "langchain_core.language_models": "import langchain_core.language_models",
    "BaseChatModel": "from langchain_core.language_models import BaseChatModel",
    "gguf_provider": "import gguf_provider",
    "ChatGGUF": "from gguf_provider import ChatGGUF",
    "httpx": "import httpx",
}
IMPORT_CHILD = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"


def compile_package() -> None:
    """Our modules' bytecode, written as pip writes the dependencies' (an install compiles; a checkout run with
    ``PYTHONDONTWRITEBYTECODE`` would compile ours on every import and not theirs)."""
    import compileall

    compileall.compile_dir(str(ROOT / "gguf_provider"), quiet=1)


def import_time(stmt: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHILD.format(stmt=stmt)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def bench_import(cfg: Config, goal: Goal) -> dict[str, Any]:
    """Import times in fresh processes, interleaved (order reversed every other round); ours ÷ the framework's."""
    compile_package()
    for stmt in IMPORTS.values():  # page cache warm
        import_time(stmt)
    times: dict[str, list[float]] = {k: [] for k in IMPORTS}

    def step(r: int) -> None:
        for k in (list(IMPORTS) if r % 2 == 0 else list(IMPORTS)[::-1]):
            times[k].append(import_time(IMPORTS[k]))
        log(f"P3 import round {r + 1}: " + ", ".join(f"{k} {v[-1] * 1e3:.0f} ms" for k, v in times.items()))

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(times[a], times[b], strict=True)]

    def worst() -> list[float]:
        return ratio("ChatGGUF", "langchain_core.language_models")

    adaptive(cfg, "P3 import", step, worst, goal)
    return {"statements": IMPORTS, "ms": {k: summary([x * 1e3 for x in v]) for k, v in times.items()},
            "package_ratio": summary(ratio("gguf_provider", "langchain_core.language_models"), goal),
            "chat_ratio": summary(ratio("ChatGGUF", "langchain_core.language_models"), goal),
            "chat_base_ratio": summary(ratio("ChatGGUF", "BaseChatModel"), goal)}
