"""The bench's progress lines: timestamped, flushed at once (a run takes an hour)."""

from __future__ import annotations

import time


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)
