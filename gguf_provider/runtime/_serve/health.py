"""What a running llama-server says about itself over HTTP: ``/health``, ``/props``, ``/slots``.

:class:`HTTPHealth` is the manager's default health collaborator (runtime/_serve/manager.py); the functions are what it
and the other callers use.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...lazy import LazyModule
from .._common import process
from .._common.process import Address
from .._common.progress import Progress

if TYPE_CHECKING:
    import httpx
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

DEFAULT_START_TIMEOUT = 600.0
"""Seconds a starting server has to load its model and answer ``/health``."""


class Proc(Protocol):
    """A spawned server process, as much of it as the manager looks at."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


def read_props(address: Address, timeout: float = 5.0, *, healthy: bool = False) -> dict[str, Any]:
    """``/props``; with ``healthy``, ``/health`` must answer 200 first (a loading or broken server does not)."""
    with address.client(timeout=timeout) as c:
        if healthy:
            c.get("/health").raise_for_status()
        r = c.get("/props")
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data


def speculating(address: Address, timeout: float = 5.0) -> bool | None:
    """Whether the server's slots do speculative decoding (``/slots``); None when it does not say."""
    try:
        with address.client(timeout=timeout) as c:
            r = c.get("/slots")
            r.raise_for_status()
            slots = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    flags = [s.get("speculative") for s in slots if isinstance(s, dict)] if isinstance(slots, list) else []
    return any(f is True for f in flags) if flags and all(isinstance(f, bool) for f in flags) else None


def props_n_ctx(props: dict[str, Any]) -> int:
    dgs = props.get("default_generation_settings") or {}
    return int(dgs.get("n_ctx") or props.get("n_ctx") or 0)


class HTTPHealth:
    """Asks the server over HTTP (its Unix socket or loopback port)."""

    def wait_healthy(self, proc: Proc, address: Address, log_path: Path, *, timeout: float,
                     progress: Progress | None) -> None:
        popen = proc if isinstance(proc, subprocess.Popen) else None
        process.wait_healthy(popen, proc.pid, address, log_path, timeout=timeout, progress=progress)

    def props(self, address: Address, *, healthy: bool = False) -> dict[str, Any]:
        return read_props(address, healthy=healthy)

    def speculating(self, address: Address) -> bool | None:
        return speculating(address)
