"""Start, share and stop llama-server processes.

``acquire(spec)`` returns a :class:`Lease` on a healthy server for the spec: an existing shared server when one
matches (checked by pid, create_time, /health, /props model path and alias), else a new one. Leases are counted
per client process in the registry; when the last goes, the server stops after ``keep_alive`` seconds (a small
watchdog process enforces it even if every client was killed).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import filelock
import httpx

from ..._warn import warn
from ...errors import (
    DeviceOutOfMemoryError,
    GGUFProviderError,
    InsufficientMemoryError,
    MemoryBudgetWarning,
    ServerConnectionError,
    ServerStartError,
    ServerTimeoutError,
)
from .._common import gguf, paths, process
from .._common import threads as threads_mod
from .._common.cancel import Cancel
from .._common.cancel import check as check_cancel
from .._common.gguf import GGUFHeader
from .._common.process import Address
from .._common.progress import Progress
from .._install import backend as backend_mod
from .._install import discovery, install
from .._memory import devices as devices_mod
from .._memory import fit as fit_mod
from .._memory import plan as plan_mod
from .._memory import rpc as rpc_mod
from . import budget as budget_mod
from . import diagnose, features, prompt_cache, registry, server_options
from . import speculative as speculative_mod
from .argv import api_name, build_argv
from .budget import MemoryBudget, local_share
from .health import DEFAULT_START_TIMEOUT, HTTPHealth, Proc, props_n_ctx, read_props
from .server_options import (
    ServerSpec,
)

DEFAULT_KEEP_ALIVE = 300.0
"""Seconds a shared server outlives its last client; ``$GGUF_PROVIDER_KEEP_ALIVE`` overrides it."""

logger = logging.getLogger(__name__)  # (`log` is the server's log file in _spawn)


@dataclass
class ServerInfo:
    """A running server as a client sees it."""

    key: str
    pid: int
    create_time: float
    alias: str
    address: Address
    log_path: Path
    model: str
    n_ctx: int
    props: dict[str, Any] = field(default_factory=dict)
    asked_ctx: int | None = None  # set when a server with a larger context was shared for a smaller ``n_ctx``
    prompt_cache: str = ""  # its prompt cache's directory (runtime/_serve/prompt_cache.py); "": none
    flags: dict[str, bool] = field(default_factory=dict)  # its binary's probed flags (features.py); {}: unknown
    server_args: tuple[str, ...] = ()  # the user's own flags it was started with

    @property
    def ends_at_context(self) -> bool:
        """Whether the server itself refuses a prompt that does not fit its context (``exceed_context_size_error``)
        and ends a reply where the context ends (finish reason ``length``): a server we started from a build whose
        context shift is off unless asked (its --help lists ``--context-shift``), not asked for it. Then a request
        need not be counted before it is sent (engine.Engine.aprepare)."""
        return bool(self.flags.get("--context-shift")) and "--context-shift" not in self.server_args

    def alive(self) -> bool:
        return process.process_matches(self.pid, self.create_time, self.alias)

    def log_tail(self, lines: int = process.LOG_TAIL_LINES) -> str:
        return process.log_tail(self.log_path, lines)

    def check_request(self, payload: dict[str, Any]) -> None:
        """ValueError when ``payload`` asks for what this server's build lacks (features.py)."""
        features.request_needs(payload, self.flags, self.model)


class Lease:
    """A claim on a running server; :meth:`release` (or process exit) gives it back."""

    def __init__(self, manager: ServerManager, info: ServerInfo, *, started: bool = False) -> None:
        self._manager = manager
        self.info = info
        self.started = started  # this acquire started the server (it was not running before)
        self.released = False

    def release(self, *, stop: bool = False) -> None:
        """Give the lease back; ``stop``: the server stops now when no other client holds it, instead of after its
        keep_alive (Ollama's ``keep_alive: 0``)."""
        if not self.released:
            self.released = True
            self._manager._release(self.info.key, stop_unused=stop)

    def abandon(self) -> None:
        """Release a lease whose caller went away before using it (a cancelled load): a server this acquire
        started stops now when no other client holds it, instead of living on for its keep_alive."""
        if not self.released:
            self.released = True
            self._manager._release(self.info.key, stop_unused=self.started)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the manager's collaborators ---------------------------------------------------------------------------------
# ServerManager reaches the world only through these (the pattern of Ollama's server/sched.go): the defaults below
# are the real ones, and tests/unit_tests/test_manager_races.py drives the manager with fakes.


class Launcher(Protocol):
    def spawn(self, argv: list[str], log_path: Path, *, private: bool) -> Proc:
        """Start llama-server with ``argv``, its output to ``log_path``."""
        ...

    def watchdog(self, key: str, entry: registry.Entry, home: Path) -> None:
        """Start the process that stops the server once its clients are gone (runtime/_serve/watchdog.py)."""
        ...


