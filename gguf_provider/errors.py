"""The exception hierarchy of gguf-provider.

Every error the library raises on purpose derives from :class:`GGUFProviderError` and says what to do next::

    GGUFProviderError                      anything from gguf-provider
    ├── BinaryNotFoundError                no llama-server to run
    ├── BuildError                         `gguf-provider server install` failed       .log_path
    │   └── PrebuiltInstallError           llama.cpp's release archive not usable      .reason
    ├── ModelError                         the model could not be resolved or read
    │   ├── ModelNotFoundError             the spec names nothing usable
    │   │   └── UnknownQuantError          the repo has no such quant                  .available
    │   ├── MissingShardError              a split GGUF lacks shards
    │   ├── GGUFFormatError                not a valid GGUF file, or truncated
    │   ├── InsufficientDiskError          not enough disk for the download
    │   ├── ModelDownloadError             the download failed or is incomplete
    │   ├── DraftModelMismatchError        a draft model's vocabulary is not the model's .model .draft
    │   └── NotARerankerError              a model given to rerank is no reranker        .model
    ├── InsufficientMemoryError            the model does not fit (free memory, budget, model count)
    │   └── DeviceOutOfMemoryError         a start ran out of a device's memory         .device .needed
    ├── MediaFetchError                    an image URL could not be fetched           .url .status_code
    │   └── MediaURLRefusedError           ... not fetched: an internal address/scheme .reason
    ├── ServerError                        the llama-server process failed             .log_tail .log_path
    │   ├── ServerStartError               exited or not healthy while starting
    │   │   └── RPCWorkerUnreachableError  an RPC worker cannot be reached or is busy  .worker
    │   ├── ServerCrashedError             died during a request
    │   │   └── RPCWorkerLostError         ... because an RPC worker went away          .workers
    │   ├── ServerTimeoutError             did not answer in time
    │   └── ServerConnectionError          could not be reached
    └── APIError                           the server answered a request with an error .status_code .body
        ├── ContextOverflowError           the prompt does not fit the context         .n_prompt_tokens .n_ctx
        │   └── GGUFContextOverflowError   (ChatGGUF) also langchain_core.exceptions.ContextOverflowError
        └── UnsupportedInputError          an image/audio part for a model without it  .modality

What to catch:

* ``GGUFProviderError``: anything gguf-provider raised on purpose.
* ``ServerError``: anything the server process did (start failed, crash, hang, unreachable); ``log_path`` is
  its log and ``log_tail`` its last lines.
* ``ContextOverflowError``: an input too long for the context; trim and retry. ``ChatGGUF`` raises
  ``GGUFContextOverflowError``, which LangChain code catching its own ``ContextOverflowError`` also sees.
* ``APIError``: any request llama-server refused (or would refuse: ``UnsupportedInputError``, raised before the
  request). ``ModelError``: anything about the model file.
* ``MediaFetchError``: an ``http(s)`` image URL in a message could not be fetched (status, size, type, network);
  ``MediaURLRefusedError`` when it was not even tried: a non-public address or another scheme (docs/security.md).

Warnings (``UserWarning`` subclasses, here too): ``LoopWarning``, ``GenerationTimeWarning`` (a reply cut by
``max_time``), ``RepeatedToolCallWarning``, ``SpeculationWarning``, ``BackendWarning``, ``PromptCacheWarning``,
``MemoryBudgetWarning``.

Wrong arguments raise ``ValueError``, not these. docs/errors.md says when each class is raised.
"""

from __future__ import annotations

from pathlib import Path


class GGUFProviderError(Exception):
    """Base class of every gguf-provider error."""


# --- llama-server binary -------------------------------------------------------------------------------------


class BinaryNotFoundError(GGUFProviderError):
    """No llama-server binary could be found."""


