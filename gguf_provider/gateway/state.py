"""The gateway's state: its settings (:class:`Settings`), its models (:class:`~.pool.ModelPool`) and what it lists
and describes of the models on this machine (:class:`Gateway`)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from ..runtime import Progress
from ..runtime import default as runtime
from .aliases import Aliases
from .common import KEEPALIVE
from .pool import DEFAULT_HOLD, ModelPool
from .responses_store import MAX_RESPONSES, DiskBackend, ResponseStore

DEFAULT_PORT = 11480  # not Ollama's 11434, nor llama-server's 8080
DEFAULT_MAX_BODY = 64 * 2**20  # bytes of one request's body (images travel inline)


@dataclass(frozen=True)
class Settings:
    """How the gateway listens and whom it answers."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None  # read from a key file; required on a non-loopback address
    allow_origins: tuple[str, ...] = ()  # browser origins answered (CORS); none by default
    max_body: int = DEFAULT_MAX_BODY
    keep_alive: float | None = None  # a started server's life once no client holds it (None: the runtime's)
    hold: float = DEFAULT_HOLD
    server_options: dict[str, Any] = field(default_factory=dict)
    aliases: Aliases = field(default_factory=Aliases)  # names clients ask for -> local models (aliases.py)
    keepalive: float = KEEPALIVE  # a stream's head waits this long for the first event, then a keep-alive each time
    responses_dir: str | None = None  # where stored Responses API responses are kept (None: in memory)
    responses_max: int = MAX_RESPONSES  # stored Responses API responses kept at most (then least recently used first)
    key_file: str = ""  # where api_key was read from: the gateway's record names it for `launch` (never the key)

    def __post_init__(self) -> None:
        if not self.keepalive > 0:
            raise ValueError(f"keepalive must be a number of seconds above 0, not {self.keepalive!r}")
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(f"listening on {self.host} (not loopback) needs an API key: --api-key-file PATH (a file "
                             "holding the key, readable only by you)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Listed:
    """A model the gateway can serve, as /v1/models and /api/tags list it. ``path`` is its file (shard 1), ""
    when unknown; ``digest`` and ``facts`` (the runtime's :meth:`~gguf_provider.runtime.Runtime.identify`) are
    there only when the listing was asked to identify its models."""

    name: str
    size: int
    quant: str | None
    mtime: float
    path: str = ""
    digest: str = ""  # "sha256:<hex>", the same for every name of one file; "": not identified
    facts: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def created(self) -> int:
        return int(self.mtime)

    @property
    def modified(self) -> str:
        return datetime.fromtimestamp(self.mtime, timezone.utc).isoformat().replace("+00:00", "Z")

    owner = "gguf-provider"


# Seconds a listing waits, in all, for the digests being hashed; past it a file answers its provisional digest
# for the rest of this process (the runtime's rule: runtime/_models/identity.py).
DIGEST_WAIT = 3.0


class Gateway:
    """The gateway's state: its settings and its models."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pool = ModelPool(server_options=settings.server_options, keep_alive=settings.keep_alive,
                              hold=settings.hold, aliases=settings.aliases)
        self.responses = ResponseStore(DiskBackend(settings.responses_dir) if settings.responses_dir else None,
                                       max_responses=settings.responses_max)

    async def model_list(self, *, identify: bool = False) -> list[Listed]:
        """The models dirs and the Hugging Face cache, then any loaded model not among them; ``identify``: with
        each file's digest and header facts (read in a worker thread, digests waited for :data:`DIGEST_WAIT`
        seconds in all)."""
        loaded = [(held.name, held.engine.info.model) for held in self.pool.loaded()]

        def scan() -> list[Listed]:
            out = []
            for m in runtime().models():
                try:
                    mtime = m.path.stat().st_mtime
                except OSError:
                    continue
                out.append(Listed(m.name, m.size_bytes, m.quant, mtime, str(m.path)))
            names = {m.name for m in out}
            for name, path in loaded:
                if name not in names:
                    names.add(name)
                    try:
                        st = os.stat(path)
                    except OSError:
                        out.append(Listed(name, 0, None, 0.0, path))
                    else:
                        out.append(Listed(name, st.st_size, None, st.st_mtime, path))
            if not identify:
                return out
            found = runtime().identify([m.path for m in out], wait=DIGEST_WAIT)
            return [replace(m, quant=m.quant or f["quant"], digest=f["digest"], facts=f) if f else m
                    for m, f in zip(out, found, strict=True)]

        return await asyncio.to_thread(scan)

    async def model_info(self, name: str) -> dict[str, Any]:
        """What ``name`` is (the runtime's describe), with its file's header facts (the runtime's identify, without
        the digest) under ``identity``."""
        def describe() -> dict[str, Any]:
            runtime().confine(name)
            info = runtime().describe(name)
            info["modified"] = datetime.fromtimestamp(info["modified"], timezone.utc).isoformat().replace("+00:00", "Z")
            info["identity"] = runtime().identify([info["path"]], digest=False)[0] or {}
            return info

        return await asyncio.to_thread(describe)

    async def pull(self, name: str, progress: Progress) -> None:
        from ..runtime import ModelRef

        def pull() -> None:
            runtime().confine(name)
            runtime().pull(ModelRef(name, progress=progress))

        await asyncio.to_thread(pull)
