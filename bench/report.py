"""What a run's results say: the table rows and verdicts, docs/benchmarks.md (the verdicts), bench/results.md (every
metric and the run's setup), the chart, and two runs compared. The method and the history are bench/NOTES.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import machine
from bench.clients import SEED
from bench.config import BATCH, BATCH_TOKENS, GOALS, N_CTX, N_PARALLEL, Config
from bench.scenarios.cache_reuse import MODES
from bench.scenarios.speculative import CHAT_TASK, CHAT_TOPICS, EDIT_SOURCE, EDIT_TASK

Row = tuple[str, str, str, str, str, str, str]


def rows(res: dict[str, Any]) -> list[Row]:
    """The report's table: metric, client, median, band, min–max, goal, verdict."""
    out: list[Row] = []

    def add(metric: str, what: str, s: dict[str, Any], digits: int = 3, unit: str = "") -> None:
        lo, hi = s.get("band", (s["min"], s["max"]))
        verdict = s.get("verdict")
        shown = "-" if verdict is None else {"yes": "yes", "no": "**no**", "within noise": "within noise"}[verdict]
        out.append((metric, what, f"{s['median']:.{digits}f}{unit}", f"{lo:.{digits}f}–{hi:.{digits}f}",
                    f"{s['min']:.{digits}f}–{s['max']:.{digits}f}", s.get("goal", ""), shown))

    if "p1" in res:
        p = res["p1"]
        timed = "server_share" in p
        for name, s in p.get("throughput_floor_ratio", {}).items():
            add("P1 stream throughput ÷ the framework's floor" + (", server time taken out" if timed else ""),
                f"{name} ÷ {p['pairs'][name]}", s)
        for name, s in p.get("throughput_floor_wall_ratio", {}).items():
            add("P1 stream throughput ÷ the framework's floor, wall clock only", f"{name} ÷ {p['pairs'][name]}", s)
        for name, s in p.get("server_share", {}).items():
            add("P1 the server's own time ÷ the stream's wall time", name, s)
        for name, s in p["throughput_ratio"].items():
            add("P1 stream throughput ÷ raw httpx", name, {k: v for k, v in s.items() if k != "verdict"})
        sped = ", core speed taken out" if p.get("core_speed_taken_out") else ""
        for name, s in p["floor_ratio"].items():
            add("P2 live client CPU per token ÷ the framework's floor" + sped, f"{name} ÷ {p['pairs'][name]}", s)
        for name, s in (p.get("floor_cpu_ratio", {}) if sped else {}).items():  # else the same as the row above
            add("P2 live client CPU per token ÷ the framework's floor, CPU time only", f"{name} ÷ {p['pairs'][name]}",
                s)
        for name, s in p["raw_ratio"].items():
            add("P2 live client CPU per token ÷ raw httpx" + sped, name, s, 2)
        for name, s in p["cpu_us_per_token"].items():
            add("P2 live client CPU per token", name, s, 1, " µs")
    if "p2_replay" in res:
        rp = res["p2_replay"]
        for name, v in rp["us_per_token"].items():
            add("P2 client CPU per token, replayed stream (no server)", name, {"median": v, "min": v, "max": v}, 1,
                " µs")
        for name, v in rp["floor_ratio"].items():
            add("P2 replayed ÷ the framework's floor", f"{name} ÷ {rp['pairs'][name]}",
                {"median": v, "min": v, "max": v}, 2)
    if "p3" in res:
        a = res["p3"]["attach"]
        add("P3 attach + 1 request from a fresh process ÷ the same with raw httpx", "gguf_provider.Engine", a["ratio"])
        add("P3 attach + 1 request, extra wall over a raw httpx process", "gguf_provider.Engine", a["extra_ms"], 0,
            " ms")
        if "cold" in res["p3"]:
            c = res["p3"]["cold"]
            add("P3 cold start to first token", "gguf_provider (private server)", c["ours_ms"], 0, " ms")
            add("P3 cold start to first token", "bare llama-server, 5 ms /health poll", c["bare_ms"], 0, " ms")
            add("P3 cold start ours ÷ bare", "", c["ratio"])
        if "import" in res["p3"]:
            i = res["p3"]["import"]
            add("P3 import time ÷ `import langchain_core.language_models`", "`import gguf_provider`", i["package_ratio"])
            add("P3 import time ÷ `import langchain_core.language_models`", "`from gguf_provider import ChatGGUF`",
                i["chat_ratio"])
            add("P3 import time ÷ `from langchain_core.language_models import BaseChatModel`",
                "`from gguf_provider import ChatGGUF`", i["chat_base_ratio"])
    if "p4" in res:
        add(f"P4 TTFT turn N ({res['p4']['prompt_tokens']}-token history) ÷ same prompt cold", "ChatGGUF",
            res["p4"]["ratio"])
    if "p5" in res:
        p5 = res["p5"]
        if "floor_ratio" in p5:
            timed = "server_share" in p5
            add(f"P5 abatch of {BATCH}, aggregate tok/s ÷ the LangChain floor's abatch"
                + (", server time taken out" if timed else ""), "ChatGGUF", p5["floor_ratio"])
            if timed:
                add(f"P5 abatch of {BATCH}, aggregate tok/s ÷ the LangChain floor's abatch, wall clock only", "ChatGGUF",
                    p5["floor_wall_ratio"])
        add(f"P5 abatch of {BATCH} ÷ raw {BATCH} concurrent, aggregate tok/s", "ChatGGUF",
            {k: v for k, v in p5["ratio"].items() if k != "verdict"})
        if "floor_raw_ratio" in p5:
            add(f"P5 abatch of {BATCH} ÷ raw {BATCH} concurrent, aggregate tok/s", "LangChain floor",
                p5["floor_raw_ratio"])
    if "p7" in res:
        p = res["p7"]
        add(f"P7 code-edit decode tok/s, speculation on ÷ off ({p['model']})", "llama-server (auto)", p["edit_ratio"], 2)
        add(f"P8 chat decode tok/s, default ÷ speculation off ({p['model']})", "llama-server (auto)", p["chat_ratio"],
            3)
    if "p9" in res:
        p = res["p9"]
        add(f"P9 automatic context, q8_0 ÷ f16 KV cache under {p['limit']} ({p['model']})", "fit",
            p["ratio"], 2)
    if "p17" in res:
        add(f"P17 first-turn TTFT after a stop and start ({res['p17']['prompt_tokens']}-token prompt), restored ÷ "
            f"cold", "prompt cache", res["p17"]["ratio"], 3)
    if "p18" in res:
        p = res["p18"]
        turn, last = p["summary_turn"], p["turns"]
        for mode, what in MODES.items():
            add(f"P18 turn {turn} prompt tokens, cache reuse ÷ without: {what}", "ChatGGUF", p[mode]["at_change"], 3)
        for mode, what in MODES.items():
            add(f"P18 turns {turn}–{last} prompt tokens, cache reuse ÷ without: {what}", "ChatGGUF",
                p[mode]["after_change"], 3)
    if "p19" in res:
        p = res["p19"]
        add("P19 one model alone, decode tok/s, our threads ÷ llama.cpp's", "SmolLM2", p["alone"])
        for variant, who in (("ours", "ours"), ("default", "llama.cpp's")):
            for k, name in (("small", "SmolLM2"), ("large", "Qwen 0.5B")):
                s = p["pair"][variant][k]
                if variant == "default":  # what users had: no verdict of ours (bench/results.md only)
                    s = {key: v for key, v in s.items() if key not in ("goal", "verdict")}
                add("P19 two models at once, decode tok/s ÷ alone", f"{who}: {name}", s, 2)
    if "p20" in res:
        p = res["p20"]
        add("P20 stream tok/s, gateway ÷ its llama-server, server time taken out", "raw httpx", p["tps_ratio"], 3)
        add("P20 stream tok/s, gateway ÷ its llama-server, wall clock only", "raw httpx", p["tps_wall_ratio"], 3)
        add("P20 TTFT, gateway − its llama-server, server time taken out", "raw httpx", p["ttft_extra_ms"], 1, " ms")
        add("P20 TTFT, gateway − its llama-server, wall clock only", "raw httpx", p["ttft_wall_extra_ms"], 1, " ms")
    if "p21" in res:
        p = res["p21"]
        if "ttft_added_ms" in p:
            add("P21 Claude Code's request: TTFT added by the gateway, server time taken out",
                "/v1/messages", p["ttft_added_ms"], 1, " ms")
        add("P21 Claude Code's requests: TTFT, gateway − its llama-server, server prompt time taken out",
            "/v1/messages", p["ttft_extra_ms"], 1, " ms")
        add("P21 Claude Code's requests: TTFT, gateway − its llama-server, wall clock only", "/v1/messages",
            p["ttft_wall_extra_ms"], 1, " ms")
        if p.get("ttft_held_ms"):
            add("P21 a reply held as a possible tool call: TTFT, gateway − its llama-server, server prompt time "
                "taken out", f"request {'/'.join(map(str, p['held_requests']))}", p["ttft_held_ms"], 1, " ms")
        add("P21 Claude Code's second request: prompt tokens evaluated ÷ its prompt tokens", "gateway",
            p["prompt_ratio"], 4)
        add("P21 Claude Code's second request: prompt tokens evaluated ÷ its prompt tokens", "llama-server",
            p["prompt_ratio_direct"], 4)
    if "p22" in res:
        add("P22 Responses turn 3 (previous_response_id): prompt tokens evaluated ÷ its prompt tokens",
            "/v1/responses", res["p22"]["prompt_ratio"], 4)
    for metric, what, summ, digits, unit in peer_rows(res):
        add(metric, what, summ, digits, unit)
    if "p6" in res:
        add(f"P6 GGUF header: gguf.GGUFReader time ÷ ours ({res['p6']['model']})", "read_header",
            res["p6"]["speedup"], 0, "x")
    return out


