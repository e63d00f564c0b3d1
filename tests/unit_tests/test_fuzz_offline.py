"""Fuzzing (issue 8) of what needs no server: the SSE parser, the tool-call healer and the event processor, on
random, truncated and mutated input, raise only their documented exceptions, never hang and never allocate absurd
memory. (The GGUF header reader on the real SmolLM2 header: tests/reliability/test_fuzz.py, which also writes the
report of every target fuzzed in its process to ``<home>/reports/reliability-fuzz.json``.)

Every call goes through :func:`call`, inside :func:`guarded`: a CPU-time watchdog (``ITIMER_PROF``) turns a hang
into a failure (``HANG_S``), the CPU time of each call is checked (``CALL_S``) and tracemalloc checks the peak
allocation of each call (``PEAK_BYTES``). CPU time, not wall time: what other processes of a busy machine take
does not count against a call.
"""

from __future__ import annotations

import json
import signal
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_provider.chat import ChatRequest, EventProcessor
from gguf_provider.client import StreamParser
from gguf_provider.errors import APIError
from gguf_provider.events import (
    Collector,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    Timings,
    ToolCallDelta,
    Usage,
)
from gguf_provider.tools import ToolCall, could_be_tool_call, heal_tool_calls, parse_forced
from tests.reliability.sse_capture import ERROR_LINES, SMOLLM2_STREAM, TOOL_CALL_STREAM

# Seconds of this process's CPU time, tracemalloc on (it makes allocation-heavy calls ~5x slower). The slowest call
# measured: heal_tool_calls on 20k unclosed <parameter=a> tags, ~0.85 s beside a CPU hog (~0.15 s untraced); a
# super-linear blow-up on these few-hundred-KB inputs would take far longer than 10x that.
CALL_S = 10.0  # slowest acceptable single call
HANG_S = 3 * CALL_S  # a call still running after this much CPU time is a hang (SIGPROF interrupts it)
PEAK_BYTES = 50 * 2**20  # peak allocation per call (tracemalloc)
EXAMPLES = 400

FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])

# --- guarded calls -------------------------------------------------------------------------------------------

INPUTS: Counter[str] = Counter()  # per target, for tests/reliability/test_fuzz.py's report
RAISED: Counter[str] = Counter()  # documented exceptions seen, per target
SLOWEST: dict[str, float] = {}  # CPU seconds
PEAK: dict[str, int] = {}

T = TypeVar("T")


class Hang(Exception):
    pass


def _hang(signum: int, frame: object) -> None:
    raise Hang(f"call still running after {HANG_S} s of CPU time")


@contextmanager
def guarded() -> Iterator[None]:
    """The SIGPROF handler set, for :func:`call` (SIGPROF: pytest-timeout's SIGALRM is left alone)."""
    old = signal.signal(signal.SIGPROF, _hang)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


@pytest.fixture(scope="module", autouse=True)
def _guard() -> Iterator[None]:
    with guarded():
        yield


def call(target: str, fn: Callable[..., T], *args: Any, allowed: tuple[type[BaseException], ...] = ()) \
        -> T | BaseException:
    """``fn(*args)`` under the watchdog; returns its result or the (documented) exception it raised."""
    mine = not tracemalloc.is_tracing()  # traced only during the call: hypothesis's own allocations run at speed
    if mine:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    result: T | BaseException
    t0 = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, HANG_S)
    try:
        result = fn(*args)
    except allowed as exc:
        result = exc
        RAISED[target] += 1
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        cpu = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        if mine:
            tracemalloc.stop()
    INPUTS[target] += 1
    SLOWEST[target] = max(SLOWEST.get(target, 0.0), cpu)
    PEAK[target] = max(PEAK.get(target, 0), peak)
    assert cpu < CALL_S, f"{target}: one call took {cpu:.2f} s of CPU time"
    assert peak < PEAK_BYTES, f"{target}: one call allocated {peak / 2**20:.1f} MiB"
    return result


# --- strategies ----------------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=16)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right type, sometimes any JSON value."""
    return st.one_of(strategy, strategy, json_values)


