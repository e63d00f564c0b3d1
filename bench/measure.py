"""One streamed request measured (wall, CPU, first delta), and the server's own time for it from its log."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

from bench import machine
from bench.clients import Client


class ServerLog:
    """The server's own time for each request, from the ``total time`` line llama-server logs when a task ends.

    The server runs alone on its core, yet its speed drifts between consecutive requests by 5–10% (this VM's host
    takes its share of that core): set against each stream's wall time, the server's time takes that drift out of a
    comparison of clients, leaving what the client adds."""

    LINE = re.compile(rb"task \d+ \|\s+total time =\s+([\d.]+) ms")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def seconds_since_mark(self, tasks: int = 1, timeout: float = 5.0) -> float:
        """The longest server time of the first ``tasks`` tasks that ended since :meth:`mark`."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                found = self.LINE.findall(f.read())
            if len(found) >= tasks:
                return max(float(ms) for ms in found[:tasks]) / 1000
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(found)} of {tasks} 'total time' lines in {self.path} within {timeout} s")
            time.sleep(0.005)


def measure(client: Client, loop: asyncio.AbstractEventLoop, server_log: ServerLog | None = None,
            awake: machine.Awake | None = None) -> dict[str, Any]:
    """One stream; with ``server_log``, the server's own time for it; with ``awake``, the client cores' speed."""
    if server_log is not None:
        server_log.mark()
    before = awake.reading() if awake is not None else None
    out: dict[str, Any] = _measure(client, loop)
    if awake is not None:
        out["core_speed"] = machine.core_speed(before, awake.reading(), out["wall"])
    if server_log is not None:
        out["server"] = server_log.seconds_since_mark()
    return out


def _measure(client: Client, loop: asyncio.AbstractEventLoop) -> dict[str, float]:
    """Wall, process CPU, time to first delta and deltas of one streamed request."""
    if client.is_async:
        async def consume() -> dict[str, float]:
            c0, t0 = time.process_time(), time.perf_counter()
            first, n = None, 0
            async for _ in client.fn():
                if first is None:
                    first = time.perf_counter()
                n += 1
            t1, c1 = time.perf_counter(), time.process_time()
            return {"wall": t1 - t0, "cpu": c1 - c0, "ttft": (first or t1) - t0, "chunks": n}
        return loop.run_until_complete(consume())
    c0, t0 = time.process_time(), time.perf_counter()
    first, n = None, 0
    for _ in client.fn():
        if first is None:
            first = time.perf_counter()
        n += 1
    t1, c1 = time.perf_counter(), time.process_time()
    return {"wall": t1 - t0, "cpu": c1 - c0, "ttft": (first or t1) - t0, "chunks": n}
