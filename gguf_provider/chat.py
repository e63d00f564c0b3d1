"""Chat requests on an :class:`~gguf_provider.engine.Engine`, shared by every adapter.

Builds the payload (sampling, reasoning switch, tool choice enforcement) and post-processes the event stream
(forced tool calls and healed text calls become :class:`ToolCallDelta` events), so adapters only translate events
into their framework's types.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Generator
from contextlib import aclosing, closing
from dataclasses import dataclass, field, replace
from typing import Any

from . import families
from ._io import no_loop, running_loop
from ._warn import warn
from .deadline import Deadline
from .engine import Engine
from .errors import GenerationTimeWarning, LoopWarning, ReasoningWarning, RepeatedToolCallWarning
from .events import (
    Collector,
    Completion,
    Event,
    Finish,
    LoopStopped,
    ReasoningDelta,
    TextDelta,
    Timings,
    ToolCallDelta,
    Usage,
)
from .tools import (
    ToolCall,
    answered_calls,
    call_key,
    could_be_tool_call,
    forced_schema,
    heal_reply,
    marker_start,
    only_repeats,
    parse_forced,
    tool_name,
)

log = logging.getLogger(__name__)
Reasoning = bool | str | None
REASONING_EFFORTS = ("low", "medium", "high")
# ``max_time="auto"`` for a call with no max_tokens: 600 s. A normal answer (2,000 tokens) fits at 3.3 tokens/s, a
# 7B model's speed on a slow CPU. Measured on the 2-core dev machine (256 tokens, ignore_eos): SmolLM2-135M Q4_1
# 94-98 tokens/s, Qwen2.5-Coder-0.5B Q4_K_M 31-33: a 128k ramble would run 22 and 68 minutes; it ends after 10.
DEFAULT_MAX_TIME = 600.0
# llama-server checks t_max_predict_ms only when a token holds a newline; a reply past the bound that writes none,
# or whose next token does not come (a slow or paused server), is closed by a timer (gguf_provider/deadline.py)
# at MAX_TIME_GRACE x max_time + 1 s after its first token (the same finish_reason and warning).
MAX_TIME_GRACE = 1.25


def normalize_tool_choice(choice: Any) -> str | None:
    """"auto" | "none" | "required" | "name:<tool>" | None, from every form LangChain/OpenAI users write."""
    if choice is None:
        return None
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice is False:
        return "none"
    if isinstance(choice, dict):
        fn = choice.get("function") or choice
        if fn.get("name"):
            return f"name:{fn['name']}"
        ctype = choice.get("type")
        return normalize_tool_choice(ctype) if ctype in ("auto", "none", "any", "required") else None
    if isinstance(choice, str):
        return choice if choice in ("auto", "none") else f"name:{choice}"
    raise ValueError(f"unsupported tool_choice {choice!r}")


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | None = None  # normalized, see normalize_tool_choice
    response_format: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)  # sampling and max_tokens, OpenAI names
    reasoning: Reasoning = None
    reasoning_budget: int | None = None  # thinking tokens (llama-server's reasoning_budget_tokens)
    heal_tool_calls: bool = True
    loop_guard: bool = True
    max_time: float | str | None = "auto"  # seconds; "auto": DEFAULT_MAX_TIME when max_tokens is unset

    @property
    def time_bound(self) -> float | None:
        """The reply's time bound in seconds (``max_time``), or None for none."""
        if self.max_time == "auto":
            return DEFAULT_MAX_TIME if self.params.get("max_tokens") is None else None
        if isinstance(self.max_time, str) or (self.max_time is not None and self.max_time < 0):
            raise ValueError(f"max_time must be seconds (>= 0), None or 'auto', not {self.max_time!r}")
        return float(self.max_time) if self.max_time else None

    @property
    def forced(self) -> list[str] | None:
        """The tool names a forced choice allows, or None when the choice is not forced."""
        if not self.tools or self.tool_choice is None:
            return None
        if self.tool_choice == "required":
            return [tool_name(t) for t in self.tools]
        if self.tool_choice.startswith("name:"):
            return [self.tool_choice[5:]]
        return None

    def payload(self, family: families.Family | None = None) -> dict[str, Any]:
        """The request body for a model of ``family`` (None: unknown, llama-server's general switches)."""
        messages = self.messages
        if family and family.ids9:
            messages = families.with_nine_char_ids(messages)
        if family and family.text_call:
            messages = families.with_calls_as_text(messages, family.text_call)
        if family and family.user_results:
            messages = families.with_results_as_user(messages)
        body: dict[str, Any] = {"messages": messages}
        body.update({k: v for k, v in self.params.items() if v is not None})
        forced = self.forced
        if self.tools and self.tool_choice != "none":
            if forced is not None:
                allowed = [t for t in self.tools if tool_name(t) in forced]
                body["tools"] = allowed or self.tools
                body["response_format"] = forced_schema(self.tools, forced)
            else:
                body["tools"] = self.tools
                body.setdefault("tool_choice", "auto")  # a raw tool_choice in model_kwargs is sent as is
        if self.response_format is not None and forced is None:
            body["response_format"] = self.response_format
        if body.get("max_tokens") is None and "response_format" in body:
            body["max_tokens"] = constrained_max_tokens(body["response_format"])
        if self.reasoning is not None or self.reasoning_budget is not None:
            fields = reasoning_fields(self.reasoning, self.reasoning_budget, family)
            kwargs = fields.pop("chat_template_kwargs", {})
            if kwargs:
                body["chat_template_kwargs"] = {**kwargs, **body.get("chat_template_kwargs", {})}
            for k, v in fields.items():
                body.setdefault(k, v)
        bound = self.time_bound
        if bound:
            body.setdefault("t_max_predict_ms", max(1, round(bound * 1000)))
        return body


