"""A running server's live numbers for ``gguf-provider ps``: llama-server's Prometheus ``/metrics`` (our servers
run with ``--metrics``, runtime/_serve/argv.py) and its ``/slots``, read with a short timeout from every server at once.

The metric names are those of llama.cpp's ``tools/server/server-task.cpp`` (``server_task_result_metrics``): the
``llamacpp:*_total`` counters are cumulative since the server started, so the speeds here are averages over its
life. Its gauges (``predicted_tokens_seconds``, ``prompt_tokens_seconds``) are averaged over the window between two
scrapes and reset by each one, so they are not used. This build has no KV cache gauge: the KV use is the tokens the
slots hold (``/slots``' ``n_prompt_tokens``: prompt and generated tokens) against the cache's size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from .._common.process import Address

REQUEST_TIMEOUT = 1.0  # seconds for one server's /metrics (and again for its /slots)
TOTAL_TIMEOUT = 2.5  # seconds for all servers together: a server that has not answered by then shows "–"
PREFIX = "llamacpp:"
K = TypeVar("K")


@dataclass(frozen=True)
class ServerMetrics:
    """One server's live numbers (the ``metrics`` object of ``gguf-provider ps --json``); None: not measured yet."""

    generation_tps: float | None  # generated tokens per second of generation, over the server's life
    prompt_tps: float | None  # prompt tokens processed per second of prompt processing (cached ones not counted)
    tokens_predicted: int  # tokens generated since start
    prompt_tokens: int  # prompt tokens processed since start
    prompt_tokens_cached: int  # prompt tokens reused from the KV cache since start
    requests_processing: int  # requests running now
    requests_deferred: int  # requests waiting for a free slot now
    kv_tokens: int | None  # tokens the slots hold in the KV cache now
    kv_size: int | None  # tokens the KV cache holds at most
    kv_use: float | None  # kv_tokens / kv_size, 0..1
    spec_drafted: int  # draft tokens proposed by speculative decoding since start
    spec_accepted: int  # of those, accepted
    spec_acceptance: float | None  # spec_accepted / spec_drafted; None before any draft

    def describe(self) -> str:
        """``gen 91.9 tok/s, prompt 221 tok/s, KV 8% (347/4096), requests 0 running, 0 waiting, drafts 58%
        accepted``."""
        parts = [f"gen {_num(self.generation_tps)} tok/s", f"prompt {_num(self.prompt_tps)} tok/s"]
        if self.kv_use is not None:
            parts.append(f"KV {self.kv_use:.0%} ({self.kv_tokens}/{self.kv_size})")
        else:
            parts.append("KV –")
        parts.append(f"requests {self.requests_processing} running, {self.requests_deferred} waiting")
        if self.spec_acceptance is not None:
            parts.append(f"drafts {self.spec_acceptance:.0%} accepted")
        return ", ".join(parts)


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format → ``{"name": value, 'name{label="x"}': value}`` (comments and timestamps dropped;
    a line that does not parse is skipped)."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            close = line.rfind("}")
            if close < 0:
                continue
            name, rest = line[:close + 1], line[close + 1:].split()
        else:
            name, *rest = line.split()
        try:
            out[name] = float(rest[0])
        except (IndexError, ValueError):
            continue
    return out


def kv_from_slots(slots: Any, *, unified: bool = True) -> tuple[int, int] | None:
    """``(tokens held, cache size)`` from ``/slots``: each slot's ``n_prompt_tokens`` (the prompt and generated
    tokens it keeps) summed; the size is one slot's ``n_ctx`` when the slots share one cache (``--kv-unified``,
    llama-server's default with automatic slots and ours with ``n_parallel``), else the sum of theirs."""
    if not isinstance(slots, list) or not slots or not all(isinstance(s, dict) for s in slots):
        return None
    sizes = [int(s.get("n_ctx") or 0) for s in slots]
    if not all(sizes):
        return None
    held = sum(int(s.get("n_prompt_tokens") or 0) for s in slots)
    return held, max(sizes) if unified else sum(sizes)


def from_samples(samples: Mapping[str, float], kv: tuple[int, int] | None = None) -> ServerMetrics:
    """The numbers ``ps`` shows, from parsed ``/metrics`` samples (and the KV use of :func:`kv_from_slots`)."""
    def get(name: str) -> float:
        return samples.get(PREFIX + name, 0.0)

    def rate(tokens: str, seconds: str) -> float | None:
        s = get(seconds)
        return round(get(tokens) / s, 1) if s > 0 else None

    drafted, accepted = int(get("spec_decode_num_draft_tokens_total")), int(
        get("spec_decode_num_accepted_tokens_total"))
    return ServerMetrics(
        generation_tps=rate("tokens_predicted_total", "tokens_predicted_seconds_total"),
        prompt_tps=rate("prompt_tokens_total", "prompt_seconds_total"),
        tokens_predicted=int(get("tokens_predicted_total")), prompt_tokens=int(get("prompt_tokens_total")),
        prompt_tokens_cached=int(get("prompt_tokens_cached_total")),
        requests_processing=int(get("requests_processing")), requests_deferred=int(get("requests_deferred")),
        kv_tokens=kv[0] if kv else None, kv_size=kv[1] if kv else None,
        kv_use=round(kv[0] / kv[1], 4) if kv and kv[1] else None,
        spec_drafted=drafted, spec_accepted=accepted,
        spec_acceptance=round(accepted / drafted, 4) if drafted else None)


def read(address: Address, *, unified: bool = True, timeout: float = REQUEST_TIMEOUT) -> ServerMetrics:
    """One server's numbers; httpx errors (no answer in ``timeout``, HTTP 501 from a server without
    ``--metrics``) or ValueError. ``/slots`` is optional: without it the KV use is None."""
    with address.client(timeout=timeout) as c:
        r = c.get("/metrics")
        r.raise_for_status()
        samples = parse_prometheus(r.text)
        if not any(k.startswith(PREFIX) for k in samples):
            raise ValueError("/metrics has no llamacpp: samples")
        try:
            s = c.get("/slots")
            s.raise_for_status()
            kv = kv_from_slots(s.json(), unified=unified)
        except (httpx.HTTPError, ValueError):
            kv = None
    return from_samples(samples, kv)


def read_all(servers: Mapping[K, tuple[Address, bool]], *, timeout: float = REQUEST_TIMEOUT,
             total: float = TOTAL_TIMEOUT) -> dict[K, ServerMetrics | None]:
    """:func:`read` for every server at once (``{key: (address, unified)}``), each in a daemon thread: the answer
    comes within ``total`` seconds whatever the servers do, None for each one that failed or had not answered."""
    results: dict[K, ServerMetrics | None] = {}
    lock = threading.Lock()

    def one(key: K, address: Address, unified: bool) -> None:
        try:
            got: ServerMetrics | None = read(address, unified=unified, timeout=timeout)
        except (httpx.HTTPError, ValueError, OSError):
            got = None
        with lock:
            results[key] = got

    threads = [threading.Thread(target=one, args=(k, a, u), daemon=True, name="gguf-provider-metrics")
               for k, (a, u) in servers.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + total
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return {k: results.get(k) for k in servers}


def unified_cache(server_args: Sequence[str]) -> bool:
    """Whether a server's slots share one KV cache: llama-server's default, and ours with ``n_parallel``
    (``--kv-unified``); not when the user's ``server_args`` set ``-np`` without ``--kv-unified``."""
    args = set(server_args)
    sets_slots = any(a in ("-np", "--parallel") or a.startswith(("-np=", "--parallel=")) for a in args)
    return not sets_slots or bool(args & {"-kvu", "--kv-unified"})