class Health(Protocol):
    def wait_healthy(self, proc: Proc, address: Address, log_path: Path, *, timeout: float,
                     progress: Progress | None) -> None:
        """Return once ``/health`` answers 200; ServerStartError (with the log tail) when the process exits or
        ``timeout`` runs out."""
        ...

    def props(self, address: Address, *, healthy: bool = False) -> dict[str, Any]:
        """``/props`` (with ``healthy``: after a 200 from ``/health``); httpx errors or ValueError otherwise."""
        ...

    def speculating(self, address: Address) -> bool | None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds: what the registry's timestamps (idle_since, last_used) are, across processes."""
        ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class AdmissionLock(Protocol):
    @property
    def is_locked(self) -> bool: ...

    def acquire(self) -> object: ...

    def release(self) -> None: ...


class Budget(Protocol):
    """The memory all our servers share (runtime/_serve/budget.py)."""

    def admission_lock(self) -> AdmissionLock:
        """Held while one server is admitted; raises filelock.Timeout when another admission takes too long."""
        ...

    def admit(self, header: GGUFHeader, file_bytes: int, *, requested: int | None, n_gpu_layers: int | None,
              memory: Callable[[], fit_mod.MemoryInfo], cache_type: str, draft: GGUFHeader | None,
              local_share: float, reg: registry.Registry,
              cache_ram: Callable[[int], int] | None = None) -> budget_mod.Admission:
        """Make room (evicting idle servers of ``reg``) and choose the context; ``cache_ram`` charged too."""
        ...

    def memory(self, binary: Path, workers: Sequence[rpc_mod.WorkerInfo]) -> fit_mod.MemoryInfo: ...

    def devices(self, binary: Path, rpc: Sequence[str]) -> list[devices_mod.Device]:
        """What a server of ``binary`` can place layers on now: its GPU-like devices, then host RAM (``CPU``)."""
        ...

    def rss(self, pid: int) -> int: ...


class Installer(Protocol):
    def find(self, explicit: str | None) -> Path:
        """The llama-server binary to run (``explicit``: the spec's own)."""
        ...

    def capabilities(self, binary: Path) -> discovery.ServerCapabilities: ...


class ProcessLauncher:
    """Spawns llama-server (runtime/_common/process.py) and the watchdog as real processes."""

    def spawn(self, argv: list[str], log_path: Path, *, private: bool) -> Proc:
        return process.spawn(argv, log_path, private=private)

    def watchdog(self, key: str, entry: registry.Entry, home: Path) -> None:
        _spawn_watchdog(key, entry, home)


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Ports(Protocol):
    """Where a server that listens on TCP (``port=``, or Windows) gets its loopback port."""

    def is_free(self, port: int) -> bool: ...

    def free(self) -> int:
        """A port free now."""
        ...


class LoopbackPorts:
    def is_free(self, port: int) -> bool:
        return process.port_is_free(port)

    def free(self) -> int:
        return process.free_port()


class BinaryInstaller:
    """The discovery order of runtime/_install/discovery.py (installing one on first use), and the binary's ``--help`` probe."""

    def find(self, explicit: str | None) -> Path:
        return install.ensure_installed(explicit)

    def capabilities(self, binary: Path) -> discovery.ServerCapabilities:
        return discovery.probe(binary)


def _default_registry() -> registry.Registry:
    return registry.default()


