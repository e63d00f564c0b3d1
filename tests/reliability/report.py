"""Reliability reports: the tests write measured figures to ``<home>/reports/reliability-<name>.json``; running
this file regenerates the figures section of bench/NOTES.md from them (docs/reliability.md sums them up).

    .venv/bin/python tests/reliability/report.py
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from a checkout

from gguf_provider.runtime._common.paths import home

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "bench" / "NOTES.md"
START, END = "<!-- figures:start (tests/reliability/report.py) -->", "<!-- figures:end -->"


def reports_dir() -> Path:
    return home() / "reports"


def write_report(name: str, data: dict[str, Any]) -> Path:
    path = reports_dir() / f"reliability-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": f"{platform.machine()}, {platform.system()} {platform.release()}, python {platform.python_version()}"}
    path.write_text(json.dumps({**stamp, **data}, indent=2, sort_keys=False))
    return path


def read_report(name: str) -> dict[str, Any] | None:
    path = reports_dir() / f"reliability-{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fuzz_table(r: dict[str, Any]) -> list[str]:
    lines = [f"Fuzzing, {r['generated']} ({r['wall_s']} s, {r['inputs_total']} inputs, failed tests: "
             f"{r['failed_tests']}; limits per call: hang {r['limits']['hang_s']} s, slow {r['limits']['call_s']} s, "
             f"peak {r['limits']['peak_mib']:g} MiB):", "",
             "| target | inputs tried | documented errors raised | other exceptions / hangs | slowest call | peak alloc |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, t in r["targets"].items():
        lines.append(f"| {name} | {t['inputs']} | {t['documented_exceptions']} | 0 | {t['max_call_ms']} ms "
                     f"| {t['max_peak_kib']} KiB |")
    return lines


def soak_table(r: dict[str, Any]) -> list[str]:
    lines = [f"Soak, {r['generated']} ({r['wall_s']} s, model {r['model']}, n_parallel {r['n_parallel']}, "
             f"max_tokens {r['max_tokens']}):", "",
             "| phase | requests | answered with content | cancelled | failed | wall | all slots idle after |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, ph in r["phases"].items():
        lines.append(f"| {name} | {ph['requests']} | {ph['answered']} | {ph['cancelled']} | {ph['failed']} "
                     f"| {ph['wall_s']} s | {ph['slots_idle_after_s']} s |")
    lines += ["", "| resource (before -> after the phase, after settling) | before | after | tolerance | leaked |",
              "|---|---:|---:|---:|---:|"]
    for name, res in r["resources"].items():
        lines.append(f"| {name} | {res['before']} | {res['after']} | {res['tolerance']} | {res['leaked']} |")
    rss = r.get("rss_mib")
    if rss:
        lines += ["", "Server RSS (MiB): " + ", ".join(f"{k} {v}" for k, v in rss.items()) + "."]
    return lines


def faults_table(r: dict[str, Any]) -> list[str]:
    lines = [f"Faults, {r['generated']} ({r['survived']} of {r['tried']} survived):", "",
             "| fault | measured |", "|---|---|"]
    lines += [f"| {name} | {f['figure']} |" for name, f in r["scenarios"].items()]
    return lines


def render() -> str:
    parts: list[str] = []
    for name, table in (("faults", faults_table), ("fuzz", fuzz_table), ("soak", soak_table)):
        r = read_report(name)
        parts += table(r) if r else [f"(no {name} report yet: run `pytest tests/reliability`)"]
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def main() -> None:
    doc = DOC.read_text()
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{render()}{END}{tail}")
    print(f"updated {DOC}")


if __name__ == "__main__":
    main()
