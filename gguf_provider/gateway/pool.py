"""The gateway's models: one :class:`~gguf_provider.engine.Engine` per model name and kind, over the runtime's
shared servers.

An engine holds its lease while requests use it and for ``hold`` seconds after the last (so that a conversation's
next turn finds it loaded), then gives it back: the server then lives on for its own ``keep_alive`` as an idle
server, which the memory budget may evict when another model needs the room (runtime/_serve/budget.py), as it may
any idle server of this machine's. A request's ``keep_alive`` (Ollama's) replaces ``hold`` for that model; 0 gives
the lease back at once and stops the server unless another client holds it.

Requests for a model that is loading wait for the same load (the engine's lock); nothing here blocks the event
loop (loads run in a worker thread, :meth:`Engine.aload`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from ..engine import Engine, EngineConfig
from ..errors import InsufficientMemoryError, ModelNotFoundError, UnsupportedInputError
from ..media import FetchPolicy
from ..runtime import default as runtime
from .aliases import Aliases
from .common import BadRequest

log = logging.getLogger(__name__)
Kind = Literal["chat", "embed", "rerank"]
Key = tuple[str, Kind, int | None, bool]  # model name, kind, context asked, with its projector
DEFAULT_HOLD = 10.0  # seconds a model's lease is kept after its last request


@dataclass(frozen=True)
class Held:
    """A model the gateway holds a server for, until ``until`` (``time.time()``; in use: inf)."""

    name: str
    kind: Kind
    engine: Engine
    until: float


@dataclass
class _Entry:
    engine: Engine
    busy: int = 0
    hold: float = DEFAULT_HOLD
    idle_since: float = field(default_factory=time.monotonic)


class ModelPool:
    """Engines by (model name, kind, context asked); ``server_options`` are the llama-server options every server
    the gateway starts gets (``EngineConfig`` fields: ``n_ctx``, ``threads``, ...); ``keep_alive`` how long a
    server it started lives on once no client holds it (None: the runtime's default)."""

    def __init__(self, *, server_options: dict[str, Any] | None = None, keep_alive: float | None = None,
                 hold: float = DEFAULT_HOLD, aliases: Aliases | None = None) -> None:
        self.server_options = dict(server_options or {})
        self.aliases = aliases or Aliases()
        self.keep_alive = keep_alive
        self.hold = hold
        self._entries: dict[Key, _Entry] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._confined: set[str] = set()  # names confine() passed

    def config(self, name: str, kind: Kind, n_ctx: int | None, vision: bool = False) -> EngineConfig:
        options = dict(self.server_options)
        if vision:
            options["vision"] = True
        if n_ctx is not None:
            options["n_ctx"] = n_ctx
        if kind != "chat":  # a chat server's options do not apply to an embedder's
            options = {k: v for k, v in options.items() if k in ("n_ctx", "threads", "llama_server", "n_gpu_layers")}
        # Image URLs as the environment allows them, but never a local file: a request comes from another program
        hosts = tuple(h for h in FetchPolicy.parse(None).setting if h not in ("file:", "file://")) or ("",)
        return EngineConfig(model=name, embedding=kind == "embed", rerank=kind == "rerank", keep_alive=self.keep_alive,
                            max_retries=0, media_allow_hosts=hosts, **options)

    @asynccontextmanager
    async def use(self, name: str, kind: Kind = "chat", *, n_ctx: int | None = None, keep_alive: float | None = None,
                  vision: bool = False) -> AsyncIterator[Engine]:
        """The loaded engine of ``name`` (or the model it is an alias of) for the body of the ``async with``
        (started, shared or reused); ``vision``: with the model's projector (a request with images: the same model
        without one is another server)."""
        name = self.aliases.resolve(name)
        if name not in self._confined:  # ModelNotFoundError for what is no model this gateway may serve
            await asyncio.to_thread(runtime().confine, name)  # it looks at the file system: off the loop
            if len(self._confined) > 4096:  # names need not exist: bounded, whatever callers send
                self._confined.clear()
            self._confined.add(name)
        key = (name, kind, n_ctx, vision)
        entry = self._entries.get(key)
        if entry is None:
            try:
                config = self.config(name, kind, n_ctx, vision)
            except ValueError as exc:  # an option the request set (num_ctx) that a server cannot take
                raise BadRequest(str(exc)) from exc
            entry = self._entries[key] = _Entry(Engine(config), hold=self.hold)
        entry.busy += 1
        try:
            try:
                await entry.engine.aload()
            except ModelNotFoundError as exc:
                if vision and "mmproj" in str(exc):  # the model exists; it takes no images here
                    raise UnsupportedInputError(f"{name} has no projector (mmproj) beside it, so it takes no images "
                                                "or audio here: send text, or put its mmproj file next to it",
                                                "vision") from exc
                raise
            except InsufficientMemoryError:
                if not await self._release_idle(entry):
                    raise
                await entry.engine.aload()  # once more, with the room the idle models held given back
            yield entry.engine
        finally:
            entry.busy -= 1
            entry.idle_since = time.monotonic()
            if keep_alive is not None:
                entry.hold = max(0.0, keep_alive)
            if entry.busy == 0 and entry.hold == 0:
                await self._unload(key, entry, stop=True)
            self._start_reaper()

    def loaded(self) -> list[Held]:
        """The models holding a server now, and until when (``time.time()``; in use: inf)."""
        now, wall = time.monotonic(), time.time()
        return [Held(name, kind, e.engine, math.inf if e.busy else wall + e.idle_since + e.hold - now)
                for (name, kind, _, _), e in self._entries.items() if e.engine.loaded()]

    async def unload(self, name: str) -> bool:
        """Give back every lease on ``name`` now (the server stops unless another client holds it)."""
        name = self.aliases.resolve(name)
        found = [(k, e) for k, e in self._entries.items() if k[0] == name]
        for key, entry in found:
            await self._unload(key, entry, stop=True)
        return bool(found)

    async def close(self) -> None:
        """Give back every lease (the gateway stops): its servers stop now unless another process holds them, as
        `serve MODEL`'s does at exit, all at once (each stop is bounded: the prompt cache's save, then SIGTERM and
        SIGKILL after a grace)."""
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*(self._unload(key, entry, stop=True, force=True)
                               for key, entry in list(self._entries.items())))

    async def _unload(self, key: Key, entry: _Entry, *, stop: bool = False,
                      force: bool = False) -> None:
        """Forget ``entry`` (a request after this makes a new engine) and give back its lease, unless it is in use.
        ``stop``: its server stops now when no other client holds it, instead of after its keep_alive."""
        if entry.busy and not force:
            return
        if self._entries.get(key) is entry:
            del self._entries[key]
        await asyncio.to_thread(entry.engine.unload, stop=stop)

    async def _release_idle(self, wanting: _Entry) -> bool:
        idle = [(k, e) for k, e in self._entries.items() if e is not wanting and not e.busy and e.engine.loaded()]
        for key, entry in idle:
            log.info("gateway: giving back idle %s to make room", key[0])
            await self._unload(key, entry)
        return bool(idle)

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        """Give back the leases of models idle past their hold, until none is held."""
        while self._entries:
            now = time.monotonic()
            wait = 1.0
            for key, entry in list(self._entries.items()):
                if entry.busy:
                    continue
                left = entry.idle_since + entry.hold - now
                if left <= 0:
                    await self._unload(key, entry)
                else:
                    wait = min(wait, left)
            await asyncio.sleep(max(wait, 0.05))
