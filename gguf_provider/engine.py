"""An engine = a model spec bound to a running llama-server (started, shared or attached) plus its client.

Adapters hold an :class:`Engine`; it starts the server on first use, maps transport failures of a dead server to
:class:`ServerCrashedError` with the log tail (and starts a fresh server on the next call), and applies the
context limits: ``max_tokens`` capped at the effective context minus the prompt, an over-long prompt refused
before generation.
"""

from __future__ import annotations

import difflib
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import aclosing, closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from . import media
from .client import EngineClient
from .errors import (
    ContextOverflowError,
    LoopWarning,
    ModelNotFoundError,
    RPCWorkerLostError,
    ServerConnectionError,
    ServerCrashedError,
)
from .events import Collector, Completion, Event, Finish, LoopStopped, ReasoningDelta, TextDelta
from .loops import LoopDetector
from .runtime import manager as mgr
from .runtime.progress import Progress

DEFAULT_TIMEOUT = 600.0  # local models can be slow: 30 s defaults are a known complaint
T = TypeVar("T")
Transport = httpx.BaseTransport | httpx.AsyncBaseTransport
API_KEY_ENV = "GGUF_PROVIDER_API_KEY"  # the key of an attached server, kept off command lines and code


def env_api_key() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None
    repo: str | None = None
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None
    hf_token: str | None = None
    model_path: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_parallel: int | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    reasoning_format: str | None = None
    server_args: tuple[str, ...] = ()
    rpc_servers: tuple[str, ...] = ()
    embedding: bool = False
    pooling: str | None = None
    vision: bool = False
    mmproj: str | None = None  # a projector file; implies vision
    port: int | None = None
    llama_server: str | None = None
    keep_alive: float | None = None  # None: $GGUF_PROVIDER_KEEP_ALIVE or 300 s
    shared: bool = True
    timeout: float = DEFAULT_TIMEOUT
    start_timeout: float = mgr.DEFAULT_START_TIMEOUT
    offline: bool | None = None
    max_retries: int = 2  # retries of a call whose server crashed or could not be reached
    progress: Progress | None = field(default=None, compare=False, hash=False)
    # "auto" (the build's n-gram self-speculation), "off"/False, an n-gram type, or a draft model spec; chat only
    speculative: bool | str = "auto"
    kv_cache_type: str = "f16"  # K and V cache type: f16, q8_0, q4_0, ... (what the build lists)

    def __post_init__(self) -> None:
        from .runtime import rpc, speculative

        # Wrong values fail here, at construction, not when the server starts.
        object.__setattr__(self, "speculative", speculative.normalize(self.speculative))
        object.__setattr__(self, "kv_cache_type", validate_cache_type(self.kv_cache_type))
        object.__setattr__(self, "rpc_servers", rpc.normalize(self.rpc_servers))


def rpc_lost(info: mgr.ServerInfo, workers: tuple[str, ...]) -> RPCWorkerLostError | None:
    """The typed error for a server that died because RPC workers went away: the ones that no longer accept
    connections, or (when all still do) the log's word that a worker broke off; None when neither."""
    from .runtime import rpc

    gone = tuple(w for w in workers if not rpc.reachable(w))
    deadline = time.monotonic() + 2.0
    while not gone and workers and time.monotonic() < deadline:
        # A killed worker's port still accepted connections when the server's death was seen, in a test run with a
        # load of 4 on 2 cores: look again for a moment before settling for "an RPC worker broke off".
        time.sleep(0.2)
        gone = tuple(w for w in workers if not rpc.reachable(w))
    tail = info.log_tail()  # read after the wait: the log may have said more meanwhile
    if not gone and "RPC server crashed" not in tail:
        return None
    which = f"RPC worker{'s' * (len(gone) > 1)} {', '.join(gone)} went away" if gone else "an RPC worker broke off"
    return RPCWorkerLostError(
        f"llama-server (pid {info.pid}) died during the request: {which}. Restart "
        f"{'it' if len(gone) == 1 else 'the workers'} (`gguf-provider rpc-worker`) or drop "
        f"{'it' if len(gone) == 1 else 'them'} from rpc_servers; the next call starts a new server",
        gone, tail, info.log_path)


