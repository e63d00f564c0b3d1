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
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock
import httpx

from ..errors import GGUFFormatError, ServerConnectionError, ServerStartError, ServerTimeoutError
from . import budget as budget_mod
from . import discovery, paths, process, registry
from . import fit as fit_mod
from . import rpc as rpc_mod
from . import speculative as speculative_mod
from .gguf import GGUFHeader
from .process import Address
from .progress import Progress

DEFAULT_KEEP_ALIVE = 300.0
"""Seconds a shared server outlives its last client; ``$GGUF_PROVIDER_KEEP_ALIVE`` overrides it."""
DEFAULT_START_TIMEOUT = 600.0
EMBED_UBATCH_MAX = 8192
_TRUNCATED = "data is not within the file bounds"  # llama-server's words for a model file cut short


@dataclass(frozen=True)
class ServerSpec:
    """Everything that makes two servers interchangeable."""

    model: Path
    shards: tuple[Path, ...] = ()
    mmproj: Path | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_parallel: int | None = None
    embedding: bool = False
    pooling: str | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    reasoning_format: str | None = None
    rpc_servers: tuple[str, ...] = ()
    server_args: tuple[str, ...] = ()
    port: int | None = None
    llama_server: str | None = None
    # Speculative decoding (runtime/speculative.py): "off", "auto", an n-gram type, or "draft" with draft_model.
    speculative: str = speculative_mod.OFF
    draft_model: Path | None = None
    draft_shards: tuple[Path, ...] = ()
    kv_cache_type: str = fit_mod.DEFAULT_CACHE_TYPE  # K and V cache type (`--cache-type-k/-v`)

    def identity(self, binary: Path) -> dict[str, Any]:
        def file_id(p: Path) -> list[Any]:
            st = p.stat()
            return [str(p.resolve()), st.st_size, st.st_mtime_ns]

        b = binary.stat()
        return {
            "binary": [str(binary.resolve()), b.st_size, b.st_mtime_ns],
            "model": [file_id(p) for p in (self.shards or (self.model,))],
            "mmproj": file_id(self.mmproj) if self.mmproj else None,
            "draft": [file_id(p) for p in (self.draft_shards or (self.draft_model,))] if self.draft_model else None,
            "args": [self.n_ctx, self.n_gpu_layers, self.n_parallel, self.embedding, self.pooling,
                     self.chat_template, self.chat_template_file, self.reasoning_format, list(self.rpc_servers),
                     list(self.server_args), self.port, self.speculative, self.kv_cache_type],
        }

    def family(self, binary: Path) -> str:
        """The identity without the context: servers of one family differ only in ``n_ctx``, so one with a
        context at least the asked one serves the request."""
        ident = self.identity(binary)
        ident["args"] = ident["args"][1:]
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


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

    def alive(self) -> bool:
        return process.process_matches(self.pid, self.create_time, self.alias)

    def log_tail(self, lines: int = process.LOG_TAIL_LINES) -> str:
        return process.log_tail(self.log_path, lines)


class Lease:
    """A claim on a running server; :meth:`release` (or process exit) gives it back."""

    def __init__(self, manager: ServerManager, info: ServerInfo) -> None:
        self._manager = manager
        self.info = info
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._manager._release(self.info.key)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# llama.cpp's pooling types by number (`{arch}.pooling_type` in a GGUF header) and `--pooling` name.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def embedding_pooling(asked: str | None, header_pooling: int | None) -> str | None:
    """The `--pooling` to pass, or None to let the model's own pooling type (from its header) stand.

    What the user asked wins. A model whose header names a pooling type (an embedder: BERT mean, BGE cls,
    Qwen3-Embedding last) keeps it: forcing `mean` on a CLS- or last-token-pooled model silently degrades its
    vectors. A model with none (a chat model) or `none` gets `mean`: the OpenAI-style endpoint needs a pooled vector.
    """
    if asked:
        return asked
    if header_pooling in POOLING_NAMES and header_pooling != 0:
        return None
    return "mean"


def user_ubatch(server_args: Sequence[str]) -> int | None:
    """The physical batch (``-ub``/``--ubatch-size``) the user set in ``server_args``, if any. Without one, an
    embedding server gets ``min(n_ctx, EMBED_UBATCH_MAX)`` (:func:`build_argv`)."""
    for i, arg in enumerate(server_args):
        for name in ("-ub", "--ubatch-size"):
            value = server_args[i + 1] if arg == name and i + 1 < len(server_args) else (
                arg.split("=", 1)[1] if arg.startswith(name + "=") else None)
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return None
    return None


