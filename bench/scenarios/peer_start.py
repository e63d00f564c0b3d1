"""P13 and P14 (issue 34), ours (``ChatGGUF``) against llama-cpp-python in process (LangChain's ``ChatLlamaCpp``),
every client a fresh child (bench/peer_start_child.py), llama.cpp threads ``cfg.peer_threads`` on both sides.

P13: two children each make the model and ``invoke`` once, then wait; PSS (a page mapped by several processes split
among them), RSS and footprint (private pages + each file's pages once, blind to outside processes) are summed over a
side: ours = two clients + the shared llama-server + its watchdog; theirs = two processes. Each side with its defaults
(ours' automatic context, theirs' 512; reported), then both at n_ctx 2048 (``same_ctx``, no goal); sides never overlap.
P14: a child timed from its own start (``$BENCH_T0``) to the first token of its first ``.stream()``, ours ÷ theirs,
order alternating: cold (no server; ours spawns one, stopped after each round) and shared (the parent started and warmed
one first; the child attaches). Both n_ctx 2048; theirs n_batch 512 (its default 8 slows its prompt), verbose off.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.config import GOALS, ROOT, Config
from bench.log import log
from bench.rounds import adaptive, late
from bench.stats import summary
from gguf_provider.runtime._serve import registry

CHILD = ROOT / "bench" / "peer_start_child.py"
P14_CTX = 2048
CODER_ROUNDS = 3  # P13 on the 1.5B model: fewer rounds (memory barely varies; each round loads 1.1 GB thrice)
SAME_CTX_ROUNDS = 2  # P13 with both sides at P14_CTX, to explain the defaults' figure
MB = 1024 * 1024
SPLIT = ("startup", "import", "load", "request")
Row = tuple[str, str, dict[str, Any], int, str]


def _ensure(key: str) -> Path:
    """Test model ``key`` from the user's cache: the bench's private home (bench/run.py ``private_home``) holds no
    models, and ensure() there would fetch them again."""
    from scripts.test_models import ensure

    home = os.environ.pop("GGUF_PROVIDER_HOME", None)
    try:
        return ensure(key)
    finally:
        if home is not None:
            os.environ["GGUF_PROVIDER_HOME"] = home


# --- processes ------------------------------------------------------------------------------------------------------


def _settings(side: str, model: Path, cfg: Config, n_ctx: int | None, **extra: Any) -> dict[str, Any]:
    return {"side": side, "model": str(model), "threads": cfg.peer_threads, "n_ctx": n_ctx, **extra}


def _spawn(mode: str, settings: dict[str, Any], err: Any) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_T0=repr(time.time()))
    return subprocess.Popen([sys.executable, str(CHILD), mode, json.dumps(settings)], env=env, cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)


def _end(proc: subprocess.Popen[str]) -> None:
    """Close its stdin and wait; kill it if it does not go."""
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(30)
    except (subprocess.TimeoutExpired, OSError):
        proc.kill()
        proc.wait(10)


def _line(proc: subprocess.Popen[str], err: Any, timeout: float = 300) -> dict[str, Any]:
    """The child's JSON line (it then waits or exits)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    text = proc.stdout.readline() if ready else ""
    if not text:
        proc.kill()
        proc.wait(10)
        err.seek(0)
        raise RuntimeError(f"peer_start child failed (rc {proc.returncode}): {err.read()[-2000:]}")
    data: dict[str, Any] = json.loads(text)
    return data


def _first(settings: dict[str, Any]) -> dict[str, Any]:
    """A ``first`` child run to its end: its timings (seconds)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = _spawn("first", settings, err)
        try:
            data = _line(proc, err)
        finally:
            _end(proc)
    return data


def _home() -> str:
    return str(registry.default().home)


def _watchdogs() -> list[int]:
    """The watchdog processes of servers in this run's home."""
    home, found = _home(), []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if "gguf_provider.runtime._serve.watchdog" in cmd and p.environ().get("GGUF_PROVIDER_HOME") == home:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _server_pids(model: Path) -> list[int]:
    return [e.pid for e in registry.read().values() if e.model == str(model) and registry.server_alive(e)]


