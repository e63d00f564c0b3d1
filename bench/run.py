"""gguf-provider benchmarks: ``make bench`` or ``.venv/bin/python bench/run.py``.

Every figure is a ratio (or a difference) measured side by side in one run, on the same server and the same request
(fixed seed, temperature 0, ``ignore_eos``, fixed token count), clients interleaved round by round so machine noise
lands on all of them alike. The server and the clients are pinned to separate cores where the OS allows. Each
verdict is yes / no / within noise, from the band of its median (``bench/stats.py``); rounds are added while a band
straddles its goal. Writes ``bench/results.json``, ``docs/benchmarks.md`` and ``docs/benchmarks.png``.

Flags: ``--compare A.json B.json`` (two reports' verdicts side by side; exit code 1 if any differs), ``--merge
FULL.json PART.json OUT.json`` (a ``BENCH_ONLY`` run's scenarios put into a full report), ``--report``
(re-render the markdown and the chart from the results, e.g. after editing bench/NOTES.md), ``--help``.

Environment: ``BENCH_ROUNDS`` (first rounds, default 9), ``BENCH_MAX_ROUNDS`` (cap, default 25),
``BENCH_PAIR_MAX_ROUNDS`` and ``BENCH_PAIR_MAX_STREAMS`` (caps of P1/P2's rounds of the pairs still within noise,
default 161 rounds or 420 streams in those rounds, whichever comes first), ``BENCH_TOKENS``
(default 256), ``BENCH_PORT`` (default 18731), ``BENCH_THREADS`` (llama-server threads, default 1), ``BENCH_ONLY``
(comma list of p1,p3,p4,p5,p6,p7,p8,p9,p17,p18,p19,p20,p21,p22,p11,...,p16 to run a subset, p2 runs with p1; the report then holds only those),
``BENCH_PEER_THREADS`` (llama.cpp threads of ours and the peers in P11-P16, default 1),
``BENCH_OUT`` (a directory for the report instead of docs/ and bench/, e.g. for a second run to compare),
``BENCH_BUDGET_S`` (the run's time, default 3540: past a scenario's point in bench/config.py's schedule it adds no
rounds, and stops its first ones at a floor).

This module only orchestrates: settings in bench/config.py, the scenarios in bench/scenarios/, the report in
bench/report.py.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repository root, for ``bench`` and ``scripts``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import machine, report, rounds
from bench.config import GOALS, N_CTX, N_PARALLEL, Config
from bench.log import log
from bench.measure import ServerLog
from bench.scenarios.batch import bench_batch
from bench.scenarios.cache_reuse import bench_cache_reuse
from bench.scenarios.cache_type import bench_cache_type
from bench.scenarios.claude_replay import bench_claude_replay
from bench.scenarios.gateway import bench_gateway
from bench.scenarios.header import bench_header
from bench.scenarios.multiturn import bench_multiturn
from bench.scenarios.prompt_cache import bench_prompt_cache
from bench.scenarios.responses_replay import bench_responses_replay
from bench.scenarios.speculative import bench_speculative
from bench.scenarios.startup import bench_attach, bench_cold, bench_import
from bench.scenarios.stream import bench_replay, bench_stream
from bench.scenarios.threads import bench_threads
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._serve import server_options


def shared_server_benches(cfg: Config, at: Callable[[str], Config], small: Path, res: dict[str, Any]) -> None:
    """P1–P5 on one shared server, pinned to its own core; ``at(key)``: the config of scenario ``key``."""
    log(f"starting the shared server ({small.name}, TCP port {cfg.port})")
    # Speculation off: P1–P5 measure the clients, one token per server write (P7/P8 measure speculation).
    engine = Engine(EngineConfig(model_path=str(small), n_ctx=N_CTX, n_parallel=N_PARALLEL, port=cfg.port,
                                 keep_alive=0, server_args=cfg.server_args, speculative=False))
    info = engine.load()
    url, api_key = info.address.url, info.address.api_key
    assert url and api_key
    res["server"] = {"url": url, "build_info": info.props.get("build_info"), "n_ctx": info.n_ctx}
    res["pinning"] = machine.pin(info.pid)
    awake = machine.keep_awake(res["pinning"].get("client_cores", []))
    res["awake"] = awake.info
    log(f"pinning: {res['pinning']}; client cores kept awake: {res['awake']}")
    try:
        if "p1" in cfg.only:
            res["p1"] = bench_stream(at("p1"), url, api_key, ServerLog(info.log_path), awake)
        if "p4" in cfg.only:
            res["p4"] = bench_multiturn(at("p4"), url, api_key)
        if "p5" in cfg.only:
            res["p5"] = bench_batch(at("p5"), url, api_key, ServerLog(info.log_path))
        if "p3" in cfg.only:
            res["p3"] = {"attach": bench_attach(at("p3"), small, url, api_key, GOALS["p3_attach"])}
    finally:
        awake.stop()
        machine.unpin(info.pid)
        engine.unload()


PEERS = {"p11", "p12", "p13", "p14", "p15", "p16"}


def peer_inputs(cfg: Config) -> dict[str, Path]:
    """The files the P11-P16 of ``cfg.only`` need: the 1.5B target (all but P15), our MiniLM GGUF and
    sentence-transformers' MiniLM folder (P15)."""
    from scripts.bench_peers import ensure_minilm_hf
    from scripts.test_models import ensure

    files: dict[str, Path] = {}
    if cfg.only & (PEERS - {"p15"}):
        files["coder15"] = ensure("coder15")
    if "p15" in cfg.only:
        files.update(minilm=ensure("minilm"), minilm_hf=ensure_minilm_hf())
    return files