texts = st.text(max_size=40)
tool_call_fragment = st.fixed_dictionaries({}, optional={
    "index": maybe(st.integers(-2, 4)), "id": maybe(texts), "type": maybe(st.just("function")),
    "function": maybe(st.fixed_dictionaries({}, optional={"name": maybe(texts), "arguments": maybe(texts)}))})
delta = st.fixed_dictionaries({}, optional={
    "role": maybe(st.just("assistant")), "content": maybe(texts), "reasoning_content": maybe(texts),
    "tool_calls": maybe(st.lists(maybe(tool_call_fragment), max_size=3))})
choice = st.fixed_dictionaries({}, optional={
    "index": maybe(st.integers(0, 2)), "delta": maybe(delta),
    "finish_reason": maybe(st.sampled_from(["stop", "length", "tool_calls"]) | texts)})
usage = st.fixed_dictionaries({}, optional={
    k: maybe(st.integers(0, 10**6)) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    | {"prompt_tokens_details": maybe(st.fixed_dictionaries({}, optional={"cached_tokens": maybe(st.integers())}))})
chunk_ok = st.fixed_dictionaries({}, optional={
    "choices": maybe(st.lists(maybe(choice), max_size=3)), "usage": maybe(usage), "model": maybe(texts),
    "timings": maybe(st.dictionaries(st.sampled_from(["prompt_n", "predicted_per_second", "x"]), json_values)),
    "object": maybe(st.just("chat.completion.chunk"))})
chunk_error = st.fixed_dictionaries({"error": maybe(st.fixed_dictionaries({}, optional={
    "code": maybe(st.integers(400, 599)), "message": maybe(texts), "n_ctx": json_values, "n_prompt_tokens": json_values,
    "type": maybe(st.sampled_from(["exceed_context_size_error", "server_error"]))}))})
chunks = st.one_of(chunk_ok, chunk_ok, chunk_ok, chunk_error, json_values)

REAL_LINES = [*SMOLLM2_STREAM, *TOOL_CALL_STREAM, *ERROR_LINES]
prefixes = st.sampled_from(["", "data:", "data: ", "error:", "error: ", ": ping", "event: x"])
random_lines = st.one_of(
    st.text(max_size=200),
    st.builds(lambda p, t: p + t, prefixes, st.text(max_size=200)),
    st.builds(lambda p, v: p + json.dumps(v), prefixes, chunks),
)


@st.composite
def mutated(draw: st.DrawFn, source: str) -> str:
    """``source`` truncated and/or with a few slices replaced, deleted or duplicated."""
    s = source
    s = s[: draw(st.integers(0, len(s)), label="cut")] if draw(st.booleans(), label="truncate") else s
    for _ in range(draw(st.integers(0, 4), label="edits")):
        i = draw(st.integers(0, len(s)))
        j = draw(st.integers(i, min(len(s), i + 8)))
        op = draw(st.sampled_from(["replace", "delete", "duplicate", "insert"]))
        if op == "replace":
            s = s[:i] + draw(st.text(min_size=1, max_size=3)) + s[j:]
        elif op == "delete":
            s = s[:i] + s[j:]
        elif op == "duplicate":
            s = s[:j] + s[i:j] + s[j:]
        else:
            s = s[:i] + draw(st.sampled_from(['"', "{", "}", "[", "]", ",", ":", "null", "1e999", "\\", "<"])) + s[i:]
    return s


real_line_variants = st.sampled_from(REAL_LINES).flatmap(mutated)

# --- checks --------------------------------------------------------------------------------------------------


def check_events(events: object) -> list[Event]:
    """The parser's contract for what it returns: typed, non-empty where it matters, JSON-safe numbers."""
    assert isinstance(events, list)
    for ev in events:
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            assert isinstance(ev.text, str) and ev.text
        elif isinstance(ev, ToolCallDelta):
            assert type(ev.index) is int and ev.index >= 0
            assert ev.id is None or isinstance(ev.id, str)
            assert ev.name is None or isinstance(ev.name, str)
            assert isinstance(ev.arguments, str)
        elif isinstance(ev, Usage):
            assert all(isinstance(v, int) for v in (ev.prompt_tokens, ev.completion_tokens, ev.total_tokens,
                                                    ev.cached_tokens))
        elif isinstance(ev, Timings):
            assert isinstance(ev.data, dict)
            assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ev.data.values())
        elif isinstance(ev, Finish):
            assert isinstance(ev.reason, str) and ev.reason
            assert ev.model is None or isinstance(ev.model, str)
        else:
            raise AssertionError(f"unexpected event {ev!r}")
    col = Collector()  # and what consumes them does not trip on them either
    for ev in events:
        col.add(ev)
    col.done()
    return events


