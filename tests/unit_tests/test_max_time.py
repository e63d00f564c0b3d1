"""``max_time``: declared once (options.py), sent as llama-server's ``t_max_predict_ms`` by every chat adapter and
the magics (``ChatRequest``), defaulting to 600 s only for calls without ``max_tokens``; a reply it cut ends with
finish reason ``length`` and a ``GenerationTimeWarning``, and one the server would not cut (no newline) is closed by
us. The real server's side: tests/integration_tests/test_max_time.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF, chat
from gguf_provider.chat import DEFAULT_MAX_TIME, ChatRequest
from gguf_provider.deadline import Deadline
from gguf_provider.errors import GenerationTimeWarning
from gguf_provider.events import Event, Finish, TextDelta, Timings, Usage
from gguf_provider.llama_index import GGUF
from gguf_provider.options import ChatOptions, SamplingOptions
from tests.support.replay import BASE_URL, load_replay, with_reply

USER = [{"role": "user", "content": "hi"}]


def test_declared_once_in_the_sampling_group_and_shared_by_the_chat_adapters() -> None:
    assert SamplingOptions.model_fields["max_time"].default == "auto"
    for adapter in (ChatGGUF, GGUF):
        assert issubclass(adapter, ChatOptions) and adapter.model_fields["max_time"].default == "auto"
    assert ChatRequest(messages=[]).max_time == "auto"  # the magics build ChatRequest: they get the default too


@pytest.mark.parametrize(("options", "per_call", "expected"), [
    ({}, {}, int(DEFAULT_MAX_TIME * 1000)),  # no max_tokens: the default bound
    ({"max_tokens": 100}, {}, None),  # a token bound given: no time bound by default
    ({}, {"max_tokens": 100}, None),
    ({"max_tokens": 100, "max_time": 5}, {}, 5000),  # an explicit one applies anyway
    ({}, {"max_time": 2.5}, 2500),
    ({"max_time": 30}, {"max_time": None}, None),  # per call wins; None turns it off
    ({"max_time": 0}, {}, None),
    ({"max_time": None}, {}, None),
    ({"model_kwargs": {"t_max_predict_ms": 1234}}, {}, 1234),  # the raw field, given by hand, is left alone
])
def test_payload_has_t_max_predict_ms(options: dict[str, Any], per_call: dict[str, Any],
                                      expected: int | None) -> None:
    llm = ChatGGUF(base_url=BASE_URL, **options)
    body = llm.chat_request(USER, per_call).payload()
    assert body.get("t_max_predict_ms") == expected
    assert "max_time" not in body
    li = GGUF(base_url=BASE_URL, **{k if k != "model_kwargs" else "additional_kwargs": v for k, v in options.items()})
    assert li.chat_request(USER, per_call).payload().get("t_max_predict_ms") == expected


def test_a_negative_max_time_is_refused() -> None:
    with pytest.raises(ValueError, match="max_time"):
        ChatRequest(messages=[], max_time=-1).payload()


def _cut(**kw: Any) -> Any:
    return with_reply(load_replay("smollm2_chat"), "One line.\nTwo lines.\n", finish="length", **kw)


def test_a_reply_cut_by_time_warns_in_both_adapters_streamed_and_whole() -> None:
    replay = _cut(timings={"predicted_ms": 1012.0, "predicted_n": 7})
    llm = ChatGGUF(base_url=BASE_URL, transport=replay.transport, max_time=1)
    with pytest.warns(GenerationTimeWarning, match=r"max_time=1 s .*max_time=None"):
        reply = llm.invoke("hi")
    assert reply.response_metadata["finish_reason"] == "length"
    with pytest.warns(GenerationTimeWarning):
        assert list(llm.stream("hi"))[-1].response_metadata["finish_reason"] == "length"
    li = GGUF(base_url=BASE_URL, transport=replay.transport, max_time=1)
    with pytest.warns(GenerationTimeWarning):
        assert li.chat([ChatMessage(role="user", content="hi")]).raw["finish_reason"] == "length"  # type: ignore[index]


@pytest.mark.parametrize(("options", "timings"), [
    ({"max_time": 1}, {"predicted_ms": 400.0}),  # cut by the context's end, well within the bound
    ({"max_time": 1, "max_tokens": 6}, {"predicted_ms": 5000.0}),  # max_tokens (6 chunks) reached first
    ({"max_tokens": 50}, {"predicted_ms": 900_000.0}),  # no time bound at all
])
def test_other_length_stops_do_not_warn(options: dict[str, Any], timings: dict[str, float]) -> None:
    llm = ChatGGUF(base_url=BASE_URL, transport=_cut(timings=timings).transport, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationTimeWarning)
        assert llm.invoke("hi").response_metadata["finish_reason"] == "length"


class _Rambler:
    """An engine whose reply never writes a newline (llama-server checks t_max_predict_ms only at one)."""

    closed = False
    props: dict[str, Any] = {}  # no chat template: no family

    def load(self) -> None:
        pass

    def stream(self, payload: dict[str, Any], *, loop_guard: bool = True, deadline: Any = None) -> Iterator[Event]:
        try:
            while True:
                time.sleep(0.02)
                yield TextDelta("word ")
        finally:
            _Rambler.closed = True


def test_a_reply_with_no_newline_is_closed_past_the_bound() -> None:
    request = ChatRequest(messages=USER, max_time=0.1)
    start = time.monotonic()
    with pytest.warns(GenerationTimeWarning, match="max_time=0.1 s"):
        events = list(chat.stream(_Rambler(), request))  # type: ignore[arg-type]
    # Not before our bound; the upper side only says "closed": ~1.3 s under 2 hogs and a build on 2 cores, 10x.
    assert 0.1 * chat.MAX_TIME_GRACE + 1 <= time.monotonic() - start < 15
    assert events[-1] == Finish("length") and _Rambler.closed


def test_the_time_cut_is_read_from_the_servers_timings() -> None:
    proc = chat.EventProcessor(ChatRequest(messages=USER, max_time=2))
    for ev in (TextDelta("a\n"), Finish("length"), Usage(1, 3, 4), Timings({"predicted_ms": 2001.5})):
        proc.feed(ev)
    assert proc.cut_by_time()
    proc = chat.EventProcessor(ChatRequest(messages=USER, max_time=2))
    for ev in (TextDelta("a\n"), Finish("stop"), Timings({"predicted_ms": 2001.5})):
        proc.feed(ev)
    assert not proc.cut_by_time()


def test_the_magics_take_max_time() -> None:
    from gguf_provider.jupyter.commands import _cell_parser

    assert _cell_parser().parse_args(["--max-time", "30"]).max_time == 30.0
    assert _cell_parser().parse_args([]).max_time is None  # then the default: "auto"


def _response(sock: socket.socket) -> Any:
    """What the client hands :meth:`Deadline.watch`: an httpx response's ``network_stream`` extension."""
    return SimpleNamespace(extensions={"network_stream": SimpleNamespace(
        get_extra_info=lambda key: sock if key == "socket" else None)})