def build_argv(spec: ServerSpec, binary: Path, caps: discovery.ServerCapabilities, alias: str, n_ctx: int,
               address: Address, api_key_file: Path | None, *, header_pooling: int | None = None) -> list[str]:
    argv = [str(binary), "-m", str(spec.model), "--alias", alias, "-c", str(n_ctx)]
    for flag in ("--jinja", "--no-webui", "--offline"):
        if caps.supports(flag):
            argv.append(flag)
    if address.socket:
        argv += ["--host", address.socket]
    else:
        assert address.url is not None
        port = address.url.rsplit(":", 1)[1]
        argv += ["--host", "127.0.0.1", "--port", port]
    if api_key_file is not None:
        argv += ["--api-key-file", str(api_key_file)]
    if spec.mmproj:
        argv += ["--mmproj", str(spec.mmproj)]
    if spec.n_gpu_layers is not None:
        argv += ["-ngl", str(spec.n_gpu_layers)]
    elif spec.rpc_servers:
        argv += ["-ngl", "999"]  # every layer on the devices (the workers), as many as there are
    if spec.n_parallel is not None:
        argv += ["-np", str(spec.n_parallel)]
        if caps.supports("--kv-unified"):
            argv.append("--kv-unified")
    if spec.embedding:
        argv.append("--embedding")
        pooling = embedding_pooling(spec.pooling, header_pooling)
        if pooling:
            argv += ["--pooling", pooling]
        if user_ubatch(spec.server_args) is None:
            # A pooled embedding must fit one physical batch: with the default (512) longer inputs fail with
            # "input is too large to process".
            n = str(min(n_ctx, EMBED_UBATCH_MAX))
            argv += ["--batch-size", n, "--ubatch-size", n]
    if spec.chat_template:
        argv += ["--chat-template", spec.chat_template]
    if spec.chat_template_file:
        argv += ["--chat-template-file", spec.chat_template_file]
    if spec.reasoning_format:
        argv += ["--reasoning-format", spec.reasoning_format]
    if spec.rpc_servers:
        argv += ["--rpc", ",".join(spec.rpc_servers)]
    argv += cache_type_args(spec.kv_cache_type, caps)
    argv += speculative_mod.server_args(spec.speculative, spec.draft_model, caps, spec.kv_cache_type)
    argv += list(spec.server_args)
    return argv


def cache_type_args(cache_type: str, caps: discovery.ServerCapabilities) -> list[str]:
    """``--cache-type-k/-v`` for a type other than the server's default f16; a quantized V cache needs flash
    attention, so it is turned on (``-fa on``, or the bare flag of older builds)."""
    if cache_type == fit_mod.DEFAULT_CACHE_TYPE:
        return []
    argv = ["--cache-type-k", cache_type, "--cache-type-v", cache_type]
    if fit_mod.is_quantized(cache_type) and caps.supports("--flash-attn"):
        argv += ["--flash-attn", "on"] if "on" in caps.allowed("--flash-attn") else ["--flash-attn"]
    return argv


def check_cache_type(cache_type: str, caps: discovery.ServerCapabilities, header: GGUFHeader) -> None:
    """Before a start: a cache type this build does not list, or whose blocks do not divide the model's head
    sizes (llama.cpp refuses both), is a ValueError that says what to pick instead."""
    if cache_type == fit_mod.DEFAULT_CACHE_TYPE:
        return
    listed = caps.allowed("--cache-type-k")
    if not caps.supports("--cache-type-k") or (listed and cache_type not in listed):
        have = f"it lists {', '.join(listed)}" if listed else "it has no --cache-type-k"
        raise ValueError(f"kv_cache_type={cache_type!r} is not a KV cache type of this llama-server ({have}; "
                         f"{caps.path})")
    block = fit_mod.CACHE_TYPES[cache_type][0]
    dims = {d for d in (header.head_dim, header.value_head_dim) if d}
    if block > 1 and any(d % block for d in dims):
        raise ValueError(f"kv_cache_type={cache_type!r} stores blocks of {block} values, which do not divide "
                         f"{header.path.name}'s attention head size ({', '.join(map(str, sorted(dims)))}); use "
                         f"f16, bf16 or f32 for this model")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def fit_memory(binary: Path, workers: Sequence[rpc_mod.WorkerInfo] = ()) -> fit_mod.MemoryInfo:
    """The memory ``binary`` can use: free RAM, plus free VRAM unless it is our CPU-only build (a GPU host without a
    CUDA toolkit gets one, and sizing its context by VRAM would overshoot RAM), plus what RPC ``workers`` report
    (llama.cpp treats each worker's device like a GPU: the offloaded layers and their KV cache go there)."""
    from . import fit, install

    memory = fit.available_memory()
    if memory.has_gpu and install.backend_of(binary) == "cpu":
        memory = fit.MemoryInfo(ram_available=memory.ram_available)
    devices = tuple(f for w in workers for f in w.free)
    return fit.MemoryInfo(memory.ram_available, memory.vram_free + devices) if devices else memory


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


