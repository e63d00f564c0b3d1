"""P1/P2: streaming throughput and client CPU per token, live against the shared server and on a replayed stream."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import machine
from bench.clients import Client, make
from bench.config import GOALS, MORE, Config
from bench.log import log
from bench.measure import ServerLog, measure
from bench.replay import clients as replay_clients
from bench.replay import replay_cpu
from bench.rounds import late
from bench.stats import summary, undecided

Stream = dict[str, Any]
P1_LEAST = 5  # full rounds (every client) a run behind its schedule still makes


def floor_pairs(clients: dict[str, Client]) -> dict[str, str]:
    """Each provider client → its framework's floor of the same kind (sync/async)."""
    floors = {(c.floor_of, c.is_async): n for n, c in clients.items() if c.floor_of}
    return {n: floors[(c.framework, c.is_async)] for n, c in clients.items()
            if c.framework and (c.framework, c.is_async) in floors}


def paired(a: list[Stream | None], b: list[Stream | None]) -> list[tuple[Stream, Stream]]:
    """The rounds that measured both (a round after the first ones measures only the pairs still within noise)."""
    return [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]


def stream_metrics(all_runs: dict[str, list[Stream | None]], pairs: dict[str, str], tokens: int) -> dict[str, Any]:
    """Per-round paired values → summaries with bands and verdicts (``tokens`` per stream)."""
    runs = {n: [x for x in rs if x is not None] for n, rs in all_runs.items()}
    raw = all_runs["raw httpx"]
    out: dict[str, Any] = {"throughput_ratio": {}, "cpu_us_per_token": {}, "tok_s": {}, "floor_ratio": {},
                           "raw_ratio": {}, "throughput_floor_ratio": {}, "floor_cpu_ratio": {}}
    # P2 with the core's speed taken out: CPU seconds × the awake loop's laps per CPU second during the same stream
    # (work in laps), for each pair of streams that both have a reading; CPU seconds alone for a pair that has not
    # (under load, the loop may not run during a stream). Either way the ratio is of like with like.
    sped_pairs = [0, 0]

    def ratio(x: Stream, f: Stream) -> float:
        sped_pairs[1] += 1
        if x.get("core_speed") and f.get("core_speed"):
            sped_pairs[0] += 1
            return float(x["cpu"] * x["core_speed"]) / float(f["cpu"] * f["core_speed"])
        return float(x["cpu"]) / float(f["cpu"])
    for name, rs in runs.items():
        out["tok_s"][name] = summary([tokens / x["wall"] for x in rs])
        out["cpu_us_per_token"][name] = summary([x["cpu"] / tokens * 1e6 for x in rs])
        if name != "raw httpx":  # paired by round: raw wall ÷ client wall of the same round
            out["throughput_ratio"][name] = summary([r["wall"] / x["wall"] for r, x in paired(raw, all_runs[name])])
    timed = all("server" in x for rs in runs.values() for x in rs)
    if timed:  # each stream's wall set against the server's own time for it: the share of the wall that is the server's
        out["server_share"] = {n: summary([x["server"] / x["wall"] for x in rs]) for n, rs in runs.items()}
    out["throughput_floor_wall_ratio"] = {}
    for name, floor in pairs.items():
        both = paired(all_runs[name], all_runs[floor])
        wall = [f["wall"] / x["wall"] for x, f in both]
        if timed:
            out["throughput_floor_wall_ratio"][name] = summary(wall)
            out["throughput_floor_ratio"][name] = summary(
                [(x["server"] / x["wall"]) / (f["server"] / f["wall"]) for x, f in both], GOALS["p1"])
        else:
            out["throughput_floor_ratio"][name] = summary(wall, GOALS["p1"])
        out["floor_ratio"][name] = summary([ratio(x, f) for x, f in both], GOALS["p2_floor"])
        out["floor_cpu_ratio"][name] = summary([x["cpu"] / f["cpu"] for x, f in both])
    # What share of P2's floor pairs had the core's speed taken out (the report says so).
    out["core_speed_pairs"] = list(sped_pairs)
    out["core_speed_taken_out"] = sped_pairs[0] > 0
    for name in pairs:
        base = all_runs["raw httpx async" if name.endswith("async") else "raw httpx"]
        out["raw_ratio"][name] = summary([ratio(x, r) for x, r in paired(all_runs[name], base)])
    return out


def stream_undecided(m: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, client) of every P1/P2 verdict still within noise."""
    out = []
    for key, goal in (("throughput_floor_ratio", GOALS["p1"]), ("floor_ratio", GOALS["p2_floor"])):
        for name, s in m[key].items():
            if "verdict" in s and undecided(s["values"], goal):
                out.append((key, name))
    return out


def bench_stream(cfg: Config, url: str, api_key: str, server_log: ServerLog | None = None,
                 awake: machine.Awake | None = None) -> dict[str, Any]:
    clients = make(url, api_key, tokens=cfg.tokens)
    pairs = floor_pairs(clients)
    names = list(clients)
    loop = asyncio.new_event_loop()
    try:
        for name in names:  # warm-up: imports, connections, the server's prompt cache
            measure(clients[name], loop)
        log(f"P1 warm-up: {measure(clients['raw httpx'], loop)['wall']:.1f} s per request")
        runs: dict[str, list[Stream | None]] = {n: [] for n in names}
        todo, r, pair_streams = set(names), 0, 0
        while True:
            # Rotated so drift spreads over the clients, and reversed every other round so each provider client
            # runs before its floor as often as after it (a pair adjacent in the list would otherwise keep one order).
            order = [n for n in names[r % len(names):] + names[:r % len(names)] if n in todo]
            if r % 2:
                order.reverse()
            got = {n: measure(clients[n], loop, server_log, awake) for n in order}
            for name in names:
                runs[name].append(got.get(name))
            if r >= cfg.rounds:
                pair_streams += len(got)
            r += 1
            log(f"P1/P2 round {r}: " + ", ".join(f"{n} {x['cpu'] / cfg.tokens * 1e6:.0f} µs/tok"
                                                 for n, x in got.items()))
            if r < cfg.rounds and not (r >= P1_LEAST and late(cfg, "P1/P2", r)):
                continue
            metrics = stream_metrics(runs, pairs, cfg.tokens)
            if r < cfg.rounds:  # past its point in the run's schedule
                break
            open_ = stream_undecided(metrics)
            todo = {n for _, name in open_ for n in (name, pairs[name])}  # only the pairs still within noise
            if (not open_ or r >= cfg.pair_max_rounds or pair_streams + len(todo) > cfg.pair_max_streams
                    or late(cfg, "P1/P2", r)):
                break
            if (r - cfg.rounds) % MORE == 0:
                log(f"P1/P2: within noise after {r} rounds ({', '.join(f'{k}:{n}' for k, n in open_)}): "
                    f"adding rounds of {sorted(todo)}")
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
    metrics["raw"] = runs
    metrics["rounds"] = r
    metrics["pair_streams"] = pair_streams
    metrics["pairs"] = pairs
    metrics["chunks"] = {n: [x["chunks"] for x in runs[n] if x is not None] for n in names}
    return metrics


def bench_replay(cfg: Config) -> dict[str, Any]:
    """Client CPU per token on a replayed stream (no server): the clients' own work, with no wake-ups."""
    us = replay_cpu(n_tokens=cfg.tokens)
    pairs = floor_pairs(replay_clients(cfg.tokens))
    return {"us_per_token": us, "floor_ratio": {n: us[n] / us[f] for n, f in pairs.items()}, "pairs": pairs}