PeerRow = tuple[str, str, dict[str, Any], int, str]


def measured(res: dict[str, Any]) -> dict[str, Any]:
    """``res`` without the scenarios that failed (their error is in results.json and the run's log)."""
    return {k: v for k, v in res.items() if not (isinstance(v, dict) and "error" in v)}


def _peer_parts(res: dict[str, Any], part: str) -> list[Any]:
    """``part`` ("rows" or "notes") of every P11-P16 scenario in ``res``, from their scenario modules."""
    from bench.scenarios import draft, embeddings, peer_start, peers

    res = measured(res)
    p11 = {**res["p11"], "defaults": res.get("p11_defaults", {})} if "p11" in res else None
    out: list[Any] = getattr(peers, part)(p11, res.get("p12"))
    if "p13" in res or "p14" in res:
        out += getattr(peer_start, part)(res.get("p13"), res.get("p14"))
    if "p14_coder" in res:
        out += getattr(peer_start, part)(None, res["p14_coder"])
    if "p15" in res:
        out += getattr(embeddings, part)(res["p15"])
    if "p16" in res:
        out += getattr(draft, part)(res["p16"])
    return out


def peer_rows(res: dict[str, Any]) -> list[PeerRow]:
    return _peer_parts(res, "rows")


def peer_notes(res: dict[str, Any]) -> list[str]:
    return _peer_parts(res, "notes")