class ServerManager:
    """Per-process front of the registry: acquires, counts and releases leases."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._refs: dict[str, int] = {}
        self._swept = False
        atexit.register(self.release_all)

    # -- public -----------------------------------------------------------------------------------------------

    def acquire(self, spec: ServerSpec, *, shared: bool = True, keep_alive: float | None = None,
                start_timeout: float = DEFAULT_START_TIMEOUT, progress: Progress | None = None) -> Lease:
        if keep_alive is None:
            keep_alive = default_keep_alive()
        binary = discovery.find_llama_server(spec.llama_server)
        if not self._swept:
            self._swept = True
            registry.sweep()  # orphans whose clients all died
        ident = spec.identity(binary)
        if not shared:
            ident["private"] = [os.getpid(), secrets.token_hex(8)]
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
        family = spec.family(binary)
        if shared and spec.n_ctx:
            # A running server of the same family with at least this context serves it (a second one would
            # only cost memory).
            with self._lock:
                for other in _compatible(family, spec.n_ctx, key):
                    with registry.key_lock(other):
                        info = self._attach(other)
                    if info is not None:
                        info.asked_ctx = spec.n_ctx
                        self._refs[other] = self._refs.get(other, 0) + 1
                        return Lease(self, info)
        with self._lock, registry.key_lock(key):
            info = self._attach(key) if shared else None
            if info is None:
                info = self._start(key, spec, binary, shared=shared, keep_alive=keep_alive,
                                   start_timeout=start_timeout, progress=progress, family=family)
            self._refs[key] = self._refs.get(key, 0) + 1
        return Lease(self, info)

    def release_all(self) -> None:
        with self._lock:
            keys = list(self._refs)
            self._refs.clear()
        for key in keys:
            self._drop_lease(key)

    # -- internals --------------------------------------------------------------------------------------------

    def _attach(self, key: str) -> ServerInfo | None:
        with registry.locked() as data:
            entry = data.get(key)
            if entry is None:
                return None
            if not registry.server_alive(entry):
                data.pop(key)
                return None
        info = _info(key, entry)
        try:
            props = read_props(info.address, healthy=True)
        except (httpx.HTTPError, ValueError) as exc:
            if not _still_registered(key, entry):
                return None  # stopped while we asked (its last lease ended; every stop unregisters first): start afresh
            # Our server (pid, start time and alias match) but it does not answer: starting another one here
            # would overwrite its entry and orphan it. Say so instead.
            err = ServerTimeoutError if isinstance(exc, httpx.TimeoutException) else ServerConnectionError
            raise err(
                f"the shared llama-server for this model (pid {info.pid}, {info.address.describe()}) is running "
                f"but does not answer ({type(exc).__name__}); it may be stopped or overloaded. Stop it with "
                f"`gguf-provider stop {key[:12]}` and try again", info.log_tail(10), info.log_path) from exc
        if props.get("model_alias") not in (None, info.alias) or (
                props.get("model_path") and os.path.realpath(props["model_path"]) != os.path.realpath(info.model)):
            return None  # the address answers, but not as our server
        info.props = props
        info.n_ctx = props_n_ctx(props) or info.n_ctx
        if not self._add_lease(key):
            return None  # stopped meanwhile (evicted to make room): start afresh
        return info

    def _add_lease(self, key: str) -> bool:
        me = os.getpid()
        with registry.locked() as data:
            entry = data.get(key)
            if entry is None:
                return False
            entry.setdefault("leases", {})[str(me)] = process.create_time(me)
            entry["idle_since"] = None
            entry["last_used"] = time.time()
            return True

    def _start(self, key: str, spec: ServerSpec, binary: Path, *, shared: bool, keep_alive: float,
               start_timeout: float, progress: Progress | None, family: str = "") -> ServerInfo:
        from . import gguf

        budget = budget_mod
        caps = discovery.probe(binary)
        # A file that is not GGUF or is cut short fails here, typed and before anything is spawned.
        header = gguf.read_header(spec.model)
        draft = gguf.read_header(spec.draft_model) if spec.draft_model else None
        for h in (header, draft):
            if h is not None:
                check_cache_type(spec.kv_cache_type, caps, h)
        speculative_mod.check_type(spec.speculative, caps)
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
        # One admission at a time across processes: evictions, the context and the registration are decided
        # together, so racing processes never both count the same free memory.
        try:
            admission_lock = budget.admission_lock()
            admission_lock.acquire()
        except filelock.Timeout as exc:
            raise ServerTimeoutError(f"another process has been starting a server for {exc.lock_file}'s "
                                     f"{budget.ADMISSION_TIMEOUT:.0f} s limit; try again") from None
        try:
            admitted = budget.admit(header, size, requested=spec.n_ctx if spec.n_ctx and spec.n_ctx > 0 else None,
                                    n_gpu_layers=spec.n_gpu_layers, memory=lambda: fit_memory(binary, workers),
                                    cache_type=spec.kv_cache_type, draft=draft,
                                    local_share=local_share(header, spec.n_gpu_layers, workers))
            return self._spawn(key, spec, binary, caps, header.pooling_type, admitted, shared=shared,
                               keep_alive=keep_alive, start_timeout=start_timeout, progress=progress,
                               family=family, admission_lock=admission_lock)
        finally:
            if admission_lock.is_locked:
                admission_lock.release()

    def _spawn(self, key: str, spec: ServerSpec, binary: Path, caps: discovery.ServerCapabilities,
               header_pooling: int | None, admitted: budget_mod.Admission, *, shared: bool, keep_alive: float,
               start_timeout: float, progress: Progress | None, family: str,
               admission_lock: filelock.BaseFileLock) -> ServerInfo:
        n_ctx = admitted.n_ctx
        run = paths.runtime_dir()
        tag = f"{key[:16]}-{secrets.token_hex(3)}"
        alias = f"gguf-provider-{key[:16]}"
        log_path = run / f"{tag}.log"
        api_key_file: Path | None = None
        if spec.port is not None or os.name == "nt":
            port = spec.port if spec.port and _port_free(spec.port) else _free_port()
            api_key = secrets.token_urlsafe(32)
            api_key_file = run / f"{tag}.key"
            fd = os.open(api_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(api_key + "\n")
            address = Address(url=f"http://127.0.0.1:{port}", api_key=api_key)
        else:
            address = Address(socket=str(run / f"{tag}.sock"))
        argv = build_argv(spec, binary, caps, alias, n_ctx, address, api_key_file, header_pooling=header_pooling)
        with open(log_path, "ab") as log:
            log.write(f"# gguf-provider: {' '.join(argv)}\n".encode())
        proc = process.spawn(argv, log_path, private=not shared)
        ctime = process.create_time(proc.pid)
        entry: registry.Entry = {
            "pid": proc.pid, "create_time": ctime, "alias": alias, "model": str(spec.model),
            "socket": address.socket, "url": address.url, "api_key_file": str(api_key_file) if api_key_file else None,
            "log": str(log_path), "n_ctx": n_ctx, "shared": shared, "keep_alive": keep_alive if shared else 0,
            "leases": {str(os.getpid()): process.create_time(os.getpid())}, "idle_since": None,
            "started_at": time.time(), "last_used": time.time(), "binary": str(binary), "family": family,
            "charge": admitted.charge, "rpc_servers": list(spec.rpc_servers),
        }
        with registry.locked() as data:
            data[key] = entry
        admission_lock.release()  # registered with its charge: the next admission counts it
        try:
            process.wait_healthy(proc, proc.pid, address, log_path, timeout=start_timeout, progress=progress)
            props = read_props(address)
        except BaseException as exc:
            with registry.locked() as data:
                data.pop(key, None)
            registry.stop_entry(entry)
            if isinstance(exc, ServerStartError) and spec.rpc_servers:
                rpc_start_failure(exc, spec.rpc_servers, binary)
            if isinstance(exc, ServerStartError) and _TRUNCATED in exc.log_tail:
                line = next(ln for ln in exc.log_tail.splitlines() if _TRUNCATED in ln)
                raise GGUFFormatError(
                    f"{spec.model} is truncated or corrupted (llama-server: {line.split('error loading model: ')[-1]})"
                    f"; download it again (log: {log_path})") from exc
            raise
        n_eff = props_n_ctx(props) or n_ctx
        if spec.speculative != speculative_mod.OFF and not speculative_mod.unsupported(spec.speculative, caps) \
                and speculating(address) is False:
            speculative_mod.warn_once(
                f"llama-server started {spec.model.name} without speculative decoding although "
                f"speculative={speculative_mod.describe(spec.speculative, spec.draft_model)!r} asked for it (it "
                f"turned it off for this model; see {log_path})", f"{binary}|{spec.model}")
        with registry.locked() as data:
            if key in data:
                data[key]["n_ctx"] = n_eff
                data[key]["rss"] = budget_mod.rss(proc.pid)
        if shared and keep_alive >= 0:
            _spawn_watchdog(key, entry)
        info = _info(key, entry)
        info.props, info.n_ctx = props, n_eff
        return info

    def _release(self, key: str) -> None:
        with self._lock:
            n = self._refs.get(key, 0) - 1
            if n > 0:
                self._refs[key] = n
                return
            self._refs.pop(key, None)
        self._drop_lease(key)

    def _drop_lease(self, key: str) -> None:
        me = str(os.getpid())
        with registry.locked() as data:
            entry = data.get(key)
            if entry is None or me not in entry.get("leases", {}):
                return  # not (or no longer) ours: e.g. the registry was reset and the key names another server
            entry["leases"].pop(me)
            entry["last_used"] = time.time()
            if entry["leases"]:
                return
            entry["idle_since"] = time.time()
            if float(entry.get("keep_alive", 0)) != 0:
                return
            data.pop(key)
        registry.stop_entry(entry)


def local_share(header: GGUFHeader, n_gpu_layers: int | None, workers: Sequence[rpc_mod.WorkerInfo]) -> float:
    """The part of a model's weights and KV cache that stays in this machine's memory: 1 without RPC workers; with
    them, the layers not offloaded (all are, unless ``n_gpu_layers`` says otherwise)."""
    if not workers:
        return 1.0
    n_layer = max(header.block_count or 1, 1)
    offloaded = n_layer if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, n_layer)
    return 1 - offloaded / n_layer


def rpc_start_failure(exc: ServerStartError, workers: Sequence[str], binary: Path) -> None:
    """Raise the typed error a start with RPC workers failed with, when its log says (else return)."""
    from ..errors import RPCWorkerUnreachableError

    tail = exc.log_tail
    if "RPC not supported in this build" in tail or "failed to find RPC backend" in tail:
        raise ServerStartError(
            f"{binary} was built without llama.cpp's RPC backend, so it cannot use rpc_servers; "
            f"`gguf-provider server install` builds one with it (GGML_RPC=ON) beside rpc-server",
            tail, exc.log_path) from exc
    for w in workers:
        if f"Failed to connect to {w}" in tail or f"RPC handshake failed for {w}" in tail:
            raise RPCWorkerUnreachableError(f"llama-server could not use RPC worker {w} (it stopped answering "
                                            f"while the server started)", w, tail, exc.log_path) from exc


def _compatible(family: str, n_ctx: int, own_key: str) -> list[str]:
    """Keys of running shared servers of ``family`` whose context is at least ``n_ctx``, smallest context first."""
    found = [(int(e.get("n_ctx") or 0), k) for k, e in registry.read().items()
             if k != own_key and e.get("family") == family and e.get("shared", True) and e.get("n_ctx", 0) >= n_ctx]
    return [k for _, k in sorted(found)]


def default_keep_alive() -> float:
    return float(os.environ.get("GGUF_PROVIDER_KEEP_ALIVE", DEFAULT_KEEP_ALIVE))


def _still_registered(key: str, entry: registry.Entry) -> bool:
    """Whether ``key`` still names the server of ``entry`` and that server still runs."""
    with registry.locked() as data:
        now = data.get(key)
    return now is not None and registry.same_server(now, entry) and registry.server_alive(now)


def _info(key: str, entry: registry.Entry) -> ServerInfo:
    api_key = None
    if entry.get("api_key_file"):
        api_key = Path(entry["api_key_file"]).read_text().strip()
    address = Address(socket=entry.get("socket"), url=entry.get("url"), api_key=api_key)
    return ServerInfo(key=key, pid=int(entry["pid"]), create_time=float(entry["create_time"]), alias=entry["alias"],
                      address=address, log_path=Path(entry["log"]), model=entry["model"], n_ctx=int(entry["n_ctx"]))


def _spawn_watchdog(key: str, entry: registry.Entry) -> None:
    """A detached process that stops the server once its clients are gone and keep_alive ran out.

    It gets the entry too: it knows its server even if the registry loses the entry before its first look.
    """
    env = dict(os.environ, GGUF_PROVIDER_HOME=str(paths.home()))
    subprocess.Popen([sys.executable, "-m", "gguf_provider.runtime.watchdog", key, json.dumps(entry)], env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


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


__all__ = ["Address", "Lease", "ServerInfo", "ServerManager", "ServerSpec", "ServerStartError", "attach",
           "build_argv", "get_manager"]