def _stop_servers(model: Path) -> None:
    """Stop this run's servers of ``model`` (as ``gguf-provider stop`` does) and wait for their watchdogs to go."""
    with registry.locked() as data:
        stopped = [data.pop(k) for k, e in list(data.items()) if e.model == str(model)]
    for e in stopped:
        registry.stop_entry(e)
    deadline = time.monotonic() + 10
    while (left := _watchdogs()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for e in stopped:
        if registry.server_alive(e):
            raise RuntimeError(f"llama-server pid {e.pid} did not stop")
    for pid in left:  # exits within a second of its server; one still here is stuck
        log(f"P13/P14: killing a stuck watchdog, pid {pid}")
        psutil.Process(pid).kill()


def _other_mappers(model: Path, pids: list[int]) -> list[int]:
    """Processes outside ``pids`` that map the model file: they take a share of its pages' PSS (a test's or another
    bench's server on the same model would make both sides look smaller)."""
    found = []
    for pid in psutil.pids():
        if pid in pids:
            continue
        try:
            if str(model) in Path(f"/proc/{pid}/maps").read_text():
                found.append(pid)
        except OSError:
            continue
    return found


def _memory(pids: list[int]) -> dict[int, tuple[int, int]]:
    """PSS and RSS (bytes) of each process."""
    out = {}
    for pid in pids:
        info = psutil.Process(pid).memory_full_info()
        out[pid] = (info.pss, info.rss)
    return out


def _footprint(pids: list[int]) -> int:
    """Bytes the processes hold together, whoever else maps the same files: their private pages, plus each file's
    shared resident pages once (the most any of them has of it); unlike PSS, no share goes to outside processes."""
    private, shared_files, shared_anon = 0, dict[str, int](), 0
    for pid in pids:
        for m in psutil.Process(pid).memory_maps(grouped=True):
            private += m.private_clean + m.private_dirty
            shared = m.shared_clean + m.shared_dirty
            if m.path.startswith("/"):
                shared_files[m.path] = max(shared_files.get(m.path, 0), shared)
            else:
                shared_anon += shared
    return private + sum(shared_files.values()) + shared_anon


# --- P13 ------------------------------------------------------------------------------------------------------------


def _hold_round(side: str, model: Path, cfg: Config, n_ctx: int | None) -> dict[str, Any]:
    """Two ``hold`` children of ``side`` started one after the other (ours: the second attaches to the server the
    first started), then every process of the side measured; all ended before it returns."""
    settings = _settings(side, model, cfg, n_ctx)
    procs: list[subprocess.Popen[str]] = []
    lines: list[dict[str, Any]] = []
    with tempfile.TemporaryFile("w+") as err:
        try:
            for _ in range(2):
                procs.append(_spawn("hold", settings, err))
                lines.append(_line(procs[-1], err))
            clients = [p.pid for p in procs]
            servers = _server_pids(model) if side == "ours" else []
            dogs = _watchdogs() if side == "ours" else []
            if side == "ours" and (servers != [lines[0]["server_pid"]] or lines[1]["server_pid"] != servers[0]):
                raise RuntimeError(f"P13: the two clients did not share one server: {lines}, registry {servers}")
            mem = _memory(clients + servers + dogs)
            footprint = _footprint(clients + servers + dogs)
            others = _other_mappers(model, clients + servers + dogs)
            if others:
                log(f"P13: processes outside the measured ones map {model.name} too (pids {others}): PSS shares "
                    "its pages with them")
        finally:
            for p in procs:
                _end(p)
            if side == "ours":
                _stop_servers(model)
    mb = {pid: (pss / MB, rss / MB) for pid, (pss, rss) in mem.items()}
    out: dict[str, Any] = {
        "pss": sum(v[0] for v in mb.values()), "rss": sum(v[1] for v in mb.values()), "footprint": footprint / MB,
        "client_pss": [mb[p][0] for p in clients], "client_rss": [mb[p][1] for p in clients],
        "n_ctx": lines[0]["n_ctx"], "other_mappers": len(others)}
    if side == "ours":
        out |= {"server_pss": mb[servers[0]][0], "server_rss": mb[servers[0]][1],
                "watchdog_pss": sum(mb[p][0] for p in dogs), "watchdogs": len(dogs)}
    return out


def _memory_model(cfg: Config, key: str, model: Path, rounds: int | None, n_ctx: int | None = None) -> dict[str, Any]:
    """P13 on ``model``: each side's default context (with the goal, ``rounds`` None: adaptive), or both at
    ``n_ctx`` (no goal: it explains the first)."""
    started = time.perf_counter()
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    goal = GOALS["p13"] if n_ctx is None else None
    what = f"P13 {key}" + (f" n_ctx {n_ctx}" if n_ctx else "")
    _stop_servers(model)

    def step(r: int) -> None:
        pair = [(ours, "ours"), (theirs, "theirs")]
        for dest, side in pair if r % 2 == 0 else pair[::-1]:
            dest.append(_hold_round(side, model, cfg, n_ctx))
        log(f"{what} round {r + 1}: PSS ours {ours[-1]['pss']:.0f} MB (server {ours[-1]['server_pss']:.0f}), "
            f"theirs {theirs[-1]['pss']:.0f} MB; RSS ours {ours[-1]['rss']:.0f} MB, theirs {theirs[-1]['rss']:.0f} MB; "
            f"footprint ours {ours[-1]['footprint']:.0f} MB, theirs {theirs[-1]['footprint']:.0f} MB")

    def ratio() -> list[float]:
        return [o["pss"] / t["pss"] for o, t in zip(ours, theirs, strict=True)]

    if rounds is None:
        adaptive(cfg, what, step, ratio, goal)
    else:
        for r in range(rounds):
            if r >= 1 and late(cfg, what, r):
                break
            step(r)

    def s(side: list[dict[str, Any]], k: str) -> dict[str, Any]:
        return summary([x[k] for x in side])

    def per_client(side: list[dict[str, Any]], k: str) -> dict[str, Any]:
        return summary([v for x in side for v in x[k]])

    return {
        "model": model.name, "same_n_ctx": n_ctx, "ratio_pss": summary(ratio(), goal),
        "ratio_rss": summary([o["rss"] / t["rss"] for o, t in zip(ours, theirs, strict=True)]),
        "ratio_footprint": summary([o["footprint"] / t["footprint"] for o, t in zip(ours, theirs, strict=True)]),
        "ours_footprint_mb": s(ours, "footprint"), "theirs_footprint_mb": s(theirs, "footprint"),
        "ours_pss_mb": s(ours, "pss"), "theirs_pss_mb": s(theirs, "pss"),
        "ours_rss_mb": s(ours, "rss"), "theirs_rss_mb": s(theirs, "rss"),
        "ours_server_pss_mb": s(ours, "server_pss"), "ours_server_rss_mb": s(ours, "server_rss"),
        "ours_client_pss_mb": per_client(ours, "client_pss"), "ours_client_rss_mb": per_client(ours, "client_rss"),
        "ours_watchdog_pss_mb": s(ours, "watchdog_pss"), "ours_watchdogs": ours[-1]["watchdogs"],
        "theirs_client_pss_mb": per_client(theirs, "client_pss"),
        "theirs_client_rss_mb": per_client(theirs, "client_rss"),
        "n_ctx": {"ours": ours[-1]["n_ctx"], "theirs": theirs[-1]["n_ctx"]},
        "rounds_with_other_mappers": sum(1 for x in ours + theirs if x["other_mappers"]),
        "rounds": len(ours), "seconds": time.perf_counter() - started,
    }


def bench_memory(cfg: Config, small: Path | None = None, coder: Path | None = None) -> dict[str, Any]:
    """P13 on SmolLM2 (rounds as the goal asks) and Qwen2.5-Coder-1.5B (a few rounds; skipped if it cannot be had),
    each side with its defaults; then both at n_ctx ``P14_CTX`` (``same_ctx``, no goal). The paths default to the
    test models in the user's cache."""
    started = time.perf_counter()
    res: dict[str, Any] = {"threads": cfg.peer_threads, "models": {}, "same_ctx": {}}
    small = small or _ensure("smollm2")
    res["models"]["smollm2"] = _memory_model(cfg, "smollm2", small, None)
    try:
        coder = coder or _ensure("coder15")
    except Exception as exc:  # not in the cache and not fetchable: the small model's figure stands alone
        log(f"P13: no Qwen2.5-Coder-1.5B ({type(exc).__name__}: {exc}); SmolLM2 only")
        coder = None
    else:
        res["models"]["coder15"] = _memory_model(cfg, "coder15", coder, min(cfg.rounds, CODER_ROUNDS))
    for key, path in (("smollm2", small), ("coder15", coder)):
        if path is not None:
            res["same_ctx"][key] = _memory_model(cfg, key, path, min(cfg.rounds, SAME_CTX_ROUNDS), P14_CTX)
    res["seconds"] = time.perf_counter() - started
    return res


# --- P14 ------------------------------------------------------------------------------------------------------------


def _pairs(cfg: Config, what: str, ours_run: Callable[[], dict[str, Any]], theirs_run: Callable[[], dict[str, Any]],
           goal_key: str | None) -> dict[str, Any]:
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []

    def step(r: int) -> None:
        pair = [(ours, ours_run), (theirs, theirs_run)]
        for dest, fn in pair if r % 2 == 0 else pair[::-1]:
            dest.append(fn())
        o, t = ours[-1], theirs[-1]
        log(f"P14 {what} round {r + 1}: ours {o['total'] * 1e3:.0f} ms (import {o['import'] * 1e3:.0f}, load "
            f"{o['load'] * 1e3:.0f}, request {o['request'] * 1e3:.0f}), theirs {t['total'] * 1e3:.0f} ms (import "
            f"{t['import'] * 1e3:.0f}, load {t['load'] * 1e3:.0f}, request {t['request'] * 1e3:.0f})")

    def ratio() -> list[float]:
        return [o["total"] / t["total"] for o, t in zip(ours, theirs, strict=True)]

    goal = GOALS[goal_key] if goal_key else None
    adaptive(cfg, f"P14 {what}", step, ratio, goal)
    return {
        "ratio": summary(ratio(), goal),
        "ours_ms": summary([o["total"] * 1e3 for o in ours]), "theirs_ms": summary([t["total"] * 1e3 for t in theirs]),
        "ours_split_ms": {k: summary([o[k] * 1e3 for o in ours]) for k in SPLIT},
        "theirs_split_ms": {k: summary([t[k] * 1e3 for t in theirs]) for k in SPLIT},
        "rounds": len(ours),
    }


def bench_start(cfg: Config, model: Path | None = None) -> dict[str, Any]:
    """P14: cold (no server) and shared (a server running), fresh processes; ``model`` defaults to SmolLM2."""
    from gguf_provider.langchain import ChatGGUF

    started = time.perf_counter()
    model = model or _ensure("smollm2")
    ours_s = _settings("ours", model, cfg, P14_CTX)
    theirs_s = _settings("theirs", model, cfg, P14_CTX, n_batch=512, verbose=False)
    _stop_servers(model)
    res: dict[str, Any] = {"model": model.name, "n_ctx": P14_CTX, "threads": cfg.peer_threads, "theirs_n_batch": 512}

    def ours_cold() -> dict[str, Any]:
        if _server_pids(model):
            raise RuntimeError("P14 cold: a server of the model is running before the cold start")
        try:
            return _first(ours_s)
        finally:
            _stop_servers(model)

    def theirs_run() -> dict[str, Any]:
        return _first(theirs_s)

    try:
        ours_cold(), theirs_run()  # page cache and bytecode warm, as after any earlier use
        t = time.perf_counter()
        res["cold"] = _pairs(cfg, "cold", ours_cold, theirs_run, None)
        res["cold"]["seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        n = str(cfg.peer_threads)
        server: dict[str, Any] = {"n_ctx": P14_CTX, "server_args": ("-t", n, "-tb", n)}  # fields made at run time
        llm = ChatGGUF(model=str(model), max_tokens=4, **server).load()
        try:
            llm.invoke("Say hi.")  # a server in use is warm: its first request's own warm-up is not the child's
            pid = llm.engine.info.pid

            def ours_shared() -> dict[str, Any]:
                data = _first(ours_s)
                if data["server_pid"] != pid:
                    raise RuntimeError(f"P14 shared: the child used server {data['server_pid']}, not {pid}")
                return data

            res["shared"] = _pairs(cfg, "shared", ours_shared, theirs_run, "p14_shared")
        finally:
            llm.unload()
        res["shared"]["seconds"] = time.perf_counter() - t
    finally:
        _stop_servers(model)
    res["seconds"] = time.perf_counter() - started
    return res


# --- report ---------------------------------------------------------------------------------------------------------


def rows(p13: dict[str, Any] | None, p14: dict[str, Any] | None) -> list[Row]:
    """The report table's rows: (metric, client, summary, digits, unit)."""
    out: list[Row] = []
    who = "ChatGGUF (+ shared server) ÷ ChatLlamaCpp"
    for m in [*(p13 or {}).get("models", {}).values(), *(p13 or {}).get("same_ctx", {}).values()]:
        how = f"both n_ctx {m['same_n_ctx']}" if m.get("same_n_ctx") else "their defaults"
        out.append((f"P13 PSS of two processes on one model, ours ÷ theirs ({m['model']}, {how})", who,
                    m["ratio_pss"], 2, ""))
        out.append((f"P13 total RSS of two processes using one model ({m['model']}, {how}), ours ÷ theirs", who,
                    m["ratio_rss"], 2, ""))
        out.append((f"P13 footprint of two processes ({m['model']}, {how}; private pages + each file once), ours "
                    "÷ theirs", who, m["ratio_footprint"], 2, ""))
        out.append((f"P13 total PSS, two processes ({m['model']}, {how})", "ChatGGUF (+ shared server)",
                    m["ours_pss_mb"], 0, " MB"))
        out.append((f"P13 total PSS, two processes ({m['model']}, {how})", "ChatLlamaCpp", m["theirs_pss_mb"], 0,
                    " MB"))
    if p14:
        for case, text in (("cold", "no server running (ours spawns one)"),
                           ("shared", "a server already shared")):
            if case not in p14:
                continue
            c = p14[case]
            what = f"P14 a fresh process's first token, {text} ({p14['model']})"
            out.append((f"{what}, ours ÷ theirs", "ChatGGUF ÷ ChatLlamaCpp", c["ratio"], 2, ""))
            out.append((what, "ChatGGUF", c["ours_ms"], 0, " ms"))
            out.append((what, "ChatLlamaCpp", c["theirs_ms"], 0, " ms"))
    return out


def notes(p13: dict[str, Any] | None, p14: dict[str, Any] | None) -> list[str]:
    """Short lines with the absolute figures, for bench/results.md."""
    out: list[str] = []
    for m in [*(p13 or {}).get("models", {}).values(), *(p13 or {}).get("same_ctx", {}).values()]:
        med = {k: v["median"] for k, v in m.items() if isinstance(v, dict) and "median" in v}
        how = f"both n_ctx {m['same_n_ctx']}" if m.get("same_n_ctx") else "defaults"
        out.append(
            f"P13 {m['model']}, {how} ({m['rounds']} rounds, {m['seconds']:.0f} s), medians in MB: ours PSS "
            f"{med['ours_pss_mb']:.0f} (llama-server {med['ours_server_pss_mb']:.0f}, each client "
            f"{med['ours_client_pss_mb']:.0f}, watchdog {med['ours_watchdog_pss_mb']:.0f}), RSS "
            f"{med['ours_rss_mb']:.0f}; theirs PSS {med['theirs_pss_mb']:.0f} (each process "
            f"{med['theirs_client_pss_mb']:.0f}), RSS {med['theirs_rss_mb']:.0f}; footprint ours {med['ours_footprint_mb']:.0f}, theirs "
            f"{med['theirs_footprint_mb']:.0f}; contexts: ours "
            f"n_ctx {m['n_ctx']['ours']}, theirs {m['n_ctx']['theirs']}.")
    if p14:
        for case in ("cold", "shared"):
            if case not in p14:
                continue
            c = p14[case]

            def split(side: str, c: dict[str, Any] = c) -> str:
                return ", ".join(f"{k} {c[f'{side}_split_ms'][k]['median']:.0f}" for k in SPLIT)

            out.append(f"P14 {case} ({c['rounds']} rounds, n_ctx {p14['n_ctx']}, {p14['threads']} thread(s)), "
                       f"medians in ms: ours {c['ours_ms']['median']:.0f} ({split('ours')}), theirs "
                       f"{c['theirs_ms']['median']:.0f} ({split('theirs')}).")
    return out