# How a verdict's figure was taken (qualifiers a newer bench adds to the same metric): left out of the key, so
# reports of two bench versions still compare.
_QUALIFIERS = (", server time taken out", ", core speed taken out")


def verdicts(res: dict[str, Any]) -> dict[str, str]:
    """Every verdict of a report by metric and client: what two runs must agree on."""
    out = {}
    for r in rows(res):
        if r[6] != "-":
            metric = r[0]
            for q in _QUALIFIERS:
                metric = metric.replace(q, "")
            out[f"{metric} | {r[1]}"] = r[6]
    return out


def write_markdown(res: dict[str, Any], path: Path, cfg: Config) -> None:
    """The full report (bench/results.md) from ``res``: the run's setup, every metric and the absolute figures;
    ``cfg`` gives what older results do not hold (the server's threads, the cap on rounds)."""
    m, v = res["machine"], res["versions"]
    pin = res.get("pinning", {})
    pinned = (f"llama-server on core {pin['server_cores']}, the clients on {pin['client_cores']}"
              if pin.get("pinned") else f"not pinned ({pin.get('why', 'not attempted')})")
    lines = [
        "# Benchmark results: every metric",
        "",
        "Generated by `make bench` (`bench/run.py`) with docs/benchmarks.md, which shows the verdicts; raw numbers in "
        "`bench/results.json`, the method and history in `bench/NOTES.md`. Every figure is a ratio or "
        "a difference measured side by side in one run, on the same llama-server and the same request (seed "
        f"{SEED}, temperature 0, `ignore_eos`, {res['tokens']} tokens for P1/P2, {BATCH_TOKENS} per request for P5), "
        "the variants interleaved in every round.",
        "",
        "**Reading a verdict.** *Median* is the median of the per-round values (each round pairs the variants "
        "measured back to back). *Band* is the ~95% confidence interval of that median (order statistics, "
        "`bench/stats.py`). The verdict is **yes** when the whole band meets the goal, **no** when none of it "
        "does, and **within noise** when the band straddles the goal; rounds are added (up to "
        f"{res.get('max_rounds', cfg.max_rounds)}; P1/P2: after the first {res['rounds']}, rounds of only the pairs "
        f"still within noise, up to {res.get('pair_max_rounds', res.get('max_rounds', cfg.max_rounds))} rounds"
        + (f" or {res['pair_max_streams']} streams in those rounds" if res.get("pair_max_streams") else "")
        + ") while it "
        "straddles. Goals are ratios, so a slower machine is not failed for being slow.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; load average before the run "
        f"{', '.join(f'{x:.2f}' for x in m['load_before'])}, after {', '.join(f'{x:.2f}' for x in m.get('load_after', []))}.",
        f"- CPU calibration: {m['calibration_ms']:.1f} ms for the fixed workload in `bench/machine.py` "
        f"(reference machine {machine.REFERENCE_CALIBRATION_MS:.0f} ms: this one is {res['speed_factor']:.2f}× "
        f"as slow per operation).",
        f"- Pinning: {pinned}; " + (f"client cores {res['awake']['cores']} kept awake by a SCHED_IDLE busy loop "
                                     "(P1–P5), whose laps measure the cores' speed during each stream (P2)." if res.get("awake", {}).get("used") else
                                     f"client cores not kept awake ({res.get('awake', {}).get('why', 'not tried')})."),
        "- Priority: " + (f"the bench and every process it starts at nice {res['priority']['nice']}, ahead of other "
                          "work (the awake loop stays below everything)." if res.get("priority", {}).get("raised")
                          else f"not raised ({res.get('priority', {}).get('why', 'not tried')})."),
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- llama-server: {res.get('server', {}).get('build_info', '?')}, `-c {N_CTX} -np {N_PARALLEL} --kv-unified"
        f" {' '.join(cfg.server_args)}`, TCP on 127.0.0.1 with an API key (so every client can reach it).",
        f"- Model (P1–P5): {res['model']}; P6: {res.get('p6', {}).get('model', '-')}.",
        f"- Rounds: P1/P2 {res.get('p1', {}).get('rounds', '-')} (every client in the first {res['rounds']}"
        + (f"; {res['p1']['pair_streams']} streams in the rounds of pairs after them"
           if res.get("p1", {}).get("pair_streams") is not None else "")
        + f"){sped_text(res)}; "
        f"total run time {res['elapsed_s']:.0f} s.",
        *([run_time(res, full=True)] if "budget_s" in res else []),
        "",
        "| Metric | Client | Median | Band | Min–max | Goal | Verdict |",
        "|---|---|---|---|---|---|---|",
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
        if "import" in res["p3"]:
            lines += ["", "P3 import times in a fresh interpreter (ms, median, our package's bytecode compiled first): "
                      + ", ".join(f"`{res['p3']['import']['statements'][k]}` {s['median']:.0f}"
                                  for k, s in res["p3"]["import"]["ms"].items()) + "."]
    if "p4" in res:
        p = res["p4"]
        lines += ["", f"P4 absolute TTFT: warm {p['warm_ms']['median']:.0f} ms, cold {p['cold_ms']['median']:.0f} ms "
                  f"(median)."]
    if "p6" in res:
        p = res["p6"]
        lines += ["", f"P6 absolute: ours {p['ours_ms']['median']:.2f} ms, gguf.GGUFReader "
                  f"{p['gguf_ms']['median']:.0f} ms ({p['size'] / 1e6:.0f} MB file, page cache warm)."]
    if "p7" in res:
        p = res["p7"]
        drafted = sum(d.get("draft_n") or 0 for d in p["drafts"])
        accepted = sum(d.get("draft_n_accepted") or 0 for d in p["drafts"])
        lines += ["", f"P7/P8 ({p['model']}, two servers of it, `speculative=\"auto\"` and `False`"
                  f"{', `' + p['server_args'] + '`, on the server core' if p.get('server_args') else ''}, "
                  f"{p['rounds']} rounds{edit_rounds_text(p)}, decode tok/s from the server's timings, prompt cached): code edit "
                  f"{p['edit_tok_s']['auto']['median']:.1f} vs {p['edit_tok_s']['False']['median']:.1f} tok/s, "
                  f"chat {p['chat_tok_s']['auto']['median']:.1f} vs {p['chat_tok_s']['False']['median']:.1f} "
                  f"tok/s; greedy text identical with and without: {p['identical']}; drafted tokens accepted "
                  f"{accepted}/{drafted}{ceiling_text(p)}. Code-edit task ({p['edit_tokens']} tokens): \"" +
                  EDIT_TASK.split(chr(10))[0] + f"\" followed by `bench/data/{EDIT_SOURCE.name}` "
                  f"({EDIT_SOURCE.stat().st_size} bytes). Chat task ({p['chat_tokens']} tokens): \"{CHAT_TASK}\" with a new "
                  f"topic each round (\"{CHAT_TOPICS[0]}\", \"{CHAT_TOPICS[1]}\", ...)."]
    if "p9" in res:
        p = res["p9"]
        lines += ["", f"P9 absolute: {p['model']} under `GGUF_PROVIDER_MEMORY_LIMIT={p['limit']}`: automatic context "
                  f"{p['f16']} tokens with an f16 KV cache, {p['q8_0']} with q8_0."]
    if "p17" in res:
        p = res["p17"]
        lines += ["", f"P17 absolute TTFT (median): restored {p['cached_ms']['median']:.0f} ms, cold "
                  f"{p['cold_ms']['median']:.0f} ms; the stop that saved the slot ({p['file_mb']:.0f} MB) took "
                  f"{p['stop_ms']['median']:.0f} ms."]
    if "p18" in res:
        p = res["p18"]
        lines += ["", f"P18 ({p['model']}, `cache_reuse={p['chunk']}` against 0, {p['turns']} turns, replies of "
                  f"{p['reply_tokens']} tokens; the agent loop keeps its last {p['keep']} messages, the chat a window "
                  f"of {p['window_messages']}{'; ' + p['run']['note'] if 'run' in p else ''}): prompt tokens evaluated per turn "
                  "(`timings.prompt_n`), first round:"]
        for mode in MODES:
            loop = p[mode]["loops"][0]
            lines += [f"- {mode}: with cache reuse {loop['on']}, without {loop['off']}"]
    if "p19" in res:
        p = res["p19"]
        tps = p["alone_default_tps"]
        lines += ["", f"P19 ({p['cores']} physical cores, {p['rounds']} rounds, replies of {p['tokens']} tokens): "
                  f"gguf-provider's threads {p['threads']['small']} for {p['small']} (started first) and "
                  f"{p['threads']['large']} for {p['large']}, `GOMP_SPINCOUNT={p['spin']}`; alone with llama.cpp's "
                  f"defaults {tps['small']['median']:.1f} and {tps['large']['median']:.1f} tok/s (median)."]
    if "p21" in res:
        p = res["p21"]
        cold = ", ".join(f"{who} {c[0]['input_tokens']} and {c[1]['input_tokens']} tokens (read cold in "
                         f"{c[0]['prompt']:.0f} s and {c[1]['prompt']:.0f} s)" for who, c in p["cold"].items())
        lines += ["", f"P21 ({p['model']}, `--ctx {p['n_ctx']}`, replies of {p['max_tokens']} tokens, {p['rounds']} "
                  f"rounds, {p['fixtures']}): the two requests' prompts: {cold}; the second request evaluated "
                  f"{'/'.join(map(str, sorted(set(p['evaluated']['gateway']))))} tokens in every round through the gateway, "
                  f"{'/'.join(map(str, sorted(set(p['evaluated']['direct']))))} straight."
                  + (f" The client's own time to first token (a server that costs nothing), taken out of the "
                     f"gateway's: {p['client_ttft_ms']['median']:.1f} ms (median)." if p.get("client_ttft_ms") else "")]
    if "p22" in res:
        p = res["p22"]
        c = p["cold"]
        lines += ["", f"P22 ({p['model']}, `--ctx {p['n_ctx']}`, replies of {p['max_tokens']} tokens, {p['rounds']} "
                  f"rounds, {p['fixture']}): the first turn's {c['tokens']} prompt tokens read cold in "
                  f"{c['prompt_s']:.0f} s ({c['evaluated']} evaluated); each round's turns had "
                  f"{p['prompt_tokens'][-1]} prompt tokens and {p['evaluated'][-1]} evaluated (the last round)."]
    for line in peer_notes(res):
        lines += ["", line]
    path.write_text("\n".join(lines) + "\n")


DITTO = "〃"  # docs/benchmarks.md: the metric of the row above (the page stays short: issue 35)


def summary_table(all_rows: list[Row]) -> list[str]:
    """The rows with a verdict, as table lines; a metric that repeats the row above's is shown as a ditto mark."""
    lines, above = [], None
    for r in all_rows:
        if r[6] == "-":
            continue
        lines.append(f"| {DITTO if r[0] == above else r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[5]} | {r[6]} |")
        above = r[0]
    return lines


def run_time(res: dict[str, Any], full: bool = False) -> str:
    """The run's time against its budget, and the scenarios its schedule cut short (bench/config.py): how many, or
    (``full``) which."""
    cut = res.get("cut_by_schedule") or []
    which = ": " + ", ".join(cut) if full else f" for {len(cut)} measurements ([which](../bench/results.md))"
    return (f"This run took {res['elapsed_s'] / 60:.1f} min (budget {res['budget_s'] / 60:.0f}, `BENCH_BUDGET_S`)"
            + (f"; behind schedule, fewer rounds{which}." if cut else "."))


def write_summary(res: dict[str, Any], path: Path, cfg: Config) -> None:
    """docs/benchmarks.md: how to read a verdict, the machine in one line, the rows that have a goal, speculation's
    figure and the chart. Every other metric is in the full report (``write_markdown``)."""
    m = res["machine"]
    lines = [
        "# Benchmarks",
        "",
        "What gguf-provider costs on top of llama-server, from `make bench` (generated; do not edit). Every "
        "metric: [bench/results.md](../bench/results.md); method and history: [bench/NOTES.md](../bench/NOTES.md).",
        "",
        "Ratios measured side by side in one run; a *floor* is the cheapest client of the same framework. *Band*: "
        "the median's ~95% confidence interval: **yes** when all of it meets the goal, **no** when none does, "
        f"**within noise** otherwise (after up to {res.get('max_rounds', cfg.max_rounds)} rounds). "
        f"This run: {m['cpu']}, {m['cores']} cores, llama-server `-c {N_CTX} -np {N_PARALLEL} --kv-unified "
        f"{' '.join(cfg.server_args)}` on its own core, {res['model']} for P1–P5.",
        "",
    ]
    if res.get("merged"):
        mg = res["merged"]
        later = [f"{', '.join(k.upper() for k in run['scenarios'] if not k.startswith('p2_'))} "
                 f"({run['part_elapsed_s'] / 60:.0f} min)" for run in [*mg.get("earlier", []), mg] if run["scenarios"]]
        lines += [f"Run alone later: {'; '.join(later)}; the rest: the full run ({mg['base_elapsed_s'] / 60:.0f} min).",
                  ""]
    elif "budget_s" in res:
        lines += [run_time(res), ""]
    lines += [
        "| Metric | Client | Median | Band | Goal | Verdict |",
        "|---|---|---|---|---|---|",
    ]
    lines += summary_table(rows(res))
    if "p7" in res:
        p = res["p7"]
        ceiling = p.get("ceiling")
        lines += ["", "## Speculative decoding", "",
                  f"P7/P8 (`speculative=\"auto\"` against `False`): rewriting a 6 kB module ran at "
                  f"{p['edit_tok_s']['auto']['median']:.1f} vs {p['edit_tok_s']['False']['median']:.1f} tok/s, "
                  f"ordinary chat at {p['chat_tok_s']['auto']['median']:.1f} vs "
                  f"{p['chat_tok_s']['False']['median']:.1f} tok/s; greedy text identical: "
                  + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in p["identical"].items()) + "."
                  + (f" The gain is bounded by the CPU's batch ÷ one-token speed ({ceiling['ratio']:.2f}x here)."
                     if ceiling else "")]
    said = [text for key, text in PEER_SENTENCES.items() if key in measured(res)]
    said += [f"{key.upper()} failed in this run: {v['error'].splitlines()[0][:200]}" for key, v in res.items()
             if isinstance(v, dict) and "error" in v]
    if said:
        lines += ["", "## Against what users pick instead", "", *[f"- {t}" for t in said]]
    lines += ["", "![benchmarks](benchmarks.png)", ""]
    path.write_text("\n".join(lines))


