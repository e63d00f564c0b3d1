"""P20: the gateway (`gguf-provider serve` with no model) against the llama-server behind it. One gateway process,
SmolLM2 loaded through it; each round streams the same request (fixed seed, temperature 0, ``ignore_eos``,
:data:`TOKENS` tokens, speculation off: one token per chunk) once through the gateway's ``/v1/chat/completions``
and once straight to the server's, in alternating order, with raw httpx in this process for both. Per round:

- decode tokens/s (tokens after the first ÷ the time from the first to the last), gateway ÷ straight (goal >= 0.99);
- time to first token, gateway − straight, in ms (goal <= 5): the median of :data:`TTFT_PAIRS` pairs of short
  replies.

Both are also shown with llama-server's own time for each reply taken out (its ``timings``, which the gateway
passes on in the stream's usage chunk as llama-server does): the machine's noise then cancels.

The server is pinned to its own core; the gateway process and this one share the other.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from bench import machine
from bench.config import GOALS, ROOT, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import summary

TOKENS = 256
TTFT_PAIRS = 7  # short replies a round times through each path, for its TTFT difference
N_CTX = 2048
BODY = {"messages": [{"role": "user", "content": "Write a story about a lighthouse keeper."}], "max_tokens": TOKENS,
        "temperature": 0, "seed": 42, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, float]:
    """One streamed reply, timed as its chunks arrive: TTFT and decode time (first to last token) in s, tok/s, and
    llama-server's own prompt and generation times for it (its ``timings``, in s)."""
    times: list[float] = []
    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            timings = chunk.get("timings") or timings
            choices = chunk.get("choices") or ()
            if choices and (choices[0].get("delta") or {}).get("content"):
                times.append(time.perf_counter())
    if len(times) < min(body["max_tokens"], TOKENS) // 2 or not times:
        raise RuntimeError(f"P20: {len(times)} content chunks for {body['max_tokens']} tokens")
    if not timings:
        raise RuntimeError("P20: no timings in the stream")
    decode = times[-1] - times[0]
    return {"ttft": times[0] - t0, "decode": decode, "tps": (len(times) - 1) / decode if decode else 0.0,
            "prompt": timings["prompt_ms"] / 1000, "predicted": timings["predicted_ms"] / 1000}


