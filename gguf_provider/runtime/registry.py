"""The per-user registry of servers that gguf-provider started, guarded by a file lock.

One JSON file (0600) maps a server key to its entry: pid + create_time + alias (the proof that we started it),
address, model, context, log path, and the leases of its client processes. Only servers listed here are ever
stopped, and only after their pid, create_time and alias all match.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock

from . import paths, process

Entry = dict[str, Any]


def registry_path() -> Path:
    return paths.home() / "servers.json"


def _lock_path() -> Path:
    return paths.home() / "servers.lock"


def key_lock(key: str) -> filelock.FileLock:
    """A lock held while one server key is being started, so racing processes start exactly one."""
    d = paths.home() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(d / f"{key}.lock"))


def _load(path: Path) -> dict[str, Entry]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        # Corrupted (a crash mid-write on a filesystem without atomic rename): keep a copy, start afresh.
        try:
            os.replace(path, path.with_suffix(f".corrupt-{int(time.time())}"))
        except OSError:
            pass
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, data: dict[str, Entry]) -> None:
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


@contextmanager
def locked(timeout: float = 30.0) -> Iterator[dict[str, Entry]]:
    """Load the registry under its lock; changes to the yielded dict are saved on exit.

    filelock uses flock(2): a lock held by a process that died is released by the kernel.
    """
    home = paths.home()
    home.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(_lock_path()), timeout=timeout):
        path = registry_path()
        data = _load(path)
        before = json.dumps(data, sort_keys=True)
        yield data
        if json.dumps(data, sort_keys=True) != before:
            _save(path, data)


def read() -> dict[str, Entry]:
    with locked() as data:
        return dict(data)


def same_server(a: Entry, b: Entry) -> bool:
    """Whether two entries name one server process (the same pid and start time)."""
    return bool(a.get("pid") == b.get("pid") and a.get("create_time") == b.get("create_time"))


def server_alive(entry: Entry) -> bool:
    return process.process_matches(int(entry["pid"]), float(entry["create_time"]), entry["alias"])


def live_leases(entry: Entry) -> dict[str, float]:
    leases: dict[str, float] = entry.get("leases", {})
    return {pid: ct for pid, ct in leases.items() if process.process_matches(int(pid), float(ct))}


def sweep_entry(entry: Entry, now: float) -> bool:
    """Prune dead leases and decide. Returns True when the entry should be removed (server dead or expired)."""
    if not server_alive(entry):
        return True
    leases = live_leases(entry)
    if leases != entry.get("leases", {}):
        entry["leases"] = leases
        if not leases and entry.get("idle_since") is None:
            entry["idle_since"] = now
    if leases:
        entry["idle_since"] = None
        return False
    keep_alive = float(entry.get("keep_alive", 300))
    if keep_alive < 0:
        return False
    idle_since = entry.get("idle_since") or now
    return now - float(idle_since) >= keep_alive


def stop_entry(entry: Entry) -> None:
    """Stop the entry's server if it is provably ours, then remove its socket and key file.

    A socket that something still listens on is left alone: the entry may be stale or forged, and the socket then
    belongs to a process we cannot prove we started.
    """
    if server_alive(entry):
        process.stop_process(int(entry["pid"]), float(entry["create_time"]), entry["alias"])
    sock = entry.get("socket")
    if sock and not _listening(sock):
        _unlink(sock)
    key_file = entry.get("api_key_file")
    if key_file and not server_alive(entry):
        _unlink(key_file)


def _listening(path: str) -> bool:
    if not hasattr(socket, "AF_UNIX"):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def sweep(only: str | None = None) -> list[Entry]:
    """Stop servers whose clients are all gone and whose keep-alive has run out; drop entries of dead servers.

    Returns the removed entries. Servers not in the registry are never touched.
    """
    removed: list[Entry] = []
    now = time.time()
    with locked() as data:
        for key in list(data):
            if only is not None and key != only:
                continue
            if sweep_entry(data[key], now):
                removed.append(data.pop(key))
    for entry in removed:
        stop_entry(entry)
    return removed
