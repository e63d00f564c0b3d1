"""Translation between LangChain messages and the OpenAI-format messages the engine takes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)


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
            parts.append({"type": "image_url", "image_url": block["image_url"]})
        elif btype == "image":
            if block.get("url"):
                parts.append({"type": "image_url", "image_url": {"url": block["url"]}})
            else:
                data = block.get("base64") or block.get("data")
                mime = block.get("mime_type", "image/jpeg")
                parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
        elif btype in ("reasoning", "thinking", "tool_call", "tool_use"):
            continue  # carried separately
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def to_openai(messages: Sequence[BaseMessage], *, keep_reasoning: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
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
            if keep_reasoning and reasoning:
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
