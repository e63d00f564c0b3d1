"""``GGUF``: a LlamaIndex function-calling LLM on a local GGUF model served by a managed llama-server.

A translation layer only: requests are built and streamed by :mod:`gguf_provider.chat` (reasoning switch, tool
choice enforcement, healing of text-written tool calls); this module maps LlamaIndex messages to OpenAI-format
messages and engine events back to ``ChatResponse`` / ``CompletionResponse``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel, ConfigDict, Field
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW, DEFAULT_NUM_OUTPUTS
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.types import PydanticProgramMode

from .. import chat
from ..options import ChatOptions, LlamaIndexExtras
from ..tools import ToolCall
from ._utils import ResponseBuilder, response, to_completion, to_openai

if TYPE_CHECKING:
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.tools.types import BaseTool

Model = TypeVar("Model", bound=BaseModel)

def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# Keyword arguments LlamaIndex passes along that are not request fields.
_FRAMEWORK_KWARGS = frozenset({"formatted", "allow_parallel_tool_calls", "tool_required", "verbose", "strict"})


class GGUF(FunctionCallingLLM, ChatOptions, LlamaIndexExtras):
    """A local GGUF model as a LlamaIndex LLM. The llama-server starts on first use (or at :meth:`load`).

    Same options as :class:`gguf_provider.ChatGGUF` (declared once in :mod:`gguf_provider.options`). ``metadata``
    is read from the running server (effective context window, tool support of the chat template).

    Example:
        .. code-block:: python

            from gguf_provider.llama_index import GGUF

            llm = GGUF(model="Qwen2.5-Coder-0.5B-Instruct", temperature=0, max_tokens=256)
            for r in llm.stream_complete("Why is the sky blue?"):
                print(r.delta, end="", flush=True)
    """

    model_config = ConfigDict(defer_build=False)  # built at import (the option groups defer theirs)

    context_window: int | None = Field(default=None, description=(
        "Override `metadata.context_window` (default: the server's effective context)."))
    """Override `metadata.context_window` (default: the server's effective context)."""

    @classmethod
    def class_name(cls) -> str:
        return "GGUF"

    @property
    def metadata(self) -> LLMMetadata:
        """Read from the server. Asked on an event loop's thread before the server is up (LlamaIndex's callbacks
        ask at the start of every ``achat``), it does not start one there, which would block the loop: the asked
        ``n_ctx`` (else LlamaIndex's default window) stands until the call has started it (or ``await aload()``)."""
        engine = self.engine
        if not engine.loaded() and _on_event_loop():
            cfg = engine.config
            return LLMMetadata(context_window=self.context_window or cfg.n_ctx or DEFAULT_CONTEXT_WINDOW,
                               num_output=self.max_tokens or DEFAULT_NUM_OUTPUTS, is_chat_model=True,
                               is_function_calling_model=True,
                               model_name=str(cfg.model or cfg.repo or cfg.model_path or cfg.base_url))
        return LLMMetadata(
            context_window=self.context_window or engine.n_ctx,
            num_output=self.max_tokens or DEFAULT_NUM_OUTPUTS,
            is_chat_model=True,
            is_function_calling_model=bool(engine.capabilities().get("supports_tools")),
            model_name=engine.model_name,
        )

    # --- requests ---------------------------------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> chat.ChatRequest:
        kwargs = {k: v for k, v in kwargs.items() if k not in _FRAMEWORK_KWARGS}
        keep_reasoning = bool(self.engine.capabilities().get("supports_preserve_reasoning"))
        return self.chat_request(to_openai(messages, keep_reasoning=keep_reasoning), kwargs)

    # unasync: async source
    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        await self.engine.aload()  # before anything asks the server (a coroutine's cold start: off the loop)
        request = self._request(messages, kwargs)
        return response(self.engine.model_name, await chat.acomplete(self.engine, request))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        await self.engine.aload()
        request = self._request(messages, kwargs)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            state = ResponseBuilder(self.engine.model_name)
            async for ev in chat.astream(self.engine, request):
                r = state.feed(ev)
                if r is not None:
                    yield r
            yield state.last()

        return gen()

    # Completion goes through the chat template: the prompt becomes one user message.

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return to_completion(await self.achat(self._prompt_messages(prompt), **kwargs))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        stream = await self.astream_chat(self._prompt_messages(prompt), **kwargs)

        async def gen() -> AsyncGenerator[CompletionResponse, None]:
            async for r in stream:
                yield to_completion(r)

        return gen()

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self.engine.load()  # before anything asks the server (a coroutine's cold start: off the loop)
        request = self._request(messages, kwargs)
        return response(self.engine.model_name, chat.complete(self.engine, request))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        self.engine.load()
        request = self._request(messages, kwargs)

        def gen() -> Generator[ChatResponse, None]:
            state = ResponseBuilder(self.engine.model_name)
            for ev in chat.stream(self.engine, request):
                r = state.feed(ev)
                if r is not None:
                    yield r
            yield state.last()

        return gen()

    # Completion goes through the chat template: the prompt becomes one user message.

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return to_completion(self.chat(self._prompt_messages(prompt), **kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        stream = self.stream_chat(self._prompt_messages(prompt), **kwargs)

        def gen() -> Generator[CompletionResponse, None]:
            for r in stream:
                yield to_completion(r)

        return gen()

    # unasync: end

    # Completion goes through the chat template: the prompt becomes one user message.

    def _prompt_messages(self, prompt: str) -> list[ChatMessage]:
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        if self.system_prompt:
            messages.insert(0, ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt))
        return messages

    # --- tokens -----------------------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact count from the model's own tokenizer (no special tokens)."""
        return len(self.engine.tokenize(text, special=False))

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

    # unasync: async source
    async def astructured_predict(self, output_cls: type[Model], prompt: PromptTemplate,
                                  llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        """Structured prediction with the output schema enforced by the server's grammar (JSON schema)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            result: Model = await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
            return result
        messages = self._get_messages(prompt, **prompt_args)
        response = await self.achat(messages, **self._structured_kwargs(output_cls, llm_kwargs))
        return output_cls.model_validate_json(response.message.content or "")

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def structured_predict(self, output_cls: type[Model], prompt: PromptTemplate,
                           llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        """Structured prediction with the output schema enforced by the server's grammar (JSON schema)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            result: Model = super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
            return result
        messages = self._get_messages(prompt, **prompt_args)
        response = self.chat(messages, **self._structured_kwargs(output_cls, llm_kwargs))
        return output_cls.model_validate_json(response.message.content or "")

    # unasync: end

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