def resolve_spec(cfg: EngineConfig) -> mgr.ServerSpec:
    """The server spec of ``cfg``: the model resolved (found, or downloaded), with its projector when ``mmproj`` is
    given (checked to be a projector file) or ``vision`` asks for the one beside the model or in its repo."""
    from .runtime import speculative
    from .runtime.models import resolve_mmproj, resolve_model

    mode = speculative.OFF if cfg.embedding else speculative.normalize(cfg.speculative)
    cache_type = validate_cache_type(cfg.kv_cache_type)
    mmproj = resolve_mmproj(cfg.mmproj) if cfg.mmproj else None
    vision = cfg.vision and mmproj is None
    if cfg.model_path:
        resolved = resolve_model(cfg.model_path, vision=vision)
    else:
        resolved = resolve_model(cfg.model, repo=cfg.repo, quant=cfg.quant, filename=cfg.filename,
                                 revision=cfg.revision, token=cfg.hf_token, vision=vision, offline=cfg.offline,
                                 progress=cfg.progress)
    draft: Path | None = None
    draft_shards: tuple[Path, ...] = ()
    if speculative.is_draft(mode):
        draft, draft_shards = _resolve_draft(mode, cfg)
        speculative.check_draft(resolved.path, draft)  # before anything starts
        mode = speculative.DRAFT
    return mgr.ServerSpec(
        model=resolved.path, shards=tuple(resolved.shards), mmproj=mmproj or resolved.mmproj, n_ctx=cfg.n_ctx,
        n_gpu_layers=cfg.n_gpu_layers, n_parallel=cfg.n_parallel, embedding=cfg.embedding, pooling=cfg.pooling,
        chat_template=cfg.chat_template, chat_template_file=cfg.chat_template_file,
        reasoning_format=cfg.reasoning_format, rpc_servers=cfg.rpc_servers, server_args=cfg.server_args,
        port=cfg.port, llama_server=cfg.llama_server, speculative=mode, draft_model=draft, draft_shards=draft_shards,
        kv_cache_type=cache_type)


def _resolve_draft(spec: str, cfg: EngineConfig) -> tuple[Path, tuple[Path, ...]]:
    """The draft model of ``speculative=spec``, resolved like any model (path, models-dir name, org/repo:QUANT)."""
    from .runtime.models import resolve_model

    try:
        resolved = resolve_model(spec, token=cfg.hf_token, offline=cfg.offline, progress=cfg.progress)
    except ModelNotFoundError as exc:
        raise type(exc)(f"speculative={spec!r} names no draft model: {exc}. speculative takes 'auto', 'off' (or "
                        f"False), an n-gram type such as 'ngram-mod', or a draft model (a .gguf path, a models-dir "
                        f"name or org/repo:QUANT)") from exc
    return resolved.path, tuple(resolved.shards)