class ServerManager:
    """Per-process front of the registry: acquires, counts and releases leases.

    Every collaborator is a parameter with the real one as default; ``pid`` is the client process the leases are
    recorded for (this one).
    """

    def __init__(self, *, registry: registry.Registry | None = None, launcher: Launcher | None = None,
                 health: Health | None = None, clock: Clock | None = None, budget: Budget | None = None,
                 installer: Installer | None = None, pid: int | None = None,
                 cores: Callable[[], int] | None = None, ports: Ports | None = None,
                 runtime_dir: Callable[[], Path] | None = None) -> None:
        self._registry = registry if registry is not None else _default_registry()
        self._launcher: Launcher = launcher or ProcessLauncher()
        self._health: Health = health or HTTPHealth()
        self._clock: Clock = clock or SystemClock()
        self._budget: Budget = budget or MemoryBudget()
        self._installer: Installer = installer or BinaryInstaller()
        self._cores = cores or threads_mod.physical_cores  # what the CPU servers' threads split (runtime/threads)
        self._ports: Ports = ports or LoopbackPorts()
        self._runtime_dir = runtime_dir or paths.runtime_dir  # sockets, key files and logs of the servers
        self._pid = os.getpid() if pid is None else pid
        self._pid_ctime: float | None = None
        # Guards _refs and _key_locks, held for microseconds: a lease release never waits for a load.
        self._lock = threading.Lock()
        # One lock per server key, held while that key's server is attached or started: two models load at once.
        self._key_locks: dict[str, threading.Lock] = {}
        self._refs: dict[str, int] = {}
        self._swept = False
        atexit.register(self.release_all)

    # -- public -----------------------------------------------------------------------------------------------

    def acquire(self, spec: ServerSpec, *, shared: bool = True, keep_alive: float | None = None,
                start_timeout: float = DEFAULT_START_TIMEOUT, progress: Progress | None = None,
                cancel: Cancel | None = None) -> Lease:
        """A lease on a healthy server for ``spec``. ``cancel`` (runtime/_common/cancel.py) stops the acquire at its next
        checkpoint with :class:`~gguf_provider.errors.LoadCancelled`, stopping a server it was starting."""
        if keep_alive is None:
            keep_alive = default_keep_alive()
        if cancel is not None:
            progress = cancel.progress(progress)
        check_cancel(cancel)
        binary = self._installer.find(spec.llama_server)
        check_cancel(cancel)
        if not self._swept:
            self._swept = True
            self._registry.sweep(now=self._clock.time())  # orphans whose clients all died
        ident = spec.identity(binary)
        if not shared:
            ident["private"] = [self._pid, secrets.token_hex(8)]
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
        family = spec.family(binary)
        if shared and spec.n_ctx:
            # A running server of the same family with at least this context serves it (a second one would
            # only cost memory).
            for other in self._compatible(family, spec.n_ctx, key):
                with self._key_lock(other), self._registry.key_lock(other):
                    info = self._attach(other)
                    if info is not None:
                        info.asked_ctx = spec.n_ctx
                        self._count(other)
                        return Lease(self, info)
        with self._key_lock(key), self._registry.key_lock(key):
            info = self._attach(key) if shared else None
            started = info is None
            if info is None:
                info = self._start(key, spec, binary, shared=shared, keep_alive=keep_alive,
                                   start_timeout=start_timeout, progress=progress, family=family, cancel=cancel)
            self._count(key)
        return Lease(self, info, started=started)

    def release_all(self) -> None:
        with self._lock:
            keys = list(self._refs)
            self._refs.clear()
        for key in keys:
            self._drop_lease(key)

    # -- internals --------------------------------------------------------------------------------------------

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _count(self, key: str) -> None:
        with self._lock:
            self._refs[key] = self._refs.get(key, 0) + 1

    def _my_lease(self) -> tuple[str, float]:
        if self._pid_ctime is None:
            self._pid_ctime = self._registry.processes.create_time(self._pid)
        return str(self._pid), self._pid_ctime

    def _compatible(self, family: str, n_ctx: int, own_key: str) -> list[str]:
        """Keys of running shared servers of ``family`` whose context is at least ``n_ctx``, smallest first."""
        found = [(e.n_ctx, k) for k, e in self._registry.read().items()
                 if k != own_key and e.family == family and e.shared and e.n_ctx >= n_ctx]
        return [k for _, k in sorted(found)]

    def _attach(self, key: str) -> ServerInfo | None:
        reg = self._registry
        with reg.locked() as data:
            entry = data.get(key)
            if entry is None:
                return None
            if not reg.server_alive(entry):
                del data[key]  # dead, or its pid now runs another program: only the entry goes
                return None
        info = _info(key, entry)
        try:
            props = self._health.props(info.address, healthy=True)
        except (httpx.HTTPError, ValueError) as exc:
            if not self._still_registered(key, entry):
                return None  # stopped while we asked (its last lease ended; every stop unregisters first): start afresh
            # Our server (pid, start time and alias match) but it does not answer: starting another one here
            # would overwrite its entry and orphan it. Say so instead.
            err = ServerTimeoutError if isinstance(exc, httpx.TimeoutException) else ServerConnectionError
            raise err(
                f"the shared llama-server for this model (pid {info.pid}, {info.address.describe()}) is running "
                f"but does not answer ({type(exc).__name__}); it may be stopped or overloaded. Stop it with "
                f"`gguf-provider stop {key[:12]}` and try again", info.log_tail(10), info.log_path) from exc
        if props.get("model_alias") not in (None, info.alias, api_name(Path(info.model))) or (
                props.get("model_path") and os.path.realpath(props["model_path"]) != os.path.realpath(info.model)):
            return None  # the address answers, but not as our server
        info.props = props
        info.n_ctx = props_n_ctx(props) or info.n_ctx
        if entry.binary and Path(entry.binary).is_file():
            info.flags = self._installer.capabilities(Path(entry.binary)).flags
        if not self._add_lease(key, entry):
            return None  # stopped meanwhile (evicted to make room): start afresh
        logger.info("attached to the running server pid %d for %s (n_ctx %d, %s); its log: %s", info.pid,
                    Path(info.model).name, info.n_ctx, info.address.describe(), info.log_path)
        return info

    def _still_registered(self, key: str, entry: registry.Entry) -> bool:
        """Whether ``key`` still names the server of ``entry`` and that server still runs."""
        now = self._registry.read().get(key)
        return now is not None and now.same_server(entry) and self._registry.server_alive(now)

    def _add_lease(self, key: str, seen: registry.Entry) -> bool:
        me, ctime = self._my_lease()
        with self._registry.locked() as data:
            entry = data.get(key)
            if entry is None or not entry.same_server(seen):
                return False
            data[key] = replace(entry, leases={**entry.leases, me: ctime}, idle_since=None,
                                last_used=self._clock.time())
            return True

    def _start(self, key: str, spec: ServerSpec, binary: Path, *, shared: bool, keep_alive: float,
               start_timeout: float, progress: Progress | None, family: str = "",
               cancel: Cancel | None = None) -> ServerInfo:
        caps = self._installer.capabilities(binary)
        # A file that is not GGUF or is cut short fails here, typed and before anything is spawned.
        header = gguf.read_header(spec.model)
        gguf.require_model(header, spec.model)
        draft = gguf.read_header(spec.draft_model) if spec.draft_model else None
        spec.check(caps, [h for h in (header, draft) if h is not None])  # each option's own check (server_options)
        features.check(spec, caps)  # what the user set that this build cannot do: refused, naming the flag
        features.say_dropped(caps, binary)  # the optimisations it lacks: left out, in one line
        why_not = speculative_mod.unsupported(spec.speculative, caps)
        if why_not:
            speculative_mod.warn_once(
                f"speculative={spec.speculative!r}: this llama-server runs without speculative decoding ({why_not}: "
                f"{binary}); a newer build has it (`gguf-provider server install`), or pass speculative=False",
                str(binary))
        # Every worker answers before anything is spawned (llama-server would abort on one it cannot reach).
        workers = rpc_mod.probe_all(spec.rpc_servers)
        files = [*(spec.shards or (spec.model,)), *([spec.mmproj] if spec.mmproj else []),
                 *(spec.draft_shards or ([spec.draft_model] if spec.draft_model else []))]
        size = sum(p.stat().st_size for p in files)
        backend_mod.announce_once(binary)  # which backend runs, and why, once per process (a warning when wrong)
        # What the binary can place layers on now (GPU-like devices, RPC workers' devices, host RAM).
        devices = seen = self._budget.devices(binary, spec.rpc_servers)
        for attempt in (1, 2):
            check_cancel(cancel)
            # One admission at a time across processes: evictions, the context and the registration are decided
            # together, so racing processes never both count the same free memory.
            try:
                admission_lock = self._budget.admission_lock()
                admission_lock.acquire()
            except filelock.Timeout as exc:
                raise ServerTimeoutError(f"another process has been starting a server for {exc.lock_file}'s "
                                         f"{budget_mod.ADMISSION_TIMEOUT:.0f} s limit; try again") from None
            placed: plan_mod.Plan | None = None
            try:
                admitted = self._budget.admit(
                    header, size, requested=spec.n_ctx if spec.n_ctx and spec.n_ctx > 0 else None,
                    n_gpu_layers=spec.n_gpu_layers, memory=lambda: self._budget.memory(binary, workers),
                    cache_type=spec.kv_cache_type, draft=draft,
                    local_share=local_share(header, spec.n_gpu_layers, workers), reg=self._registry,
                    cache_ram=_cache_ram(spec, caps, header))
                placed = _plan(header, spec, devices, admitted.n_ctx)
                return self._spawn(key, spec, binary, caps, header.pooling_type, admitted, shared=shared,
                                   keep_alive=keep_alive, start_timeout=start_timeout, progress=progress,
                                   family=family, admission_lock=admission_lock, placed=placed,
                                   recurrent=header.has_ssm)
            except DeviceOutOfMemoryError as exc:
                devices = _after_out_of_memory(exc, header, spec, devices, placed, attempt, seen)
            finally:
                if admission_lock.is_locked:
                    admission_lock.release()
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _spawn(self, key: str, spec: ServerSpec, binary: Path, caps: discovery.ServerCapabilities,
               header_pooling: int | None, admitted: budget_mod.Admission, *, shared: bool, keep_alive: float,
               start_timeout: float, progress: Progress | None, family: str,
               admission_lock: AdmissionLock, placed: plan_mod.Plan | None = None,
               recurrent: bool = False) -> ServerInfo:
        reg = self._registry
        n_ctx = placed.n_ctx if placed is not None else admitted.n_ctx
        run = self._runtime_dir()
        tag = f"{key[:16]}-{secrets.token_hex(3)}"
        alias = f"~gguf-provider-{key[:16]}"  # "~": sorts after the model's name (argv.build_argv)
        log_path = run / f"{tag}.log"
        api_key_file: Path | None = None
        # TCP on loopback with a key file: asked for, on Windows, or a build that binds no Unix socket
        if spec.port is not None or os.name == "nt" or not caps.flags.get(discovery.UNIX_SOCKET, True):
            port = spec.port if spec.port and self._ports.is_free(spec.port) else self._ports.free()
            api_key = secrets.token_urlsafe(32)
            api_key_file = run / f"{tag}.key"
            fd = os.open(api_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(api_key + "\n")
            address = Address(url=f"http://127.0.0.1:{port}", api_key=api_key)
        else:
            address = Address(socket=str(run / f"{tag}.sock"))
        slot_dir, why_no_cache = _prompt_dir(spec, binary, caps)
        n_threads, on_cpu = self._threads(spec, placed)
        argv = build_argv(spec, binary, caps, alias, n_ctx, address, api_key_file, header_pooling=header_pooling,
                          placement=tuple(placed.args()) if placed is not None and _places(spec) else (),
                          slot_save_path=slot_dir, recurrent=recurrent, threads=n_threads,
                          cache_ram=admitted.cache_ram if _passes_cache_ram(spec, caps) else None)
        with open(log_path, "ab") as log:
            log.write(f"# gguf-provider: {' '.join(argv)}\n".encode())
            if why_no_cache:
                log.write(f"# gguf-provider: prompt cache off: {why_no_cache}\n".encode())
        if why_no_cache:
            logger.info("prompt cache off for %s: %s", spec.model.name, why_no_cache)
        logger.info("starting llama-server for %s (n_ctx %d, %s, %s); its log: %s", spec.model.name, n_ctx,
                    "shared" if shared else "private", address.describe(), log_path)
        logger.debug("llama-server command line: %s", " ".join(argv))  # a key file's path, never a key
        started = self._clock.monotonic()
        me, my_ctime = self._my_lease()
        # Spawned under the registry lock and registered at once: a client killed in between would leave a shared
        # server that no entry names (no sweep or `stop` could prove it ours); this keeps that gap to milliseconds.
        with reg.locked() as data:
            proc = self._launcher.spawn(argv, log_path, private=not shared)
            now = self._clock.time()
            entry = registry.Entry(
                pid=proc.pid, create_time=reg.processes.create_time(proc.pid), alias=alias, model=str(spec.model),
                socket=address.socket, url=address.url, api_key_file=str(api_key_file) if api_key_file else None,
                log=str(log_path), n_ctx=n_ctx, shared=shared, keep_alive=keep_alive if shared else 0,
                leases={me: my_ctime}, idle_since=None, started_at=now, last_used=now, binary=str(binary),
                family=family, charge=admitted.charge, rpc_servers=tuple(spec.rpc_servers),
                options=server_options.summary(spec), placement=tuple(placed.summary()) if placed is not None else (),
                prompt_cache=str(slot_dir) if slot_dir else "",
                threads=on_cpu)
            data[key] = entry
        admission_lock.release()  # registered with its charge: the next admission counts it
        if shared and keep_alive >= 0:
            # Before the load, not after: a client killed while the model loads must not orphan the server.
            self._launcher.watchdog(key, entry, reg.home)
        try:
            self._health.wait_healthy(proc, address, log_path, timeout=start_timeout, progress=progress)
            props = self._health.props(address)
        except BaseException as exc:
            logger.warning("llama-server pid %d for %s did not start (%s); its log: %s", proc.pid,
                           spec.model.name, type(exc).__name__, log_path)
            with reg.locked() as data:
                if key in data and data[key].same_server(entry):
                    del data[key]
            reg.stop_entry(entry, save_prompts=False)
            if isinstance(exc, ServerStartError):
                typed = diagnose.start_failure(exc, model=spec.model, binary=binary, workers=spec.rpc_servers)
                if typed is not exc:
                    raise typed from exc
            if isinstance(exc, httpx.HTTPError | ValueError):  # healthy, then gone before /props answered
                raise ServerStartError(
                    f"llama-server stopped answering right after it became healthy ({type(exc).__name__}: {exc})",
                    process.log_tail(log_path), log_path) from exc
            raise
        n_eff = props_n_ctx(props) or n_ctx
        logger.info("llama-server pid %d for %s is ready after %.1f s (n_ctx %d, %s); its log: %s", proc.pid,
                    spec.model.name, self._clock.monotonic() - started, n_eff, address.describe(), log_path)
        if spec.speculative != speculative_mod.OFF and not speculative_mod.unsupported(spec.speculative, caps) \
                and self._health.speculating(address) is False:
            speculative_mod.warn_once(
                f"llama-server started {spec.model.name} without speculative decoding although "
                f"speculative={speculative_mod.describe(spec.speculative, spec.draft_model)!r} asked for it (it "
                f"turned it off for this model; see {log_path})", f"{binary}|{spec.model}")
        with reg.locked() as data:
            if key in data and data[key].same_server(entry):
                data[key] = replace(data[key], n_ctx=n_eff, rss=self._budget.rss(proc.pid))
        info = _info(key, entry)
        info.props, info.n_ctx, info.flags = props, n_eff, caps.flags
        return info

    def _threads(self, spec: ServerSpec, placed: plan_mod.Plan | None) -> tuple[int | None, int]:
        """The ``-t``/``-tb`` of a start (runtime/_common/threads.py) and the threads it computes with on the CPU (what the
        registry counts and `ps` shows; 0: none). The user's ``threads`` or ``-t`` in ``server_args`` (its
        llama.cpp default, every physical core, for -1), else the physical cores split among our CPU servers alive
        now and this one; none for a model offloaded whole. Called under the admission lock: no other start of
        ours decides meanwhile."""
        if _offloaded_whole(spec, placed):
            return spec.threads, 0
        if spec.threads is not None:
            return spec.threads, spec.threads
        if threads_mod.sets_threads(spec.server_args):
            asked = threads_mod.user_threads(spec.server_args)
            return None, asked if asked is not None and asked > 0 else self._cores()
        reg = self._registry
        others = sum(1 for e in reg.read().values() if e.threads > 0 and reg.server_alive(e))
        n = threads_mod.share(self._cores(), others)
        return n, n

    def _release(self, key: str, *, stop_unused: bool = False) -> None:
        with self._lock:
            n = self._refs.get(key, 0) - 1
            if n > 0:
                self._refs[key] = n
                return
            self._refs.pop(key, None)
        self._drop_lease(key, stop_unused=stop_unused)

    def _drop_lease(self, key: str, *, stop_unused: bool = False) -> None:
        me = str(self._pid)
        with self._registry.locked() as data:
            entry = data.get(key)
            if entry is None or me not in entry.leases:
                return  # not (or no longer) ours: e.g. the registry was reset and the key names another server
            now = self._clock.time()
            leases = {pid: ct for pid, ct in entry.leases.items() if pid != me}
            entry = replace(entry, leases=leases, last_used=now, idle_since=None if leases else now)
            if leases or (entry.keep_alive != 0 and not stop_unused):
                data[key] = entry
                return
            del data[key]
        why = "its last client asked it to stop (a cancelled load, keep_alive 0)" if stop_unused else \
            "its keep_alive is 0"
        logger.info("the last lease of server pid %d (%s) ended and %s: stopping it", entry.pid, Path(entry.model).name,
                    why)
        self._registry.stop_entry(entry)


# llama-server flags with which the user places layers themselves: the plan is then only reported, not passed.
USER_PLACEMENT_FLAGS = frozenset({"-ngl", "--n-gpu-layers", "--gpu-layers", "-ts", "--tensor-split", "-ncmoe",
                                  "--n-cpu-moe", "-cmoe", "--cpu-moe", "-ot", "--override-tensor", "-sm",
                                  "--split-mode", "-dev", "--device", "-fit", "--fit"})


def _offloaded_whole(spec: ServerSpec, placed: plan_mod.Plan | None) -> bool:
    """Whether no layer computes on this machine's CPU: the plan (or the user's -ngl) puts every layer and the
    output head on GPU-like devices."""
    if placed is None or not placed.gpus or placed.n_cpu_moe:
        return False
    n_gpu = spec.n_gpu_layers if spec.n_gpu_layers is not None and spec.n_gpu_layers >= 0 else placed.n_gpu_layers
    return n_gpu >= placed.n_layer + 1


def _places(spec: ServerSpec) -> bool:
    """Whether the plan's -ngl / --tensor-split / --n-cpu-moe go on the command line (the user set none)."""
    return spec.n_gpu_layers is None and not USER_PLACEMENT_FLAGS.intersection(spec.server_args)


def _plan(header: GGUFHeader, spec: ServerSpec, devices: Sequence[devices_mod.Device],
          admitted_ctx: int) -> plan_mod.Plan | None:
    """The memory plan of a start on ``devices`` (None without a GPU-like device: everything is in RAM), its
    automatic context no larger than the budget admitted. A model that fits nowhere with everything automatic is
    refused here, before anything is spawned."""
    if not any(d.kind != "cpu" for d in devices):
        return None
    requested = spec.n_ctx if spec.n_ctx and spec.n_ctx > 0 else None
    slots = spec.n_parallel or 4
    outputs = slots * (1 + 64) if spec.speculative != speculative_mod.OFF and not spec.embedding else slots
    placed = plan_mod.for_model(header, list(spec.shards or (spec.model,)), devices, n_ctx=requested,
                                max_ctx=admitted_ctx, n_gpu_layers=spec.n_gpu_layers, cache_type=spec.kv_cache_type,
                                model=spec.model.name, n_outputs=outputs, other=_beside(spec))
    if not placed.fits and requested is None and _places(spec):
        raise InsufficientMemoryError(
            f"{spec.model.name} does not fit: {placed.reason}. Levers: a smaller quant, a quantized KV cache "
            f"(kv_cache_type='q8_0'), an explicit smaller n_ctx; `gguf-provider plan {spec.model}` shows the plan")
    return placed


def _beside(spec: ServerSpec) -> Callable[[int], int] | None:
    """What the server loads beside the model, at a context: the projector file, and the draft model's files, KV
    cache and compute buffer (planned on the first GPU, as llama.cpp puts them; :func:`.plan.place`)."""
    projector = spec.mmproj.stat().st_size if spec.mmproj else 0
    draft = gguf.read_header(spec.draft_model) if spec.draft_model else None
    draft_files = sum(p.stat().st_size for p in (spec.draft_shards or ([spec.draft_model] if spec.draft_model else [])))
    if not projector and draft is None:
        return None
    per = fit_mod.cache_type_bytes(spec.kv_cache_type)

    def at(n_ctx: int) -> int:
        if draft is None:
            return projector
        return (projector + draft_files + fit_mod.kv_cache_bytes(draft, n_ctx, type_k_bytes=per, type_v_bytes=per)
                + plan_mod.compute_bytes(draft, n_ctx))

    return at


def _after_out_of_memory(exc: DeviceOutOfMemoryError, header: GGUFHeader, spec: ServerSpec,
                         devices: Sequence[devices_mod.Device], placed: plan_mod.Plan | None,
                         attempt: int, seen: Sequence[devices_mod.Device]) -> list[devices_mod.Device]:
    """A start that ran out of device memory: the devices to plan the one retry on (the failing device counted
    with half of what the plan put there, so fewer layers, then a smaller automatic context, go to it), with a
    warning saying so; or the final :class:`DeviceOutOfMemoryError`, naming the device, what was needed and what
    was free, when this was the retry or the layers were not ours to move."""
    failing = [d for d in devices if d.kind != "cpu" and (exc.device is None or d.name == exc.device)]
    held = placed.by_device() if placed is not None else {}
    if attempt > 1 or placed is None or not failing or not _places(spec):
        free = "; ".join(f"{d.name} had {d.free / 2**20:,.0f} MiB free" for d in seen
                         if d.name in {f.name for f in failing}) or "free memory unknown"
        what = (f" It failed again after a retry with {placed.n_gpu_layers} layers on the GPU at n_ctx "
                f"{placed.n_ctx}." if placed is not None and attempt > 1 else "")
        said = str(exc).split("\n--- last llama-server log lines", 1)[0]
        raise DeviceOutOfMemoryError(f"{said}{what} ({free} when the start began)", device=exc.device,
                                     needed=exc.needed, log_tail=exc.log_tail, log_path=exc.log_path) from exc
    names = {d.name for d in failing}
    smaller = [replace(d, free=min(d.free, plan_mod.device_reserve(d) + held.get(d.name, 0) // 2))
               if d.name in names else d for d in devices]
    said = (f"{spec.model.name}: llama-server ran out of {', '.join(sorted(names))} memory with "
            f"{placed.n_gpu_layers} layers on the GPU at n_ctx {placed.n_ctx}; retrying once with a smaller "
            f"plan (fewer layers on the GPU, then a smaller automatic context)")
    logger.warning("%s; its log: %s", said, exc.log_path)
    warn(said, MemoryBudgetWarning)
    return smaller


def _passes_cache_ram(spec: ServerSpec, caps: discovery.ServerCapabilities) -> bool:
    """Whether the start passes our ``--cache-ram``: the build has the host-RAM prompt cache and the user did not
    size it (``server_args``)."""
    return caps.supports("--cache-ram") and server_options.user_cache_ram(spec.server_args) is None


def _cache_ram(spec: ServerSpec, caps: discovery.ServerCapabilities,
               header: GGUFHeader) -> Callable[[int], int] | None:
    """What the server's host-RAM prompt cache is charged at a context: the user's ``--cache-ram`` (MiB; -1, no
    limit, as llama.cpp's default bound), none for embedding and reranking servers (stateless: every request is
    new) or a build without the cache, else :func:`.budget.prompt_ram`."""
    if not caps.supports("--cache-ram"):
        return None
    user = server_options.user_cache_ram(spec.server_args)
    if user is not None:
        return lambda n_ctx: budget_mod.LLAMA_CACHE_RAM if user < 0 else user << 20
    if spec.embedding or spec.rerank:
        return lambda n_ctx: 0
    pool = budget_mod.ram_pool()
    return lambda n_ctx: budget_mod.prompt_ram(header, n_ctx, cache_type=spec.kv_cache_type, pool=pool)


def _prompt_dir(spec: ServerSpec, binary: Path, caps: discovery.ServerCapabilities) -> tuple[Path | None, str]:
    """The prompt cache's directory for a server of ``spec`` (None: no cache), and why not when it was asked for
    but cannot work (said in the server's log). One directory per identity, the private servers' included: the
    next server of the same model and options finds what this one saved."""
    if not spec.prompt_cache or spec.embedding or spec.rerank or prompt_cache.limit() <= 0:
        return None, ""
    why = prompt_cache.why_off(supported=caps.supports("--slot-save-path"), mmproj=spec.mmproj is not None,
                               draft=spec.draft_model is not None)
    if why:
        return None, why
    ident = hashlib.sha256(json.dumps(spec.identity(binary), sort_keys=True).encode()).hexdigest()[:24]
    try:
        return prompt_cache.server_dir(ident), ""
    except (OSError, GGUFProviderError) as exc:
        return None, f"its directory could not be made ({exc})"


def default_keep_alive() -> float:
    return float(os.environ.get("GGUF_PROVIDER_KEEP_ALIVE", DEFAULT_KEEP_ALIVE))


def _info(key: str, entry: registry.Entry) -> ServerInfo:
    api_key = None
    if entry.api_key_file:
        try:
            api_key = Path(entry.api_key_file).read_text().strip()
        except OSError:
            pass  # gone: the server refuses us (401), which _attach reports as not answering
    address = Address(socket=entry.socket, url=entry.url, api_key=api_key)
    return ServerInfo(key=key, pid=entry.pid, create_time=entry.create_time, alias=entry.alias, address=address,
                      log_path=Path(entry.log or os.devnull), model=entry.model, n_ctx=entry.n_ctx,
                      prompt_cache=entry.prompt_cache,
                      server_args=tuple(str(a) for a in entry.options.get("server_args") or ()))


def _spawn_watchdog(key: str, entry: registry.Entry, home: Path) -> None:
    """A detached process that stops the server once its clients are gone and keep_alive ran out.

    It gets the entry too: it knows its server even if the registry loses the entry before its first look.
    """
    env = dict(os.environ, GGUF_PROVIDER_HOME=str(home))
    process.Outliving([sys.executable, "-m", "gguf_provider.runtime._serve.watchdog", key,
                       json.dumps(entry.to_json())], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def attach(base_url: str, api_key: str | None = None, timeout: float = 10.0, *,
           transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None) -> ServerInfo:
    """Use an existing server (http URL or Unix socket path) without spawning anything. ``transport`` carries
    the requests instead of the network (tests replay recorded llama-server answers through it)."""
    if base_url.startswith("http://") or base_url.startswith("https://"):
        address = Address(url=base_url.rstrip("/").removesuffix("/v1"), api_key=api_key, injected=transport)
    else:
        address = Address(socket=base_url.removeprefix("unix:"), api_key=api_key, injected=transport)
    try:
        props = read_props(address, timeout=timeout)
    except httpx.HTTPStatusError as exc:
        raise ServerConnectionError(
            f"the server at {address.describe()} answered /props with HTTP {exc.response.status_code}"
            + (" (check api_key)" if exc.response.status_code == 401 else "")) from exc
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerConnectionError(
            f"could not reach a llama-server at {address.describe()} ({type(exc).__name__}: {exc}). Is it running? "
            f"Start one with `gguf-provider serve MODEL` or drop base_url to let gguf-provider start one.") from exc
    return ServerInfo(key="attached", pid=0, create_time=0.0, alias=str(props.get("model_alias") or ""),
                      address=address, log_path=Path(os.devnull), model=str(props.get("model_path") or ""),
                      n_ctx=props_n_ctx(props), props=props)


_manager: ServerManager | None = None
_manager_lock = threading.Lock()


def get_manager() -> ServerManager:
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = ServerManager()
        return _manager