def feed_lines(lines: list[str]) -> list[Event]:
    parser, out = StreamParser(), []
    for line in lines:
        events = parser.feed_line(line)
        if events is None:
            break
        out += check_events(events)
    return out


def check_calls(calls: object, names: set[str]) -> None:
    """The healer's contract: None, or a non-empty list of calls of bound tools whose arguments are a JSON object."""
    if calls is None:
        return
    assert isinstance(calls, list) and calls
    for c in calls:
        assert isinstance(c, ToolCall) and c.name in names and c.id.startswith("call_")
        assert isinstance(json.loads(c.arguments), dict)


# --- SSE parser ----------------------------------------------------------------------------------------------


def test_real_stream_parses() -> None:
    events = feed_lines(SMOLLM2_STREAM)
    assert "".join(e.text for e in events if isinstance(e, TextDelta))
    assert any(isinstance(e, Finish) for e in events) and any(isinstance(e, Usage) for e in events)
    calls = [e for e in feed_lines(TOOL_CALL_STREAM) if isinstance(e, ToolCallDelta)]
    assert calls[0].name == "add" and json.loads("".join(c.arguments for c in calls)) == {"a": 1, "b": 2}


@FUZZ
@given(random_lines)
def test_fuzz_parser_random_lines(line: str) -> None:
    result = call("sse.feed_line: random lines", StreamParser().feed_line, line, allowed=(APIError,))
    if not isinstance(result, BaseException) and result is not None:
        check_events(result)


@FUZZ
@given(chunks)
def test_fuzz_parser_random_chunks(chunk: Any) -> None:
    result = call("sse.feed: random JSON chunks", StreamParser().feed, chunk, allowed=(APIError,))
    if not isinstance(result, BaseException):
        check_events(result)


@FUZZ
@given(real_line_variants)
def test_fuzz_parser_mutated_real_lines(line: str) -> None:
    result = call("sse.feed_line: truncated/mutated real lines", StreamParser().feed_line, line, allowed=(APIError,))
    if not isinstance(result, BaseException) and result is not None:
        check_events(result)


@FUZZ
@given(st.sampled_from([SMOLLM2_STREAM, TOOL_CALL_STREAM]), st.data())
def test_fuzz_parser_cut_streams(stream: list[str], data: st.DataObject) -> None:
    """A real stream cut after any line, sometimes with one line truncated or mutated."""
    k = data.draw(st.integers(0, len(stream)), label="lines")
    lines = list(stream[:k])
    mutate: bool = data.draw(st.booleans(), label="mutate")
    if lines and mutate:
        i = data.draw(st.integers(0, len(lines) - 1), label="which")
        lines[i] = data.draw(mutated(lines[i]), label="line")
    call("sse: cut/mutated real streams", feed_lines, lines, allowed=(APIError,))


@pytest.mark.parametrize("line", [
    "data: " + "[" * 200_000,  # nesting deeper than the recursion limit
    "data: " + '{"a":' * 100_000,
    "error: " + "[" * 200_000,
    'data: {"choices":[{"delta":{"content":"' + "x" * 300_000 + '"}}]}',
    'data: {"choices":[{"delta":{"tool_calls":[{"index":1e999}]}}]}',
    'data: {"choices":[{"delta":{"tool_calls":[{"index":99999999999999999999}]}}]}',
    'data: {"usage":{"prompt_tokens":1e999}}',
    'data: {"usage":{"prompt_tokens":"' + "9" * 5000 + '"}}',
    'error: {"message":' + "[" * 900 + "]" * 900 + "}",
    'data: {"error":{"n_ctx":1e999,"type":"exceed_context_size_error"}}',
])
def test_parser_adversarial_lines(line: str) -> None:
    result = call("sse: adversarial large lines", StreamParser().feed_line, line, allowed=(APIError,))
    if not isinstance(result, BaseException) and result is not None:
        check_events(result)
    if isinstance(result, APIError):
        assert len(str(result)) < 2000  # error messages stay bounded too


