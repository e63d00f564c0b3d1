"""Every option of the adapters, declared once: pydantic groups with a description and a default each.

The adapters compose the groups (chat: :class:`ChatOptions`; embeddings: :class:`EmbeddingOptions`; rerankers:
:class:`RerankOptions`) plus their
framework's rule for unknown keyword arguments (:class:`LangChainExtras`, :class:`LlamaIndexExtras`). A new option
is one field here plus the place in the runtime or in :mod:`gguf_provider.chat` that uses it: a field whose name is
an :class:`~gguf_provider.engine.EngineConfig` field reaches the engine through :meth:`EngineOptions.engine_config`.
A llama-server option is not declared here but in :data:`gguf_provider.runtime.OPTIONS`: the server
groups' fields (their type, default and description) are written from that table into
:mod:`gguf_provider._server_fields` by ``scripts/gen_options.py``, so that type checkers see them, and a value is
checked by its entry's ``normalize`` (:meth:`_Options._server_option`). ``docs/reference.md`` is generated from
these descriptions (``scripts/gen_reference.py``).
"""

from __future__ import annotations

import difflib
import functools
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from typing_extensions import Self

from . import chat
from ._server_fields import _ChatServerFields, _EmbeddingServerFields, _ModelFields, _ServerFields
from ._warn import warn
from .engine import (
    API_KEY_ENV,
    DEFAULT_TIMEOUT,
    RERANK_BATCH,
    Engine,
    EngineConfig,
    RerankResult,
    env_api_key,
)
from .runtime import DEFAULT_START_TIMEOUT, OPTIONS

if TYPE_CHECKING:
    from dataclasses import InitVar

_BY_NAME = {o.name: o for o in OPTIONS}  # the llama-server options (runtime.OPTIONS) by name
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
            "seed", "max_tokens")


class UnknownOptionWarning(UserWarning):
    """An adapter got a keyword argument that is none of its options: it is forwarded to llama-server as-is."""


def _env_api_key_secret() -> SecretStr | None:
    key = env_api_key()
    return SecretStr(key) if key else None


class _Options(BaseModel):
    # The groups are composed into the adapters, which build their own schema at import (defer_build=False there);
    # a group's schema is built only if the group itself is used. Building them all at import was most of the
    # adapters' import time of our own (bench P3).
    model_config = ConfigDict(populate_by_name=True, protected_namespaces=(), arbitrary_types_allowed=True,
                              defer_build=True)

    # The field that takes unknown keyword arguments, by the framework's convention (see the extras below).
    _extras_field: ClassVar[str | None] = None

    @model_validator(mode="before")
    @classmethod
    def _forward_unknown(cls, values: Any) -> Any:
        return forward_unknown(cls, values, cls._extras_field) if cls._extras_field else values

    @field_validator("*", mode="before")
    @classmethod
    def _server_option(cls, value: Any, info: ValidationInfo) -> Any:
        """A llama-server option's value, checked by its declaration (the one check; ValueError says what is
        wrong)."""
        option = _BY_NAME.get(info.field_name or "")
        return option.normalize(value) if option is not None and option.normalize is not None else value

    def extra_body(self) -> dict[str, Any]:
        """Fields sent as they are in every request body (the framework's ``model_kwargs`` and the like)."""
        return dict(getattr(self, self._extras_field)) if self._extras_field else {}


# The model options are declared in runtime/_common/model_source.py (ModelSource) and written into _ModelFields by
# scripts/gen_options.py; the group adds how to attach to a running server instead.
class ModelOptions(_ModelFields, _Options):
    """Which model, and where it comes from."""

    base_url: str | None = Field(default=None, description=(
        "Attach to a running llama-server (http URL or Unix socket path) instead of starting one."))
    """Attach to a running llama-server (http URL or Unix socket path) instead of starting one."""
    api_key: SecretStr | None = Field(default_factory=_env_api_key_secret, description=(
        f"Key of an attached server (default `${API_KEY_ENV}`); servers we start use their own key file."))
    """Key of an attached server (default `$GGUF_PROVIDER_API_KEY`); servers we start use their own key
    file."""