# docs/benchmarks.md: one sentence each on what P11-P16 compare (issue 34)
PEER_SENTENCES = {
    "p11": "P11: decode speed against ChatLlamaCpp and LlamaCPP (llama-cpp-python), same settings.",
    "p12": "P12: four requests at once against what a ChatLlamaCpp user can run.",
    "p13": "P13: memory of two processes on one model: a shared server against a copy each.",
    "p14": "P14: a fresh process's first token: starting or attaching against loading in process.",
    "p15": "P15: embedding 2,000 chunks against sentence-transformers (same MiniLM), and the vectors' agreement.",
    "p16": "P16: a 1.5B drafted by its 0.5B against no speculation and n-gram.",
}


def sped_text(res: dict[str, Any]) -> str:
    n = res.get("p1", {}).get("core_speed_pairs")
    if not n:
        return ""
    return f"; P2's core speed taken out in {n[0]} of its {n[1]} ours ÷ floor pairs of streams (the rest: CPU time)"


def edit_rounds_text(p: dict[str, Any]) -> str:
    """Rounds after P7 was decided measure only P8's chat (older reports have no ``edit_rounds``)."""
    n = p.get("edit_rounds", p["rounds"])
    return "" if n == p["rounds"] else f", the code edit in the first {n}"


def ceiling_text(p: dict[str, Any]) -> str:
    c = p.get("ceiling")
    if not c:
        return ""
    return (f"; the machine's batch ceiling (the cold edit prompt's {c['prompt_tok_s']:.1f} tok/s ÷ "
            f"{c['decode_tok_s']:.1f} tok/s one-token decode, speculation off) is {c['ratio']:.2f}x: verifying drafts "
            "is batch work, so speculation stays below it")


