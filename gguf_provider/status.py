"""The status views that both front ends print: the servers gguf-provider runs (``gguf-provider ps``, ``%gguf ps``)
and the models on this machine (``gguf-provider models``, ``%gguf list``).

Rows only, no formatting: the CLI prints them as text or JSON, the magics as a table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from .runtime import registry
from .runtime.models import LocalModel, list_local_models


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


def running_servers() -> list[ServerStatus]:
    """The servers in the registry, after a sweep (dead servers and dead clients' leases removed)."""
    registry.sweep()
    rows = []
    for key, e in registry.read().items():
        try:
            rss = psutil.Process(int(e["pid"])).memory_info().rss
        except psutil.Error:
            rss = 0
        idle = time.time() - e["idle_since"] if e.get("idle_since") else 0.0
        rows.append(ServerStatus(id=key[:12], pid=e["pid"], model=e["model"], ctx=e["n_ctx"],
                                 address=f"unix:{e['socket']}" if e.get("socket") else e.get("url"), rss=rss,
                                 leases=len(e.get("leases", {})), idle_s=round(idle, 1),
                                 shared=e.get("shared", True)))
    return rows


def local_models() -> list[LocalModel]:
    """The GGUF models on this machine: the models dirs, then the Hugging Face cache (mmproj files left out)."""
    return list_local_models()