class BuildError(GGUFProviderError):
    """Fetching or building llama.cpp failed."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


# --- models --------------------------------------------------------------------------------------------------


class ModelError(GGUFProviderError):
    """A model could not be resolved or read."""


class ModelNotFoundError(ModelError):
    """The model spec names nothing that exists locally or on the hub."""


class UnknownQuantError(ModelNotFoundError):
    """The requested quant is not available in the repository."""

    def __init__(self, message: str, available: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.available = available or {}


class MissingShardError(ModelError):
    """A split GGUF is missing one or more of its shards."""


class GGUFFormatError(ModelError):
    """The file is not a valid GGUF file (wrong magic, truncated, or absurd values)."""


class InsufficientDiskError(ModelError):
    """Not enough free disk space to download a model."""


class InsufficientMemoryError(GGUFProviderError):
    """The model does not fit in the available memory at any usable context."""


class DeviceOutOfMemoryError(InsufficientMemoryError):
    """llama-server ran out of a device's memory while loading (cudaMalloc, Vulkan's ErrorOutOfDeviceMemory, Metal),
    after the start had been retried once with a smaller plan: ``device`` is llama.cpp's name for it (``CUDA0``),
    ``needed`` the bytes of the allocation that failed (None when the log does not say)."""

    def __init__(self, message: str, *, device: str | None = None, needed: int | None = None, log_tail: str = "",
                 log_path: Path | None = None) -> None:
        if log_tail:
            message = f"{message}\n--- last llama-server log lines ({log_path}) ---\n{log_tail}"
        super().__init__(message)
        self.device, self.needed, self.log_tail, self.log_path = device, needed, log_tail, log_path


# --- server --------------------------------------------------------------------------------------------------


class ServerError(GGUFProviderError):
    """A llama-server process failed."""

    def __init__(self, message: str, log_tail: str = "", log_path: Path | None = None) -> None:
        if log_tail:
            message = f"{message}\n--- last llama-server log lines ({log_path}) ---\n{log_tail}"
        elif log_path is not None:
            message = f"{message} (log: {log_path})"
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path


class ServerStartError(ServerError):
    """llama-server exited or never became healthy while starting."""


class ServerCrashedError(ServerError):
    """llama-server died while serving a request."""


class RPCWorkerUnreachableError(ServerStartError):
    """An RPC worker (``rpc_servers``) refused the connection, does not resolve, or is busy with another client;
    checked before llama-server starts."""

    def __init__(self, message: str, worker: str, log_tail: str = "", log_path: Path | None = None) -> None:
        super().__init__(message, log_tail, log_path)
        self.worker = worker


class RPCWorkerLostError(ServerCrashedError):
    """llama-server died during a request because an RPC worker went away (``workers``: the ones that no longer
    accept connections)."""

    def __init__(self, message: str, workers: tuple[str, ...], log_tail: str = "",
                 log_path: Path | None = None) -> None:
        super().__init__(message, log_tail, log_path)
        self.workers = workers


class LoadCancelled(GGUFProviderError):
    """A model load (install, download, server start) was stopped because its caller went away: the coroutine
    awaiting ``aload()`` was cancelled. Nothing it started is left running or registered."""


class ServerTimeoutError(ServerError):
    """llama-server did not answer within the timeout."""


class ServerConnectionError(ServerError):
    """The server at the given address could not be reached."""


# --- requests ------------------------------------------------------------------------------------------------


class APIError(GGUFProviderError):
    """llama-server answered a request with an error."""

    def __init__(self, message: str, status_code: int | None = None, body: object = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class ContextOverflowError(APIError):
    """The prompt does not fit into the server's context window."""

    def __init__(self, message: str, n_prompt_tokens: int | None = None, n_ctx: int | None = None) -> None:
        super().__init__(message, status_code=400)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class UnsupportedInputError(APIError):
    """A message has an image (or audio) part but the server's model has no projector for it (``/props``
    ``modalities``). Raised before the request is sent."""

    def __init__(self, message: str, modality: str) -> None:
        super().__init__(message, status_code=400)
        self.modality = modality


# --- media ---------------------------------------------------------------------------------------------------


