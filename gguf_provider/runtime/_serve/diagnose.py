"""One table from llama-server failures to our typed errors (:mod:`gguf_provider.errors`).

A failure is what llama-server left behind: the tail of its log (a start that failed, a death during a request),
the error body it answered a request with (HTTP or an in-stream ``error`` event), or the httpx exception a request
ended in. :data:`TABLE` names each failure we recognize once: its matcher (a regex over the log tail, the body's
error ``type`` or a regex over its ``message``, an httpx exception class, or a fact looked up, such as an RPC
worker that no longer accepts connections), the error class it becomes and the builder of its message. The first
entry that matches and builds an error wins (a builder returns None when the match is not about this server, e.g.
an RPC worker it was not given). A failure no entry knows becomes the generic error of its kind, the server's log
tail still in it: the :class:`ServerStartError` as raised, a :class:`ServerCrashedError`, an :class:`APIError`.

tests/unit_tests/test_diagnose.py runs every entry on a sample as llama-server prints it.
"""

from __future__ import annotations

import re
import reprlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ...errors import (
    APIError,
    ContextOverflowError,
    DeviceOutOfMemoryError,
    GGUFFormatError,
    GGUFProviderError,
    RPCWorkerLostError,
    RPCWorkerUnreachableError,
    ServerCrashedError,
    ServerStartError,
    ServerTimeoutError,
)
from ...lazy import LazyModule
from .._memory import rpc

if TYPE_CHECKING:
    import httpx
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

Kind = Literal["start", "crash", "answer", "transport"]
"""``start``: the log of a server that exited or never became healthy while starting; ``crash``: the log of a
server that died during a request; ``answer``: an error body the server answered with; ``transport``: the httpx
exception a request ended in."""


@dataclass(frozen=True)
class Failure:
    """What is known about one failure; each kind fills its own fields."""

    kind: Kind
    log_tail: str = ""
    log_path: Path | None = None
    status: int | None = None  # the HTTP status of an answer (None: an in-stream error event)
    body: Any = None  # the answer's body: its JSON, or its text
    exc: BaseException | None = None  # the exception the request or start ended in
    pid: int = 0
    model: Path | None = None
    binary: Path | None = None
    workers: tuple[str, ...] = ()  # the server's RPC workers (``rpc_servers``)
    gone: tuple[str, ...] = ()  # those that no longer accept connections

    @cached_property
    def error(self) -> dict[str, Any]:
        """The error object of the body (``{"error": {...}}`` or the object itself)."""
        body = self.body
        err = body.get("error", body) if isinstance(body, dict) else {"message": _text(body)}
        return err if isinstance(err, dict) else {"message": _text(err)}

    @cached_property
    def message(self) -> str:
        return _text(self.error.get("message") or self.error) if self.kind == "answer" else ""

    @property
    def etype(self) -> Any:
        return self.error.get("type") if self.kind == "answer" else None


Builder = Callable[[Failure, "re.Match[str] | None"], "GGUFProviderError | None"]


@dataclass(frozen=True)
class Rule:
    """One known failure: it matches when any of its matchers does (on a failure of its ``kind``)."""

    name: str
    kind: Kind
    error: type[GGUFProviderError]
    build: Builder
    log: re.Pattern[str] | None = None  # searched in the log tail
    etype: str | None = None  # the answer's error ``type``
    message: re.Pattern[str] | None = None  # searched in the answer's error ``message``
    when: Callable[[Failure], bool] | None = None  # a fact looked up rather than read

    def matches(self, f: Failure) -> Iterator[re.Match[str] | None]:
        """Each match on ``f``: None for a matcher without groups, the regex match otherwise."""
        if f.kind != self.kind:
            return
        if self.when is not None and self.when(f):
            yield None
        if self.etype is not None and f.etype == self.etype:
            yield None
        if self.message is not None:
            yield from self.message.finditer(f.message)
        if self.log is not None:
            yield from self.log.finditer(f.log_tail)


# --- builders ----------------------------------------------------------------------------------------------------