def peer_benches(cfg: Config, at: Callable[[str], Config], small: Path, large: Path, files: dict[str, Path],
                 res: dict[str, Any], results_path: Path) -> None:
    """P11-P16: against what users pick instead (llama-cpp-python in process, sentence-transformers) and a draft
    model; the peers come from scripts/bench_peers.py (``make bench`` installs them)."""
    from bench.scenarios import draft, embeddings, peer_start, peers

    if not cfg.only & PEERS:
        return
    coder = files.get("coder15", Path())  # absent when P15 runs alone

    def short(key: str, rounds: int = 3) -> Config:
        # P13/P14 start fresh processes every round: fewer rounds (their bands are narrow) keep `make bench` in an hour
        return replace(at(key), rounds=min(cfg.rounds, rounds), max_rounds=min(cfg.max_rounds, 7))

    models = {"SmolLM2": small, "Qwen2.5-Coder-1.5B": coder}
    steps: list[tuple[str, Any]] = [
        ("p11", lambda: peers.bench_single(at("p11"), models)),
        ("p11_defaults", lambda: peers.bench_defaults(at("p11_defaults"), large)),
        ("p12", lambda: peers.bench_concurrent(at("p12"), models, "Qwen2.5-Coder-1.5B")),
        ("p13", lambda: peer_start.bench_memory(short("p13"), small, coder)),
        ("p14", lambda: peer_start.bench_start(short("p14"), small)),
        ("p14_coder", lambda: peer_start.bench_start(short("p14_coder", 2), coder)),  # a model of a size users run
        ("p15", lambda: embeddings.bench_embeddings(at("p15"), files["minilm"], files["minilm_hf"])),
        ("p16", lambda: draft.bench_draft(at("p16"), coder, large)),
    ]
    for key, fn in steps:
        if key.split("_")[0] not in cfg.only:
            continue
        t0 = time.perf_counter()
        log(f"{key.upper()} starting")
        try:
            res[key] = fn()
        except Exception as exc:  # one scenario's failure is reported; the others still run
            log(f"{key.upper()} failed: {type(exc).__name__}: {exc}")
            res[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        res[key]["elapsed_s"] = time.perf_counter() - t0
        log(f"{key.upper()} done in {res[key]['elapsed_s']:.0f} s")
        results_path.write_text(json.dumps(res, indent=1, default=str))


def private_home() -> None:
    """The bench's servers live in a home of their own, so work alongside (a test suite's ``ps``, its memory limit)
    neither sees them nor is seen by them. The binary is named, as a new home holds none."""
    os.environ.setdefault("GGUF_PROVIDER_LLAMA_SERVER", str(discovery.find_llama_server()))
    os.environ["GGUF_PROVIDER_HOME"] = tempfile.mkdtemp(prefix="bench-home-")


def run(cfg: Config, results_path: Path) -> dict[str, Any]:
    """Every scenario ``cfg.only`` names, in order; the results (also written to ``results_path`` as they come)."""
    from scripts.test_models import ensure  # it puts the repository root on sys.path

    started = time.perf_counter()
    clock = time.monotonic()

    def at(key: str) -> Config:
        return cfg.scheduled(key, clock)

    small, large = ensure("smollm2"), ensure("qwen")
    peer_files = peer_inputs(cfg)  # before the private home: they live in the user's cache
    private_home()
    priority = machine.raise_priority()  # before any server starts: they inherit it
    desc = machine.describe()
    speed = desc["calibration_ms"] / machine.REFERENCE_CALIBRATION_MS
    res: dict[str, Any] = {"machine": desc, "speed_factor": speed, "versions": machine.versions(),
                           "model": small.name, "rounds": cfg.rounds, "max_rounds": cfg.max_rounds,
                           "pair_max_rounds": cfg.pair_max_rounds, "pair_max_streams": cfg.pair_max_streams,
                           "tokens": cfg.tokens, "priority": priority}
    log(f"calibration {desc['calibration_ms']:.1f} ms ({speed:.2f}× the reference), load {desc['load_before']}")
    if "p6" in cfg.only:
        res["p6"] = bench_header(large)
    if "p1" in cfg.only:
        res["p2_replay"] = bench_replay(cfg)
        log("P2 replayed: " + ", ".join(f"{n} {v:.1f} µs/tok" for n, v in res["p2_replay"]["us_per_token"].items()))
    if cfg.only & {"p1", "p3", "p4", "p5"}:
        shared_server_benches(cfg, at, small, res)
        results_path.write_text(json.dumps(res, indent=1, default=str))  # kept if a later part fails
    if "p3" in cfg.only:
        res["p3"]["cold"] = bench_cold(at("p3"), small, GOALS["p3_cold"])
        res["p3"]["import"] = bench_import(at("p3"), GOALS["p3_import"])
    if "p7" in cfg.only or "p8" in cfg.only:
        res["p7"] = bench_speculative(at("p7"), large)
    if "p9" in cfg.only:
        res["p9"] = bench_cache_type(large)
    if "p17" in cfg.only:
        res["p17"] = bench_prompt_cache(at("p17"), small)
    if "p18" in cfg.only:
        res["p18"] = bench_cache_reuse(at("p18"), small, server_options.DEFAULT_CACHE_REUSE)
    if "p19" in cfg.only:
        res["p19"] = bench_threads(at("p19"), small, large)
        results_path.write_text(json.dumps(res, indent=1, default=str))
    if "p20" in cfg.only:
        res["p20"] = bench_gateway(at("p20"), small)
        results_path.write_text(json.dumps(res, indent=1, default=str))
    if "p21" in cfg.only:
        res["p21"] = bench_claude_replay(at("p21"), large)
        results_path.write_text(json.dumps(res, indent=1, default=str))
    if "p22" in cfg.only:
        res["p22"] = bench_responses_replay(at("p22"), large)
        results_path.write_text(json.dumps(res, indent=1, default=str))
    peer_benches(cfg, at, small, large, peer_files, res, results_path)
    res["machine"]["load_after"] = list(os.getloadavg())
    res["elapsed_s"] = time.perf_counter() - started
    res["budget_s"] = cfg.budget_s
    res["cut_by_schedule"] = list(rounds.CUT)
    return res


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        print(__doc__)
        return
    if "--merge" in args:  # a run of some scenarios into a full report: its scenarios replace the report's
        i = args.index("--merge")
        base, part = (json.loads(Path(a).read_text()) for a in args[i + 1:i + 3])
        out = Path(args[i + 3])
        out.write_text(json.dumps(report.merge(base, part), indent=1, default=str))
        return
    if "--compare" in args:
        i = args.index("--compare")
        raise SystemExit(report.compare(Path(args[i + 1]), Path(args[i + 2])))
    cfg = Config.from_env()
    results_path, md_path, png_path = cfg.outputs()
    if "--report" in args:  # re-render the pages from the results (after a change to bench/report.py)
        report.write_docs(json.loads(results_path.read_text()), md_path, png_path, cfg, results_path.with_suffix(".md"))
        return
    res = run(cfg, results_path)
    results_path.write_text(json.dumps(res, indent=1, default=str))
    report.write_docs(res, md_path, png_path, cfg, results_path.with_suffix(".md"))
    for r in report.rows(res):
        print(" | ".join(r))
    log(f"done in {res['elapsed_s']:.0f} s: {md_path}, {png_path}, {results_path}")


if __name__ == "__main__":
    main()