# --- tool-call healer ----------------------------------------------------------------------------------------

NAMES = {"add", "get_weather"}
FRAGMENTS = ["<tool_call>", "</tool_call>", "<function=add>", "<function=x>", "</function>", "<parameter=a>",
             "</parameter>", "```", "```json\n", '{"name": "add"', '"arguments": ', '{"a": 1}', "[", "]", "{", "}",
             ",", '"', ":", " ", "\n", "\t", "null", "1", "get_weather", '"function": ', '"parameters": ']
tool_texts = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
arg_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet="abc xyz123", max_size=10),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from("abcxyz"), c, max_size=3),
                          max_leaves=8)
arg_dicts = st.dictionaries(st.sampled_from(["a", "b", "city", "q"]), arg_values, max_size=3)
calls_spec = st.lists(st.tuples(st.sampled_from(sorted(NAMES)), arg_dicts), min_size=1, max_size=3)
FORMATS = ["tagged", "tagged_open", "bare", "list", "fenced", "openai", "function", "parameters"]


def render(fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """A tool-call text in one of the formats small models write."""
    one = [json.dumps({"name": n, "arguments": a}) for n, a in calls]
    if fmt == "tagged":
        return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in one)
    if fmt == "tagged_open":
        return f"<tool_call>{one[0]}"
    if fmt == "bare":
        return one[0]
    if fmt == "list":
        return "[" + ", ".join(one) + "]"
    if fmt == "fenced":
        return f"```json\n{one[0]}\n```"
    if fmt == "openai":
        return json.dumps({"type": "function", "function": {"name": calls[0][0], "arguments": json.dumps(calls[0][1])}})
    if fmt == "function":
        return "".join(f"<function={n}>{json.dumps(a)}</function>" for n, a in calls)
    return "".join(f"<function={n}>" + "".join(f"<parameter={k}>\n{json.dumps(v)}\n</parameter>" for k, v in a.items())
                   + "</function>" for n, a in calls)