def test_the_deadline_ends_a_read_that_waits_for_a_token() -> None:
    """A timer, not a count of tokens: a read blocked on a silent socket returns when the deadline fires."""
    ours, server = socket.socketpair()
    with ours, server:
        deadline = Deadline(0.2)
        deadline.watch(_response(ours))
        assert deadline.watching and not deadline.armed
        start = time.monotonic()
        deadline.arm()
        assert ours.recv(16) == b""  # nothing was ever sent: only the shutdown ends this read
        assert deadline.fired and time.monotonic() - start >= 0.2
        deadline.cancel()


def test_a_deadline_cancelled_or_unwatched_in_time_leaves_the_connection_alone() -> None:
    ours, server = socket.socketpair()
    with ours, server:
        deadline = Deadline(0.05)
        deadline.watch(_response(ours))
        deadline.arm()
        deadline.cancel()
        time.sleep(0.2)
        server.sendall(b"x")
        assert ours.recv(1) == b"x" and not deadline.fired
        late = Deadline(0.0)
        late.watch(_response(ours))
        late.unwatch()  # the response went back to the pool before the timer fired
        late.fire()
        server.sendall(b"y")
        assert ours.recv(1) == b"y" and late.fired


async def test_an_async_deadline_fires_on_the_event_loop() -> None:
    ours, server = socket.socketpair()
    with ours, server:
        loop = asyncio.get_running_loop()
        deadline = Deadline(0.1, loop)
        deadline.watch(_response(ours))
        deadline.arm()
        assert not any(t.name == "gguf-provider-max-time" for t in threading.enumerate())  # the loop's timer
        await asyncio.sleep(0.3)
        assert deadline.fired and ours.recv(16) == b""
