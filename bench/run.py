"""gguf-provider benchmarks (issue 7): ``make bench`` or ``.venv/bin/python bench/run.py``.

Every figure is a ratio (or a difference) measured side by side in one run, on the same server and the same request
(fixed seed, temperature 0, ``ignore_eos``, fixed token count), clients interleaved round by round so machine noise
lands on all of them alike. Writes ``bench/results.json``, ``docs/benchmarks.md`` and ``docs/benchmarks.png``.

Environment: ``BENCH_ROUNDS`` (default 7), ``BENCH_TOKENS`` (default 256), ``BENCH_PORT`` (default 18731),
``BENCH_THREADS`` (llama-server threads, default 1), ``BENCH_ONLY`` (comma list of p1,p3,p4,p5,p6 to run a subset; the report then holds only those).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gguf_provider.engine import Engine, EngineConfig  # noqa: E402
from scripts.test_models import ensure  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
N_TOKENS = int(os.environ.get("BENCH_TOKENS", "256"))
PORT = int(os.environ.get("BENCH_PORT", "18731"))
# One generation thread: on 2 cores the client under test keeps the other core, and a server whose threads spin on
# a barrier collapses when other work shares the CPU (seen: 0.2 tok/s with -t 2 beside other servers).
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
SERVER_ARGS = ("-t", str(THREADS), "-tb", str(THREADS))
ONLY = {s.strip() for s in os.environ.get("BENCH_ONLY", "p1,p3,p4,p5,p6").split(",") if s.strip()}
N_CTX, N_PARALLEL = 8192, 4
SEED = 42
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
BATCH, BATCH_TOKENS = 4, 128

GOALS = {
    "p1": ">= 0.99", "p2": "<= 60 µs/token and <= ChatOpenAI", "p3_attach": "<= 150 ms", "p4": "<= 0.2",
    "p5": ">= 0.97", "p6": ">= 100x",
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


# --- P1/P2: streaming throughput and client CPU per token --------------------------------------------------------


def raw_body(max_tokens: int = N_TOKENS, stream: bool = True) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "seed": SEED, "ignore_eos": True, "stream": stream}


def make_clients(url: str, api_key: str) -> dict[str, Callable[[], Iterator[str]]]:
    """Each client streams the same request and yields the text of each content delta."""
    from langchain_llama_cpp import ChatLlama
    from langchain_openai import ChatOpenAI

    from gguf_provider import ChatGGUF

    auth = {"Authorization": f"Bearer {api_key}"}
    raw_client = httpx.Client(base_url=url, headers=auth, timeout=600)

    def raw() -> Iterator[str]:
        with raw_client.stream("POST", "/v1/chat/completions", json=raw_body()) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                for choice in json.loads(payload).get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text

    # loop_guard off: ignore_eos makes every client generate N_TOKENS, loop or not; the guard would stop early.
    gguf = ChatGGUF(base_url=url, api_key=api_key, temperature=0, seed=SEED, max_tokens=N_TOKENS, loop_guard=False)
    openai = ChatOpenAI(base_url=f"{url}/v1", api_key=api_key, model="bench", temperature=0, seed=SEED,
                        max_tokens=N_TOKENS, extra_body={"ignore_eos": True}, max_retries=0)
    def bearer(request: httpx.Request) -> httpx.Request:  # ChatLlama sends built requests: client headers don't apply
        request.headers["Authorization"] = auth["Authorization"]
        return request

    llama = ChatLlama(model="bench", base_url=url, http_client=httpx.Client(auth=bearer, timeout=600),
                      temperature=0, seed=SEED, max_tokens=N_TOKENS, ignore_eos=True, max_retries=0)

    def lc(model: Any, **kwargs: Any) -> Callable[[], Iterator[str]]:
        def run() -> Iterator[str]:
            for chunk in model.stream(PROMPT, **kwargs):
                if chunk.content:
                    yield chunk.content
        return run

    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(raw_body()).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {api_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()

    def bare_socket() -> Iterator[str]:
        """The floor: one recv per server write, no HTTP or JSON parsing (counts content fields)."""
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head + body)
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                for _ in range(data.count(b'"content":"')):
                    yield "x"
                if b"[DONE]" in data:
                    break

    return {"raw httpx": raw, "ChatGGUF": lc(gguf, ignore_eos=True), "ChatOpenAI": lc(openai),
            "ChatLlama": lc(llama), "bare socket": bare_socket}


def measure_stream(fn: Callable[[], Iterator[str]]) -> dict[str, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    first = None
    n = 0
    for _ in fn():
        if first is None:
            first = time.perf_counter()
        n += 1
    t1, c1 = time.perf_counter(), time.process_time()
    return {"wall": t1 - t0, "cpu": c1 - c0, "ttft": (first or t1) - t0, "chunks": n}


def bench_stream(url: str, api_key: str) -> dict[str, Any]:
    clients = make_clients(url, api_key)
    names = list(clients)
    for name in names:  # warm-up: imports, connections, the server's prompt cache
        measure_stream(clients[name])
        if name == names[0]:
            log(f"P1 warm-up: {name} {measure_stream(clients[name])['wall']:.1f} s per request")
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate to spread drift
        for name in order:
            runs[name].append(measure_stream(clients[name]))
        log(f"P1/P2 round {r + 1}/{ROUNDS}: " + ", ".join(
            f"{n} {N_TOKENS / runs[n][-1]['wall']:.0f} tok/s {runs[n][-1]['cpu'] / N_TOKENS * 1e6:.0f} µs/tok"
            for n in names))
    out: dict[str, Any] = {"raw": runs, "throughput_ratio": {}, "cpu_us_per_token": {}, "tok_s": {}}
    for name in names:
        out["tok_s"][name] = summary([N_TOKENS / x["wall"] for x in runs[name]])
        out["cpu_us_per_token"][name] = summary([x["cpu"] / N_TOKENS * 1e6 for x in runs[name]])
        if name != "raw httpx":  # paired by round: client wall vs raw wall of the same round
            out["throughput_ratio"][name] = summary(
                [b["wall"] / a["wall"] for a, b in zip(runs[name], runs["raw httpx"], strict=True)])
        out.setdefault("chunks", {})[name] = [x["chunks"] for x in runs[name]]
    return out


# --- P3: attach from a second process; cold start --------------------------------------------------------------


def run_child(args: list[str]) -> dict[str, float]:
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


def bench_attach(model: Path, url: str, api_key: str) -> dict[str, Any]:
    raw_args = ["raw", url, api_key]
    eng_args = ["engine", str(model), str(N_CTX), str(N_PARALLEL), str(PORT), *SERVER_ARGS]
    run_child(raw_args), run_child(eng_args)  # warm the page cache
    raws, engs = [], []
    for r in range(ROUNDS):
        pair = [(raws, raw_args), (engs, eng_args)]
        for dest, args in pair if r % 2 == 0 else pair[::-1]:
            dest.append(run_child(args))
        log(f"P3 attach round {r + 1}/{ROUNDS}: raw {raws[-1]['wall'] * 1e3:.0f} ms, "
            f"gguf_provider {engs[-1]['wall'] * 1e3:.0f} ms")
    return {
        "extra_ms": summary([(e["wall"] - r["wall"]) * 1e3 for r, e in zip(raws, engs, strict=True)]),
        "extra_in_process_ms": summary([(e["total"] - r["total"]) * 1e3 for r, e in zip(raws, engs, strict=True)]),
        "raw_ms": summary([r["wall"] * 1e3 for r in raws]), "engine_ms": summary([e["wall"] * 1e3 for e in engs]),
        "engine_split_ms": {k: summary([e[k] * 1e3 for e in engs]) for k in ("startup", "import", "attach",
                                                                               "request")},
        "raw_split_ms": {k: summary([r[k] * 1e3 for r in raws]) for k in ("startup", "import", "attach",
                                                                            "request")},
    }


def first_token_ours(model: Path) -> float:
    """Private server (fresh key), started by the library, to the first streamed text delta."""
    from gguf_provider.events import TextDelta

    t0 = time.perf_counter()
    engine = Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, n_parallel=N_PARALLEL, shared=False,
                                 keep_alive=0, server_args=SERVER_ARGS))
    try:
        for ev in engine.stream(raw_body(max_tokens=4, stream=True)):
            if isinstance(ev, TextDelta):
                return time.perf_counter() - t0
        raise RuntimeError("no text")
    finally:
        engine.unload()


def first_token_bare(model: Path) -> float:
    """The same llama-server command line spawned by hand, /health polled every 5 ms: the floor."""
    from gguf_provider.runtime import discovery, manager, process

    binary = discovery.find_llama_server()
    caps = discovery.probe(binary)
    spec = manager.ServerSpec(model=model, n_ctx=N_CTX, n_parallel=N_PARALLEL, server_args=SERVER_ARGS)
    port = manager._free_port()
    argv = manager.build_argv(spec, binary, caps, "bench-bare", N_CTX, process.Address(url=f"http://127.0.0.1:{port}"),
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


def bench_cold(model: Path) -> dict[str, Any]:
    ours, bare = [], []
    for r in range(ROUNDS):
        pair = [(ours, first_token_ours), (bare, first_token_bare)]
        for dest, fn in pair if r % 2 == 0 else pair[::-1]:
            dest.append(fn(model))
        log(f"P3 cold round {r + 1}/{ROUNDS}: gguf_provider {ours[-1] * 1e3:.0f} ms, bare {bare[-1] * 1e3:.0f} ms")
    return {"ours_ms": summary([x * 1e3 for x in ours]), "bare_ms": summary([x * 1e3 for x in bare]),
            "extra_ms": summary([(o - b) * 1e3 for o, b in zip(ours, bare, strict=True)]),
            "ratio": summary([o / b for o, b in zip(ours, bare, strict=True)])}


# --- P4: multi-turn prefix cache -------------------------------------------------------------------------------

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


def bench_multiturn(url: str, api_key: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    from gguf_provider import ChatGGUF

    llm = ChatGGUF(base_url=url, api_key=api_key, temperature=0, seed=SEED)
    warm, cold, ratio, prompt_tokens, timings = [], [], [], [], []
    for r in range(ROUNDS + 1):  # round 0 is a warm-up
        h = history(1000 + r)
        answer = llm.invoke(h, max_tokens=16, ignore_eos=True)  # turn N-1: its prompt and answer are cached
        turn = [*h, answer, HumanMessage("And what was the first word of turn 3?")]
        pair = [("warm", {}), ("cold", {"cache_prompt": False})]
        res = {}
        for kind, kw in pair if r % 2 == 0 else pair[::-1]:
            res[kind] = ttft(llm, turn, **kw)
            if kind == "cold":  # put the cache back where a real turn N would find it
                llm.invoke(h, max_tokens=16, ignore_eos=True)
        if r == 0:
            prompt_tokens.append(llm.get_num_tokens_from_messages(turn))
            continue
        warm.append(res["warm"][0])
        cold.append(res["cold"][0])
        ratio.append(res["warm"][0] / res["cold"][0])
        timings.append({"warm": res["warm"][1], "cold": res["cold"][1]})
        log(f"P4 round {r}/{ROUNDS}: warm {warm[-1] * 1e3:.0f} ms, cold {cold[-1] * 1e3:.0f} ms "
            f"(cache_n {res['warm'][1].get('cache_n')}/{res['cold'][1].get('cache_n')})")
    return {"ratio": summary(ratio), "warm_ms": summary([x * 1e3 for x in warm]),
            "cold_ms": summary([x * 1e3 for x in cold]), "prompt_tokens": prompt_tokens[0], "timings": timings}


# --- P5: abatch --------------------------------------------------------------------------------------------------


async def raw_batch(url: str, api_key: str) -> float:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=600) as c:
        async def one() -> int:
            r = await c.post("/v1/chat/completions", json=raw_body(BATCH_TOKENS, stream=False))
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(one() for _ in range(BATCH)))
        return sum(tokens) / (time.perf_counter() - t0)


async def gguf_batch(llm: Any) -> float:
    t0 = time.perf_counter()
    out = await llm.abatch([PROMPT] * BATCH, ignore_eos=True)
    tokens = sum(m.usage_metadata["output_tokens"] for m in out)
    return tokens / (time.perf_counter() - t0)


def bench_batch(url: str, api_key: str) -> dict[str, Any]:
    from gguf_provider import ChatGGUF

    llm = ChatGGUF(base_url=url, api_key=api_key, temperature=0, seed=SEED, max_tokens=BATCH_TOKENS, loop_guard=False)
    asyncio.run(raw_batch(url, api_key)), asyncio.run(gguf_batch(llm))
    raws, ggufs = [], []
    for r in range(ROUNDS):
        pair = [(raws, lambda: raw_batch(url, api_key)), (ggufs, lambda: gguf_batch(llm))]
        for dest, fn in pair if r % 2 == 0 else pair[::-1]:
            dest.append(asyncio.run(fn()))
        log(f"P5 round {r + 1}/{ROUNDS}: raw {raws[-1]:.0f} tok/s, abatch {ggufs[-1]:.0f} tok/s")
    return {"ratio": summary([g / r for r, g in zip(raws, ggufs, strict=True)]), "raw_tok_s": summary(raws),
            "abatch_tok_s": summary(ggufs)}


# --- P6: GGUF header ---------------------------------------------------------------------------------------------


def bench_header(model: Path) -> dict[str, Any]:
    import gguf

    from gguf_provider.runtime.gguf import read_header

    def ours() -> float:
        t0 = time.perf_counter()
        h = read_header(model)
        dt = time.perf_counter() - t0
        assert h is not None
        return dt

    def theirs() -> float:
        t0 = time.perf_counter()
        reader = gguf.GGUFReader(str(model))
        dt = time.perf_counter() - t0
        assert reader.fields
        return dt

    ours(), theirs()  # page cache
    a, b = [], []
    for _ in range(ROUNDS):
        a.append(ours())
        b.append(theirs())
    log(f"P6: ours {statistics.median(a) * 1e3:.1f} ms, gguf.GGUFReader {statistics.median(b) * 1e3:.0f} ms")
    return {"speedup": summary([t / o for o, t in zip(a, b, strict=True)]), "ours_ms": summary([x * 1e3 for x in a]),
            "gguf_ms": summary([x * 1e3 for x in b]), "model": model.name, "size": model.stat().st_size}


# --- report ------------------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("gguf-provider", "langchain-core", "langchain-openai", "openai", "langchain-llama-cpp", "httpx",
                "gguf"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "-"
    return out


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()}


def fmt(s: dict[str, Any], unit: str = "", digits: int = 3) -> tuple[str, str]:
    return (f"{s['median']:.{digits}f}{unit}", f"{s['min']:.{digits}f}–{s['max']:.{digits}f}")


def rows(res: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    out: list[tuple[str, str, str, str, str, str]] = []

    def add(metric: str, what: str, s: dict[str, Any], goal: str, ok: bool | None, digits: int = 3,
            unit: str = "") -> None:
        med, rng = fmt(s, unit, digits)
        out.append((metric, what, med, rng, goal, "-" if ok is None else ("yes" if ok else "**no**")))

    if "p1" in res:
        p = res["p1"]
        for name, s in p["throughput_ratio"].items():
            add("P1 stream throughput ÷ raw", name, s, GOALS["p1"] if name == "ChatGGUF" else "",
                s["median"] >= 0.99 if name == "ChatGGUF" else None)
        cpu = p["cpu_us_per_token"]
        for name, s in cpu.items():
            ok = None
            if name == "ChatGGUF":
                ok = s["median"] <= 60 and s["median"] <= cpu["ChatOpenAI"]["median"]
            add("P2 client CPU per token, live", name, s, GOALS["p2"] if name == "ChatGGUF" else "", ok, 1, " µs")
    if "p2_replay" in res:
        rp = res["p2_replay"]
        for name, v in rp.items():
            ok = v <= 60 and v <= rp["ChatOpenAI"] if name == "ChatGGUF" else None
            add("P2 client CPU per token, replayed stream (no server)", name,
                {"median": v, "min": v, "max": v}, GOALS["p2"] if name == "ChatGGUF" else "", ok, 1, " µs")
    if "p3" in res:
        a = res["p3"]["attach"]
        add("P3 attach + 1 request, extra wall over raw httpx process", "gguf_provider.Engine", a["extra_ms"],
            GOALS["p3_attach"], a["extra_ms"]["median"] <= 150, 0, " ms")
        c = res["p3"]["cold"]
        add("P3 cold start to first token", "gguf_provider (private server)", c["ours_ms"], "", None, 0, " ms")
        add("P3 cold start to first token", "bare llama-server, 5 ms /health poll", c["bare_ms"], "", None, 0, " ms")
        add("P3 cold start ours ÷ bare", "", c["ratio"], "", None)
    if "p4" in res:
        s = res["p4"]["ratio"]
        add(f"P4 TTFT turn N ({res['p4']['prompt_tokens']}-token history) ÷ same prompt cold", "ChatGGUF", s,
            GOALS["p4"], s["median"] <= 0.2)
    if "p5" in res:
        s = res["p5"]["ratio"]
        add(f"P5 abatch of {BATCH} ÷ raw {BATCH} concurrent, aggregate tok/s", "ChatGGUF", s, GOALS["p5"],
            s["median"] >= 0.97)
    if "p6" in res:
        s = res["p6"]["speedup"]
        add(f"P6 GGUF header: gguf.GGUFReader time ÷ ours ({res['p6']['model']})", "read_header", s, GOALS["p6"],
            s["median"] >= 100, 0, "x")
    return out


def write_markdown(res: dict[str, Any], path: Path) -> None:
    m, v = res["machine"], res["versions"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`bench/run.py`); raw numbers in `bench/results.json`. Every figure is a ratio or "
        "a difference measured side by side in one run, on the same llama-server and the same request (seed "
        f"{SEED}, temperature 0, `ignore_eos`, {N_TOKENS} tokens for P1/P2, {BATCH_TOKENS} per request for P5), "
        f"clients interleaved in each of {ROUNDS} rounds. Median of the rounds, min–max beside it.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; load average before the run "
        f"{', '.join(f'{x:.2f}' for x in m['load_before'])} (shared with other work: noise is expected).",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- llama-server: {res.get('server', {}).get('build_info', '?')}, `-c {N_CTX} -np {N_PARALLEL} --kv-unified"
        f" {' '.join(SERVER_ARGS)}`, TCP on 127.0.0.1 with an API key (so every client can reach it).",
        f"- Model (P1–P5): {res['model']}; P6: {res.get('p6', {}).get('model', '-')}.",
        f"- Total run time: {res['elapsed_s']:.0f} s.",
        "",
        "| Metric | Client | Median | Min–max | Goal | Met |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(r)} |" for r in rows(res)]
    if "p1" in res:
        lines += ["", "Absolute streaming throughput (tok/s, median): " + ", ".join(
            f"{n} {s['median']:.1f}" for n, s in res["p1"]["tok_s"].items()) + "."]
    if "p3" in res:
        a = res["p3"]["attach"]
        lines += ["", "P3 split, gguf_provider child (ms, median): " + ", ".join(
            f"{k} {s['median']:.0f}" for k, s in a["engine_split_ms"].items()) + "; raw child: " + ", ".join(
            f"{k} {s['median']:.0f}" for k, s in a["raw_split_ms"].items()) + "."]
    if "p4" in res:
        p = res["p4"]
        lines += ["", f"P4 absolute TTFT: warm {p['warm_ms']['median']:.0f} ms, cold {p['cold_ms']['median']:.0f} ms "
                  f"(median)."]
    if "p6" in res:
        p = res["p6"]
        lines += ["", f"P6 absolute: ours {p['ours_ms']['median']:.2f} ms, gguf.GGUFReader "
                  f"{p['gguf_ms']['median']:.0f} ms ({p['size'] / 1e6:.0f} MB file, page cache warm)."]
    lines += ["", "![benchmarks](benchmarks.png)", ""]
    notes = ROOT / "bench" / "NOTES.md"
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    path.write_text("\n".join(lines))


def write_chart(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))

    def bars(ax: Any, items: list[tuple[str, dict[str, Any]]], title: str, goal: float | None, unit: str) -> None:
        names = [n for n, _ in items]
        med = [s["median"] for _, s in items]
        lo = [s["median"] - s["min"] for _, s in items]
        hi = [s["max"] - s["median"] for _, s in items]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color="#4c78a8")
        if goal is not None:
            ax.axhline(goal, color="#e45756", linestyle="--", label=f"goal {goal:g}{unit}")
            ax.legend()
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=8)

    if "p1" in res:
        bars(axes[0][0], list(res["p1"]["throughput_ratio"].items()), "P1 stream throughput ÷ raw httpx", 0.99, "")
        axes[0][0].set_ylim(0.8, 1.05)
        bars(axes[0][1], list(res["p1"]["cpu_us_per_token"].items()), "P2 client CPU per token (µs)", 60, " µs")
    if "p3" in res:
        c = res["p3"]
        bars(axes[1][0], [("attach extra", c["attach"]["extra_ms"]), ("cold: ours", c["cold"]["ours_ms"]),
                          ("cold: bare", c["cold"]["bare_ms"])], "P3 ms (attach extra; cold start to 1st token)",
             150, " ms")
    ratios = []
    if "p4" in res:
        ratios.append(("P4 warm÷cold TTFT", res["p4"]["ratio"]))
    if "p5" in res:
        ratios.append(("P5 abatch÷raw", res["p5"]["ratio"]))
    if ratios:
        bars(axes[1][1], ratios, "P4 (goal <= 0.2), P5 (goal >= 0.97)", None, "")
        axes[1][1].axhline(0.2, color="#e45756", linestyle="--")
        axes[1][1].axhline(0.97, color="#e45756", linestyle=":")
    if "p6" in res:
        fig.suptitle(f"gguf-provider benchmarks — P6 header read speedup over gguf.GGUFReader: "
                     f"{res['p6']['speedup']['median']:.0f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if "--report" in sys.argv:  # re-render docs from bench/results.json (e.g. after editing bench/NOTES.md)
        res = json.loads((ROOT / "bench" / "results.json").read_text())
        write_markdown(res, ROOT / "docs" / "benchmarks.md")
        write_chart(res, ROOT / "docs" / "benchmarks.png")
        return
    started = time.perf_counter()
    small, large = ensure("smollm2"), ensure("qwen")
    res: dict[str, Any] = {"machine": machine(), "versions": versions(), "model": small.name, "rounds": ROUNDS,
                           "tokens": N_TOKENS}
    if "p6" in ONLY:
        res["p6"] = bench_header(large)
    if "p1" in ONLY:
        from bench.replay import replay_cpu

        res["p2_replay"] = replay_cpu()
        log("P2 replayed: " + ", ".join(f"{n} {v:.1f} µs/tok" for n, v in res["p2_replay"].items()))
    log(f"starting the shared server ({small.name}, TCP port {PORT})")
    engine = Engine(EngineConfig(model_path=str(small), n_ctx=N_CTX, n_parallel=N_PARALLEL, port=PORT, keep_alive=0,
                                 server_args=SERVER_ARGS))
    info = engine.load()
    url, api_key = info.address.url, info.address.api_key
    assert url and api_key
    res["server"] = {"url": url, "build_info": info.props.get("build_info"), "n_ctx": info.n_ctx}
    try:
        if "p1" in ONLY:
            res["p1"] = bench_stream(url, api_key)
        if "p4" in ONLY:
            res["p4"] = bench_multiturn(url, api_key)
        if "p5" in ONLY:
            res["p5"] = bench_batch(url, api_key)
        if "p3" in ONLY:
            res["p3"] = {"attach": bench_attach(small, url, api_key)}
    finally:
        engine.unload()
    if "p3" in ONLY:
        res["p3"]["cold"] = bench_cold(small)
    res["elapsed_s"] = time.perf_counter() - started
    (ROOT / "bench" / "results.json").write_text(json.dumps(res, indent=1, default=str))
    write_markdown(res, ROOT / "docs" / "benchmarks.md")
    write_chart(res, ROOT / "docs" / "benchmarks.png")
    for r in rows(res):
        print(" | ".join(r))
    log(f"done in {res['elapsed_s']:.0f} s: docs/benchmarks.md, docs/benchmarks.png, bench/results.json")


if __name__ == "__main__":
    main()