def start_gateway(cfg: Config, model: Path, n_ctx: int, keep_alive: float, who: str, boundary: Path | None = None
                  ) -> tuple[subprocess.Popen[str], str, deque[str]]:
    """`gguf-provider serve` with no model over ``model``'s directory (speculation off, ``cfg.threads``): the
    process, its URL and its last output lines (read on in a thread, so its pipe never fills). ``keep_alive``: the
    server outlives the gateway's hold while a straight request runs. ``boundary``: its upstream requests timed
    into that file (:mod:`bench.boundary`)."""
    env = dict(os.environ, GGUF_PROVIDER_MODELS=str(model.parent), GGUF_PROVIDER_KEEP_ALIVE=str(keep_alive))
    cli = ["-m", "gguf_provider.cli"] if boundary is None else ["-m", "bench.boundary", str(boundary)]
    proc = subprocess.Popen([sys.executable, *cli, "serve", "--port", "0", "--ctx", str(n_ctx),
                             "--speculative", "off", "--threads", str(cfg.threads)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("gateway at"):
        proc.kill()
        raise RuntimeError(f"{who}: the gateway did not start: {line}{proc.stdout.read()}")
    said: deque[str] = deque(maxlen=40)
    threading.Thread(target=lambda: said.extend(proc.stdout or ()), daemon=True).start()
    return proc, line.split()[2], said


def bench_gateway(cfg: Config, model: Path) -> dict[str, Any]:
    proc, url, _ = start_gateway(cfg, model, N_CTX, 600, "P20")
    gw = httpx.Client(base_url=url, timeout=600)
    try:
        body = {**BODY, "model": model.stem}
        stream(gw, "/v1/chat/completions", {**body, "max_tokens": 8})  # loads the model
        server = _behind(url)
        pinning = machine.pin(server["pid"])
        for tid in machine._tasks(proc.pid) if pinning.get("pinned") else ():  # the gateway beside the clients
            os.sched_setaffinity(tid, pinning["client_cores"])
        headers = {"Authorization": f"Bearer {server['key']}"} if server["key"] else {}
        if server["socket"]:
            direct = httpx.Client(base_url="http://llama-server", timeout=600, headers=headers,
                                  transport=httpx.HTTPTransport(uds=server["socket"]))
        else:
            direct = httpx.Client(base_url=server["url"], timeout=600, headers=headers)
        awake = machine.keep_awake(pinning.get("client_cores", []))
        wall: list[float] = []  # decode tok/s as the client sees it, gateway ÷ straight
        tps: list[float] = []  # the same, each set against the server's own generation time for it
        ttft: list[float] = []  # ms: (TTFT − the server's prompt time), gateway − straight
        ttft_wall: list[float] = []  # ms: TTFT, gateway − straight

        def pair(r: int, b: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
            order = ("gateway", "direct") if r % 2 == 0 else ("direct", "gateway")
            got = {who: stream(gw if who == "gateway" else direct, "/v1/chat/completions", b) for who in order}
            return got["gateway"], got["direct"]

        def step(r: int) -> None:
            g, d = pair(r, body)
            wall.append(g["tps"] / d["tps"])
            tps.append((g["predicted"] / g["decode"]) / (d["predicted"] / d["decode"]))
            # TTFT: the median of TTFT_PAIRS short replies' differences (one pair alone is mostly noise)
            short = [pair(r + i, {**body, "max_tokens": 2}) for i in range(TTFT_PAIRS)]
            ttft.append(statistics.median(((g["ttft"] - g["prompt"]) - (d["ttft"] - d["prompt"])) * 1000
                                          for g, d in short))
            ttft_wall.append(statistics.median((g["ttft"] - d["ttft"]) * 1000 for g, d in short))
            log(f"P20 round {r + 1}: tok/s gateway ÷ straight {wall[-1]:.3f} ({tps[-1]:.3f} server time taken out), "
                f"TTFT +{ttft_wall[-1]:.1f} ms ({ttft[-1]:+.1f} ms server time taken out)")

        try:
            # rounds are added while the TTFT verdict is within noise (the tok/s one is decided at once: 1.000)
            n = adaptive(cfg, "P20", step, lambda: ttft, GOALS["p20_ttft"])
        finally:
            awake.stop()
            machine.unpin(server["pid"])
        return {"model": model.name, "tokens": TOKENS, "rounds": n, "pinning": pinning,
                "tps_ratio": summary(tps, GOALS["p20_tps"]), "tps_wall_ratio": summary(wall),
                "ttft_extra_ms": summary(ttft, GOALS["p20_ttft"]), "ttft_wall_extra_ms": summary(ttft_wall)}
    finally:
        gw.close()
        stop_gateway(proc)


def stop_gateway(proc: subprocess.Popen[str]) -> None:
    """The gateway stopped (SIGTERM, SIGKILL after 30 s), then its servers: they outlive it by their keep_alive (the
    bench's home holds only its own)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    subprocess.run([sys.executable, "-m", "gguf_provider.cli", "stop", "--all"], capture_output=True, check=False)


def _behind(url: str) -> dict[str, Any]:
    """The llama-server the gateway at ``url`` holds: its pid, socket or URL, and key (from ``ps --json``)."""
    out = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "ps", "--json"], capture_output=True, text=True,
                         check=True)
    (row,) = [s for s in json.loads(out.stdout)["servers"] if s["gateway"] == url]
    address: str = row["address"]
    from gguf_provider.runtime._serve import registry

    entry = next(e for k, e in registry.read().items() if k.startswith(row["id"]))
    key = Path(entry.api_key_file).read_text().strip() if entry.api_key_file else None
    if address.startswith("unix:"):
        return {"pid": row["pid"], "socket": address[5:], "url": None, "key": key}
    return {"pid": row["pid"], "socket": None, "url": address, "key": key}
