"""What a report needs to be compared with another: the machine, its load, a CPU calibration, the core pinning."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The calibration of the machine the absolute goals (P3 attach, in ms) were set on: an idle 2-core AMD EPYC VM.
# A machine whose calibration is k times this one gets those goals scaled by k.
REFERENCE_CALIBRATION_MS = 12.0


def calibrate() -> float:
    """Best of 25 short bursts: ms for a fixed pure-Python workload (integer loop, dict and JSON work), the
    per-operation speed that client CPU, imports and process starts scale with. Short bursts, so that the best one
    ran without being preempted even on a busy machine."""
    doc = {"choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}], "model": "m", "id": "x"}
    line = json.dumps(doc)
    best = float("inf")
    for _ in range(25):
        t0 = time.perf_counter()
        acc = 0
        for i in range(20_000):
            acc += i * i % 7
        for _ in range(2_000):
            d = json.loads(line)
            acc += len(d["choices"][0]["delta"]["content"])
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def describe() -> dict[str, Any]:
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
            "load_before": list(os.getloadavg()), "calibration_ms": calibrate()}


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def pin(server_pid: int | None) -> dict[str, Any]:
    """Server on the first core, this process (the clients) on the others, where the OS allows: every thread of
    both, as ``sched_setaffinity`` applies to one thread. Children started later inherit the client's cores."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2 or server_pid is None or not hasattr(os, "sched_setaffinity"):
        return {"pinned": False, "why": "needs Linux and two cores" if len(cores) < 2 else "no server pid"}
    server, client = {cores[0]}, set(cores[1:])
    try:
        for tid in _tasks(server_pid):
            os.sched_setaffinity(tid, server)
        for tid in _tasks(os.getpid()):
            os.sched_setaffinity(tid, client)
    except OSError as exc:
        return {"pinned": False, "why": str(exc)}
    return {"pinned": True, "server_cores": sorted(server), "client_cores": sorted(client)}


def unpin(server_pid: int | None) -> None:
    if not hasattr(os, "sched_setaffinity"):
        return
    every = set(range(os.cpu_count() or 1))
    for pid in (server_pid, os.getpid()):
        if pid is None:
            continue
        for tid in _tasks(pid):
            try:
                os.sched_setaffinity(tid, every)
            except OSError:
                pass


# A busy loop at SCHED_IDLE: the lowest priority there is, so any other task on its core preempts it at once.
_SPIN = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"


def keep_awake(cores: list[int]) -> tuple[list[subprocess.Popen[bytes]], dict[str, Any]]:
    """One SCHED_IDLE busy loop per client core, so those cores never halt between tokens.

    Measured on a 2-core VM: with the client's core idle between tokens, the client CPU per token of one stream
    differed from the next (same client, same request) by up to 4x, and ours ÷ floor per round spread 0.4–2.8;
    with the core kept awake the spread was 0.95–1.08. A halted virtual CPU gives its core back to the host, and
    what ran there meanwhile decides what the next token's wake-up costs. The loop's own CPU is another process's,
    and a client or child on the core preempts it at once. It does cost the server on the other core speed (about
    30% on that VM: two busy vCPUs share a physical core or a clock budget), the same for every variant of a round,
    so the ratios hold and the absolute tok/s under it are lower."""
    if not hasattr(os, "SCHED_IDLE") or not cores:
        return [], {"used": False, "why": "needs Linux (SCHED_IDLE)" if cores else "no client cores"}
    procs = []
    for core in cores:
        proc = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL)
        os.sched_setaffinity(proc.pid, {core})
        procs.append(proc)
    return procs, {"used": True, "cores": cores}


def stop_awake(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()