def constrained_max_tokens(response_format: dict[str, Any]) -> int:
    """The default ``max_tokens`` of a grammar-constrained reply (structured output, forced tool call) when the
    caller gave none: 256 + 2 tokens per character of the JSON schema (1024 for schemaless JSON mode), at most
    4096. A constrained reply that loops inside the grammar can then not run to the end of the context; a reply cut
    there is asked once more with a repeat penalty, and if cut again ends with finish_reason "length" (LangChain's
    parsers raise on it)."""
    schema = (response_format.get("json_schema") or {}).get("schema") or response_format.get("schema")
    if not schema:
        return 1024
    return min(4096, 256 + 2 * len(json.dumps(schema, separators=(",", ":"))))


_warned: set[str] = set()


def reasoning_fields(reasoning: Reasoning, budget: int | None, family: families.Family | None) -> dict[str, Any]:
    """The request fields that switch thinking for ``family`` (:func:`gguf_provider.families.reasoning_fields`);
    a :class:`ReasoningWarning`, once per message, when the family cannot do what was asked."""
    if reasoning is not None and reasoning is not True and reasoning is not False \
            and reasoning not in REASONING_EFFORTS:
        raise ValueError(f"reasoning must be None, True, False or one of {REASONING_EFFORTS}, not {reasoning!r}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < -1):
        raise ValueError(f"reasoning_budget must be tokens (>= 0) or -1 (none), not {budget!r}")
    fields, warning = families.reasoning_fields(reasoning, budget, family)
    if warning and warning not in _warned:
        _warned.add(warning)
        warn(warning, ReasoningWarning)
    return fields


def family_of(engine: Engine) -> families.Family | None:
    """The family of the server's chat template (``/props``)."""
    template = engine.props.get("chat_template")
    return families.detect(template if isinstance(template, str) else None)


class EventProcessor:
    """Applies tool-call enforcement and healing to a raw event stream. One per request.

    A grammar-constrained reply (forced tool call, JSON schema, JSON mode) is held back until it is whole: half a
    JSON object is no use to anyone, and a reply that became a loop can then be asked again (``looped``)."""

    def __init__(self, request: ChatRequest) -> None:
        self.forced = request.forced is not None
        self.constrained = self.forced or request.response_format is not None
        self.names = {tool_name(t) for t in request.tools}
        self.heal = bool(request.tools) and request.heal_tool_calls and request.tool_choice != "none" \
            and not self.forced
        self.tools = request.tools
        self.buffer: list[str] = []
        self.buffering = self.constrained or self.heal
        # Once prose is streaming: a tagged call may still follow it. Text that may begin one is held (``carry``);
        # from a whole marker on, the rest of the reply is held (``tail``) and healed at the end.
        self.scan = self.heal and not self.constrained
        self.carry = ""
        self.tail: list[str] | None = None
        self.native_calls = 0
        self.answered = answered_calls(request.messages) if self.heal else set()
        self.repeated_only = False  # the reply only repeated calls whose results the conversation already has
        # A constrained reply that the loop guard stopped, held back to be asked again (unless the caller chose
        # its repeat_penalty: then the stopped reply is the answer).
        self.may_retry_loop = self.constrained and request.params.get("repeat_penalty") is None
        # ... and so is one that ran out of the default max_tokens (constrained_max_tokens) without closing its JSON.
        self.default_bound = request.params.get("max_tokens") is None
        self.looped: str | None = None  # why the reply is asked again: "repetition" or "length"
        # max_time: what tells a reply cut by time from one cut by max_tokens or the context's end.
        self.max_time = request.time_bound
        self.max_tokens = request.params.get("max_tokens")
        self.started: float | None = None  # the first generated token's arrival
        self.deadline: Deadline | None = None  # the timer that closes the stream past the bound (new_deadline)
        self.waiting = False  # past_bound is called for each event: until the deadline is armed (or polled)
        self.overdue = False  # closed by us, past the bound with no newline for the server to stop at
        self.reason: str | None = None  # the server's finish reason
        self.predicted_ms: float | None = None
        self.completion_tokens: int | None = None

    def feed(self, ev: Event) -> list[Event]:
        if type(ev) is TextDelta and not self.buffering:  # the common case, once per token
            return self._scan(ev.text) if self.scan else [ev]
        if isinstance(ev, TextDelta) and self.buffering:
            self.buffer.append(ev.text)
            if self.constrained or could_be_tool_call("".join(self.buffer)):
                return []
            self.buffering = False  # plainly prose: release what we held and stream on
            text, self.buffer = "".join(self.buffer), []
            return self._scan(text) if self.scan else [TextDelta(text)]
        if isinstance(ev, ToolCallDelta):
            self.native_calls = max(self.native_calls, ev.index + 1)
            return [ev]
        if isinstance(ev, Finish):
            self.reason = ev.reason
            return self._finish(ev)
        if isinstance(ev, Timings) and isinstance(ev.data.get("predicted_ms"), (int, float)):
            self.predicted_ms = float(ev.data["predicted_ms"])
        elif isinstance(ev, Usage):
            self.completion_tokens = ev.completion_tokens
        if isinstance(ev, LoopStopped) and ev.channel == "content" and self.buffering:
            # What we hold is the whole content so far: cut it here, before it is healed or released.
            self.buffer = ["".join(self.buffer)[:ev.keep]]
            return []
        if isinstance(ev, LoopStopped) and ev.channel == "content" and self.tail is not None:
            # A call that became a loop is no call: what is held is released (the collector cuts it at ``keep``).
            held, self.carry, self.tail, self.scan = self.carry + "".join(self.tail), "", None, False
            return [TextDelta(held), ev]
        return [ev]

    def new_deadline(self, loop: asyncio.AbstractEventLoop | None = None) -> Deadline | None:
        """The timer of one request's stream (None without a time bound): armed by :meth:`past_bound` at the
        first generated token, it fires ``MAX_TIME_GRACE`` x ``max_time`` (+1 s) later."""
        if self.max_time is None:
            return None
        self.deadline = Deadline(self.max_time * MAX_TIME_GRACE + 1, loop)
        self.waiting = True
        return self.deadline

    def past_bound(self, ev: Event) -> bool:
        """Called for each event while :attr:`waiting`: arms the deadline at the first generated token; true once
        it fired. Where it shuts the stream's socket (a real connection) nothing is left to check per event; a
        stream it cannot shut (an injected transport, a test's engine) is closed here, at its next event."""
        deadline = self.deadline
        if deadline is None:
            self.waiting = False
            return False
        if deadline.fired:
            self.overdue = self.reason is None
            return True
        if not deadline.armed and isinstance(ev, (TextDelta, ReasoningDelta, ToolCallDelta)):
            self.started = time.monotonic()
            deadline.arm()
            self.waiting = not deadline.watching
        return False

    def stream_ended(self) -> None:
        """After the request's stream: the timer stops; a stream that its firing ended was cut by time."""
        deadline = self.deadline
        if deadline is not None:
            deadline.cancel()
            if deadline.fired and self.reason is None:
                self.overdue = True

    def end(self) -> list[Event]:
        """After the stream: the finish of a reply we closed past its bound, and the warning of one cut by time."""
        out = self.feed(Finish("length")) if self.overdue else []
        if self.cut_by_time():
            how = "closed by gguf-provider: no newline" if self.overdue else "llama-server's t_max_predict_ms"
            log.info("max_time: the reply was cut after %g s (%s)", self.max_time, how)
            warn(f"the reply was cut by max_time={self.max_time:g} s (finish_reason 'length'); pass a larger "
                 "max_time, or max_time=None for no time bound", GenerationTimeWarning)
        return out

    def cut_by_time(self) -> bool:
        """Whether the reply ended (finish reason ``length``) because of ``max_time``, not max_tokens or the
        context: llama-server's generation time (``predicted_ms``) is past the bound."""
        if self.max_time is None or self.reason != "length" or self.looped:
            return False
        if self.overdue:
            return True
        if self.max_tokens is not None and (self.completion_tokens or 0) >= self.max_tokens:
            return False
        if self.predicted_ms is not None:
            return self.predicted_ms >= self.max_time * 1000
        return self.started is not None and time.monotonic() - self.started >= self.max_time

    def _scan(self, text: str) -> list[Event]:
        """Prose streams on, but from where a tagged call may begin (``marker_start``) the text is held."""
        if self.tail is not None:
            self.tail.append(text)
            return []
        if not self.carry and "<" not in text and not text[-1:].isspace():
            return [TextDelta(text)]
        s, self.carry = self.carry + text, ""
        i = marker_start(s)
        if i < 0:
            return [TextDelta(s)]
        shown, held = s[:i], s[i:]
        if "tool_call>" in held or "<function=" in held:
            self.tail = [held]
        else:
            self.carry = held
        return [TextDelta(shown)] if shown else []

    def _finish(self, ev: Finish) -> list[Event]:
        if self.tail is not None or self.carry:
            return self._finish_tail(ev)
        text, self.buffer = "".join(self.buffer), []
        self.buffering = False
        if self.may_retry_loop and (ev.reason == "repetition" or (ev.reason == "length" and self.default_bound)):
            self.looped = ev.reason
            return []  # the caller asks again, with a repeat penalty
        calls: list[ToolCall] | None = None
        prose = ""
        if text and self.forced:
            call = parse_forced(text)
            calls = [call] if call else None
        elif text and self.heal:
            healed = heal_reply(text, self.names, self.tools, cut=ev.reason == "length")
            calls, prose = (healed.calls, healed.content) if healed else (None, "")
            if self.answered:
                fresh = [c for c in calls or () if call_key(c.name, c.arguments) not in self.answered]
                if (calls and not fresh) or (not calls and only_repeats(text, self.answered)):
                    self.repeated_only = True
                    return []  # the caller asks again, without tools
                calls = fresh or calls
        if calls:
            return self._calls(calls, ev, [TextDelta(prose)] if prose else [])
        tail: list[Event] = [TextDelta(text)] if text else []
        return [*tail, ev]

    def _finish_tail(self, ev: Finish) -> list[Event]:
        """The end of a reply whose prose streamed: the held text is a tagged call (or several), or more prose."""
        held, self.carry, tail, self.tail = self.carry + "".join(self.tail or ()), "", self.tail, None
        healed = heal_reply(held, self.names, self.tools, cut=ev.reason == "length", after_prose=True) if tail \
            else None
        if healed and not healed.content:
            return self._calls(healed.calls, ev, [])
        return [TextDelta(held), ev] if held else [ev]

    def _calls(self, calls: list[ToolCall], ev: Finish, before: list[Event]) -> list[Event]:
        out: list[Event] = [*before, *(ToolCallDelta(self.native_calls + i, c.id, c.name, c.arguments)
                                       for i, c in enumerate(calls))]
        out.append(Finish("tool_calls", ev.model))
        return out


# The request paths: each written once, async; the sync functions are generated from it (scripts/gen_sync.py).

# unasync: async source
async def _aevents(engine: Engine, request: ChatRequest, proc: EventProcessor) -> AsyncGenerator[Event, None]:
    """One request's events through ``proc``; a reply past its time bound is closed (the server cancels it).
    Closing this generator (a consumer that stops early) closes the request at once, not at garbage collection."""
    await engine.aload()  # the payload needs the server's template (a coroutine's cold start: off the loop)
    deadline = proc.new_deadline(running_loop())
    try:
        async with aclosing(engine.astream(request.payload(family_of(engine)), loop_guard=request.loop_guard,
                                           deadline=deadline)) as events:
            async for ev in events:
                for out in proc.feed(ev):
                    yield out
                if proc.waiting and proc.past_bound(ev):  # per token, once armed: one attribute read
                    break
    finally:
        proc.stream_ended()
    for out in proc.end():
        yield out


async def astream(engine: Engine, request: ChatRequest) -> AsyncGenerator[Event, None]:
    """The reply's events, post-processed (tool calls, reasoning, the loop guard, the time bound); a structured
    reply that looped is asked once more, a repeated answered tool call once more without tools."""
    proc = EventProcessor(request)
    await engine.aload()  # the payload needs the server's template (a coroutine's cold start: off the loop)
    # Inlined (not through the events function above): one generator less per token.
    deadline = proc.new_deadline(running_loop())
    try:
        async with aclosing(engine.astream(request.payload(family_of(engine)), loop_guard=request.loop_guard,
                                           deadline=deadline)) as events:
            async for ev in events:
                for out in proc.feed(ev):
                    yield out
                if proc.waiting and proc.past_bound(ev):
                    break
    finally:
        proc.stream_ended()
    for out in proc.end():
        yield out
    if proc.looped:
        async with aclosing(astream(engine, _for_loop_retry(request, proc.looped))) as retried:
            async for ev in retried:
                yield ev
    elif proc.repeated_only:
        # Asked once more without tools; the reply is judged by the same tools (it may repeat the call again).
        again = EventProcessor(request)
        async with aclosing(_aevents(engine, _without_tools(request), again)) as more:
            async for ev in more:
                yield ev
        if again.repeated_only:
            for out in _tool_results_answer(request):
                yield out


async def acomplete(engine: Engine, request: ChatRequest) -> Completion:
    """The whole reply, retried on a fresh server after a crash (``max_retries``)."""

    async def run() -> Completion:
        col = Collector()
        async for ev in astream(engine, request):
            col.add(ev)
        return col.done()

    return await engine.aretrying(run)


# unasync: generated from the async source above by scripts/gen_sync.py; do not edit
def _events(engine: Engine, request: ChatRequest, proc: EventProcessor) -> Generator[Event, None]:
    """One request's events through ``proc``; a reply past its time bound is closed (the server cancels it).
    Closing this generator (a consumer that stops early) closes the request at once, not at garbage collection."""
    engine.load()  # the payload needs the server's template (a coroutine's cold start: off the loop)
    deadline = proc.new_deadline(no_loop())
    try:
        with closing(engine.stream(request.payload(family_of(engine)), loop_guard=request.loop_guard,
                                   deadline=deadline)) as events:
            for ev in events:
                for out in proc.feed(ev):
                    yield out
                if proc.waiting and proc.past_bound(ev):  # per token, once armed: one attribute read
                    break
    finally:
        proc.stream_ended()
    for out in proc.end():
        yield out


def stream(engine: Engine, request: ChatRequest) -> Generator[Event, None]:
    """The reply's events, post-processed (tool calls, reasoning, the loop guard, the time bound); a structured
    reply that looped is asked once more, a repeated answered tool call once more without tools."""
    proc = EventProcessor(request)
    engine.load()  # the payload needs the server's template (a coroutine's cold start: off the loop)
    # Inlined (not through the events function above): one generator less per token.
    deadline = proc.new_deadline(no_loop())
    try:
        with closing(engine.stream(request.payload(family_of(engine)), loop_guard=request.loop_guard,
                                   deadline=deadline)) as events:
            for ev in events:
                for out in proc.feed(ev):
                    yield out
                if proc.waiting and proc.past_bound(ev):
                    break
    finally:
        proc.stream_ended()
    for out in proc.end():
        yield out
    if proc.looped:
        with closing(stream(engine, _for_loop_retry(request, proc.looped))) as retried:
            for ev in retried:
                yield ev
    elif proc.repeated_only:
        # Asked once more without tools; the reply is judged by the same tools (it may repeat the call again).
        again = EventProcessor(request)
        with closing(_events(engine, _without_tools(request), again)) as more:
            for ev in more:
                yield ev
        if again.repeated_only:
            for out in _tool_results_answer(request):
                yield out


def complete(engine: Engine, request: ChatRequest) -> Completion:
    """The whole reply, retried on a fresh server after a crash (``max_retries``)."""

    def run() -> Completion:
        col = Collector()
        for ev in stream(engine, request):
            col.add(ev)
        return col.done()

    return engine.retrying(run)


# unasync: end


ANSWER_NUDGE = "Answer my question in words now, using the tool results above. Do not call a tool."


def _without_tools(request: ChatRequest) -> ChatRequest:
    """The request asked once more, without tools and with a one-line nudge to answer: when a small model's whole
    reply was a call it had already made and got the result of (it would loop on it otherwise)."""
    log.info("loop guard: the model repeated an answered tool call; asking once more without tools")
    warn("the model repeated a tool call whose result it already has; asking it once more, without tools, "
         "to answer from the result", RepeatedToolCallWarning)
    messages = [*request.messages, {"role": "user", "content": ANSWER_NUDGE}]
    return replace(request, messages=messages, tools=[], tool_choice=None)


def _tool_results_answer(request: ChatRequest) -> list[Event]:
    """The last resort when the model repeats the answered call even without tools (the 0.5B test model does,
    about half the time): the results of the last tool calls are the answer, as with LlamaIndex's
    ``return_direct``, so an agent ends with the result instead of raw call JSON."""
    log.info("loop guard: the model repeated the answered tool call again; returning the tool results as the answer")
    warn("the model repeated its answered tool call again; the tool results are returned as the answer",
         RepeatedToolCallWarning)
    results: list[str] = []
    for m in reversed(request.messages):
        if m.get("role") != "tool":
            break
        content = m.get("content")
        results.insert(0, content if isinstance(content, str) else json.dumps(content))
    return [TextDelta("\n".join(results)), Finish("stop")]


# The retry's sampling: a mild repeat penalty, and llama.cpp's DRY sampler, which penalises extending a verbatim
# repeat of more than two tokens exponentially (JSON's quotes and colons break its sequences, so keys are free).
# The penalty alone let the 0.5B test model loop again once in CI ("? Do you think he's a cat" x48).
LOOP_RETRY_PARAMS: dict[str, float] = {"repeat_penalty": 1.15, "dry_multiplier": 0.8}


def _for_loop_retry(request: ChatRequest, why: str) -> ChatRequest:
    """A structured reply that became a loop, or rambled past its default ``max_tokens``, is useless half JSON: it
    is asked once more with ``LOOP_RETRY_PARAMS`` where the caller set none of them (once: the retry has a
    repeat_penalty, so it is not retried)."""
    what = "became a loop" if why == "repetition" else "ran out of its default max_tokens before its JSON closed"
    added = {k: v for k, v in LOOP_RETRY_PARAMS.items() if request.params.get(k) is None}
    settings = ", ".join(f"{k}={v}" for k, v in added.items())
    log.info("loop guard: the structured reply %s; asking once more with %s", what, settings)
    warn(f"the structured reply {what}; asking once more with {settings}", LoopWarning)
    return replace(request, params={**request.params, **added})
