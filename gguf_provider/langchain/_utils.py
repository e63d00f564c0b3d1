"""Translation between LangChain messages and the OpenAI-format messages the engine takes, and the parsers of
structured output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, Generation
from pydantic import ConfigDict


def _content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            parts.append({"type": "text", "text": block})
            continue
        btype = block.get("type")
        if btype == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif btype == "image_url":
            value = block["image_url"]  # OpenAI: {"url": ..., "detail": ...}; older LangChain: the URL itself
            parts.append({"type": "image_url", "image_url": value if isinstance(value, dict) else {"url": value}})
        elif btype == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
        elif btype == "input_audio":
            parts.append({"type": "input_audio", "input_audio": block["input_audio"]})
        elif btype == "audio" and (block.get("base64") or block.get("data")):
            # llama-server takes base64 wav/mp3 as OpenAI input_audio parts (with an audio mmproj)
            fmt = str(block.get("mime_type") or "audio/wav").split("/")[-1].replace("mpeg", "mp3").replace("x-wav", "wav")
            parts.append({"type": "input_audio",
                          "input_audio": {"data": block.get("base64") or block.get("data"), "format": fmt}})
        elif btype in ("reasoning", "thinking", "tool_call", "tool_use"):
            continue  # carried separately
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _image_url(block: dict[str, Any]) -> str:
    """The URL (http(s) or data:) of a LangChain ``image`` block: v1 ``{"url"}`` / ``{"base64", "mime_type"}``, v0
    ``{"source_type": "url"|"base64", "url"|"data"}``, or Anthropic's ``{"source": {"type": "url"|"base64"}}``.
    http(s) URLs are fetched and inlined by the engine (:mod:`gguf_provider.media`)."""
    source: dict[str, Any] = block["source"] if isinstance(block.get("source"), dict) else {}
    url = block.get("url") or (source.get("url") if source.get("type") == "url" else None)
    if url:
        return str(url)
    data = block.get("base64") or block.get("data") or (source.get("data") if source.get("type") == "base64" else None)
    if not data:
        keys = sorted(k for k in block if k != "type")
        raise ValueError(f"image block with {keys} has no url or base64 data: ChatGGUF takes an http(s)/data URL "
                         f"('url') or base64 data ('base64' with 'mime_type'); provider file ids are not supported")
    mime = block.get("mime_type") or source.get("media_type") or "image/jpeg"
    return f"data:{mime};base64,{data}"


def to_openai(messages: Sequence[BaseMessage], *, keep_reasoning: bool) -> list[dict[str, Any]]:
    """OpenAI-format messages; an AI message's reasoning is kept where the template preserves it
    (``keep_reasoning``) and on a last AI message, which llama-server continues (a prefilled reply)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": _content(m.content)})
        elif isinstance(m, HumanMessage):
            out.append({"role": "user", "content": _content(m.content)})
        elif isinstance(m, AIMessage):
            msg: dict[str, Any] = {"role": "assistant", "content": _content(m.content) or ""}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": tc.get("id") or f"call_{i}", "type": "function",
                     "function": {"name": tc["name"], "arguments": json.dumps(tc.get("args") or {})}}
                    for i, tc in enumerate(m.tool_calls)]
            reasoning = m.additional_kwargs.get("reasoning_content")
            if reasoning and (keep_reasoning or i == len(messages) - 1):
                msg["reasoning_content"] = reasoning
            out.append(msg)
        elif isinstance(m, ToolMessage):
            content = m.content if isinstance(m.content, str) else json.dumps(m.content)
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": content})
        elif isinstance(m, FunctionMessage):
            out.append({"role": "tool", "tool_call_id": m.name, "content": str(m.content)})
        elif isinstance(m, ChatMessage):
            out.append({"role": m.role, "content": _content(m.content)})
        else:
            raise ValueError(f"unsupported message type {type(m).__name__}")
    return out


def _refuse_truncated(result: list[Generation]) -> None:
    """LangChain's JSON parsers close a cut-off object and return it; a reply stopped by ``max_tokens`` would pass
    as a complete one with fields missing. Say what happened instead."""
    for gen in result:
        finish = gen.message.response_metadata.get("finish_reason") if isinstance(gen, ChatGeneration) else None
        if finish == "length":
            raise OutputParserException(
                "the structured output was cut off by max_tokens before the JSON was complete: raise max_tokens "
                "(the default for structured output is bounded by the schema's size)", llm_output=gen.text)
        if finish == "repetition":
            raise OutputParserException(
                "the structured output became a repeating loop and was stopped before the JSON was complete: try "
                "another prompt, a larger model, or sampling settings such as repeat_penalty", llm_output=gen.text)


class CompleteJsonOutputParser(JsonOutputParser):
    """``JsonOutputParser`` that refuses a reply cut off by ``max_tokens`` (streamed partial objects still flow)."""

    model_config = ConfigDict(defer_build=True)  # only structured output uses it: its schema at first use

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        if not partial:
            _refuse_truncated(result)
        return super().parse_result(result, partial=partial)


class CompletePydanticOutputParser(PydanticOutputParser):  # type: ignore[type-arg]
    """``PydanticOutputParser`` that refuses a reply cut off by ``max_tokens``."""

    model_config = ConfigDict(defer_build=True)

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        if not partial:
            _refuse_truncated(result)
        return super().parse_result(result, partial=partial)