class MediaFetchError(GGUFProviderError):
    """An ``http(s)`` image URL in a message could not be fetched and inlined (bad status, too large, not an image,
    network failure or timeout)."""

    def __init__(self, message: str, url: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code


class MediaURLRefusedError(MediaFetchError):
    """An image URL was not fetched because of where it points: a loopback, private, link-local, multicast or
    reserved address (after DNS resolution, or after a redirect), a scheme other than http(s) and ``data:``, or
    URL fetching turned off (``none``). ``reason`` says which; ``media_allow_hosts`` /
    ``$GGUF_PROVIDER_MEDIA_ALLOW_HOSTS`` allow it."""

    def __init__(self, message: str, url: str, reason: str) -> None:
        super().__init__(message, url)
        self.reason = reason


class ModelDownloadError(ModelError):
    """Downloading a model failed or left an incomplete file (nothing partial is ever returned as a model)."""


class DraftModelMismatchError(ModelError):
    """A draft model for speculative decoding (``speculative=``) has a vocabulary other than the main model's (from
    both GGUF headers), so it cannot draft for it. Raised before any server starts."""

    def __init__(self, message: str, model: Path, draft: Path) -> None:
        super().__init__(message)
        self.model = model
        self.draft = draft


class NotARerankerError(ModelError):
    """A model given to a reranker (``GGUFRerank``, ``rerank``) is no reranker: its GGUF header has no ``rank``
    pooling type and it has no classifier head (``cls.output``/``cls`` tensors). Raised before the server starts
    and before any request (llama-server would score with whatever its first output is)."""

    def __init__(self, message: str, model: Path) -> None:
        super().__init__(message)
        self.model = model


# --- warnings ------------------------------------------------------------------------------------------------


class LoopWarning(UserWarning):
    """The loop guard stopped a reply that had become a repeating cycle (``finish_reason="repetition"``)."""


class BuildFeatureWarning(UserWarning):
    """The llama-server in use lacks optimisations gguf-provider would use (``--metrics``, ``--cache-reuse``, ...):
    they are left out, said once per binary and process (docs/install.md#a-newer-llamacpp-and-back)."""


class GenerationTimeWarning(UserWarning):
    """A reply was cut by ``max_time`` (llama-server's ``t_max_predict_ms``; ``finish_reason="length"``): pass a
    larger ``max_time``, or ``max_time=None`` for no time bound."""


class ReasoningWarning(UserWarning):
    """``reasoning=`` asked for what the model's family cannot do (thinking off on gpt-oss or an always-thinking
    model, thinking on a model without it); the message says what happens instead (docs/models.md). Said once per
    family and request."""


class RepeatedToolCallWarning(UserWarning):
    """A model's reply only repeated a tool call whose result the conversation already had; it was asked once more
    without tools."""


class SpeculationWarning(UserWarning):
    """Speculative decoding was asked for (``speculative=``, default ``"auto"``) but the server runs without it: the
    llama-server build has no such flag, or the server turned it off. Said once per binary and reason."""


class BackendWarning(UserWarning):
    """The llama-server in use computes on the CPU of a machine with a GPU (a CPU build, or a GPU build this
    machine's GPU cannot run); the message names the reason and the fix (docs/install.md#which-backend). Said once
    per process and binary, at the first model start."""


class PromptCacheWarning(UserWarning):
    """The prompt cache (a long prompt's KV saved when a server stops, restored by the next one; docs/runtime.md)
    skipped something: a save that failed or ran out of its time bound (the server stopped anyway), or a saved file
    that was corrupt or did not match the server and was deleted instead of served."""


class MemoryBudgetWarning(UserWarning):
    """A server started with a smaller automatic context than its model's own to fit the memory budget
    (``$GGUF_PROVIDER_MEMORY_LIMIT``)."""


# --- prebuilt llama.cpp archives -----------------------------------------------------------------------------


class PrebuiltInstallError(BuildError):
    """llama.cpp's published release archive could not be installed. ``.reason`` says why: ``"network"`` (no
    network, DNS, timeout), ``"rate-limit"`` (HTTP 403/429 from the releases API), ``"http"`` (another HTTP answer,
    e.g. 404 for an unknown tag or 422), ``"no-asset"`` (no archive for this OS, CPU and backend), ``"no-digest"``
    (the release publishes no sha256 for it), ``"digest"`` (the download does not match that sha256),
    ``"archive"`` (unreadable, unsafe paths or links, no llama-server inside) or ``"smoke"`` (the binary failed its
    smoke run). ``server install --from auto`` falls back to the source build on it; ``--from prebuilt`` raises
    it."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
