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
        # Until the loop has run: a SCHED_IDLE loop starts late beside other work (~4 s under 2 hogs and a build
        # on 2 cores; 15x).
        deadline = time.monotonic() + 60
        while (after := awake.reading()) is not None and not (after[0] > before[0] and after[1] > before[1]):
            assert time.monotonic() < deadline, "the awake loop made no lap"
            time.sleep(0.05)
        assert after is not None
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
