"""An engine = a model spec bound to a running llama-server (started, shared or attached) plus its client.

Adapters hold an :class:`Engine`; it starts the server on first use, maps transport failures of a dead server to
:class:`ServerCrashedError` with the log tail (runtime/_serve/diagnose.py names the cause when it knows it; the next call
starts a fresh server), retries such calls, and applies the context limits (:mod:`gguf_provider.limits`):
``max_tokens`` capped at the effective context minus the prompt, an over-long prompt refused before generation.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Sequence
from contextlib import aclosing, asynccontextmanager, closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import limits, media
from ._io import AsyncCall, SyncCall, in_caller, off_loop
from .client import EngineClient
from .client import RerankResult as RerankResult  # the result type of Engine.rerank
from .deadline import Deadline
from .errors import APIError, GGUFProviderError, RPCWorkerLostError, ServerConnectionError, ServerCrashedError
from .events import Collector, Completion, Event
from .lazy import LazyModule
from .loops import LoopGuard
from .runtime._common.cancel import Cancel, in_thread
from .runtime._common.cancel import check as check_cancel
from .runtime._common.progress import Progress
from .runtime._serve import diagnose, prompt_cache, server_options
from .runtime._serve.config import ServerConfig
from .runtime._serve.health import DEFAULT_START_TIMEOUT

if TYPE_CHECKING:
    import httpx

    # The server manager (and what it needs to start servers: install, plan, budget, ...) loads at the first load():
    # importing an adapter does not pay for it.
    from .runtime import Lease, ServerInfo

    Transport = httpx.BaseTransport | httpx.AsyncBaseTransport
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

DEFAULT_TIMEOUT = 600.0  # local models can be slow: 30 s defaults are a known complaint
T = TypeVar("T")
log = logging.getLogger(__name__)
API_KEY_ENV = "GGUF_PROVIDER_API_KEY"  # the key of an attached server, kept off command lines and code
# Documents per /v1/rerank request. The server scores a request's pairs n_parallel at a time either way, so batches
# cost next to nothing (256 pairs of 40-120 words, the test reranker on 2 CPU cores, medians of 3: 8.8 s in one
# request, 8.7 s in batches of 64 or of 16); they bound one request's time (the timeout is per request) and let
# other clients' requests in between.
RERANK_BATCH = 64
# A server seen alive this recently is taken to be (a dead one shows as a transport error, which is diagnosed).
ALIVE_FRESH_S = 0.25


def env_api_key() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


def _log_retry(exc: Exception, attempt: int, max_retries: int) -> None:
    log.warning("retry %d of %d (max_retries) on a fresh server after %s: %s", attempt + 1, max_retries,
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


@dataclass(frozen=True, kw_only=True)
class EngineConfig(ServerConfig):
    """What an engine is made from: a server's config (``ServerConfig``: the model and llama-server options, declared
    in runtime/_common/model_source.py and server_options.OPTIONS) and the engine's own, below."""

    base_url: str | None = None
    api_key: str | None = None
    keep_alive: float | None = None  # None: $GGUF_PROVIDER_KEEP_ALIVE or 300 s
    shared: bool = True
    timeout: float = DEFAULT_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    max_retries: int = 2  # retries of a call whose server crashed or could not be reached
    progress: Progress | None = field(default=None, compare=False, hash=False)
    # Hosts, addresses or networks whose non-public image URLs may be fetched, "*", "file:" (media.FetchPolicy);
    # None: $GGUF_PROVIDER_MEDIA_ALLOW_HOSTS, read at each request
    media_allow_hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.media_allow_hosts, str):
            object.__setattr__(self, "media_allow_hosts", media.FetchPolicy.parse(self.media_allow_hosts).setting)


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
        self._lease: Lease | None = None
        self._info: ServerInfo | None = None
        self._client: EngineClient | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._aloading = 0  # coroutines awaiting aload() now
        self._alive_at = 0.0  # when the server's process was last seen alive (time.monotonic())

    # lifecycle ----------------------------------------------------------------------------------------------

    def _loaded(self) -> ServerInfo | None:
        """The server when it is up: every call's fast path (no lock; a process check for a server we started, at
        most every ``ALIVE_FRESH_S``: one request asks several times, and a check reads /proc, ~90 µs)."""
        info = self._info
        if info is None or self._lease is None:
            return info
        now = time.monotonic()
        if now - self._alive_at < ALIVE_FRESH_S:
            return info
        if not info.alive():
            return None
        self._alive_at = now
        return info

    def loaded(self) -> bool:
        """Whether the server is up (nothing is started to find out)."""
        return self._loaded() is not None

    def load(self) -> ServerInfo:
        """Start (or attach to) the server, or return the running one."""
        return self._loaded() or self._load(None)[0]

    async def aload(self) -> ServerInfo:
        """:meth:`load` without blocking the event loop: the install, download, start and health wait run in a
        worker thread. Cancelling the awaiting coroutine stops the load at its next checkpoint
        (runtime/_common/cancel.py): a server it was starting is stopped and unregistered before the cancellation
        propagates, and one it had just started is given back and stops unless another client holds it."""
        info = self._loaded()
        if info is not None:
            return info
        self._aloading += 1
        try:
            return (await in_thread(self._load, abandon=self._abandon_if_alone))[0]
        finally:
            self._aloading -= 1

    def _abandon_if_alone(self, loaded: tuple[ServerInfo, bool]) -> None:
        """A load whose caller left: given back when it started the server for no other coroutine."""
        if loaded[1] and self._aloading == 1:
            self._abandon()

    def _load(self, cancel: Cancel | None) -> tuple[ServerInfo, bool]:
        """The server, and whether this call loaded it (False: another caller had meanwhile)."""
        from .runtime import default as runtime

        with self._lock:
            info = self._loaded()
            if info is not None:
                return info, False
            self._drop()
            check_cancel(cancel)
            cfg = self.config
            if cfg.base_url:
                info = runtime().attach(cfg.base_url, cfg.api_key, timeout=min(cfg.timeout, 30.0),
                                        transport=self.transport)
            else:
                spec = runtime().spec(cfg, progress=cancel.progress(cfg.progress) if cancel is not None else
                                      cfg.progress)
                lease = runtime().acquire(spec, shared=cfg.shared, keep_alive=cfg.keep_alive,
                                          start_timeout=cfg.start_timeout, progress=cfg.progress, cancel=cancel)
                self._lease, info = lease, lease.info
                # Give the lease back when this engine is garbage-collected, not only at exit (where the manager's
                # atexit hook releases every lease).
                self._finalizer = weakref.finalize(self, _release_in_thread, lease)
                self._finalizer.atexit = False
            self._info = info
            self._client = EngineClient(info.address, timeout=cfg.timeout)
            if cancel is not None:
                _import_async_transport()
            return info, True

    def _abandon(self) -> None:
        with self._lock:
            lease = self._lease
            if lease is not None:
                lease.abandon()
            self._drop()

    def _drop(self, *, stop: bool = False) -> None:
        if self._client is not None:
            self._client.close()
        if self._lease is not None:
            self._lease.release(stop=stop)
        self._lease = self._info = self._client = None
        self._alive_at = 0.0

    def unload(self, *, stop: bool = False) -> None:
        """Give back the lease; ``stop``: the server stops now unless another client holds it (else it lives on for
        its keep_alive)."""
        with self._lock:
            self._drop(stop=stop)

    @property
    def info(self) -> ServerInfo:
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

    def _needs_count(self, payload: dict[str, Any]) -> bool:
        """Whether :meth:`aprepare` counts the prompt before it is sent."""
        n_ctx, info = self.n_ctx, self.info
        if not n_ctx or (info.ends_at_context and n_ctx == info.n_ctx):
            return False
        return not limits.fits(payload, n_ctx)  # the cheap bound walks the payload (~0.5 ms for 76 KB): last

    @property
    def props(self) -> dict[str, Any]:
        return self.info.props

    @property
    def model_name(self) -> str:
        cfg = self.config
        name = os.fspath(cfg.model or cfg.repo or cfg.model_path or self.info.model)
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

    def _failure(self, exc: httpx.TransportError) -> Exception:
        info = self._info
        if info is not None and self._lease is not None and not _still_alive(info):
            with self._lock:
                self._drop()  # the next call starts a fresh server
            return diagnose.crash(info, exc, self.config.rpc_servers)
        where = info.address.describe() if info else "?"
        return ServerConnectionError(f"lost the connection to llama-server at {where}: {exc}")

    def media_policy(self) -> media.FetchPolicy:
        """Where image URLs in messages may point (``media_allow_hosts``, else the environment's)."""
        return media.FetchPolicy.parse(self.config.media_allow_hosts)

    # the prompt cache ---------------------------------------------------------------------------------------

    def _prompt_cache(self) -> prompt_cache.ServerCache | None:
        info = self._info
        if info is None or self._lease is None or not info.prompt_cache:
            return None  # an attached server's directory is not ours to know
        return prompt_cache.for_server(info.pid, info.create_time, Path(info.prompt_cache), model=info.model,
                                       build=str(info.props.get("build_info") or ""))

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        client = self.client
        with self.guard():
            return client.tokenize(text, special=special)

    # requests -----------------------------------------------------------------------------------------------

    def chat(self, payload: dict[str, Any], *, loop_guard: bool = True) -> Completion:
        """A whole reply, folded from the stream (the one request path; no retry here)."""
        col = Collector()
        for ev in self.stream(payload, loop_guard=loop_guard):
            col.add(ev)
        return col.done()

    def _rerank_args(self, documents: Sequence[str], top_n: int | None, batch_size: int) -> list[str]:
        if isinstance(documents, str):
            raise ValueError("documents must be a list of texts, not one string")
        if top_n is not None and top_n < 0:
            raise ValueError(f"top_n must be None (every document) or >= 0, not {top_n}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        if not (self.config.rerank or self.config.base_url):
            raise ValueError("this engine's server is no reranker: EngineConfig(rerank=True, ...) starts one")
        return list(documents)

    def embed_limit(self) -> int:
        """The most tokens one text (or one reranked query+document pair) may have: the slot's context, and for a
        server we started, its physical batch (a non-causal embedder sees a text in one batch)."""
        n_ctx = self.n_ctx
        if self._lease is None:
            return n_ctx
        ubatch = server_options.user_ubatch(self.config.server_args)
        return min(n_ctx, ubatch if ubatch is not None else server_options.EMBED_UBATCH_MAX)

    # I/O paths: each written once, async; the sync methods are generated from it (scripts/gen_sync.py) --------

    # unasync: async source
    @asynccontextmanager
    async def aguard(self) -> AsyncIterator[None]:
        """Map transport failures to our errors: :class:`ServerCrashedError` (with the log tail) when the server we
        started died, else :class:`ServerConnectionError`. The failure's diagnosis (a process check with a grace,
        the log) runs off the event loop."""
        try:
            yield
        except httpx.TransportError as exc:
            raise await off_loop(self._failure, exc) from exc

    async def aretrying(self, call: AsyncCall[T]) -> T:
        """Run ``call`` again (on a fresh server) after a crash or lost connection, ``max_retries`` times."""
        for attempt in itertools.count():
            try:
                return await call()
            except RPCWorkerLostError:
                raise  # a worker that went away does not come back on a retry
            except (ServerCrashedError, ServerConnectionError) as exc:
                if attempt >= self.config.max_retries:
                    raise
                _log_retry(exc, attempt, self.config.max_retries)
        raise AssertionError("unreachable")

    async def aprepare(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload as it is sent: its images and audio checked and inlined (:mod:`gguf_provider.media`), and
        no reply longer than the context leaves: a prompt that alone fills the context raises
        :class:`ContextOverflowError`, a reply ends where the context does (finish reason ``length``).

        A server we started from a build whose context shift is off unless asked does both itself
        (:attr:`~.runtime._serve.manager.ServerInfo.ends_at_context`: ``exceed_context_size_error``, read as
        :class:`ContextOverflowError`), so the request goes as it is. Elsewhere (an older build, a server started
        with ``--context-shift``, a shared server with a larger context than this engine asked) the prompt is
        counted (two small requests, ``/apply-template`` and ``/tokenize``: ~70 ms for 17,000 tokens here),
        ``max_tokens`` set to context - prompt when none is given and a larger one capped there; with an explicit
        ``max_tokens`` only when a cheap upper bound (one token per character, plus template overhead) says it
        might not fit. The count covers the text: an image's tokens are known only to the server, which ends and
        refuses as above.
        """
        await self.aload()
        self.info.check_request(payload)  # what this build cannot do: refused before anything is sent
        payload = await media.aprepare(payload, self.modalities(), model=self._where(), policy=self.media_policy())
        payload = await self.arestore_prompt(payload)
        if not self._needs_count(payload):
            return payload
        return limits.apply_limits(payload, await self.acount_prompt_tokens(payload), self.n_ctx)

    async def arestore_prompt(self, payload: dict[str, Any]) -> dict[str, Any]:
        """On a server's first requests (:data:`~.runtime._serve.prompt_cache.FIRST_REQUESTS`): when a prompt saved
        by an earlier server of this model and options shares at least ``MIN_TOKENS`` tokens with this request's,
        restore it into a free slot and send the request there (``id_slot``), so that only the rest is processed.
        Costs a directory listing (off the event loop) when nothing is saved; a failure only leaves the prompt to
        be processed as usual."""
        cache = self._prompt_cache()
        looks = cache is not None and cache.left > 0 and "id_slot" not in payload
        candidates = await off_loop(cache.pending) if cache is not None and looks else []
        if cache is None or not candidates:
            return payload
        client = self.client
        restoring: prompt_cache.Match | None = None
        try:
            async with self.aguard():
                tokens = await client.atokenize(await client.aapply_template(limits.template_payload(payload)))
                match = cache.choose(tokens, candidates)
                slot = prompt_cache.free_slot(await client.aget_json("/slots")) if match is not None else None
                if match is None or slot is None:
                    return payload
                restoring = match
                try:
                    answer = await client.apost_json(f"/slots/{slot}?action=restore",
                                                     {"filename": match.saved.path.name})
                except APIError as exc:
                    answer = {"error": str(exc)}
        except GGUFProviderError as exc:
            return _no_restore(restoring, exc, payload)
        return {**payload, "id_slot": slot} if cache.restored(match, answer) else payload

    async def acount_prompt_tokens(self, payload: dict[str, Any]) -> int:
        """Tokens of the prompt's text (the chat template applied by the server, then tokenized); image and audio
        parts are left out (their tokens show in the reply's usage)."""
        client = self.client
        async with self.aguard():
            return len(await client.atokenize(await client.aapply_template(limits.template_payload(payload))))

    async def astream(self, payload: dict[str, Any], *, loop_guard: bool = True,
                      deadline: Deadline | None = None) -> AsyncGenerator[Event, None]:
        """The reply's events. With ``loop_guard`` a reply that became a cycle is stopped (closing the stream
        makes llama-server cancel it) and ends with :class:`LoopStopped` and ``Finish("repetition")``. A
        ``deadline`` that fires ends the stream early, without a finish (:mod:`gguf_provider.deadline`)."""
        payload = await self.aprepare(payload)
        guard = LoopGuard() if loop_guard else None
        async with self.aguard(), aclosing(self.client.astream_chat(payload, deadline)) as events:
            async for ev in events:
                yield ev
                stopped = guard.check(ev) if guard else None
                if stopped:
                    for out in stopped:
                        yield out
                    return

    async def aembed(self, inputs: list[str], *, truncate: bool = False, **extra: Any) -> list[list[float]]:
        """One vector per text. A text longer than :meth:`embed_limit` tokens raises :class:`ContextOverflowError`
        naming it, or with ``truncate`` is sent as its first tokens (the model's special tokens kept)."""
        async def run() -> list[list[float]]:
            await self.aload()
            client = self.client
            limit = self.embed_limit()
            async with self.aguard():
                sent: list[str | list[int]] = []
                for i, text in enumerate(inputs):
                    if not limits.may_exceed(text, limit):
                        sent.append(text)
                        continue
                    with_special = await client.atokenize(text)
                    too_long = truncate and len(with_special) > limit
                    plain = await client.atokenize(text, special=False) if too_long else []
                    sent.append(limits.fit_text(i, text, with_special, plain, limit, truncate))
                return await client.aembed(sent, **extra)

        return await self.aretrying(run)

    async def arerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
                      batch_size: int = RERANK_BATCH, **extra: Any) -> list[RerankResult]:
        """The documents' relevance to ``query``, best first (``top_n`` of them, or all): one
        :class:`RerankResult` (the document's index in ``documents``, its score) each, from ``/v1/rerank`` in
        requests of ``batch_size`` documents. A query+document pair longer than :meth:`embed_limit` tokens raises
        :class:`ContextOverflowError` naming the document, before any is scored. No documents: no request."""
        docs = self._rerank_args(documents, top_n, batch_size)
        if not docs:
            return []

        async def run() -> list[RerankResult]:
            await self.aload()
            client = self.client
            limit = self.embed_limit()
            async with self.aguard():
                long = [i for i, d in enumerate(docs) if limits.pair_may_exceed(query, d, limit)]
                if long:
                    n_query = len(await client.atokenize(query, special=False))
                    for i in long:
                        n_doc = len(await client.atokenize(docs[i], special=False))
                        limits.check_pair(i, docs[i], n_query, n_doc, limit)
                found: list[RerankResult] = []
                for start in range(0, len(docs), batch_size):
                    batch = await client.arerank(query, docs[start:start + batch_size], **extra)
                    found += [RerankResult(start + r.index, r.score) for r in batch]
            return best_first(found, top_n)

        return await self.aretrying(run)

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    @contextmanager
    def guard(self) -> Iterator[None]:
        """Map transport failures to our errors: :class:`ServerCrashedError` (with the log tail) when the server we
        started died, else :class:`ServerConnectionError`. The failure's diagnosis (a process check with a grace,
        the log) runs off the event loop."""
        try:
            yield
        except httpx.TransportError as exc:
            raise in_caller(self._failure, exc) from exc

    def retrying(self, call: SyncCall[T]) -> T:
        """Run ``call`` again (on a fresh server) after a crash or lost connection, ``max_retries`` times."""
        for attempt in itertools.count():
            try:
                return call()
            except RPCWorkerLostError:
                raise  # a worker that went away does not come back on a retry
            except (ServerCrashedError, ServerConnectionError) as exc:
                if attempt >= self.config.max_retries:
                    raise
                _log_retry(exc, attempt, self.config.max_retries)
        raise AssertionError("unreachable")

    def prepare(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload as it is sent: its images and audio checked and inlined (:mod:`gguf_provider.media`), and
        no reply longer than the context leaves: a prompt that alone fills the context raises
        :class:`ContextOverflowError`, a reply ends where the context does (finish reason ``length``).

        A server we started from a build whose context shift is off unless asked does both itself
        (:attr:`~.runtime._serve.manager.ServerInfo.ends_at_context`: ``exceed_context_size_error``, read as
        :class:`ContextOverflowError`), so the request goes as it is. Elsewhere (an older build, a server started
        with ``--context-shift``, a shared server with a larger context than this engine asked) the prompt is
        counted (two small requests, ``/apply-template`` and ``/tokenize``: ~70 ms for 17,000 tokens here),
        ``max_tokens`` set to context - prompt when none is given and a larger one capped there; with an explicit
        ``max_tokens`` only when a cheap upper bound (one token per character, plus template overhead) says it
        might not fit. The count covers the text: an image's tokens are known only to the server, which ends and
        refuses as above.
        """
        self.load()
        self.info.check_request(payload)  # what this build cannot do: refused before anything is sent
        payload = media.prepare(payload, self.modalities(), model=self._where(), policy=self.media_policy())
        payload = self.restore_prompt(payload)
        if not self._needs_count(payload):
            return payload
        return limits.apply_limits(payload, self.count_prompt_tokens(payload), self.n_ctx)

    def restore_prompt(self, payload: dict[str, Any]) -> dict[str, Any]:
        """On a server's first requests (:data:`~.runtime._serve.prompt_cache.FIRST_REQUESTS`): when a prompt saved
        by an earlier server of this model and options shares at least ``MIN_TOKENS`` tokens with this request's,
        restore it into a free slot and send the request there (``id_slot``), so that only the rest is processed.
        Costs a directory listing (off the event loop) when nothing is saved; a failure only leaves the prompt to
        be processed as usual."""
        cache = self._prompt_cache()
        looks = cache is not None and cache.left > 0 and "id_slot" not in payload
        candidates = in_caller(cache.pending) if cache is not None and looks else []
        if cache is None or not candidates:
            return payload
        client = self.client
        restoring: prompt_cache.Match | None = None
        try:
            with self.guard():
                tokens = client.tokenize(client.apply_template(limits.template_payload(payload)))
                match = cache.choose(tokens, candidates)
                slot = prompt_cache.free_slot(client.get_json("/slots")) if match is not None else None
                if match is None or slot is None:
                    return payload
                restoring = match
                try:
                    answer = client.post_json(f"/slots/{slot}?action=restore",
                                              {"filename": match.saved.path.name})
                except APIError as exc:
                    answer = {"error": str(exc)}
        except GGUFProviderError as exc:
            return _no_restore(restoring, exc, payload)
        return {**payload, "id_slot": slot} if cache.restored(match, answer) else payload

    def count_prompt_tokens(self, payload: dict[str, Any]) -> int:
        """Tokens of the prompt's text (the chat template applied by the server, then tokenized); image and audio
        parts are left out (their tokens show in the reply's usage)."""
        client = self.client
        with self.guard():
            return len(client.tokenize(client.apply_template(limits.template_payload(payload))))

    def stream(self, payload: dict[str, Any], *, loop_guard: bool = True,
               deadline: Deadline | None = None) -> Generator[Event, None]:
        """The reply's events. With ``loop_guard`` a reply that became a cycle is stopped (closing the stream
        makes llama-server cancel it) and ends with :class:`LoopStopped` and ``Finish("repetition")``. A
        ``deadline`` that fires ends the stream early, without a finish (:mod:`gguf_provider.deadline`)."""
        payload = self.prepare(payload)
        guard = LoopGuard() if loop_guard else None
        with self.guard(), closing(self.client.stream_chat(payload, deadline)) as events:
            for ev in events:
                yield ev
                stopped = guard.check(ev) if guard else None
                if stopped:
                    for out in stopped:
                        yield out
                    return

    def embed(self, inputs: list[str], *, truncate: bool = False, **extra: Any) -> list[list[float]]:
        """One vector per text. A text longer than :meth:`embed_limit` tokens raises :class:`ContextOverflowError`
        naming it, or with ``truncate`` is sent as its first tokens (the model's special tokens kept)."""
        def run() -> list[list[float]]:
            self.load()
            client = self.client
            limit = self.embed_limit()
            with self.guard():
                sent: list[str | list[int]] = []
                for i, text in enumerate(inputs):
                    if not limits.may_exceed(text, limit):
                        sent.append(text)
                        continue
                    with_special = client.tokenize(text)
                    too_long = truncate and len(with_special) > limit
                    plain = client.tokenize(text, special=False) if too_long else []
                    sent.append(limits.fit_text(i, text, with_special, plain, limit, truncate))
                return client.embed(sent, **extra)

        return self.retrying(run)

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
               batch_size: int = RERANK_BATCH, **extra: Any) -> list[RerankResult]:
        """The documents' relevance to ``query``, best first (``top_n`` of them, or all): one
        :class:`RerankResult` (the document's index in ``documents``, its score) each, from ``/v1/rerank`` in
        requests of ``batch_size`` documents. A query+document pair longer than :meth:`embed_limit` tokens raises
        :class:`ContextOverflowError` naming the document, before any is scored. No documents: no request."""
        docs = self._rerank_args(documents, top_n, batch_size)
        if not docs:
            return []

        def run() -> list[RerankResult]:
            self.load()
            client = self.client
            limit = self.embed_limit()
            with self.guard():
                long = [i for i, d in enumerate(docs) if limits.pair_may_exceed(query, d, limit)]
                if long:
                    n_query = len(client.tokenize(query, special=False))
                    for i in long:
                        n_doc = len(client.tokenize(docs[i], special=False))
                        limits.check_pair(i, docs[i], n_query, n_doc, limit)
                found: list[RerankResult] = []
                for start in range(0, len(docs), batch_size):
                    batch = client.rerank(query, docs[start:start + batch_size], **extra)
                    found += [RerankResult(start + r.index, r.score) for r in batch]
            return best_first(found, top_n)

        return self.retrying(run)

    # unasync: end

    def with_config(self, **changes: Any) -> Engine:
        return Engine(replace(self.config, **changes), transport=self.transport)


def _release_in_thread(lease: Lease) -> None:
    """A collected engine's release, in a thread of its own: a collection runs in whatever thread allocated at
    that moment (an event loop's, say), and a release may stop a server (keep_alive 0), which takes a moment."""
    try:
        threading.Thread(target=lease.release, name="gguf-provider-release").start()
    except RuntimeError:  # no new threads at interpreter shutdown
        lease.release()


def _import_async_transport() -> None:
    """Import what httpx's async transport imports at its first request (anyio's asyncio backend, ~0.1-0.9 s on 2
    busy cores), here in aload's worker thread instead of on the caller's event loop."""
    import anyio._backends._asyncio  # noqa: F401
    import httpcore._async  # noqa: F401


def best_first(results: list[RerankResult], top_n: int | None = None) -> list[RerankResult]:
    """Highest score first (a tie: the earlier document first), cut to ``top_n``."""
    ranked = sorted(results, key=lambda r: (-r.score, r.index))
    return ranked if top_n is None else ranked[:top_n]


def _no_restore(restoring: prompt_cache.Match | None, exc: GGUFProviderError,
                payload: dict[str, Any]) -> dict[str, Any]:
    """A restore that could not happen: the prompt is processed as usual. A file that made the server crash (this
    build aborts on some malformed slot files) is discarded; the request then goes to a fresh server."""
    if restoring is not None and isinstance(exc, ServerCrashedError):
        prompt_cache.discard(restoring.saved.path, "llama-server crashed restoring it")
    log.debug("prompt cache: no restore (%s: %s)", type(exc).__name__, exc)
    return payload


def _still_alive(info: ServerInfo, grace: float = 0.3) -> bool:
    """Whether the server is still alive after up to ``grace`` seconds: a killed server closes its sockets a
    moment before it shows up as exited."""
    deadline = time.monotonic() + grace
    while info.alive():
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False
