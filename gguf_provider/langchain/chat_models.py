"""``ChatGGUF``: a LangChain chat model on a local GGUF model served by a managed llama-server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, closing, contextmanager
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import ContextOverflowError as LCContextOverflowError
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import JsonOutputKeyToolsParser
from langchain_core.output_parsers.openai_tools import PydanticToolsParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from typing_extensions import Self

from .. import chat
from ..engine import API_KEY_ENV, Engine
from ..errors import ContextOverflowError
from ..events import Completion, Event, Finish, ReasoningDelta, TextDelta, Timings, ToolCallDelta, Usage
from ..options import ChatOptions, LangChainExtras
from ._utils import CompleteJsonOutputParser, CompletePydanticOutputParser, to_openai


class GGUFContextOverflowError(ContextOverflowError, LCContextOverflowError):
    """The prompt does not fit the context window (both gguf-provider's and LangChain's error type)."""


class ChatGGUF(BaseChatModel, ChatOptions, LangChainExtras):
    """Chat with a local GGUF model. The llama-server starts on first use (or at :meth:`load`) and is shared.

    Example:
        .. code-block:: python

            from gguf_provider import ChatGGUF

            llm = ChatGGUF(model="SmolLM2-135M-Instruct", temperature=0)
            for chunk in llm.stream("Why is the sky blue?"):
                print(chunk.content, end="", flush=True)
    """

    # The option groups defer their schemas (gguf_provider.options); an adapter builds its own at import, as a
    # pydantic model does.
    model_config = ConfigDict(defer_build=False)

    streaming: bool = Field(default=False, description=(
        "Make `invoke` stream internally (callbacks see each token); `stream` always streams."))
    """Make `invoke` stream internally (callbacks see each token); `stream` always streams."""

    _engines: dict[str, Engine] = PrivateAttr(default_factory=dict)  # per-call ``model=`` overrides

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["gguf_provider", "langchain", "chat_models"]

    @property
    def lc_secrets(self) -> dict[str, str]:
        return {"api_key": API_KEY_ENV, "hf_token": "HF_TOKEN"}

    # --- engine -----------------------------------------------------------------------------------------------

    def load(self) -> Self:
        """Start (or attach to) the server now instead of on first use."""
        self.engine.load()
        self._set_profile()
        return self

    async def aload(self) -> Self:
        """:meth:`load` without blocking the event loop (the start runs in a worker thread; cancelling the
        awaiting task stops it)."""
        await self.engine.aload()
        self._set_profile()
        return self

    def _set_profile(self) -> None:
        modalities = self.engine.modalities()
        self.profile = {"max_input_tokens": self.engine.n_ctx,
                        "tool_calling": bool(self.engine.capabilities().get("supports_tools")),
                        "structured_output": True, "image_inputs": bool(modalities.get("vision")),
                        "image_url_inputs": bool(modalities.get("vision")),
                        "audio_inputs": bool(modalities.get("audio"))}

    def unload(self) -> None:
        """Give back this model's leases on its servers (they stop after ``keep_alive``)."""
        for engine in [self._engine, *self._engines.values()]:
            if engine is not None:
                engine.unload()

    def _engine_for(self, model: str | None) -> Engine:
        """The engine of a per-call ``model=`` (a spec like the ``model`` field): started and shared through the
        runtime like the default one, with this object's server options."""
        if not model or model == self.model or self.base_url:
            return self.engine
        engine = self._engines.get(model)
        if engine is None:
            engine = self._engines.setdefault(model, self.engine.with_config(
                model=model, repo=None, quant=None, filename=None, model_path=None))
        return engine

    @property
    def _llm_type(self) -> str:
        return "gguf"

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model or self.repo or self.model_path or self.base_url, "quant": self.quant,
                **self.sampling_params()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(ls_provider="gguf", ls_model_type="chat",
                                 ls_model_name=str(kwargs.get("model") or self.model or self.repo
                                                   or self.model_path or "gguf"))
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = temperature
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        stop = stop or kwargs.get("stop") or self.stop
        if stop:
            params["ls_stop"] = stop
        return params

    # --- requests ---------------------------------------------------------------------------------------------

    def _chat_request(self, engine: Engine, messages: list[BaseMessage], stop: list[str] | None,
                      kwargs: dict[str, Any]) -> chat.ChatRequest:
        kwargs = dict(kwargs)
        kwargs.pop("ls_structured_output_format", None)
        model = kwargs.pop("model", None)
        if model and self.base_url:
            kwargs["model"] = model  # an attached server in router mode picks the model by name
        if stop is not None:
            kwargs["stop"] = stop
        keep_reasoning = bool(engine.capabilities().get("supports_preserve_reasoning"))
        return self.chat_request(to_openai(messages, keep_reasoning=keep_reasoning), kwargs)

    # The calls: each written once, async; the sync methods are generated from it (scripts/gen_sync.py).

    # unasync: async source
    async def _arequest(self, messages: list[BaseMessage], stop: list[str] | None,
                        **kwargs: Any) -> tuple[Engine, chat.ChatRequest]:
        """The engine and request of a call, the servers they need loaded first (a coroutine's: off the loop)."""
        if self.profile is None:
            await self.aload()
        engine = self._engine_for(kwargs.get("model"))
        await engine.aload()
        return engine, self._chat_request(engine, messages, stop, kwargs)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.streaming:
            from langchain_core.language_models.chat_models import agenerate_from_stream

            return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))
        engine, request = await self._arequest(messages, stop, **kwargs)
        with _lc_errors():
            completion = await chat.acomplete(engine, request)
        return self._result(completion, engine.model_name)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        engine, request = await self._arequest(messages, stop, **kwargs)
        chunks = _ChunkBuilder()
        with _lc_errors():
            async with aclosing(chat.astream(engine, request)) as events:
                async for ev in events:
                    chunk = chunks.chunk(ev)
                    if chunk is not None:
                        if run_manager and isinstance(ev, TextDelta):
                            await run_manager.on_llm_new_token(ev.text, chunk=chunk)
                        yield chunk
        yield chunks.last(engine.model_name)

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def _request(self, messages: list[BaseMessage], stop: list[str] | None,
                 **kwargs: Any) -> tuple[Engine, chat.ChatRequest]:
        """The engine and request of a call, the servers they need loaded first (a coroutine's: off the loop)."""
        if self.profile is None:
            self.load()
        engine = self._engine_for(kwargs.get("model"))
        engine.load()
        return engine, self._chat_request(engine, messages, stop, kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.streaming:
            from langchain_core.language_models.chat_models import generate_from_stream

            return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))
        engine, request = self._request(messages, stop, **kwargs)
        with _lc_errors():
            completion = chat.complete(engine, request)
        return self._result(completion, engine.model_name)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        engine, request = self._request(messages, stop, **kwargs)
        chunks = _ChunkBuilder()
        with _lc_errors():
            with closing(chat.stream(engine, request)) as events:
                for ev in events:
                    chunk = chunks.chunk(ev)
                    if chunk is not None:
                        if run_manager and isinstance(ev, TextDelta):
                            run_manager.on_llm_new_token(ev.text, chunk=chunk)
                        yield chunk
        yield chunks.last(engine.model_name)

    # unasync: end

    def _result(self, c: Completion, model_name: str) -> ChatResult:
        calls, invalid = [], []
        for tc in c.tool_calls:
            try:
                args = json.loads(tc.arguments or "{}")
                if not isinstance(args, dict):
                    raise ValueError("arguments are not an object")
                calls.append(tool_call(name=tc.name, args=args, id=tc.id))
            except ValueError as exc:
                invalid.append(invalid_tool_call(name=tc.name, args=tc.arguments, id=tc.id, error=str(exc)))
        extra = {"reasoning_content": c.reasoning} if c.reasoning else {}
        message = AIMessage(content=c.content, additional_kwargs=extra, tool_calls=calls, invalid_tool_calls=invalid,
                            usage_metadata=_usage(c.usage),
                            response_metadata=_metadata(model_name, c.finish_reason, c.timings))
        return ChatResult(generations=[ChatGeneration(message=message)])

    # --- tokens -----------------------------------------------------------------------------------------------

    def get_num_tokens(self, text: str) -> int:
        """Exact count from the model's own tokenizer (no special tokens)."""
        return len(self.get_token_ids(text))

    def get_token_ids(self, text: str) -> list[int]:
        return self.engine.tokenize(text, special=False)

    def get_num_tokens_from_messages(self, messages: list[BaseMessage],
                                     tools: Sequence[Any] | None = None) -> int:
        """Exact prompt size: the chat template applied by the server, then tokenized."""
        payload: dict[str, Any] = {"messages": to_openai(messages, keep_reasoning=False)}
        if tools:
            payload["tools"] = [convert_to_openai_tool(t) for t in tools]
        return self.engine.count_prompt_tokens(payload)

    # --- tools and structured output --------------------------------------------------------------------------

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
                   *, tool_choice: dict[str, Any] | str | bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools. ``tool_choice`` "required"/"any"/True or a tool name is enforced by constrained decoding."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None and tool_choice is not False:
            choice = chat.normalize_tool_choice(tool_choice)
            names = {f["function"]["name"] for f in formatted}
            if choice and choice.startswith("name:") and choice[5:] not in names:
                raise ValueError(f"tool_choice {choice[5:]!r} is not one of the bound tools {sorted(names)}")
        return super().bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(self, schema: dict[str, Any] | type | None = None, *,
                               method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
                               include_raw: bool = False, strict: bool | None = None,
                               **kwargs: Any) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Structured output; ``json_schema`` (the default) is enforced by the server's grammar."""
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        parser: Runnable[Any, Any]
        if method == "function_calling":
            if schema is None:
                raise ValueError("function_calling needs a schema")
            tool = convert_to_openai_tool(schema)
            name = tool["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, ls_structured_output_format={
                "kwargs": {"method": method}, "schema": tool})
            parser = (PydanticToolsParser(tools=[schema], first_tool_only=True) if is_pydantic  # type: ignore[list-item]
                      else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
        elif method == "json_mode":
            llm = self.bind(response_format={"type": "json_object"},
                            ls_structured_output_format={"kwargs": {"method": method}, "schema": schema})
            parser = (CompletePydanticOutputParser(pydantic_object=schema) if is_pydantic  # type: ignore[arg-type]
                      else CompleteJsonOutputParser())
        elif method == "json_schema":
            if schema is None:
                raise ValueError("json_schema needs a schema")
            json_schema = convert_to_json_schema(schema)
            name = json_schema.get("title", "output")
            response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": json_schema,
                                                                      "strict": True}}
            llm = self.bind(response_format=response_format, ls_structured_output_format={
                "kwargs": {"method": method, "strict": strict}, "schema": json_schema})
            parser = (CompletePydanticOutputParser(pydantic_object=schema) if is_pydantic  # type: ignore[arg-type]
                      else CompleteJsonOutputParser())
        else:
            raise ValueError(f"unknown method {method!r}: use json_schema, function_calling or json_mode")
        if include_raw:
            parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
            fallback = RunnablePassthrough.assign(parsed=lambda _: None)
            return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")
        return llm | parser


