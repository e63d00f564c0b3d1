"""LlamaIndex messages to OpenAI-format messages, and engine events back to LlamaIndex responses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from ..events import (
    Collector,
    Completion,
    Event,
    LoopStopped,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from ..tools import ToolCall


def to_openai(messages: Sequence[ChatMessage], *, keep_reasoning: bool) -> list[dict[str, Any]]:
    """LlamaIndex messages as OpenAI-format messages (text, images, tool calls, tool results, reasoning: kept where
    the template preserves it, and on a last assistant message, which llama-server continues)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m.role.value if isinstance(m.role, MessageRole) else str(m.role)
        role = {"chatbot": "assistant", "model": "assistant", "developer": "system", "function": "tool"}.get(role,
                                                                                                            role)
        msg: dict[str, Any] = {"role": role, "content": _content(m)}
        if role == "assistant":
            calls = _tool_calls_of(m)
            if calls:
                msg["tool_calls"] = calls
            reasoning = "".join(b.content or "" for b in m.blocks if isinstance(b, ThinkingBlock))
            if reasoning and (keep_reasoning or i == len(messages) - 1):
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


def message(content: str, reasoning: str, calls: Sequence[ToolCall]) -> ChatMessage:
    blocks: list[Any] = []
    if reasoning:
        blocks.append(ThinkingBlock(content=reasoning))
    blocks.append(TextBlock(text=content))
    blocks += [_tool_block(c) for c in calls]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)


def usage_kwargs(u: Usage | None) -> dict[str, Any]:
    if u is None:
        return {}
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens or u.prompt_tokens + u.completion_tokens}


def raw(model_name: str, finish: str | None, usage: Usage | None, timings: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {"model": model_name, "finish_reason": finish}
    if usage is not None:
        raw["usage"] = {**usage_kwargs(usage), "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}
    if timings:
        raw["timings"] = timings
        if timings.get("predicted_per_second"):
            raw["tokens_per_second"] = round(float(timings["predicted_per_second"]), 2)
    return raw


def to_completion(r: ChatResponse) -> CompletionResponse:
    extra = dict(r.additional_kwargs)
    thinking = "".join(b.content or "" for b in r.message.blocks if isinstance(b, ThinkingBlock))
    if thinking:
        extra["thinking"] = thinking
    return CompletionResponse(text=r.message.content or "", delta=r.delta, raw=r.raw, additional_kwargs=extra)


class ResponseBuilder:
    """Folds engine events into the running message; each delta becomes one ``ChatResponse`` whose message is
    everything so far (LlamaIndex's streaming convention). The text so far is kept as it grows, not re-joined per
    delta (that made a long reply's stream quadratic)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.collector = Collector()
        self.content = ""
        self.reasoning = ""
        self.calls: list[ToolCall] = []

    def _snapshot(self, delta: str, extra: dict[str, Any]) -> ChatResponse:
        return ChatResponse(message=message(self.content, self.reasoning, self.calls), delta=delta,
                            additional_kwargs=extra)

    def feed(self, ev: Event) -> ChatResponse | None:
        if type(ev) is TextDelta:  # once per token: inlined
            self.content += ev.text
            return ChatResponse(message=message(self.content, self.reasoning, self.calls), delta=ev.text)
        if isinstance(ev, ReasoningDelta):
            self.reasoning += ev.text
            return self._snapshot("", {"thinking_delta": ev.text})
        if isinstance(ev, LoopStopped):  # the text past the loop's first turn is dropped
            if ev.channel == "content":
                self.content = self.content[:ev.keep]
            else:
                self.reasoning = self.reasoning[:ev.keep]
            return None
        self.collector.add(ev)  # tool calls, usage, finish, timings (the text is kept above)
        if isinstance(ev, ToolCallDelta):
            self.calls = self.collector.done().tool_calls
            return self._snapshot("", {})
        return None  # Usage, Finish, Timings: carried by the last response

    def last(self) -> ChatResponse:
        c = self.collector.done()
        self.calls = c.tool_calls
        r = self._snapshot("", usage_kwargs(c.usage))
        r.raw = raw(self.model_name, c.finish_reason, c.usage, c.timings)
        return r


def response(model_name: str, c: Completion) -> ChatResponse:
    """A whole reply as a ``ChatResponse``."""
    return ChatResponse(message=message(c.content, c.reasoning, c.tool_calls),
                        raw=raw(model_name, c.finish_reason, c.usage, c.timings), additional_kwargs=usage_kwargs(c.usage))