# The generated field classes come before _Options in a group's bases, as when the fields were made on _Options:
# the adapters' fields keep their order (EmbeddingOptions too).
class ServerOptions(_ServerFields, _Options):
    """How the llama-server is started and shared (part of the server's identity: other values, other server)."""

    shared: bool = Field(default=True, description=(
        "Share one server with every process that asks for the same model and options."))
    """Share one server with every process that asks for the same model and options."""
    keep_alive: float | None = Field(default=None, description=(
        "Seconds the server lives after its last client lets go (0: at once, -1: until `gguf-provider stop`); "
        "default `$GGUF_PROVIDER_KEEP_ALIVE` or 300."))
    """Seconds the server lives after its last client lets go (0: at once, -1: until `gguf-provider stop`);
    default `$GGUF_PROVIDER_KEEP_ALIVE` or 300."""
    start_timeout: float = Field(default=DEFAULT_START_TIMEOUT, description=(
        "Seconds to wait for a starting server to load the model and answer `/health`."))
    """Seconds to wait for a starting server to load the model and answer `/health`."""


class ChatServerOptions(_ChatServerFields, _Options):
    """Server options that only chat models have."""


class SamplingOptions(_Options):
    """Per-request generation settings (each may also be given per call)."""

    temperature: float | None = Field(default=None, description="Sampling temperature; default: the server's.")
    """Sampling temperature; default: the server's."""
    top_p: float | None = Field(default=None, description="Nucleus sampling threshold.")
    """Nucleus sampling threshold."""
    top_k: int | None = Field(default=None, description="Sample from the k most likely tokens.")
    """Sample from the k most likely tokens."""
    min_p: float | None = Field(default=None, description="Drop tokens below this fraction of the top probability.")
    """Drop tokens below this fraction of the top probability."""
    repeat_penalty: float | None = Field(default=None, description="Penalty for repeated tokens (1.0: none).")
    """Penalty for repeated tokens (1.0: none)."""
    presence_penalty: float | None = Field(default=None, description="OpenAI-style presence penalty.")
    """OpenAI-style presence penalty."""
    frequency_penalty: float | None = Field(default=None, description="OpenAI-style frequency penalty.")
    """OpenAI-style frequency penalty."""
    seed: int | None = Field(default=None, description="Sampling seed, for repeatable replies.")
    """Sampling seed, for repeatable replies."""
    max_tokens: int | None = Field(default=None, description=(
        "Most tokens to generate; default and cap: what the context leaves after the prompt."))
    """Most tokens to generate; default and cap: what the context leaves after the prompt."""
    stop: list[str] | None = Field(default=None, validation_alias="stop_sequences",
                                   serialization_alias="stop_sequences", description=(
        "Strings that end the reply (also accepted as `stop_sequences`)."))
    """Strings that end the reply (also accepted as `stop_sequences`)."""
    if TYPE_CHECKING:  # the alias, as hf_token's (ModelOptions)
        stop_sequences: InitVar[list[str] | None] = None
        """`stop`'s other name."""
    reasoning: bool | Literal["low", "medium", "high"] | None = Field(default=None, description=(
        "Thinking: None = the template's default, True/False = on/off, `low`/`medium`/`high` = gpt-oss's effort or "
        "a thinking budget of 1024/4096/unbounded tokens; per family in docs/models.md."))
    """Thinking: None = the template's default, True/False = on/off, `low`/`medium`/`high` = gpt-oss's effort
    or a thinking budget of 1024/4096/unbounded tokens; per family in docs/models.md."""
    reasoning_budget: int | None = Field(default=None, ge=-1, description=(
        "Most tokens of thinking (llama-server ends the thinking there; -1: unbounded); overrides `reasoning`'s "
        "budget."))
    """Most tokens of thinking (llama-server ends the thinking there; -1: unbounded); overrides `reasoning`'s
    budget."""
    max_time: float | Literal["auto"] | None = Field(default="auto", description=(
        "Seconds of generation (`t_max_predict_ms`), then finish reason `length` and a `GenerationTimeWarning`; "
        "a timer closes the reply 1.25x + 1 s after its first token however slow the server; `auto`: 600 without "
        "`max_tokens`; None/0: none."))
    """Seconds of generation (`t_max_predict_ms`), then finish reason `length` and a `GenerationTimeWarning`;
    a timer closes the reply 1.25x + 1 s after its first token however slow the server; `auto`: 600 without
    `max_tokens`; None/0: none."""
    loop_guard: bool = Field(default=True, description=(
        "Stop a reply that became one unit repeated (finish reason `repetition`, a `LoopWarning`); False lets it "
        "run."))
    """Stop a reply that became one unit repeated (finish reason `repetition`, a `LoopWarning`); False lets it
    run."""
    auto_heal_tool_calls: bool = Field(default=True, description=(
        "Turn tool calls written as text (JSON, Qwen3-Coder XML) into tool calls."))
    """Turn tool calls written as text (JSON, Qwen3-Coder XML) into tool calls."""


