"""P6: reading a GGUF header, ours ÷ ``gguf.GGUFReader``."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.config import GOALS
from bench.log import log
from bench.stats import summary
from gguf_provider.runtime._common.gguf import read_header


def bench_header(model: Path) -> dict[str, Any]:
    import gguf  # the bench extra

    def ours() -> float:
        t0 = time.perf_counter()
        h = read_header(model)
        dt = time.perf_counter() - t0
        assert h is not None
        return dt

    def theirs() -> float:
        t0 = time.perf_counter()
        reader = gguf.GGUFReader(str(model))
        dt = time.perf_counter() - t0
        assert reader.fields
        return dt

    ours(), theirs()  # page cache
    a, b = [], []
    for _ in range(5):  # GGUFReader takes seconds; the goal is two orders of magnitude away
        a.append(ours())
        b.append(theirs())
    log(f"P6: ours {statistics.median(a) * 1e3:.1f} ms, gguf.GGUFReader {statistics.median(b) * 1e3:.0f} ms")
    return {"speedup": summary([t / o for o, t in zip(a, b, strict=True)], GOALS["p6"]),
            "ours_ms": summary([x * 1e3 for x in a]), "gguf_ms": summary([x * 1e3 for x in b]), "model": model.name,
            "size": model.stat().st_size}
