"""The bench without a server: its settings, its rounds, its P1/P2 arithmetic, its report, and an import that reads
and changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import report, rounds
from bench.config import BUDGET_S, SCENARIOS, SCHEDULE_MIN, Config
from bench.measure import ServerLog
from bench.rounds import adaptive
from bench.run import main
from bench.scenarios.stream import stream_metrics, stream_undecided
from bench.stats import Goal

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results.json"


def test_importing_the_bench_reads_no_setting_and_changes_nothing() -> None:
    # Settings that would fail to parse: importing must not read them.
    env = dict(os.environ, BENCH_ROUNDS="x", BENCH_TOKENS="y", BENCH_PORT="z", PYTHONPATH=str(ROOT))
    code = ("import os, sys; path, env = list(sys.path), dict(os.environ)\n"
            "import bench.run, bench.replay, bench.report, bench.profile_stream\n"
            "assert sys.path == path, 'sys.path changed'; assert dict(os.environ) == env, 'environment changed'")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # ~1.7 s under 2 hogs and a build on 2 cores; 70x
    assert proc.returncode == 0, proc.stderr


def test_settings_come_from_the_environment_when_asked() -> None:
    assert Config.from_env({}) == Config()
    cfg = Config.from_env({"BENCH_ROUNDS": "30", "BENCH_MAX_ROUNDS": "12", "BENCH_PAIR_MAX_ROUNDS": "5",
                           "BENCH_PAIR_MAX_STREAMS": "7", "BENCH_TOKENS": "64", "BENCH_PORT": "1234",
                           "BENCH_THREADS": "2", "BENCH_ONLY": " p1, p9 ,", "BENCH_OUT": "/tmp/b"})
    assert (cfg.rounds, cfg.max_rounds, cfg.pair_max_rounds) == (30, 30, 30)  # a cap is never below the first rounds
    assert (cfg.pair_max_streams, cfg.tokens, cfg.port) == (7, 64, 1234)
    assert cfg.only == {"p1", "p9"} and cfg.out == Path("/tmp/b")
    assert cfg.server_args == ("-t", "2", "-tb", "2")


def test_outputs_go_to_docs_unless_a_directory_is_named(tmp_path: Path) -> None:
    assert Config().outputs() == (ROOT / "bench" / "results.json", ROOT / "docs" / "benchmarks.md",
                                  ROOT / "docs" / "benchmarks.png")
    out = tmp_path / "run2"
    assert Config(out=out).outputs() == (out / "results.json", out / "benchmarks.md", out / "benchmarks.png")
    assert out.is_dir()


@pytest.mark.parametrize(("values", "expected"), [
    ([1.0, 2.0, 3.0, 4.0, 5.0], 3),  # decided (every value above the goal): the first rounds only
    ([0.0, 1.0] * 20, 6),  # within noise: up to the cap
])
def test_rounds_are_added_only_while_a_verdict_is_within_noise(values: list[float], expected: int) -> None:
    seen: list[float] = []
    n = adaptive(Config(rounds=3, max_rounds=6), "test", lambda r: seen.append(values[r]), lambda: seen,
                 Goal(">=", 0.5))
    assert n == expected == len(seen)
    assert adaptive(Config(rounds=3, max_rounds=6), "test", lambda r: None, lambda: [], None) == 3


def test_a_scenario_past_its_point_in_the_schedule_adds_no_rounds() -> None:
    """The hour's budget: with the run behind (``until`` passed), a within-noise verdict gets no more rounds and the
    first ones stop at the floor; the cut is recorded for the report. Ahead of it, nothing changes."""
    noisy = [0.0, 1.0] * 20
    seen: list[float] = []
    rounds.CUT.clear()
    ahead = Config(rounds=3, max_rounds=6, until=time.monotonic() + 3600)
    assert adaptive(ahead, "ahead", lambda r: seen.append(noisy[r]), lambda: seen, Goal(">=", 0.5)) == 6
    assert rounds.CUT == []
    behind = Config(rounds=3, max_rounds=6, until=time.monotonic() - 1)
    seen.clear()
    assert adaptive(behind, "behind", lambda r: seen.append(noisy[r]), lambda: seen, Goal(">=", 0.5)) == 2
    assert adaptive(behind, "floor", lambda r: None, lambda: [], None, least=1) == 1
    assert adaptive(behind, "decided", lambda r: None, lambda: [1.0, 1.0], Goal(">=", 0.5), least=3) == 3
    assert rounds.CUT == ["behind (2 rounds)", "floor (1 round)"]
    rounds.CUT.clear()


def test_the_schedule_spreads_the_budget_over_the_scenarios_in_their_order() -> None:
    cfg = Config.from_env({"BENCH_BUDGET_S": "600"})
    assert cfg.budget_s == 600 and Config().budget_s == BUDGET_S <= 3600  # `make bench` within an hour
    assert cfg.scheduled("p16", 100.0).until == pytest.approx(700.0)  # the last scenario ends with the budget
    times = [cfg.scheduled(k, 0.0).until for k in SCHEDULE_MIN]
    assert times == sorted(times) and times[-1] == max(times)
    # every scenario run.py schedules has its point; the scenario list names every key's scenario
    calls = re.findall(r'(?:at|short)\("(\w+)"', (ROOT / "bench" / "run.py").read_text())
    assert len(calls) > 10 and set(calls) <= set(SCHEDULE_MIN)
    assert {k.split("_")[0] for k in SCHEDULE_MIN} <= set(SCENARIOS.split(","))


def _stream(wall: float, cpu: float, server: float) -> dict[str, Any]:
    return {"wall": wall, "cpu": cpu, "server": server, "ttft": 0.1, "chunks": 10}


def test_stream_metrics_pair_only_the_rounds_that_measured_both() -> None:
    runs: dict[str, list[dict[str, Any] | None]] = {
        "raw httpx": [_stream(1.0, 0.10, 0.9), _stream(1.0, 0.10, 0.9), None],
        "raw httpx async": [_stream(1.0, 0.10, 0.9), _stream(1.0, 0.10, 0.9), None],
        "ChatGGUF": [_stream(1.25, 0.30, 0.9), _stream(1.25, 0.30, 0.9), _stream(1.25, 0.30, 0.9)],
        "LangChain floor": [_stream(1.0, 0.20, 0.9), _stream(1.0, 0.20, 0.9), _stream(1.0, 0.20, 0.9)],
    }
    m = stream_metrics(runs, {"ChatGGUF": "LangChain floor"}, tokens=100)
    assert m["throughput_ratio"]["ChatGGUF"]["n"] == 2  # the third round measured only the pair
    assert m["floor_ratio"]["ChatGGUF"]["n"] == 3
    assert m["floor_ratio"]["ChatGGUF"]["median"] == pytest.approx(1.5)
    assert m["floor_ratio"]["ChatGGUF"]["verdict"] == "no"
    assert m["throughput_floor_ratio"]["ChatGGUF"]["median"] == pytest.approx(0.8)  # server share 0.72 ÷ 0.9
    assert m["throughput_floor_wall_ratio"]["ChatGGUF"]["median"] == pytest.approx(0.8)
    assert m["cpu_us_per_token"]["ChatGGUF"]["median"] == pytest.approx(3000)
    assert m["tok_s"]["raw httpx"]["median"] == pytest.approx(100)
    assert m["core_speed_pairs"] == [0, 3] and m["core_speed_taken_out"] is False  # the floor pairs, no reading
    assert stream_undecided(m) == []  # both verdicts are a clear "no"


def test_the_server_log_gives_each_request_its_own_time(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"slot release: task 1 |    total time =     900.00 ms\n")
    log = ServerLog(path)
    log.mark()
    with path.open("ab") as f:
        f.write(b"task 7 | total time =  250.50 ms\nother line\ntask 8 |   total time = 300.00 ms\n")
    assert log.seconds_since_mark() == pytest.approx(0.2505)
    assert log.seconds_since_mark(tasks=2) == pytest.approx(0.3)
    with pytest.raises(RuntimeError, match="2 of 3"):
        log.seconds_since_mark(tasks=3, timeout=0.01)


def test_the_report_states_the_server_args_of_its_settings(tmp_path: Path) -> None:
    res = json.loads(RESULTS.read_text())
    md = tmp_path / "benchmarks.md"
    report.write_markdown(res, md, Config(threads=2))
    text = md.read_text()
    assert "`-c 8192 -np 4 --kv-unified -t 2 -tb 2`" in text
    assert "| Metric | Client | Median | Band | Min–max | Goal | Verdict |" in text
    assert all(f"| {' | '.join(r)} |" in text for r in report.rows(res))


def test_the_docs_page_holds_the_verdicts_in_under_1300_words(tmp_path: Path) -> None:
    """docs/benchmarks.md: every row with a verdict, no other row, and short (issue 35: 800 words for 18 verdicts;
    issue 34 added 18 verdicts against the peers, issue 47 two for the gateway, issue 61 two for Claude Code's
    requests); the rest is the full report."""
    res = json.loads(RESULTS.read_text())
    md = tmp_path / "benchmarks.md"
    report.write_summary(res, md, Config())
    text = md.read_text()
    judged = [r for r in report.rows(res) if r[6] != "-"]
    shown = [line for line in text.splitlines() if line.startswith(("| P", f"| {report.DITTO}"))]
    assert len(judged) == len(shown)
    above = None
    for r, line in zip(judged, shown, strict=True):  # a metric repeated from the row above is a ditto mark
        metric = report.DITTO if r[0] == above else r[0]
        assert line == f"| {metric} | {r[1]} | {r[2]} | {r[3]} | {r[5]} | {r[6]} |"
        above = r[0]
    assert len(text.split()) <= 1300 and "../bench/NOTES.md" in text and "../bench/results.md" in text


def test_compare_lists_the_verdicts_that_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = json.loads(RESULTS.read_text())
    n = len(report.verdicts(res))
    assert n > 0
    with pytest.raises(SystemExit) as same:
        main(["--compare", str(RESULTS), str(RESULTS)])
    assert same.value.code == 0 and f"0 of {n} verdicts differ" in capsys.readouterr().out
    res["p4"]["ratio"]["verdict"] = "no" if res["p4"]["ratio"]["verdict"] != "no" else "yes"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(res))
    assert report.compare(RESULTS, other) == 1
    out = capsys.readouterr().out
    assert f"1 of {n} verdicts differ" in out and "≠ P4 TTFT" in out


def test_help_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    assert "BENCH_ROUNDS" in capsys.readouterr().out



def test_merge_puts_a_partial_run_into_the_full_report() -> None:
    """`--merge`: the scenarios a BENCH_ONLY run measured replace the full report's, the rest is kept, and the
    summary page says which rows came from which run."""
    full = {"machine": {"cpu": "a"}, "elapsed_s": 1200.0, "p1": {"x": 1}, "p3": {"old": True}, "versions": {"a": "1"}}
    part = {"machine": {"cpu": "b"}, "elapsed_s": 600.0, "p3": {"new": True}, "p15": {"y": 2}, "versions": {"b": "2"}}
    merged = report.merge(full, part)
    assert merged["p1"] == {"x": 1} and merged["p3"] == {"new": True} and merged["p15"] == {"y": 2}
    assert merged["merged"]["scenarios"] == ["p3", "p15"] and merged["versions"] == {"a": "1", "b": "2"}
    assert merged["machine"] == {"cpu": "a"} and merged["merged"]["part_machine"] == {"cpu": "b"}


def test_a_second_merge_keeps_the_first_parts_rows_and_says_so() -> None:
    full = {"machine": {"cpu": "a"}, "elapsed_s": 3600.0, "p1": {"x": 1}, "p3": {"old": True}, "p15": {"y": 1}}
    once = report.merge(full, {"machine": {"cpu": "b"}, "elapsed_s": 1800.0, "p1": {"x": 2}, "p15": {"y": 2}})
    twice = report.merge(once, {"machine": {"cpu": "c"}, "elapsed_s": 420.0, "p15": {"y": 3}})
    assert twice["p1"] == {"x": 2} and twice["p15"] == {"y": 3} and twice["p3"] == {"old": True}
    mg = twice["merged"]
    assert mg["scenarios"] == ["p15"] and mg["base_elapsed_s"] == 3600.0 and mg["base_machine"] == {"cpu": "a"}
    assert [run["scenarios"] for run in mg["earlier"]] == [["p1"]]  # its P15 was measured again


def test_a_failed_scenario_is_said_not_rendered(tmp_path: Path) -> None:
    res = json.loads(RESULTS.read_text())
    res["p16"] = {"error": "RuntimeError: draft server did not start", "elapsed_s": 3.0}
    md = tmp_path / "benchmarks.md"
    report.write_summary(res, md, Config())
    text = md.read_text()
    assert "P16 failed in this run: RuntimeError: draft server did not start" in text
    assert not [r for r in report.rows(res) if r[0].startswith("P16")]


def test_the_summary_says_the_run_time_and_what_the_schedule_cut(tmp_path: Path) -> None:
    res = json.loads(RESULTS.read_text())
    res.pop("merged", None)
    res.update(elapsed_s=3300.0, budget_s=3540.0, cut_by_schedule=["P17 (2 rounds)", "P16 (1 round)"])
    md = tmp_path / "benchmarks.md"
    report.write_summary(res, md, Config())
    assert ("This run took 55.0 min (budget 59, `BENCH_BUDGET_S`); behind schedule, fewer rounds for 2 measurements "
            "([which](../bench/results.md)).") in md.read_text()
    full = tmp_path / "results.md"
    report.write_markdown(res, full, Config())
    assert "behind schedule, fewer rounds: P17 (2 rounds), P16 (1 round)." in full.read_text()


def test_p21_sends_llama_server_the_prompt_the_gateway_reads() -> None:
    """P21's straight requests carry the gateway's two changes (billing block dropped, system messages joined), so
    llama-server's own /v1/messages renders the same leading system message and the same conversation after it."""
    from bench.scenarios.claude_replay import load_requests, straight
    from gguf_provider.gateway.anthropic import messages

    for req in load_requests():
        body = req["body"]
        direct = straight(body)
        assert all(m["role"] != "system" for m in direct["messages"])
        through = messages(body.get("system"), body["messages"])
        assert through[0] == {"role": "system", "content": direct["system"]}
        assert through[1:] == messages(None, direct["messages"])


