"""The per-user registry of servers that gguf-provider started, guarded by a file lock.

One JSON file (0600) maps a server key to its :class:`Entry`: pid + create_time + alias (the proof that we started
it), address, model, context, log path, and the leases of its client processes. Only servers listed here are ever
stopped, and only after their pid, create_time and alias all match.

Entries are typed and versioned (:data:`SCHEMA_VERSION`). One written by an older version is read with defaults for
what it lacks; one from a newer version is read as far as we know its fields (the rest is kept and written back);
one that cannot prove whose server it names is dropped, and its process left alone. A file that is not JSON is set
aside (``servers.corrupt-*``) and the registry starts afresh.

:class:`Registry` is the file plus a :class:`Processes` seam (is this pid our server, stop it): the manager's race
tests give it fake processes and a temporary directory.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol, TypeGuard

import filelock

from .._common import paths, process
from . import prompt_cache

SCHEMA_VERSION = 3
"""3: start times (an entry's ``create_time``, its leases') as :func:`.process.start_time` gives them (seconds since
boot on Linux); 2: typed entries with ``schema_version``, psutil's start times; 1 (no version field): the untyped
dicts before it."""
DEFAULT_KEEP_ALIVE = 300.0  # an entry without one (the manager's default, which is what wrote it)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One server we started, as the registry stores it."""

    pid: int
    create_time: float
    alias: str  # on the server's command line: with pid and create_time, the proof that it is ours
    model: str = ""
    socket: str | None = None
    url: str | None = None
    api_key_file: str | None = None
    log: str = ""
    n_ctx: int = 0
    shared: bool = True
    keep_alive: float = DEFAULT_KEEP_ALIVE  # seconds it outlives its last lease; 0: stop then; < 0: never
    leases: Mapping[str, float] = field(default_factory=dict, hash=False)  # client pid -> its create_time
    idle_since: float | None = None  # when the last lease ended (None while leased)
    started_at: float = 0.0
    last_used: float = 0.0
    binary: str = ""
    family: str = ""  # identity without n_ctx (manager.ServerSpec.family)
    charge: int = 0  # bytes the budget charged it at start
    rss: int = 0
    rpc_servers: tuple[str, ...] = ()
    # The declared server options that differ from their defaults (server_options.summary), for `ps`.
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # The memory plan, per device: {"device": "CUDA0", "layers": "layers 12-23 + output", "n_layers", "bytes"}.
    placement: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    prompt_cache: str = ""  # its --slot-save-path: its long prompts are saved there when it stops; "": none
    threads: int = 0  # its CPU threads (-t, runtime/_common/threads.py); 0: none of ours (a model offloaded whole)
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)  # a newer version's fields
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        out["leases"] = dict(self.leases)
        out["rpc_servers"] = list(self.rpc_servers)
        out["options"] = dict(self.options)
        out["placement"] = [dict(p) for p in self.placement]
        return out

    @classmethod
    def from_json(cls, data: object) -> Entry | None:
        """The entry ``data`` describes, or None when it cannot say which process it names or where it listens."""
        if not isinstance(data, dict):
            return None
        pid, ctime, alias = data.get("pid"), data.get("create_time"), data.get("alias")
        if not _is_int(pid) or not _is_num(ctime) or not isinstance(alias, str) or not alias:
            return None
        sock, url = _opt_str(data.get("socket")), _opt_str(data.get("url"))
        if not sock and not url:
            return None
        known = {f.name for f in fields(cls)}
        leases = data.get("leases")
        version = data.get("schema_version")
        # Older versions wrote psutil's start times (the wall clock's): read as ours, so their servers stay known
        when = float if _is_int(version) and int(version) >= 3 else process.from_wall_clock
        return cls(
            pid=int(pid), create_time=when(ctime), alias=alias,
            model=_str(data.get("model")), socket=sock, url=url, api_key_file=_opt_str(data.get("api_key_file")),
            log=_str(data.get("log")), n_ctx=_int(data.get("n_ctx")),
            shared=data["shared"] if isinstance(data.get("shared"), bool) else True,
            keep_alive=float(data["keep_alive"]) if _is_num(data.get("keep_alive")) else DEFAULT_KEEP_ALIVE,
            leases={str(k): when(v) for k, v in leases.items() if _is_num(v)} if isinstance(leases, dict) else {},
            idle_since=float(data["idle_since"]) if _is_num(data.get("idle_since")) else None,
            started_at=_float(data.get("started_at")), last_used=_float(data.get("last_used")),
            binary=_str(data.get("binary")), family=_str(data.get("family")), charge=_int(data.get("charge")),
            rss=_int(data.get("rss")),
            rpc_servers=tuple(s for s in data.get("rpc_servers") or () if isinstance(s, str))
            if isinstance(data.get("rpc_servers"), list) else (),
            options=dict(data["options"]) if isinstance(data.get("options"), dict) else {},
            placement=tuple(dict(p) for p in data.get("placement") or () if isinstance(p, dict))
            if isinstance(data.get("placement"), list) else (),
            prompt_cache=_str(data.get("prompt_cache")),
            threads=_int(data.get("threads")),
            extra={k: v for k, v in data.items() if k not in known},
            # An older entry is upgraded as it is read; a newer one keeps its number (and its extra fields).
            schema_version=max(int(version), SCHEMA_VERSION) if _is_int(version) else SCHEMA_VERSION,
        )

    def same_server(self, other: Entry) -> bool:
        """Whether both name one server process (the same pid and start time)."""
        return self.pid == other.pid and self.create_time == other.create_time


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _str(v: object) -> str:
    return v if isinstance(v, str) else ""


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _float(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


class Processes(Protocol):
    """What the registry asks of the operating system."""

    def matches(self, pid: int, create_time: float, marker: str | None = None) -> bool:
        """Alive, started at ``create_time`` and (if given) with ``marker`` on its command line."""
        ...

    def create_time(self, pid: int) -> float: ...

    def stop(self, pid: int, create_time: float, marker: str) -> bool:
        """Stop the process only if :meth:`matches` proves it is the one we started."""
        ...


class OSProcesses:
    """The real processes (psutil)."""

    def matches(self, pid: int, create_time: float, marker: str | None = None) -> bool:
        return process.process_matches(pid, create_time, marker)

    def create_time(self, pid: int) -> float:
        return process.create_time(pid)

    def stop(self, pid: int, create_time: float, marker: str) -> bool:
        return process.stop_process(pid, create_time, marker)


class Registry:
    """The registry file in ``home`` (default: :func:`paths.home`, read at each use) and the processes it names."""

    def __init__(self, home: Path | None = None, processes: Processes | None = None) -> None:
        self._home = home
        self.processes: Processes = processes or OSProcesses()

    @property
    def home(self) -> Path:
        return self._home if self._home is not None else paths.home()

    def path(self) -> Path:
        return self.home / "servers.json"

    def lock_path(self) -> Path:
        return self.home / "servers.lock"

    def key_lock(self, key: str) -> filelock.FileLock:
        """A lock held while one server key is being started, so racing processes start exactly one."""
        d = self.home / "locks"
        d.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(d / f"{key}.lock"))

    @contextmanager
    def locked(self, timeout: float = 30.0) -> Iterator[dict[str, Entry]]:
        """Load the registry under its lock; changes to the yielded dict are saved on exit.

        filelock uses flock(2): a lock held by a process that died is released by the kernel.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.lock_path()), timeout=timeout):
            path = self.path()
            data = _load(path)
            before = _dump(data)
            yield data
            if _dump(data) != before:
                _save(path, data)

    def read(self) -> dict[str, Entry]:
        with self.locked() as data:
            return dict(data)

    def server_alive(self, entry: Entry) -> bool:
        return self.processes.matches(entry.pid, entry.create_time, entry.alias)

    def live_leases(self, entry: Entry) -> dict[str, float]:
        return {pid: ct for pid, ct in entry.leases.items()
                if pid.isdigit() and self.processes.matches(int(pid), ct)}

    def sweep_entry(self, entry: Entry, now: float) -> tuple[Entry, bool]:
        """Prune dead leases and decide: the updated entry, and whether it should be removed (server dead or
        expired)."""
        if not self.server_alive(entry):
            return entry, True
        leases = self.live_leases(entry)
        if leases != dict(entry.leases):
            idle = now if not leases and entry.idle_since is None else entry.idle_since
            entry = replace(entry, leases=leases, idle_since=idle)
        if leases:
            return (replace(entry, idle_since=None) if entry.idle_since is not None else entry), False
        if entry.keep_alive < 0:
            return entry, False
        idle_since = entry.idle_since or now
        return entry, now - idle_since >= entry.keep_alive

    def stop_entry(self, entry: Entry, *, save_prompts: bool = True) -> None:
        """Stop the entry's server if it is provably ours (first saving its long prompts when it has a prompt cache
        and ``save_prompts``: runtime/_serve/prompt_cache.py, bounded in time), then remove its socket and key file.

        A socket that something still listens on is left alone: the entry may be stale or forged, and the socket
        then belongs to a process we cannot prove we started.
        """
        if self.server_alive(entry):
            if save_prompts and entry.prompt_cache:
                prompt_cache.save_slots(_address(entry), Path(entry.prompt_cache), model=entry.model)
            log.info("stopping server pid %d (%s); its log: %s", entry.pid, os.path.basename(entry.model),
                     entry.log or "none")
            self.processes.stop(entry.pid, entry.create_time, entry.alias)
        if entry.socket and not _listening(entry.socket):
            _unlink(entry.socket)
        if entry.api_key_file and not self.server_alive(entry):
            _unlink(entry.api_key_file)

    def sweep(self, only: str | None = None, now: float | None = None) -> list[Entry]:
        """Stop servers whose clients are all gone and whose keep-alive has run out; drop entries of dead servers.

        Returns the removed entries. Servers not in the registry are never touched.
        """
        removed: list[Entry] = []
        now = time.time() if now is None else now
        with self.locked() as data:
            for key in list(data):
                if only is not None and key != only:
                    continue
                entry, remove = self.sweep_entry(data[key], now)
                if remove:
                    log.debug("sweep: server pid %d (%s) %s", entry.pid, os.path.basename(entry.model),
                              "is gone" if not self.server_alive(entry) else "outlived its keep_alive")
                    removed.append(entry)
                    del data[key]
                else:
                    data[key] = entry
        for entry in removed:
            self.stop_entry(entry)
        return removed


def _load(path: Path) -> dict[str, Entry]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        # Corrupted (a crash mid-write on a filesystem without atomic rename): keep a copy, start afresh.
        try:
            os.replace(path, path.with_suffix(f".corrupt-{int(time.time())}"))
        except OSError:
            pass
        return {}
    if not isinstance(raw, dict):
        return {}
    data = {}
    for key, value in raw.items():
        entry = Entry.from_json(value)
        if entry is not None:  # one that proves nothing is dropped; its process is not ours to touch
            data[str(key)] = entry
    return data


def _dump(data: dict[str, Entry]) -> str:
    return json.dumps({k: e.to_json() for k, e in data.items()}, sort_keys=True, indent=1)


def _save(path: Path, data: dict[str, Entry]) -> None:
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_dump(data))
    os.replace(tmp, path)


def _address(entry: Entry) -> process.Address:
    key = None
    if entry.api_key_file:
        try:
            key = Path(entry.api_key_file).read_text().strip()
        except OSError:
            pass
    return process.Address(socket=entry.socket, url=entry.url, api_key=key)


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


# --- the default registry (this user's home, real processes) -----------------------------------------------------

_default = Registry()


def default() -> Registry:
    return _default


def registry_path() -> Path:
    return _default.path()


def _lock_path() -> Path:
    return _default.lock_path()


def key_lock(key: str) -> filelock.FileLock:
    return _default.key_lock(key)


@contextmanager
def locked(timeout: float = 30.0) -> Iterator[dict[str, Entry]]:
    with _default.locked(timeout) as data:
        yield data


def read() -> dict[str, Entry]:
    return _default.read()


def same_server(a: Entry, b: Entry) -> bool:
    return a.same_server(b)


def server_alive(entry: Entry) -> bool:
    return _default.server_alive(entry)


def live_leases(entry: Entry) -> dict[str, float]:
    return _default.live_leases(entry)


def sweep_entry(entry: Entry, now: float) -> tuple[Entry, bool]:
    return _default.sweep_entry(entry, now)


def stop_entry(entry: Entry) -> None:
    _default.stop_entry(entry)


def sweep(only: str | None = None) -> list[Entry]:
    return _default.sweep(only)