def _rpc_not_built(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    if not f.workers:
        return None
    return ServerStartError(
        f"{f.binary} was built without llama.cpp's RPC backend, so it cannot use rpc_servers; "
        f"`gguf-provider server install` builds one with it (GGML_RPC=ON) beside rpc-server", f.log_tail, f.log_path)


def _rpc_unreachable(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    worker = m["worker"] if m else None
    if worker not in f.workers:
        return None  # a worker this server was not given
    return RPCWorkerUnreachableError(f"llama-server could not use RPC worker {worker} (it stopped answering while the "
                                     f"server started)", worker, f.log_tail, f.log_path)


def _truncated(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    line = m[0] if m else ""
    return GGUFFormatError(f"{f.model} is truncated or corrupted (llama-server: "
                           f"{line.split('error loading model: ')[-1]}); download it again (log: {f.log_path})")


def _rpc_lost(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    if not f.workers:
        return None
    gone = f.gone
    which = f"RPC worker{'s' * (len(gone) > 1)} {', '.join(gone)} went away" if gone else "an RPC worker broke off"
    return RPCWorkerLostError(
        f"llama-server (pid {f.pid}) died during the request: {which}. Restart "
        f"{'it' if len(gone) == 1 else 'the workers'} (`gguf-provider rpc-worker`) or drop "
        f"{'it' if len(gone) == 1 else 'them'} from rpc_servers; the next call starts a new server",
        gone, f.log_tail, f.log_path)


_OUT_OF_DEVICE_MEMORY = re.compile(
    r"failed to allocate (?P<device>(?!CPU)[A-Za-z_]+\d+(?:\[[^\]]*\])?) buffer of size (?P<bytes>\d+)|"
    r"allocating (?P<mib>[\d.]+) MiB on device (?P<dev>\d+): cudaMalloc failed|ErrorOutOfDeviceMemory|"
    r"ggml_metal\w*: error: failed to allocate")


def _out_of_device_memory(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    groups: dict[str, str] = {}  # what every matching line says, the first word on each wins
    for each in _OUT_OF_DEVICE_MEMORY.finditer(f.log_tail):
        groups.update({k: v for k, v in each.groupdict().items() if v and k not in groups})
    device = groups.get("device") or (f"CUDA{groups['dev']}" if groups.get("dev") else None)
    needed = (int(groups["bytes"]) if groups.get("bytes") else
              int(float(groups["mib"]) * 2**20) if groups.get("mib") else None)
    asked = f" (an allocation of {needed / 2**20:,.0f} MiB failed)" if needed else ""
    return DeviceOutOfMemoryError(
        f"llama-server ran out of {device or 'device'} memory loading {f.model}{asked}. Levers: fewer layers on "
        f"the GPU (n_gpu_layers), a smaller context (n_ctx), a quantized KV cache (kv_cache_type='q8_0'), a "
        f"smaller quant of the model; `gguf-provider plan MODEL` shows what goes where",
        device=device, needed=needed, log_tail=f.log_tail, log_path=f.log_path)


def _context_overflow(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    n_prompt, n_ctx = _int_or_none(f.error.get("n_prompt_tokens")), _int_or_none(f.error.get("n_ctx"))
    return ContextOverflowError(
        f"the prompt ({n_prompt} tokens) does not fit the context window ({n_ctx} tokens): shorten the input, "
        f"trim the history, or start the model with a larger n_ctx", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


def _batch_too_small(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    assert m is not None
    n_in, n_batch = int(m[1]), int(m[2])
    return ContextOverflowError(
        f"an input of {n_in} tokens is longer than the {n_batch} tokens the embedding server takes at once: "
        f"shorten or split it, or pass truncate=True", n_prompt_tokens=n_in, n_ctx=n_batch)


def _context_filled(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    return ContextOverflowError(
        "the server's context filled up while generating (its parallel slots share it): set max_tokens, "
        "shorten the conversation, or start the model with a larger n_ctx")


def _timeout(f: Failure, m: re.Match[str] | None) -> GGUFProviderError | None:
    return ServerTimeoutError(f"llama-server did not answer in time ({type(f.exc).__name__}); raise `timeout` for "
                              f"slow models, or check the server")


# --- the table -----------------------------------------------------------------------------------------------------

TABLE: tuple[Rule, ...] = (
    # A start with rpc_servers on a build without the RPC backend (common/arg.cpp, on `--rpc`).
    Rule("rpc-not-built", "start", ServerStartError, _rpc_not_built,
         log=re.compile(r"RPC not supported in this build|failed to find RPC backend")),
    # A worker that stopped answering between our probe and llama-server's own connect (ggml-rpc.cpp's aborts).
    Rule("rpc-worker-unreachable", "start", RPCWorkerUnreachableError, _rpc_unreachable,
         log=re.compile(r"(?:Failed to connect to|RPC handshake failed for) (?P<worker>\S+)")),
    # A model file cut short (llama-model-loader.h): "... error loading model: tensor 'x' data is not within ...".
    Rule("truncated-model", "start", GGUFFormatError, _truncated,
         log=re.compile(r"^[^\r\n]*data is not within the file bounds[^\r\n]*", re.MULTILINE)),
    # Out of a device's memory while loading: ggml's allocator names the buffer ("failed to allocate CUDA0 buffer
    # of size N", ggml-alloc.c), after the backend's own line (CUDA: "allocating X MiB on device 0: cudaMalloc
    # failed: out of memory"; Vulkan: "ErrorOutOfDeviceMemory"; Metal: "failed to allocate buffer"). Seen on an H200.
    Rule("out-of-device-memory", "start", DeviceOutOfMemoryError, _out_of_device_memory,
         log=_OUT_OF_DEVICE_MEMORY),
    # A worker that no longer accepts connections after the server died during a request ...
    Rule("rpc-worker-gone", "crash", RPCWorkerLostError, _rpc_lost, when=lambda f: bool(f.gone)),
    # ... or, with all of them still answering, the server's own word that one broke off (ggml-rpc.cpp).
    Rule("rpc-server-crashed", "crash", RPCWorkerLostError, _rpc_lost, log=re.compile(r"RPC server crashed")),
    # The prompt does not fit the slot's context (server-context.cpp, ERROR_TYPE_EXCEED_CONTEXT_SIZE).
    Rule("context-overflow", "answer", ContextOverflowError, _context_overflow, etype="exceed_context_size_error",
         message=re.compile(r"exceeds the available context size")),
    # An embedding input longer than the physical batch (a non-causal model must see it in one batch).
    Rule("embedding-batch-too-small", "answer", ContextOverflowError, _batch_too_small,
         message=re.compile(r"input \((\d+) tokens\) is too large to process.*?batch size: (\d+)")),
    # Generation filled the KV cache (shared by the server's parallel slots) before max_tokens.
    Rule("context-filled", "answer", ContextOverflowError, _context_filled,
         message=re.compile(r"Context size has been exceeded")),
    # A hung server must never hang the caller silently.
    Rule("timeout", "transport", ServerTimeoutError, _timeout,
         when=lambda f: isinstance(f.exc, httpx.TimeoutException)),  # not exc=: httpx loads at first use
)


def find(f: Failure) -> tuple[Rule, GGUFProviderError] | None:
    """The first entry of :data:`TABLE` that matches ``f`` and builds an error, with that error."""
    for rule in TABLE:
        for m in rule.matches(f):
            err = rule.build(f, m)
            if err is not None:
                return rule, err
    return None


def diagnose(f: Failure) -> GGUFProviderError | None:
    """The typed error of ``f`` from :data:`TABLE`; None when no entry knows it."""
    found = find(f)
    return found[1] if found else None


# --- each kind with its generic error ------------------------------------------------------------------------------


class ServerLog(Protocol):
    """A server as the diagnosis sees it (a ``manager.ServerInfo``)."""

    @property
    def pid(self) -> int: ...

    @property
    def log_path(self) -> Path: ...

    def log_tail(self) -> str: ...


def start_failure(exc: ServerStartError, *, model: Path, binary: Path,
                  workers: Sequence[str] = ()) -> GGUFProviderError:
    """The typed error of a failed start, or ``exc`` itself (it carries the log tail) when no entry knows it."""
    f = Failure("start", exc.log_tail, exc.log_path, exc=exc, model=model, binary=binary, workers=tuple(workers))
    return diagnose(f) or exc


def crash(server: ServerLog, exc: BaseException, workers: Sequence[str] = ()) -> ServerCrashedError:
    """The typed error of a server that died during a request: an RPC worker lost, else the generic
    :class:`ServerCrashedError` with the log tail."""
    err = rpc_lost(server, workers, exc) if workers else None
    if err is not None:
        return err
    return ServerCrashedError(f"llama-server (pid {server.pid}) died during the request ({type(exc).__name__}); the "
                              f"next call starts a new one", server.log_tail(), server.log_path)


def rpc_lost(server: ServerLog, workers: Sequence[str], exc: BaseException | None = None) -> RPCWorkerLostError | None:
    """The typed error for a server that died because RPC workers went away: the ones that no longer accept
    connections, or (when all still do) the log's word that a worker broke off; None when neither."""
    gone = gone_workers(workers)
    tail = server.log_tail()  # read after the wait: the log may have said more meanwhile
    err = diagnose(Failure("crash", tail, server.log_path, exc=exc, pid=server.pid, workers=tuple(workers),
                           gone=gone))
    return err if isinstance(err, RPCWorkerLostError) else None


def gone_workers(workers: Sequence[str], patience: float = 2.0) -> tuple[str, ...]:
    """The workers that no longer accept connections, looked at again for up to ``patience`` s while all do."""
    gone = tuple(w for w in workers if not rpc.reachable(w))
    deadline = time.monotonic() + patience
    while not gone and workers and time.monotonic() < deadline:
        # A killed worker's port still accepted connections when the server's death was seen, in a test run with a
        # load of 4 on 2 cores: look again for a moment before settling for "an RPC worker broke off".
        time.sleep(0.2)
        gone = tuple(w for w in workers if not rpc.reachable(w))
    return gone


def error_from_body(status: int | None, body: Any) -> APIError:
    """The typed error of a llama-server error object (HTTP body or in-stream event); the generic
    :class:`APIError` with its message when no entry knows it."""
    f = Failure("answer", status=status, body=body)
    err = diagnose(f)
    if isinstance(err, APIError):
        return err
    code = f.error.get("code", status)
    return APIError(f"llama-server error{f' {code}' if code else ''}: {f.message}", status_code=status, body=body)


def transport_error(exc: BaseException) -> GGUFProviderError | None:
    """The typed error of a request's httpx exception when the table knows one (a timeout); None for the rest,
    which the engine maps (crashed or unreachable, from whether the server still runs)."""
    return diagnose(Failure("transport", exc=exc))


# --- helpers -------------------------------------------------------------------------------------------------------


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 200


def bounded_repr(value: Any) -> str:
    """A bounded repr (depth and length) of a payload for error messages."""
    return _repr.repr(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else bounded_repr(value)  # bounded even for deeply nested bodies