def validate_cache_type(cache_type: Any) -> str:
    """``kv_cache_type`` checked against the types the fit can size (ValueError naming the closest)."""
    from .runtime import fit

    if not isinstance(cache_type, str):
        raise ValueError(f"kv_cache_type must be a string such as 'q8_0', not {type(cache_type).__name__}")
    value = cache_type.strip().lower()
    if value not in fit.CACHE_TYPES:
        close = difflib.get_close_matches(value, list(fit.CACHE_TYPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"kv_cache_type={cache_type!r} is not a KV cache type{hint}; use one of "
                         f"{', '.join(fit.CACHE_TYPES)}")
    return value


class Engine:
    """A lazily started server plus its :class:`EngineClient`. Thread-safe.

    ``transport`` (an httpx transport, e.g. ``httpx.MockTransport``) carries every request of an attached
    ``base_url`` instead of the network: unit tests replay captured llama-server streams through it.
    """

    def __init__(self, config: EngineConfig, *, transport: Transport | None = None) -> None:
        if not (config.model or config.repo or config.model_path or config.base_url):
            raise ValueError("give a model: model='name or path or org/repo:QUANT', repo=..., model_path=... or "
                             "base_url=... to attach to a running server")
        if transport is not None and not config.base_url:
            raise ValueError("a transport carries the requests of an attached server: give base_url too")
        self.config = config
        self.transport = transport
        self._lock = threading.Lock()
        self._lease: mgr.Lease | None = None
        self._info: mgr.ServerInfo | None = None
        self._client: EngineClient | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # lifecycle ----------------------------------------------------------------------------------------------

    def load(self) -> mgr.ServerInfo:
        with self._lock:
            if self._info is not None and (self._lease is None or self._info.alive()):
                return self._info
            self._drop()
            cfg = self.config
            if cfg.base_url:
                info = mgr.attach(cfg.base_url, cfg.api_key, timeout=min(cfg.timeout, 30.0),
                                  transport=self.transport)
            else:
                spec = resolve_spec(cfg)
                lease = mgr.get_manager().acquire(spec, shared=cfg.shared, keep_alive=cfg.keep_alive,
                                                  start_timeout=cfg.start_timeout, progress=cfg.progress)
                self._lease, info = lease, lease.info
                # Give the lease back when this engine is garbage-collected, not only at exit.
                self._finalizer = weakref.finalize(self, lease.release)
            self._info = info
            self._client = EngineClient(info.address, timeout=cfg.timeout)
            return info

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._lease is not None:
            self._lease.release()
        self._lease = self._info = self._client = None

    def unload(self) -> None:
        with self._lock:
            self._drop()

    @property
    def info(self) -> mgr.ServerInfo:
        return self.load()

    @property
    def client(self) -> EngineClient:
        self.load()
        assert self._client is not None
        return self._client

    @property
    def n_ctx(self) -> int:
        """The context this engine's requests get: the server's, or the ``n_ctx`` asked when a running server with
        a larger one was shared (the runtime reuses such servers instead of starting another)."""
        info = self.info
        return min(info.n_ctx, info.asked_ctx) if info.asked_ctx and info.n_ctx else info.n_ctx

    @property
    def props(self) -> dict[str, Any]:
        return self.info.props

    @property
    def model_name(self) -> str:
        cfg = self.config
        name = cfg.model or cfg.repo or cfg.model_path or self.info.model
        return Path(name).name if name and (cfg.model_path or name.endswith(".gguf")) else str(name)

    def capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = self.props.get("chat_template_caps") or {}
        return caps

    def modalities(self) -> dict[str, bool]:
        """The inputs the server's model takes besides text, from ``/props`` (``{"vision": True, "audio": False,
        ...}``; ``vision`` needs a projector: ``vision=True`` or ``mmproj=``)."""
        return media.modalities(self.props)

    def _where(self) -> str:
        return f"the server at {self.config.base_url}" if self.config.base_url else f"the model {self.model_name}"

    # the one error guard ------------------------------------------------------------------------------------

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Map transport failures to our errors: :class:`ServerCrashedError` (with the log tail) when the server we
        started died, else :class:`ServerConnectionError`. Wraps sync and async code alike."""
        try:
            yield
        except httpx.TransportError as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: httpx.TransportError) -> Exception:
        info = self._info
        if info is not None and self._lease is not None and not _still_alive(info):
            with self._lock:
                self._drop()  # the next call starts a fresh server
            if self.config.rpc_servers:
                lost = rpc_lost(info, self.config.rpc_servers)
                if lost is not None:
                    return lost
            return ServerCrashedError(
                f"llama-server (pid {info.pid}) died during the request ({type(exc).__name__}); the next call "
                f"starts a new one", info.log_tail(), info.log_path)
        where = info.address.describe() if info else "?"
        return ServerConnectionError(f"lost the connection to llama-server at {where}: {exc}")

    def retrying(self, call: Callable[[], T]) -> T:
        """Run ``call`` again (on a fresh server) after a crash or lost connection, ``max_retries`` times."""
        for attempt in itertools.count():
            try:
                return call()
            except RPCWorkerLostError:
                raise  # a worker that went away does not come back on a retry
            except (ServerCrashedError, ServerConnectionError):
                if attempt >= self.config.max_retries:
                    raise
        raise AssertionError("unreachable")

    async def aretrying(self, call: Callable[[], Awaitable[T]]) -> T:
        for attempt in itertools.count():
            try:
                return await call()
            except RPCWorkerLostError:
                raise  # a worker that went away does not come back on a retry
            except (ServerCrashedError, ServerConnectionError):
                if attempt >= self.config.max_retries:
                    raise
        raise AssertionError("unreachable")

    # limits -------------------------------------------------------------------------------------------------

    def prepare(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload as it is sent: its images and audio checked and inlined (:mod:`gguf_provider.media`),
        ``max_tokens`` set to context − prompt when none is given, a larger one capped there, and a prompt that
        alone fills the context refused.

        Counting the prompt costs two small requests, so with an explicit ``max_tokens`` it is done only when a
        cheap upper bound (one token per character, plus template overhead) says the request might not fit. The
        count covers the text: an image's tokens are known only to the server, which stops a reply at the end of
        the context (finish reason ``length``) and refuses an image prompt that does not fit
        (:class:`ContextOverflowError`).
        """
        payload = media.prepare(payload, self.modalities(), model=self._where())
        n_ctx = self.n_ctx
        if not n_ctx or _fits(payload, n_ctx):
            return payload
        return _apply_limits(payload, self.count_prompt_tokens(payload), n_ctx)

    async def aprepare(self, payload: dict[str, Any]) -> dict[str, Any]:
        payload = await media.aprepare(payload, self.modalities(), model=self._where())
        n_ctx = self.n_ctx
        if not n_ctx or _fits(payload, n_ctx):
            return payload
        client = self.client
        with self.guard():
            prompt = await client.aapply_template(_template_payload(payload))
            n_prompt = len(await client.atokenize(prompt))
        return _apply_limits(payload, n_prompt, n_ctx)

    def count_prompt_tokens(self, payload: dict[str, Any]) -> int:
        """Tokens of the prompt's text (the chat template applied by the server, then tokenized); image and audio
        parts are left out (their tokens show in the reply's usage)."""
        client = self.client
        with self.guard():
            return len(client.tokenize(client.apply_template(_template_payload(payload))))

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        client = self.client
        with self.guard():
            return client.tokenize(text, special=special)

    # requests -----------------------------------------------------------------------------------------------

    def stream(self, payload: dict[str, Any], *, loop_guard: bool = True) -> Iterator[Event]:
        """The reply's events. With ``loop_guard`` a reply that became a cycle is stopped (closing the stream
        makes llama-server cancel it) and ends with :class:`LoopStopped` and ``Finish("repetition")``."""
        payload = self.prepare(payload)
        guard = _LoopGuard() if loop_guard else None
        with self.guard(), closing(self.client.stream_chat(payload)) as events:
            for ev in events:
                yield ev
                stopped = guard.check(ev) if guard else None
                if stopped:
                    yield from stopped
                    return

    async def astream(self, payload: dict[str, Any], *, loop_guard: bool = True) -> AsyncGenerator[Event, None]:
        payload = await self.aprepare(payload)
        guard = _LoopGuard() if loop_guard else None
        with self.guard():
            async with aclosing(self.client.astream_chat(payload)) as events:
                async for ev in events:
                    yield ev
                    stopped = guard.check(ev) if guard else None
                    if stopped:
                        for out in stopped:
                            yield out
                        return

    def chat(self, payload: dict[str, Any], *, loop_guard: bool = True) -> Completion:
        """A whole reply, folded from the stream (the one request path; no retry here)."""
        col = Collector()
        for ev in self.stream(payload, loop_guard=loop_guard):
            col.add(ev)
        return col.done()

    def embed(self, inputs: list[str], *, truncate: bool = False, **extra: Any) -> list[list[float]]:
        """One vector per text. A text longer than :meth:`embed_limit` tokens raises :class:`ContextOverflowError`
        naming it, or with ``truncate`` is sent as its first tokens (the model's special tokens kept)."""
        def run() -> list[list[float]]:
            client = self.client
            limit = self.embed_limit()
            with self.guard():
                sent: list[str | list[int]] = []
                for i, text in enumerate(inputs):
                    if not _may_exceed(text, limit):
                        sent.append(text)
                        continue
                    with_special = client.tokenize(text)
                    plain = client.tokenize(text, special=False) if truncate and len(with_special) > limit else []
                    sent.append(_fit_text(i, text, with_special, plain, limit, truncate))
                return client.embed(sent, **extra)

        return self.retrying(run)

    async def aembed(self, inputs: list[str], *, truncate: bool = False, **extra: Any) -> list[list[float]]:
        async def run() -> list[list[float]]:
            client = self.client
            limit = self.embed_limit()
            with self.guard():
                sent: list[str | list[int]] = []
                for i, text in enumerate(inputs):
                    if not _may_exceed(text, limit):
                        sent.append(text)
                        continue
                    with_special = await client.atokenize(text)
                    too_long = truncate and len(with_special) > limit
                    plain = await client.atokenize(text, special=False) if too_long else []
                    sent.append(_fit_text(i, text, with_special, plain, limit, truncate))
                return await client.aembed(sent, **extra)

        return await self.aretrying(run)

    def embed_limit(self) -> int:
        """The most tokens one text may have: the slot's context, and for a server we started, its physical batch
        (a non-causal embedder sees a text in one batch)."""
        n_ctx = self.n_ctx
        if self._lease is None:
            return n_ctx
        ubatch = mgr.user_ubatch(self.config.server_args)
        return min(n_ctx, ubatch if ubatch is not None else mgr.EMBED_UBATCH_MAX)

    def with_config(self, **changes: Any) -> Engine:
        return Engine(replace(self.config, **changes), transport=self.transport)


class _LoopGuard:
    """Watches the content and reasoning deltas of one reply (see :mod:`gguf_provider.loops`)."""

    __slots__ = ("content", "reasoning")

    def __init__(self) -> None:
        self.content = LoopDetector()
        self.reasoning = LoopDetector()

    def check(self, ev: Event) -> list[Event] | None:
        if isinstance(ev, TextDelta):
            channel, loop = "content", self.content.feed(ev.text)
        elif isinstance(ev, ReasoningDelta):
            channel, loop = "reasoning", self.reasoning.feed(ev.text)
        else:
            return None
        if loop is None:
            return None
        warnings.warn(f"stopped a reply that became a loop: {loop.describe()} in its {channel}; the reply ends "
                      f"after the first repetition (finish_reason 'repetition'). Pass loop_guard=False (per call "
                      f"or on the model) to let it run", LoopWarning, stacklevel=2)
        return [LoopStopped(channel, loop.keep, loop.period), Finish("repetition")]


def _still_alive(info: mgr.ServerInfo, grace: float = 0.3) -> bool:
    """Whether the server is still alive after up to ``grace`` seconds: a killed server closes its sockets a
    moment before it shows up as exited."""
    deadline = time.monotonic() + grace
    while info.alive():
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False


def _may_exceed(text: str, limit: int) -> bool:
    # A token covers at least one UTF-8 byte (byte-level BPE, SentencePiece byte fallback, WordPiece [UNK]), plus a
    # few special tokens: a text under that bound fits without asking the server to count.
    return len(text.encode()) + 8 > limit


def _fit_text(index: int, text: str, with_special: list[int], plain: list[int], limit: int,
              truncate: bool) -> str | list[int]:
    """The text as it is when it fits, else its first tokens (``truncate``) between the model's special tokens."""
    n = len(with_special)
    if n <= limit:
        return text
    if not truncate:
        raise ContextOverflowError(
            f"text {index} to embed is {n} tokens but the model takes at most {limit} per text "
            f"(starts {text[:40]!r}): split it (a text splitter with chunks under {limit} tokens) or pass "
            f"truncate=True to embed its first {limit} tokens", n_prompt_tokens=n, n_ctx=limit)
    head = next((k for k in range(min(n - len(plain), 8) + 1) if with_special[k:k + len(plain)] == plain), None)
    if not plain or head is None:
        return with_special[:limit]
    tail = with_special[head + len(plain):]
    return [*with_special[:head], *plain[:limit - head - len(tail)], *tail]


def _template_payload(payload: dict[str, Any]) -> dict[str, Any]:
    keys = ("messages", "tools", "chat_template_kwargs", "tool_choice")
    out = {k: payload[k] for k in keys if k in payload}
    if "messages" in out:
        out["messages"] = media.text_only(out["messages"])  # the server's marker for an image is no count of it
    return out


def _fits(payload: dict[str, Any], n_ctx: int) -> bool:
    """An explicit ``max_tokens`` that surely fits beside the prompt (no ``max_tokens``: count, to set one)."""
    max_tokens = payload.get("max_tokens")
    return max_tokens is not None and _char_bound(payload) + max_tokens < n_ctx


def _char_bound(payload: dict[str, Any]) -> int:
    # Every token covers at least one character of the JSON we send, except template special tokens; an image or
    # audio part counts as a fixed allowance, never as the length of its base64 data.
    return media.size_bound(payload.get("messages", "")) + len(str(payload.get("tools", ""))) + 512


def _apply_limits(payload: dict[str, Any], n_prompt: int, n_ctx: int) -> dict[str, Any]:
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {n_prompt} tokens but the context window is {n_ctx} tokens: shorten the input, trim "
            f"the history, or start the model with a larger n_ctx", n_prompt_tokens=n_prompt, n_ctx=n_ctx)
    room = n_ctx - n_prompt
    max_tokens = payload.get("max_tokens")
    if max_tokens is None or max_tokens > room:
        payload = {**payload, "max_tokens": room}
    return payload
