"""The bench's awake loop: it counts laps the bench reads back, and it leaves nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.machine import core_speed, keep_awake


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_the_awake_loop_counts_laps_and_the_bench_reads_its_speed() -> None:
    core = sorted(os.sched_getaffinity(0))[-1]
    awake = keep_awake([core])
    try:
        before = awake.reading()
        assert before is not None
        deadline = time.monotonic() + 10
        while (now := awake.reading()) is not None and now[0] == before[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        after = awake.reading()
        assert after is not None and after[0] > before[0] and after[1] > before[1]
        laps, cpu = after[0] - before[0], after[1] - before[1]
        assert core_speed(before, after, wall=cpu) == pytest.approx(laps / cpu)
        assert core_speed(before, after, wall=cpu * 11) is None  # the loop ran for less than a tenth of the wall
    finally:
        awake.stop()
    assert all(p.poll() is not None for p in awake.procs)
    assert not any(Path(p).exists() for p in awake.paths)


def test_no_loop_no_reading() -> None:
    awake = keep_awake([])
    assert awake.reading() is None and awake.info["used"] is False
    assert core_speed(None, None, 1.0) is None
    awake.stop()
