"""The normalized events a llama-server chat stream becomes, and their fold into one :class:`Completion`.

The client yields these; :mod:`gguf_provider.chat` post-processes them; adapters translate them. Nothing here
knows about HTTP or any framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .tools import ToolCall


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """One fragment of a tool call. ``id`` and ``name`` are set only on the first fragment of a call."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0


@dataclass(slots=True)
class Timings:
    """llama-server's own timings: prompt_n, prompt_ms, predicted_n, predicted_per_second, cache_n, ..."""

    data: dict[str, Any]


@dataclass(slots=True)
class Finish:
    reason: str | None
    model: str | None = None


@dataclass(slots=True)
class LoopStopped:
    """The loop guard stopped a reply that had become a cycle: ``keep`` characters of the ``channel``
    ("content" or "reasoning") are the reply up to the end of the first repetition."""

    channel: str
    keep: int
    period: int


Event = TextDelta | ReasoningDelta | ToolCallDelta | Usage | Timings | Finish | LoopStopped


@dataclass
class Completion:
    """A whole reply: what every non-streaming call returns (folded from the stream, never a second code path)."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: dict[str, Any] = field(default_factory=dict)


class Collector:
    """Folds events into a :class:`Completion` (tool-call fragments joined by index). ``done()`` is repeatable."""

    def __init__(self) -> None:
        self.result = Completion()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, ToolCall] = {}
        self._keep: dict[str, int] = {}  # channel → characters to keep, after a loop was stopped

    def add(self, ev: Event) -> None:
        if isinstance(ev, TextDelta):
            self._text.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            self._reasoning.append(ev.text)
        elif isinstance(ev, ToolCallDelta):
            call = self._calls.get(ev.index)
            if call is None:
                self._calls[ev.index] = ToolCall(ev.id or "", ev.name or "", ev.arguments)
            else:
                call.arguments += ev.arguments
        elif isinstance(ev, Finish):
            self.result.finish_reason = ev.reason
        elif isinstance(ev, Usage):
            self.result.usage = ev
        elif isinstance(ev, Timings):
            self.result.timings = ev.data
        elif isinstance(ev, LoopStopped):
            self._keep[ev.channel] = ev.keep

    def done(self) -> Completion:
        r = self.result
        r.content = "".join(self._text)[:self._keep.get("content")]
        r.reasoning = "".join(self._reasoning)[:self._keep.get("reasoning")]
        r.tool_calls = [self._calls[i] for i in sorted(self._calls)]
        return r