def write_chart(res: dict[str, Any], path: Path) -> None:
    """docs/benchmarks.png: the verdicts' medians and bands against their goals."""
    import matplotlib  # the bench extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(18, 8))

    def bars(ax: Any, items: list[tuple[str, dict[str, Any]]], title: str, goal: float | None) -> None:
        names = [n for n, _ in items]
        med = [s["median"] for _, s in items]
        lo = [s["median"] - s.get("band", (s["min"], s["max"]))[0] for _, s in items]
        hi = [s.get("band", (s["min"], s["max"]))[1] - s["median"] for _, s in items]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color="#4c78a8")
        if goal is not None:
            ax.axhline(goal, color="#e45756", linestyle="--", label=f"goal {goal:g}")
            ax.legend()
        ax.set_title(title + " (bars: median, whiskers: band)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7, labelrotation=20)

    if "p1" in res:
        p = res["p1"]
        bars(axes[0][0], [(n.replace(" (LlamaIndex)", " LI"), s) for n, s in
                          (p.get("throughput_floor_ratio") or p["throughput_ratio"]).items()],
             "P1 stream throughput ÷ framework floor", GOALS["p1"].value)
        axes[0][0].set_ylim(0.8, 1.1)
        bars(axes[0][1], [(n.replace(" (LlamaIndex)", " LI"), s) for n, s in p["floor_ratio"].items()],
             "P2 live CPU per token ÷ framework floor", GOALS["p2_floor"].value)
        axes[0][1].set_ylim(0.8, 1.3)
    if "p3" in res:
        c = res["p3"]
        items = [("attach extra", c["attach"]["extra_ms"])]
        if "cold" in c:
            items += [("cold: ours", c["cold"]["ours_ms"]), ("cold: bare", c["cold"]["bare_ms"])]
        bars(axes[1][0], items, "P3 ms (attach extra; cold start to 1st token)", None)
    ratios = []
    if "p4" in res:
        ratios.append(("P4 warm÷cold TTFT", res["p4"]["ratio"]))
    if "p5" in res:
        ratios.append(("P5 abatch÷floor", res["p5"].get("floor_ratio", res["p5"]["ratio"])))
    if ratios:
        bars(axes[1][1], ratios, "P4 (goal <= 0.2), P5 (goal >= 0.97)", None)
        axes[1][1].axhline(0.2, color="#e45756", linestyle="--")
        axes[1][1].axhline(0.97, color="#e45756", linestyle=":")
    spec = []
    if "p7" in res:
        spec += [("P7 code edit spec÷off", res["p7"]["edit_ratio"]), ("P8 chat default÷off", res["p7"]["chat_ratio"])]
    if "p9" in res:
        spec.append(("P9 ctx q8_0÷f16", res["p9"]["ratio"]))
    if spec:
        bars(axes[0][2], spec, "P7 (goal >= 2), P8 (>= 0.97), P9 (>= 1.8)", None)
        for goal, style in ((2.0, "--"), (0.97, ":"), (1.8, "-.")):
            axes[0][2].axhline(goal, color="#e45756", linestyle=style)
    if "p2_replay" in res:
        bars(axes[1][2], [(n.replace(" (LlamaIndex)", " LI"), {"median": v, "min": v, "max": v})
                          for n, v in res["p2_replay"]["floor_ratio"].items()],
             "P2 replayed CPU per token ÷ framework floor", GOALS["p2_floor"].value)
        axes[1][2].set_ylim(0.8, 1.3)
    if "p6" in res:
        fig.suptitle(f"gguf-provider benchmarks — P6 header read speedup over gguf.GGUFReader: "
                     f"{res['p6']['speedup']['median']:.0f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_docs(res: dict[str, Any], md_path: Path, png_path: Path, cfg: Config, full_path: Path | None = None) -> None:
    """The verdicts page, its chart and the full report (``full_path``, default: results.md beside ``md_path``)."""
    write_summary(res, md_path, cfg)
    write_markdown(res, full_path or md_path.with_name("results.md"), cfg)
    write_chart(res, png_path)


SCENARIO_KEYS = ("p1", "p2_replay", "p3", "p4", "p5", "p6", "p7", "p9", "p17", "p18", "p19", "p20", "p21", "p22", "p11", "p11_defaults", "p12",
                 "p13", "p14", "p14_coder", "p15", "p16")


def merge(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a full run, or one merged before) with the scenarios ``part`` (a ``BENCH_ONLY`` run) measured
    replacing its own; what came from which run is kept in ``merged`` (the runs merged before in its ``earlier``)."""
    taken = [k for k in SCENARIO_KEYS if k in part]
    out = {**base, **{k: part[k] for k in taken}}
    # a part run's "-" (not installed where it ran) does not hide the version the full run had
    out["versions"] = {**base.get("versions", {}), **{k: v for k, v in part.get("versions", {}).items() if v != "-"}}
    out["merged"] = {"scenarios": taken, "part_machine": part["machine"], "part_elapsed_s": part.get("elapsed_s"),
                     "base_elapsed_s": base.get("elapsed_s"), "base_machine": base["machine"]}
    if "merged" in base:  # a report merged before: its parts are kept, less the scenarios measured again
        before = base["merged"]
        earlier = [*before.get("earlier", []), {k: v for k, v in before.items() if k != "earlier"}]
        out["merged"]["earlier"] = [{**run, "scenarios": [k for k in run["scenarios"] if k not in taken]}
                                    for run in earlier]
        out["merged"]["base_elapsed_s"], out["merged"]["base_machine"] = before["base_elapsed_s"], before["base_machine"]
    return out


def compare(a: Path, b: Path) -> int:
    """``bench/run.py --compare A.json B.json``: the verdicts of two reports side by side; 1 if any differs."""
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    va, vb = verdicts(ra), verdicts(rb)
    differ = 0
    print(f"load before: {ra['machine']['load_before'][0]:.2f} vs {rb['machine']['load_before'][0]:.2f}; "
          f"calibration {ra['machine']['calibration_ms']:.1f} vs {rb['machine']['calibration_ms']:.1f} ms")
    for key in sorted(set(va) & set(vb)):
        same = va[key] == vb[key]
        differ += not same
        print(f"{'  ' if same else '≠ '}{key}: {va[key]} | {vb[key]}")
    for key in sorted(set(va) ^ set(vb)):
        print(f"  (in one report only) {key}")
    print(f"{differ} of {len(set(va) & set(vb))} verdicts differ")
    return 1 if differ else 0
