"""llama.cpp's own account of a load (its log's ``... buffer size = X MiB`` lines) against our memory plan.

The bounds (tests/integration_tests/test_memory_real.py says why): weights and KV within :data:`EXACT`; compute
(with the output buffer) at least what llama.cpp reserved and at most a quarter and :data:`SLACK` more; resident
memory under the plan's total, llama.cpp's repacked copies and :data:`PROCESS` for the process itself.
"""

from __future__ import annotations

import re
from collections import defaultdict

from gguf_provider.runtime._memory.plan import Plan

MiB = 1 << 20
EXACT = int(1.5 * MiB)
SLACK = 8 * MiB
PROCESS = 64 * MiB

_LINE = re.compile(r"(?P<buf>[A-Za-z][\w]*?(?:\[[^\]]*\])?)\s+(?P<kind>model|KV|compute|output) buffer size =\s+"
                   r"(?P<mib>[\d.]+) MiB")


def _device(buf: str, kind: str) -> tuple[str, str]:
    """``CPU_Mapped`` → (CPU, model); ``CPU_REPACK`` → (CPU, repack); ``CUDA_Host`` → (CPU, kind);
    ``RPC0[127.0.0.1:50052]`` → (RPC0, kind)."""
    name = buf.split("[", 1)[0]
    if name.endswith("_REPACK"):
        return "CPU", "repack"
    if name.endswith(("_Mapped", "_Host")) or name == "CPU":
        return "CPU", kind.lower()
    return name, kind.lower()


def buffers(log: str) -> dict[str, dict[str, float]]:
    """Bytes per device and kind (model, repack, KV, compute, output) from a llama-server log (``-lv 4``)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for m in _LINE.finditer(log):
        device, kind = _device(m["buf"], m["kind"])
        out[device][kind] += float(m["mib"]) * MiB
    return {d: dict(k) for d, k in out.items()}


def assert_plan_matches_log(placed: Plan, log: str, *, rss: int | None = None) -> None:
    """Every placement against llama.cpp's lines for its device (see the module docstring for the bounds)."""
    got = buffers(log)
    split = any(p.device.kind != "cpu" and (p.layers or p.output) for p in placed.placements)
    for p in placed.placements:
        seen = got.get(p.device.name, {})
        if not p.total:
            continue
        what = f"{p.device.name}: planned {p.weights / MiB:.2f}/{p.kv / MiB:.2f}/{p.compute / MiB:.2f} MiB, " \
               f"llama.cpp {seen}"
        # The host's mapped span covers offloaded tensors between its own when layers are split: not comparable.
        if p.device.kind != "cpu" or not split:
            assert abs(seen.get("model", 0) - p.weights) <= EXACT, what
        assert abs(seen.get("kv", 0) - p.kv) <= EXACT, what
        used = seen.get("compute", 0) + (seen.get("output", 0) if p.device.kind == "cpu" and not split else 0)
        assert used <= p.compute <= 1.25 * used + SLACK, what
    if rss is not None:
        repack = sum(d.get("repack", 0) for d in got.values())
        total = sum(p.total for p in placed.placements)
        assert rss <= total + repack + PROCESS, (rss / MiB, total / MiB, repack / MiB)