def test_the_boundary_timer_times_a_chat_request_to_its_first_text(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.boundary (P21): one line per POST /v1/chat/completions, from the hand-over to the transport to the
    first chunk holding text (not the role chunk before it); other requests are not timed."""
    import asyncio

    import httpx

    from bench import boundary

    pause = 0.05
    chunks = [b'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}\n\n',
              b'data: {"choices":[{"delta":{"content":"1"}}]}\n\n', b"data: [DONE]\n\n"]

    class Slow(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            for i, chunk in enumerate(chunks):
                if i == 1:
                    await asyncio.sleep(pause)
                yield chunk

    async def server(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Slow() if request.method == "POST" else httpx.ByteStream(b"{}"))

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", server)
    log = tmp_path / "boundary.jsonl"
    uninstall = boundary.install(str(log))

    async def run() -> list[bytes]:
        async with httpx.AsyncClient(base_url="http://llama-server", transport=httpx.AsyncHTTPTransport()) as c:
            await c.get("/health")
            async with c.stream("POST", "/v1/chat/completions", json={}) as r:
                return [chunk async for chunk in r.aiter_raw()]

    t0 = time.perf_counter()
    try:
        assert b"".join(asyncio.run(run())) == b"".join(chunks)  # passed on as it came
    finally:
        uninstall()
    lines, offset = boundary.read(str(log), 0)
    assert len(lines) == 1 and offset == log.stat().st_size
    assert t0 <= lines[0]["sent"] and lines[0]["first"] - lines[0]["sent"] >= pause
