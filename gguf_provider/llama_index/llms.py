"""``GGUF``: a LlamaIndex function-calling LLM on a local GGUF model served by a managed llama-server.

A translation layer only: requests are built and streamed by :mod:`gguf_provider.chat` (reasoning switch, tool
choice enforcement, healing of text-written tool calls); this module maps LlamaIndex messages to OpenAI-format
messages and engine events back to ``ChatResponse`` / ``CompletionResponse``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    ImageBlock,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr, SecretStr
from llama_index.core.constants import DEFAULT_NUM_OUTPUTS
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.types import PydanticProgramMode

from .. import chat
from .._adapter import env_api_key_secret
from ..client import Event, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from ..engine import DEFAULT_TIMEOUT, Engine, EngineConfig
from ..errors import ServerConnectionError, ServerCrashedError
from ..tools import ToolCall

if TYPE_CHECKING:
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.tools.types import BaseTool

Model = TypeVar("Model", bound=BaseModel)

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
             "seed", "max_tokens")


class GGUF(FunctionCallingLLM):
    """A local GGUF model as a LlamaIndex LLM. The llama-server starts on first use (or at :meth:`load`).

    Same constructor vocabulary as :class:`gguf_provider.ChatGGUF`. ``metadata`` is read from the running server
    (effective context window, tool support of the chat template).

    Example:
        .. code-block:: python

            from gguf_provider.llama_index import GGUF

            llm = GGUF(model="Qwen2.5-Coder-0.5B-Instruct", temperature=0, max_tokens=256)
            for r in llm.stream_complete("Why is the sky blue?"):
                print(r.delta, end="", flush=True)
    """

    # --- the model ---
    model: str | None = Field(default=None, description="A .gguf path, a name in the models dir, or "
                                                        "'org/repo[:QUANT]' on Hugging Face.")
    repo: str | None = None
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None
    token: SecretStr | None = Field(default=None, description="Hugging Face token.")
    model_path: str | None = None
    base_url: str | None = Field(default=None, description="Attach to a running llama-server (http URL or Unix "
                                                           "socket path) instead of starting one.")
    api_key: SecretStr | None = Field(default_factory=env_api_key_secret, description="Key of an attached "
                                      "server (default $GGUF_PROVIDER_API_KEY).")

    # --- the server ---
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_parallel: int | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    reasoning_format: str | None = None
    server_args: list[str] = Field(default_factory=list)
    keep_alive: float | None = Field(default=None, description="Seconds the shared server lives after its last "
                                                               "client lets go (default $GGUF_PROVIDER_KEEP_ALIVE "
                                                               "or 300).")
    shared: bool = True
    llama_server: str | None = None
    rpc_servers: list[str] = Field(default_factory=list, description="llama.cpp RPC workers (host:port) to spread "
                                                                       "the model over (--rpc).")
    vision: bool = Field(default=False, description="Fetch and load the repo's mmproj projector (images).")

    # --- sampling ---
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    reasoning: bool | Literal["low", "medium", "high"] | None = Field(
        default=None, description="None: the template's default; True/False: thinking on/off; effort levels.")

    # --- client ---
    timeout: float | None = DEFAULT_TIMEOUT
    max_retries: int = Field(default=2, description="Retries of a non-streaming request whose server crashed or "
                                                    "could not be reached (a fresh server is started).")
    auto_heal_tool_calls: bool = True
    context_window: int | None = Field(default=None, description="Override metadata.context_window (default: "
                                                                 "the server's effective context).")

    _engine: Engine | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "GGUF"

    # --- engine -----------------------------------------------------------------------------------------------

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_fields(self)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(self.engine_config())
        return self._engine

    def load(self) -> GGUF:
        """Start (or attach to) the server now instead of on first use."""
        self.engine.load()
        return self

    def unload(self) -> None:
        """Give back this model's lease on its server (it stops after ``keep_alive``)."""
        if self._engine is not None:
            self._engine.unload()

    @property
    def metadata(self) -> LLMMetadata:
        engine = self.engine
        return LLMMetadata(
            context_window=self.context_window or engine.n_ctx,
            num_output=self.max_tokens or DEFAULT_NUM_OUTPUTS,
            is_chat_model=True,
            is_function_calling_model=bool(engine.capabilities().get("supports_tools")),
            model_name=engine.model_name,
        )

    # --- requests ---------------------------------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> chat.ChatRequest:
        kwargs = dict(kwargs)
        keep_reasoning = bool(self.engine.capabilities().get("supports_preserve_reasoning"))
        params: dict[str, Any] = {k: kwargs.pop(k, getattr(self, k)) for k in _SAMPLING}
        stop = kwargs.pop("stop", None) or self.stop
        if stop:
            params["stop"] = stop
        request = chat.ChatRequest(
            messages=to_openai(messages, keep_reasoning=keep_reasoning), tools=kwargs.pop("tools", None) or [],
            tool_choice=chat.normalize_tool_choice(kwargs.pop("tool_choice", None)),
            response_format=kwargs.pop("response_format", None), params=params,
            reasoning=kwargs.pop("reasoning", self.reasoning), heal_tool_calls=self.auto_heal_tool_calls)
        for key in ("formatted", "allow_parallel_tool_calls", "tool_required", "verbose", "strict"):
            kwargs.pop(key, None)
        request.params.update({k: v for k, v in kwargs.items() if v is not None})  # extra llama-server fields
        return request

    def _retrying(self, fn: Callable[[], chat.Completion]) -> chat.Completion:
        for attempt in range(self.max_retries + 1):
            try:
                return fn()
            except (ServerCrashedError, ServerConnectionError):
                if attempt >= self.max_retries:
                    raise
        raise AssertionError("unreachable")

    def _response(self, c: chat.Completion) -> ChatResponse:
        return ChatResponse(message=_message(c.content, c.reasoning, c.tool_calls),
                            raw=_raw(self.engine.model_name, c.finish_reason, c.usage, c.timings),
                            additional_kwargs=_usage_kwargs(c.usage))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._request(messages, kwargs)
        return self._response(self._retrying(lambda: chat.complete(self.engine, request)))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._request(messages, kwargs)
        for attempt in range(self.max_retries + 1):
            try:
                return self._response(await chat.acomplete(self.engine, request))
            except (ServerCrashedError, ServerConnectionError):
                if attempt >= self.max_retries:
                    raise
        raise AssertionError("unreachable")

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request = self._request(messages, kwargs)

        def gen() -> Generator[ChatResponse, None, None]:
            state = _StreamState(self.engine.model_name)
            for ev in chat.stream(self.engine, request):
                r = state.feed(ev)
                if r is not None:
                    yield r
            yield state.last()

        return gen()

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        request = self._request(messages, kwargs)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            state = _StreamState(self.engine.model_name)
            async for ev in chat.astream(self.engine, request):
                r = state.feed(ev)
                if r is not None:
                    yield r
            yield state.last()

        return gen()

    # Completion goes through the chat template: the prompt becomes one user message.

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _to_completion(self.chat(self._prompt_messages(prompt), **kwargs))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _to_completion(await self.achat(self._prompt_messages(prompt), **kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        stream = self.stream_chat(self._prompt_messages(prompt), **kwargs)

        def gen() -> Generator[CompletionResponse, None, None]:
            for r in stream:
                yield _to_completion(r)

        return gen()

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        stream = await self.astream_chat(self._prompt_messages(prompt), **kwargs)

        async def gen() -> AsyncGenerator[CompletionResponse, None]:
            async for r in stream:
                yield _to_completion(r)

        return gen()

    def _prompt_messages(self, prompt: str) -> list[ChatMessage]:
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        if self.system_prompt:
            messages.insert(0, ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt))
        return messages

    # --- tokens -----------------------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact count from the model's own tokenizer (no special tokens)."""
        return len(self.engine.client.tokenize(text, special=False))

    def count_message_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Exact prompt size: the chat template applied by the server, then tokenized."""
        return self.engine.count_prompt_tokens({"messages": to_openai(messages, keep_reasoning=False)})

    # --- tools ------------------------------------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``tool_required`` (or a named ``tool_choice``) is enforced by constrained decoding."""
        specs = [t.metadata.to_openai_tool(skip_length_check=True) for t in tools]
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg))
        elif user_msg is not None:
            messages.append(user_msg)
        choice: Any = tool_choice
        if specs and tool_required and choice in (None, "auto"):
            choice = "required"
        if specs and choice is not None:
            normalized = chat.normalize_tool_choice(choice)
            names = {s["function"]["name"] for s in specs}
            if normalized and normalized.startswith("name:") and normalized[5:] not in names:
                raise ValueError(f"tool_choice {normalized[5:]!r} is not one of the tools {sorted(names)}")
        out: dict[str, Any] = {"messages": messages, **kwargs}
        if specs:
            out["tools"] = specs
            out["tool_choice"] = choice
            if allow_parallel_tool_calls:
                out["parallel_tool_calls"] = True
        return out

    def _validate_chat_with_tools_response(self, response: ChatResponse, tools: Sequence[BaseTool],
                                           allow_parallel_tool_calls: bool = False,
                                           **kwargs: Any) -> ChatResponse:
        if not allow_parallel_tool_calls:
            calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
            if len(calls) > 1:
                response.message.blocks = [b for b in response.message.blocks
                                           if not isinstance(b, ToolCallBlock) or b is calls[0]]
        return response

    def get_tool_calls_from_response(self, response: ChatResponse, error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        selections = []
        for block in response.message.blocks:
            if isinstance(block, ToolCallBlock):
                args = block.tool_kwargs
                if isinstance(args, str):
                    args = ToolCall("", block.tool_name, args).args()  # {} while still partial
                selections.append(ToolSelection(tool_id=block.tool_call_id or "", tool_name=block.tool_name,
                                                tool_kwargs=args))
        if not selections and error_on_no_tool_call:
            raise ValueError(f"expected at least one tool call, got none: {response.message.content!r}")
        return selections

    # --- structured output: the server's grammar enforces the JSON schema ---------------------------------------

    def _structured_kwargs(self, output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        schema = output_cls.model_json_schema()
        return {**(llm_kwargs or {}), "response_format": {"type": "json_schema", "json_schema": {
            "name": schema.get("title", output_cls.__name__), "schema": schema, "strict": True}}}

    def structured_predict(self, output_cls: type[Model], prompt: PromptTemplate,
                           llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        """Structured prediction with the output schema enforced by the server's grammar (JSON schema)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            result: Model = super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
            return result
        messages = self._get_messages(prompt, **prompt_args)
        response = self.chat(messages, **self._structured_kwargs(output_cls, llm_kwargs))
        return output_cls.model_validate_json(response.message.content or "")

    async def astructured_predict(self, output_cls: type[Model], prompt: PromptTemplate,
                                  llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            result: Model = await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
            return result
        messages = self._get_messages(prompt, **prompt_args)
        response = await self.achat(messages, **self._structured_kwargs(output_cls, llm_kwargs))
        return output_cls.model_validate_json(response.message.content or "")

    def _structured_stream_call(self, output_cls: type[Model], prompt: PromptTemplate,
                                llm_kwargs: dict[str, Any] | None = None,
                                **prompt_args: Any) -> Generator[Any, None, None]:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super()._structured_stream_call(
                output_cls, prompt, llm_kwargs, **prompt_args)
        from llama_index.core.program.utils import process_streaming_objects

        messages = self._get_messages(prompt, **prompt_args)
        stream = self.stream_chat(messages, **self._structured_kwargs(output_cls, llm_kwargs))

        def gen() -> Generator[Any, None, None]:
            current: list[Any] | None = None
            for r in stream:
                if r.delta or r.raw is not None:  # a new piece of JSON, or the final response
                    obj = process_streaming_objects(r, output_cls, cur_objects=current, llm=self)
                    current = obj if isinstance(obj, list) else [obj]
                    yield obj

        return gen()

    async def _structured_astream_call(self, output_cls: type[Model], prompt: PromptTemplate,
                                       llm_kwargs: dict[str, Any] | None = None,
                                       **prompt_args: Any) -> AsyncGenerator[Any, None]:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super()._structured_astream_call(
                output_cls, prompt, llm_kwargs, **prompt_args)
        from llama_index.core.program.utils import process_streaming_objects

        messages = self._get_messages(prompt, **prompt_args)
        stream = await self.astream_chat(messages, **self._structured_kwargs(output_cls, llm_kwargs))

        async def gen() -> AsyncGenerator[Any, None]:
            current: list[Any] | None = None
            async for r in stream:
                if r.delta or r.raw is not None:  # a new piece of JSON, or the final response
                    obj = process_streaming_objects(r, output_cls, cur_objects=current, llm=self)
                    current = obj if isinstance(obj, list) else [obj]
                    yield obj

        return gen()


# --- translation ------------------------------------------------------------------------------------------------


def to_openai(messages: Sequence[ChatMessage], *, keep_reasoning: bool) -> list[dict[str, Any]]:
    """LlamaIndex messages as OpenAI-format messages (text, images, tool calls, tool results, reasoning)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.role.value if isinstance(m.role, MessageRole) else str(m.role)
        role = {"chatbot": "assistant", "model": "assistant", "developer": "system", "function": "tool"}.get(role,
                                                                                                            role)
        msg: dict[str, Any] = {"role": role, "content": _content(m)}
        if role == "assistant":
            calls = _tool_calls_of(m)
            if calls:
                msg["tool_calls"] = calls
            reasoning = "".join(b.content or "" for b in m.blocks if isinstance(b, ThinkingBlock))
            if keep_reasoning and reasoning:
                msg["reasoning_content"] = reasoning
            if msg["content"] is None:
                msg["content"] = ""
        elif role == "tool":
            msg["tool_call_id"] = m.additional_kwargs.get("tool_call_id") or m.additional_kwargs.get("name") or ""
            if not isinstance(msg["content"], str):
                msg["content"] = json.dumps(msg["content"])
        if msg["content"] is None:
            msg["content"] = ""
        out.append(msg)
    return out


def _content(m: ChatMessage) -> str | list[dict[str, Any]] | None:
    parts: list[dict[str, Any]] = []
    for b in m.blocks:
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            if b.url is not None and b.image is None and b.path is None:
                url = str(b.url)
            else:
                data = b.resolve_image(as_base64=True).read()
                mime = b.image_mimetype or "image/png"
                url = f"data:{mime};base64,{data.decode() if isinstance(data, bytes) else data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    if not parts:
        return None
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_calls_of(m: ChatMessage) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for i, b in enumerate(b for b in m.blocks if isinstance(b, ToolCallBlock)):
        args = b.tool_kwargs if isinstance(b.tool_kwargs, str) else json.dumps(b.tool_kwargs)
        calls.append({"id": b.tool_call_id or f"call_{i}", "type": "function",
                      "function": {"name": b.tool_name, "arguments": args}})
    if calls:
        return calls
    for i, tc in enumerate(m.additional_kwargs.get("tool_calls") or []):  # OpenAI-shaped, from other LLMs
        tc = tc.model_dump() if hasattr(tc, "model_dump") else dict(tc)
        fn = tc.get("function") or {}
        raw_args = fn.get("arguments")
        text = raw_args if isinstance(raw_args, str) else json.dumps(raw_args or {})
        calls.append({"id": tc.get("id") or f"call_{i}", "type": "function",
                      "function": {"name": fn.get("name", ""), "arguments": text}})
    return calls


def _tool_block(call: ToolCall) -> ToolCallBlock:
    try:
        args: dict[str, Any] | str = json.loads(call.arguments or "{}")
        if not isinstance(args, dict):
            args = call.arguments
    except ValueError:
        args = call.arguments
    return ToolCallBlock(tool_call_id=call.id or None, tool_name=call.name, tool_kwargs=args)


def _message(content: str, reasoning: str, calls: Sequence[ToolCall]) -> ChatMessage:
    blocks: list[Any] = []
    if reasoning:
        blocks.append(ThinkingBlock(content=reasoning))
    blocks.append(TextBlock(text=content))
    blocks += [_tool_block(c) for c in calls]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)


def _usage_kwargs(u: Usage | None) -> dict[str, Any]:
    if u is None:
        return {}
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens or u.prompt_tokens + u.completion_tokens}


def _raw(model_name: str, finish: str | None, usage: Usage | None, timings: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {"model": model_name, "finish_reason": finish}
    if usage is not None:
        raw["usage"] = {**_usage_kwargs(usage), "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}
    if timings:
        raw["timings"] = timings
        if timings.get("predicted_per_second"):
            raw["tokens_per_second"] = round(float(timings["predicted_per_second"]), 2)
    return raw


def _to_completion(r: ChatResponse) -> CompletionResponse:
    extra = dict(r.additional_kwargs)
    thinking = "".join(b.content or "" for b in r.message.blocks if isinstance(b, ThinkingBlock))
    if thinking:
        extra["thinking"] = thinking
    return CompletionResponse(text=r.message.content or "", delta=r.delta, raw=r.raw, additional_kwargs=extra)


class _StreamState:
    """Folds engine events into the running message; each delta becomes one ``ChatResponse`` whose message is
    everything so far (LlamaIndex's streaming convention)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.collector = chat.Collector()

    def _snapshot(self, delta: str, extra: dict[str, Any]) -> ChatResponse:
        c = self.collector.done()  # repeatable: joins what was collected so far
        return ChatResponse(message=_message(c.content, c.reasoning, c.tool_calls), delta=delta,
                            additional_kwargs=extra)

    def feed(self, ev: Event) -> ChatResponse | None:
        self.collector.add(ev)
        if isinstance(ev, TextDelta):
            return self._snapshot(ev.text, {})
        if isinstance(ev, ReasoningDelta):
            return self._snapshot("", {"thinking_delta": ev.text})
        if isinstance(ev, ToolCallDelta):
            return self._snapshot("", {})
        return None  # Usage, Finish, Timings: carried by the last response

    def last(self) -> ChatResponse:
        c = self.collector.done()
        r = self._snapshot("", _usage_kwargs(c.usage))
        r.raw = _raw(self.model_name, c.finish_reason, c.usage, c.timings)
        return r
