"""What a report needs to be compared with another: the machine, its load, a CPU calibration, the software's
versions, the core pinning."""

from __future__ import annotations

import json
import mmap
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
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


def versions() -> dict[str, str]:
    """Python's and the measured packages' versions ("-" for one not installed)."""
    out = {"python": platform.python_version()}
    for pkg in ("gguf-provider", "langchain-core", "llama-index-core", "langchain-openai", "httpx", "pydantic",
                "gguf", "llama-cpp-python", "langchain-community", "llama-index-llms-llama-cpp", "langchain-huggingface",
                "sentence-transformers", "torch"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "-"
    return out


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


PRIORITY = -10  # nice value of the bench and everything it starts; the default is 0


def raise_priority() -> dict[str, Any]:
    """Put the bench (and the servers and child processes it starts, which inherit it) ahead of other work.

    Pinning keeps the server and the clients off each other's cores, not off other work's. At nice -10 the
    scheduler gives the bench about nine tenths of a contended core, so a loaded run measures our code with about the
    CPU share an idle one has; what other work still costs it (caches, memory bandwidth, waits for a slice) is left
    in, and widens the bands of figures near their goals (bench/NOTES.md). The awake loop stays at SCHED_IDLE, below everything."""
    if not hasattr(os, "setpriority"):
        return {"raised": False, "why": "the OS has no setpriority"}
    try:
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
    except OSError as exc:
        return {"raised": False, "why": f"{exc.strerror} (raising priority needs root or CAP_SYS_NICE)"}
    return {"raised": True, "nice": os.getpriority(os.PRIO_PROCESS, 0)}


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


# A busy loop at SCHED_IDLE: the lowest priority there is, so any other task on its core preempts it at once. It
# counts its laps in a shared 8-byte file, so the bench can read how fast the core ran while a stream was measured.
_SPIN = ("import mmap, os, struct, sys\n"
         "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
         "m = mmap.mmap(os.open(sys.argv[1], os.O_RDWR), 8)\n"
         "n = 0\n"
         "while True:\n"
         "    for _ in range(1000):\n"
         "        pass\n"
         "    n += 1\n"
         "    struct.pack_into('q', m, 0, n)\n")


def _runtime_s(pid: int) -> float:
    """CPU time of a process in seconds: /proc's scheduler nanoseconds where there are some, else psutil's ticks."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        import psutil

        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)


@dataclass
class Awake:
    """The busy loops on the client cores and their lap counters."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    counters: list[mmap.mmap] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def reading(self) -> tuple[int, float] | None:
        """Laps and CPU seconds of every loop so far, or None without loops."""
        if not self.procs:
            return None
        laps = sum(struct.unpack_from("q", m, 0)[0] for m in self.counters)
        return laps, sum(_runtime_s(p.pid) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for m in self.counters:
            m.close()
        for path in self.paths:
            os.unlink(path)


def core_speed(before: tuple[int, float] | None, after: tuple[int, float] | None, wall: float) -> float | None:
    """The loop's laps per CPU second between two readings: how fast the client cores ran meanwhile. None when the
    loop ran for less than a tenth of the wall time (other work had the core) or there is no loop."""
    if before is None or after is None:
        return None
    laps, cpu = after[0] - before[0], after[1] - before[1]
    if cpu < 0.1 * wall or laps <= 0:
        return None
    return laps / cpu


def keep_awake(cores: list[int]) -> Awake:
    """One SCHED_IDLE busy loop per client core, so those cores never halt between tokens.

    Measured on a 2-core VM: with the client's core idle between tokens, the client CPU per token of one stream
    differed from the next (same client, same request) by up to 4x, and ours ÷ floor per round spread 0.4–2.8.
    A halted virtual CPU gives its core back to the host, and what ran there meanwhile decides what the next
    token's wake-up costs. The loop's own CPU is another process's, and a client or child on the core preempts it
    at once. It does cost the server on the other core speed (about 30% on that VM: two busy vCPUs share a
    physical core or a clock budget), the same for every variant of a round, so the ratios hold and the absolute
    tok/s under it are lower.

    The loop also measures the core: its laps per CPU second while a stream ran (:func:`core_speed`). On a VM that
    speed moves by 10–15% from one stream to the next (what the host runs beside the vCPU), and a client's CPU per
    token moves with it (correlation 0.9 over 12 streams each of three clients, bench/NOTES.md)."""
    if not hasattr(os, "SCHED_IDLE") or not cores:
        return Awake(info={"used": False, "why": "needs Linux (SCHED_IDLE)" if cores else "no client cores"})
    awake = Awake(info={"used": True, "cores": cores})
    for core in cores:
        fd, path = tempfile.mkstemp(prefix=f"bench-awake-{core}-")
        os.write(fd, b"\0" * 8)
        awake.counters.append(mmap.mmap(fd, 8))
        os.close(fd)
        proc = subprocess.Popen([sys.executable, "-c", _SPIN, path], stdin=subprocess.DEVNULL)
        os.sched_setaffinity(proc.pid, {core})
        awake.procs.append(proc)
        awake.paths.append(path)
    return awake
