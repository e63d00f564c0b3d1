"""The status view that both front ends print (``gguf-provider ps``, ``%gguf ps``): the servers gguf-provider runs
and the memory budget they share (``Runtime.status``).

Rows only, no formatting: the CLI prints them as text or JSON, the magics as a table.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._common import paths, process
from .._common.process import Address
from . import budget, metrics, registry
from .metrics import ServerMetrics


@dataclass(frozen=True)
class ServerStatus:
    """One running server. Its fields, in this order, are the keys of ``gguf-provider ps --json``."""

    id: str  # the first 12 characters of its registry key (`gguf-provider stop` takes a prefix)
    pid: int
    model: str  # the model file
    ctx: int
    address: str | None  # "unix:<socket>" or the TCP URL
    rss: int  # resident memory in bytes, 0 when it cannot be read
    leases: int  # live client processes
    idle_s: float  # seconds since its last client let go, 0 while one holds it
    shared: bool
    memory: int  # bytes counted against the memory budget: its charge (weights + KV at its context) or RSS
    charge: int  # weights + mmproj + KV cache at its context, computed at start
    last_used: float  # Unix time of its last lease taken or given back
    holders: tuple[int, ...]  # pids of the client processes holding it
    workers: tuple[str, ...] = ()  # the RPC workers (`host:port`) its model is spread over
    # Its llama-server options that differ from the defaults, by their declared names (runtime/_serve/server_options.py):
    # {"kv_cache_type": "q8_0", "n_gpu_layers": 12, ...}; empty for a server started before they were recorded.
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    # Where its model sits, per device (runtime/_memory/plan.py): [{"device": "CUDA0", "layers": "layers 12-23 + output",
    # "n_layers": 13, "bytes": ...}, {"device": "CPU", ...}]; empty when everything is in RAM (no GPU-like device).
    placement: list[dict[str, Any]] = field(default_factory=list, hash=False)
    log: str = ""  # the server's log file (its stdout and stderr)
    threads: int = 0  # its CPU threads (-t/-tb, runtime/_common/threads.py); 0: none written (a model offloaded whole)
    # Its live numbers from /metrics and /slots (runtime/_serve/metrics.py): tok/s, KV use, requests, draft acceptance;
    # None when it did not answer within the bound (or was not asked: ``running_servers(live=False)``).
    metrics: ServerMetrics | None = None
    gateway: str | None = None  # the URL of the gateway (`gguf-provider serve` with no model) holding it
    key_file: str = ""  # the 0600 file holding its API key (a server on a TCP port), "" for a Unix socket


    def describe_metrics(self) -> str:
        """The live numbers in one line; "–" when the server did not answer."""
        return self.metrics.describe() if self.metrics is not None else "–"

    def describe_placement(self) -> str:
        """``CUDA0 layers 12-23 + output (1,204 MiB), CPU layers 0-11 (980 MiB)``; "" when all is in RAM."""
        return ", ".join(f"{p.get('device')} {p.get('layers')} ({int(p.get('bytes') or 0) / 2**20:,.0f} MiB)"
                         for p in self.placement)

    def describe_options(self) -> str:
        """``name=value`` for each of :attr:`options` not shown on its own (the context, the workers)."""
        return " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                        for k, v in self.options.items() if k not in ("n_ctx", "rpc_servers"))


@dataclass(frozen=True)
class BudgetStatus:
    """The memory budget of all our servers (the ``budget`` object of ``gguf-provider ps --json``)."""

    used: int  # bytes our servers hold (the sum of their `memory`)
    limit: int | None  # $GGUF_PROVIDER_MEMORY_LIMIT, None: the free memory at each start decides
    servers: int
    max_models: int | None  # $GGUF_PROVIDER_MAX_MODELS, None: no count limit
    # What our servers' memory plans put on each device, by llama.cpp's name ({"CUDA0": bytes, "CPU": bytes});
    # servers with no GPU-like device are not in it.
    devices: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        limit = f"{self.limit / 2**20:.0f} MiB" if self.limit is not None else "free memory"
        count = f"{self.servers}/{self.max_models}" if self.max_models is not None else str(self.servers)
        per = "".join(f"; {name} {n / 2**20:,.0f} MiB planned" for name, n in self.devices.items())
        return f"memory budget: {self.used / 2**20:.0f} MiB used / {limit}; servers {count}{per}"


def running_servers(*, live: bool = False) -> list[ServerStatus]:
    """The servers in the registry, after a sweep (dead servers and dead clients' leases removed); with ``live``,
    each one's :class:`~.runtime.metrics.ServerMetrics`, asked of all at once and within
    :data:`~.runtime.metrics.TOTAL_TIMEOUT` seconds however the servers behave."""
    registry.sweep()
    entries = registry.read()
    live_numbers = metrics.read_all({key: (_address(e), metrics.unified_cache(e.options.get("server_args") or ()))
                                     for key, e in entries.items()}) if live and entries else {}
    rows = []
    for key, e in entries.items():
        rss = budget.rss(e.pid)
        idle = time.time() - e.idle_since if e.idle_since else 0.0
        rows.append(ServerStatus(id=key[:12], pid=e.pid, model=e.model, ctx=e.n_ctx,
                                 address=f"unix:{e.socket}" if e.socket else e.url, rss=rss,
                                 leases=len(e.leases), idle_s=round(idle, 1), shared=e.shared,
                                 memory=max(e.charge, rss), charge=e.charge,
                                 last_used=e.last_used or e.started_at or 0.0,
                                 holders=tuple(sorted(int(p) for p in e.leases)), workers=e.rpc_servers,
                                 options=dict(e.options), placement=[dict(p) for p in e.placement], log=e.log,
                                 threads=e.threads, metrics=live_numbers.get(key), key_file=e.api_key_file or ""))
    return rows


def _address(e: registry.Entry) -> Address:
    """Where the server of ``e`` listens, with its API key (read from its 0600 key file) when it has one."""
    key = None
    if e.api_key_file:
        try:
            key = Path(e.api_key_file).read_text().strip()
        except OSError:
            pass  # gone: the server answers 401, shown as "–"
    return Address(socket=e.socket, url=e.url, api_key=key)


def memory_budget(rows: list[ServerStatus] | None = None) -> BudgetStatus:
    rows = running_servers() if rows is None else rows
    per_device: dict[str, int] = {}
    for r in rows:
        for p in r.placement:
            name = str(p.get("device"))
            per_device[name] = per_device.get(name, 0) + int(p.get("bytes") or 0)
    return BudgetStatus(used=sum(r.memory for r in rows), limit=budget.memory_limit(), servers=len(rows),
                        max_models=budget.max_models(), devices=per_device)


@dataclass(frozen=True)
class GatewayStatus:
    """A running gateway: its process, its URL, the ids of the servers it holds now, the file its clients' key is in
    ("": it takes none), its --ctx (None: fitted per model)."""

    pid: int
    url: str
    servers: tuple[str, ...]
    key_file: str = ""
    n_ctx: int | None = None


@dataclass(frozen=True)
class Status:
    """What ``gguf-provider ps`` shows: the servers we run, the memory budget they share, the gateways."""

    servers: list[ServerStatus]
    budget: BudgetStatus
    gateways: list[GatewayStatus] = field(default_factory=list)


def status(*, live: bool = False) -> Status:
    rows = running_servers(live=live)
    found = gateways()
    by_pid = {g["pid"]: g["url"] for g in found}
    rows = [replace(r, gateway=by_pid[min(set(r.holders) & set(by_pid))]) if set(r.holders) & set(by_pid) else r
            for r in rows]
    held = [GatewayStatus(g["pid"], g["url"], tuple(r.id for r in rows if g["pid"] in r.holders),
                          str(g.get("key_file") or ""), g.get("n_ctx") if isinstance(g.get("n_ctx"), int) else None)
            for g in found]
    return Status(rows, memory_budget(rows), held)


def _gateways_dir() -> Path:
    return paths.ensure_private_dir(paths.runtime_dir() / "gateways")


def register_gateway(url: str, *, key_file: str = "", n_ctx: int | None = None) -> Path:
    """Say that this process is a gateway at ``url`` (``ps`` shows which servers it holds); a file in the private
    runtime dir, removed by :func:`unregister_gateway`, or by the next reader once the process is gone."""
    path = _gateways_dir() / f"{os.getpid()}.json"
    path.write_text(json.dumps({"pid": os.getpid(), "create_time": process.create_time(os.getpid()), "url": url,
                                "key_file": str(Path(key_file).resolve()) if key_file else "", "n_ctx": n_ctx}))
    return path


def unregister_gateway(path: Path) -> None:
    path.unlink(missing_ok=True)


def gateways() -> list[dict[str, Any]]:
    """The running gateways (``pid``, ``url``); the files of gone ones are removed."""
    out = []
    for path in sorted(_gateways_dir().glob("*.json")):
        try:
            g = json.loads(path.read_text())
            alive = process.process_matches(int(g["pid"]), float(g["create_time"]))
        except (OSError, ValueError, KeyError, TypeError):
            alive, g = False, {}
        if alive:
            out.append(g)
        else:
            path.unlink(missing_ok=True)
    return out