def expected(fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    kept = calls[:1] if fmt in ("tagged_open", "bare", "fenced", "openai") else calls
    unique: list[tuple[str, dict[str, Any]]] = []
    for c in kept:  # identical calls are healed once
        if c not in unique:
            unique.append(c)
    return unique


@FUZZ
@given(tool_texts)
def test_fuzz_healer_random_text(text: str) -> None:
    check_calls(call("tools.heal_tool_calls: random text", heal_tool_calls, text, NAMES), NAMES)
    forced = call("tools.parse_forced: random text", parse_forced, text)
    assert forced is None or (isinstance(forced, ToolCall) and isinstance(json.loads(forced.arguments), dict))
    assert isinstance(call("tools.could_be_tool_call: random text", could_be_tool_call, text), bool)


@FUZZ
@given(st.sampled_from(FORMATS), calls_spec)
def test_fuzz_healer_valid_calls_round_trip(fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    text = render(fmt, calls)
    healed = call("tools.heal_tool_calls: valid calls (round trip)", heal_tool_calls, text, NAMES)
    check_calls(healed, NAMES)
    assert isinstance(healed, list)
    got = [(c.name, json.loads(c.arguments)) for c in healed]
    if fmt == "parameters":  # values are re-read as scalars, so two calls may become one identical call
        assert {n for n, _ in got} == {n for n, _ in calls} and len(got) <= len(calls)
    else:
        assert got == expected(fmt, calls)
    # every prefix of a real call must keep the streaming buffer open, or healing could never see it
    for cut in range(0, len(text) + 1, max(1, len(text) // 12)):
        assert call("tools.could_be_tool_call: prefixes of valid calls", could_be_tool_call, text[:cut])


@FUZZ
@given(st.sampled_from(FORMATS), calls_spec, st.data())
def test_fuzz_healer_mutated_calls(fmt: str, calls: list[tuple[str, dict[str, Any]]], data: st.DataObject) -> None:
    text = data.draw(mutated(render(fmt, calls)), label="text")
    check_calls(call("tools.heal_tool_calls: truncated/mutated calls", heal_tool_calls, text, NAMES), NAMES)
    forced = call("tools.parse_forced: truncated/mutated calls", parse_forced, text)
    assert forced is None or (isinstance(forced, ToolCall) and isinstance(json.loads(forced.arguments), dict))


@pytest.mark.parametrize("text", [
    "<tool_call>" + " " * 100_000 + "x" + " " * 100_000 + "y",
    "<function=add>" + " " * 100_000 + "x" + " " * 100_000 + "y",
    "<function=add>" + "<parameter=a>" * 20_000,
    "<function=add><parameter=a>" + " " * 100_000 + "x" + " " * 100_000,
    "<tool_call>" * 20_000,
    "```" + " " * 100_000 + "x" + " " * 100_000,
    "```" * 50_000,
    "[" * 200_000,
    "<tool_call>" + "{" * 200_000,
    '[{"name": ["add"], "arguments": {}}]',  # unhashable name
    '{"name": {"a": 1}, "arguments": "{}"}',
])
def test_healer_adversarial_texts(text: str) -> None:
    """Pathological model output (long whitespace runs, unclosed tags, deep nesting): linear time, no exception."""
    check_calls(call("tools: adversarial large texts", heal_tool_calls, text, NAMES), NAMES)
    call("tools: adversarial large texts", parse_forced, text)
    call("tools: adversarial large texts", could_be_tool_call, text)


# --- event processor -----------------------------------------------------------------------------------------

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}}}}
events_strategy = st.one_of(
    st.builds(TextDelta, st.one_of(st.text(min_size=1, max_size=20), st.sampled_from(FRAGMENTS))),
    st.builds(ReasoningDelta, st.text(min_size=1, max_size=10)),
    st.builds(ToolCallDelta, st.integers(0, 3), st.none() | texts, st.none() | st.sampled_from(["add", "x"]), texts),
    st.builds(Usage, st.integers(0, 100), st.integers(0, 100), st.integers(0, 200)),
    st.builds(Timings, st.dictionaries(st.sampled_from(["prompt_n", "predicted_per_second"]), st.floats(0, 1e3))),
    st.builds(Finish, st.sampled_from(["stop", "length", "tool_calls"]), st.none() | texts),
)
requests = st.builds(lambda tools, choice, heal: ChatRequest(messages=[], tools=tools, tool_choice=choice,
                                                             heal_tool_calls=heal),
                     st.sampled_from([[], [ADD]]), st.sampled_from([None, "auto", "none", "required", "name:add"]),
                     st.booleans())


def process(request: ChatRequest, events: list[Event]) -> list[Event]:
    proc = EventProcessor(request)
    return [out for ev in events for out in proc.feed(ev)]


@FUZZ
@given(requests, st.lists(events_strategy, max_size=30), st.booleans())
def test_fuzz_event_processor(request: ChatRequest, events: list[Event], finish: bool) -> None:
    """Random event sequences: no exception; with a final Finish, text is either passed on whole or healed."""
    if finish:
        events = [*events, Finish("stop", "m")]
    out = call("chat.EventProcessor: random event sequences", process, request, events)
    assert isinstance(out, list) and all(isinstance(e, (TextDelta, ReasoningDelta, ToolCallDelta, Usage, Timings,
                                                        Finish)) for e in out)
    text_in = "".join(e.text for e in events if isinstance(e, TextDelta))
    text_out = "".join(e.text for e in out if isinstance(e, TextDelta))
    if not request.tools or request.tool_choice == "none":
        assert out == events  # nothing to enforce or heal: a pure pass-through
    elif finish and not any(isinstance(e, Finish) for e in events[:-1]) and text_out != text_in:
        # the text was held back and became tool calls: none of it leaks, the calls are well-formed
        assert text_out == "" and out[-1] == Finish("tool_calls", "m")
        new = [e for e in out if isinstance(e, ToolCallDelta) and e not in events]
        assert new and all(isinstance(json.loads(e.arguments), dict) for e in new)