class _ChunkBuilder:
    """Turns engine events into LangChain chunks; usage and metadata go on the one last chunk."""

    __slots__ = ("finish", "timings", "usage")

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.finish: str | None = None
        self.timings: dict[str, Any] = {}

    def chunk(self, ev: Event) -> ChatGenerationChunk | None:
        if isinstance(ev, TextDelta):
            return ChatGenerationChunk(message=AIMessageChunk(content=ev.text))
        if isinstance(ev, ReasoningDelta):
            return ChatGenerationChunk(message=AIMessageChunk(content="",
                                                              additional_kwargs={"reasoning_content": ev.text}))
        if isinstance(ev, ToolCallDelta):
            return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[
                tool_call_chunk(name=ev.name, args=ev.arguments, id=ev.id, index=ev.index)]))
        if isinstance(ev, Usage):
            self.usage = ev
        elif isinstance(ev, Finish):
            self.finish = ev.reason
        elif isinstance(ev, Timings):
            self.timings = ev.data
        return None

    def last(self, model_name: str) -> ChatGenerationChunk:
        metadata = _metadata(model_name, self.finish, self.timings)
        message = AIMessageChunk(content="", usage_metadata=_usage(self.usage), response_metadata=metadata,
                                 chunk_position="last")
        return ChatGenerationChunk(message=message, generation_info={"finish_reason": self.finish})


def _usage(u: Usage | None) -> UsageMetadata | None:
    if u is None:
        return None
    return UsageMetadata(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
                         total_tokens=u.total_tokens or u.prompt_tokens + u.completion_tokens,
                         input_token_details={"cache_read": u.cached_tokens})


def _metadata(model_name: str, finish: str | None, timings: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"model_name": model_name, "model_provider": "gguf", "finish_reason": finish}
    if timings:
        meta["timings"] = timings
        if timings.get("predicted_per_second"):
            meta["tokens_per_second"] = round(float(timings["predicted_per_second"]), 2)
    return meta


@contextmanager
def _lc_errors() -> Iterator[None]:
    """Our context overflow raised as one that is also LangChain's (middleware catches that type)."""
    try:
        yield
    except ContextOverflowError as exc:
        if isinstance(exc, GGUFContextOverflowError):
            raise
        raise GGUFContextOverflowError(str(exc), n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx) from exc