class MediaOptions(_Options):
    """Images in messages (chat adapters)."""

    media_allow_hosts: list[str] | str | None = Field(default=None, description=(
        "Image URLs are fetched from public addresses only; these hosts (names, addresses or CIDR networks, e.g. "
        "`localhost`, `10.0.0.0/8`) may be fetched although they resolve to loopback, private or other internal "
        "addresses; `*` allows every host, `file:` reads `file://` URLs, `none` fetches no URL at all (a list, or "
        "one comma-separated string). Default: `$GGUF_PROVIDER_MEDIA_ALLOW_HOSTS`, else public addresses only "
        "(docs/security.md)."))
    """Image URLs are fetched from public addresses only; these hosts (names, addresses or CIDR networks, e.g.
    `localhost`, `10.0.0.0/8`) may be fetched although they resolve to loopback, private or other internal
    addresses; `*` allows every host, `file:` reads `file://` URLs, `none` fetches no URL at all (a list, or
    one comma-separated string). Default: `$GGUF_PROVIDER_MEDIA_ALLOW_HOSTS`, else public addresses only
    (docs/security.md)."""

    @field_validator("media_allow_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        return [h.strip() for h in value.split(",") if h.strip()] if isinstance(value, str) else value


class ClientOptions(_Options):
    """How requests are sent."""

    timeout: float | None = Field(default=DEFAULT_TIMEOUT, description=(
        "Seconds a request may take (None: the default); local models can be slow."))
    """Seconds a request may take (None: the default); local models can be slow."""
    max_retries: int = Field(default=2, description=(
        "Retries of a whole (non-streamed) request whose server crashed or was unreachable, on a fresh server."))
    """Retries of a whole (non-streamed) request whose server crashed or was unreachable, on a fresh
    server."""
    transport: Any = Field(default=None, exclude=True, description=(
        "An httpx transport for an attached `base_url` (tests replay recorded streams with "
        "`httpx.MockTransport`)."))
    """An httpx transport for an attached `base_url` (tests replay recorded streams with
    `httpx.MockTransport`)."""


class EngineOptions(ModelOptions, ServerOptions, ClientOptions):
    """The options every adapter has, and the one place they become an :class:`EngineConfig`."""

    _embedding: ClassVar[bool] = False
    _rerank: ClassVar[bool] = False
    _engine: Engine | None = PrivateAttr(default=None)

    def engine_config(self) -> EngineConfig:
        """The engine's config: every field of the engine's groups (:func:`engine_fields`), by name (a name
        EngineConfig lacks is a TypeError here, never a dropped option); secrets unwrapped, lists made tuples, None
        left to the engine's defaults."""
        values: dict[str, Any] = {"embedding": self._embedding, "rerank": self._rerank}
        for name in engine_fields(type(self)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, list):
                value = tuple(value)
            values[name] = value
        return EngineConfig(**values)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(self.engine_config(), transport=self.transport)
        return self._engine

    def load(self) -> Self:
        """Start (or attach to) the server now instead of on first use."""
        self.engine.load()
        return self

    async def aload(self) -> Self:
        """:meth:`load` without blocking the event loop (the start runs in a worker thread; cancelling the
        awaiting task stops it)."""
        await self.engine.aload()
        return self

    def unload(self) -> None:
        """Give back this object's lease on its server: the server stops after ``keep_alive`` once no client
        holds it."""
        if self._engine is not None:
            self._engine.unload()


class ChatOptions(EngineOptions, ChatServerOptions, SamplingOptions, MediaOptions):
    """Every option of a chat adapter, and the request they make."""

    def chat_request(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> chat.ChatRequest:
        """A request from OpenAI-format messages and per-call keyword arguments (which override the fields;
        keys that are no option go into the body as llama-server fields, like ``extra_body``)."""
        kwargs = dict(kwargs)
        params: dict[str, Any] = {k: kwargs.pop(k, getattr(self, k)) for k in SAMPLING}
        stop = kwargs.pop("stop", None) or self.stop
        if stop:
            params["stop"] = stop
        request = chat.ChatRequest(
            messages=messages, tools=kwargs.pop("tools", None) or [],
            tool_choice=chat.normalize_tool_choice(kwargs.pop("tool_choice", None)),
            response_format=kwargs.pop("response_format", None), params=params,
            reasoning=kwargs.pop("reasoning", self.reasoning),
            reasoning_budget=kwargs.pop("reasoning_budget", self.reasoning_budget), heal_tool_calls=self.auto_heal_tool_calls,
            loop_guard=kwargs.pop("loop_guard", self.loop_guard), max_time=kwargs.pop("max_time", self.max_time))
        request.params.update(self.extra_body())
        request.params.update({k: v for k, v in kwargs.items() if v is not None})
        return request

    def sampling_params(self) -> dict[str, Any]:
        """The sampling fields that are set (for tracing and identifying params)."""
        return {k: getattr(self, k) for k in SAMPLING if getattr(self, k) is not None}


class EmbeddingOptions(EngineOptions, _EmbeddingServerFields, _Options):
    """Every option of an embeddings adapter."""

    _embedding: ClassVar[bool] = True

    truncate: bool = Field(default=False, description=(
        "A text longer than the model's context (e.g. 512 tokens for MiniLM): False raises "
        "`ContextOverflowError` naming it, True embeds its first tokens (never a silent cut)."))
    """A text longer than the model's context (e.g. 512 tokens for MiniLM): False raises
    `ContextOverflowError` naming it, True embeds its first tokens (never a silent cut)."""

    # unasync: async source
    async def aembed(self, texts: list[str]) -> list[list[float]]:
        return await self.engine.aembed(texts, truncate=self.truncate, **self.extra_body()) if texts else []

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def embed(self, texts: list[str]) -> list[list[float]]:
        return self.engine.embed(texts, truncate=self.truncate, **self.extra_body()) if texts else []

    # unasync: end


class RerankOptions(EngineOptions):
    """Every option of a reranker (a LangChain document compressor, a LlamaIndex node postprocessor)."""

    _rerank: ClassVar[bool] = True

    top_n: int | None = Field(default=3, ge=0, description=(
        "How many of the best documents (nodes) to keep, best first; None keeps them all, reordered."))
    """How many of the best documents (nodes) to keep, best first; None keeps them all, reordered."""
    batch_size: int = Field(default=RERANK_BATCH, ge=1, description=(
        "Documents scored per `/v1/rerank` request; the best `top_n` are picked over all of them."))
    """Documents scored per `/v1/rerank` request; the best `top_n` are picked over all of them."""

    # unasync: async source
    async def arerank(self, query: str, documents: list[str]) -> list[RerankResult]:
        return await self.engine.arerank(query, documents, top_n=self.top_n, batch_size=self.batch_size,
                                         **self.extra_body()) if documents else []

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def rerank(self, query: str, documents: list[str]) -> list[RerankResult]:
        return self.engine.rerank(query, documents, top_n=self.top_n, batch_size=self.batch_size,
                                  **self.extra_body()) if documents else []

    # unasync: end


# The groups whose fields configure the engine (an EngineConfig field each, by name); the others are per request.
ENGINE_GROUPS: tuple[type[BaseModel], ...] = (ModelOptions, ServerOptions, ChatServerOptions, _EmbeddingServerFields,
                                              MediaOptions, ClientOptions)
NOT_CONFIG = frozenset({"transport"})  # the engine's, not its config's: Engine(config, transport=)


@functools.cache
def engine_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of adapter class ``cls`` that become its :class:`EngineConfig`."""
    groups = [g for g in ENGINE_GROUPS if issubclass(cls, g)]
    return tuple(n for n in cls.model_fields if n not in NOT_CONFIG and any(n in g.model_fields for g in groups))


# --- unknown keyword arguments: each framework's convention, never silent ---------------------------------------

_EXTRAS_DESCRIPTION = ("Extra fields sent in every request body (llama-server takes more than the named options, e.g. "
                       "`dry_multiplier`). Unknown constructor arguments land here, with a warning.")


def aliases(field: FieldInfo) -> list[str]:
    """The other keyword names a field takes besides its own (its ``alias`` and ``validation_alias`` choices)."""
    names = [field.alias] if field.alias else []
    choices = field.validation_alias
    for choice in choices.choices if isinstance(choices, AliasChoices) else [choices]:
        if isinstance(choice, str) and choice not in names:
            names.append(choice)
    return names


def forward_unknown(cls: type[BaseModel], values: Any, target: str) -> Any:
    """Move the keys of ``values`` that name no field of ``cls`` into ``values[target]``, warning about each with
    the closest known name; a known option given inside ``target`` is an error (it would be ambiguous)."""
    if not isinstance(values, dict):
        return values
    known = set(cls.model_fields)
    known.update(a for f in cls.model_fields.values() for a in aliases(f))
    inside = values.get(target) or {}
    clash = sorted(set(inside) & known)
    if clash:
        raise ValueError(f"{cls.__name__}: give {', '.join(clash)} as their own parameters, not inside {target}")
    unknown = [k for k in values if k not in known]
    if not unknown:
        return values
    values = dict(values)
    moved = dict(inside)
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        warn(f"{cls.__name__} has no option {key!r}{hint}: it is sent to llama-server in the request body "
             f"as {target}[{key!r}]", UnknownOptionWarning)
        moved[key] = values.pop(key)
    values[target] = moved
    return values


class LangChainExtras(_Options):
    """LangChain's convention: unknown keyword arguments land in ``model_kwargs`` (with a warning)."""

    _extras_field: ClassVar[str | None] = "model_kwargs"
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description=_EXTRAS_DESCRIPTION)
    """Extra fields sent in every request body (llama-server takes more than the named options, e.g.
    `dry_multiplier`). Unknown constructor arguments land here, with a warning."""


class LlamaIndexExtras(_Options):
    """LlamaIndex's convention: unknown keyword arguments land in ``additional_kwargs`` (with a warning)."""

    _extras_field: ClassVar[str | None] = "additional_kwargs"
    additional_kwargs: dict[str, Any] = Field(default_factory=dict, description=_EXTRAS_DESCRIPTION)
    """Extra fields sent in every request body (llama-server takes more than the named options, e.g.
    `dry_multiplier`). Unknown constructor arguments land here, with a warning."""
