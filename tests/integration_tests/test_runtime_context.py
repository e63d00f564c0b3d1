"""The effective context is the server's own, and `max_tokens` never asks for more than the context leaves."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gguf_provider.client import EngineClient
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.events import Usage
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow


def _server_n_ctx(engine: Engine) -> int:
    addr = engine.info.address
    with httpx.Client(transport=addr.transport(), base_url=addr.base_url, headers=addr.headers(), timeout=10) as h:
        props = h.get("/props").json()
    return int(props["default_generation_settings"]["n_ctx"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n_ctx", [2048, 1000, None])
def test_effective_context_is_props_n_ctx(rt: RuntimeEnv, n_ctx: int | None) -> None:
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=n_ctx))
    try:
        served = _server_n_ctx(engine)
        assert engine.n_ctx == served
        assert rt.registry()[engine.info.key]["n_ctx"] == served
        if n_ctx is not None:
            assert served >= n_ctx  # the server may round up, never down
    finally:
        engine.unload()


@pytest.mark.timeout(240)  # typical ~19 s on a loaded 2-core machine; 12x
@pytest.mark.parametrize("server_args", [(), ("--context-shift",)], ids=["ends-at-context", "context-shift"])
def test_no_reply_runs_past_the_context(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch,
                                         server_args: tuple[str, ...]) -> None:
    """The pinned build ends a reply where the context ends by itself (its context shift is off unless asked), so a
    request goes to it as it is, uncounted; a server started with ``--context-shift`` would shift and go on, so
    there the prompt is counted and ``max_tokens`` capped at the room it leaves. Either way no reply runs past the
    context. The end-of-generation token is ignored and the loop guard off, so that each reply reaches the end."""
    sent: list[dict[str, Any]] = []
    counted: list[str] = []
    real_stream, real_template = EngineClient.stream_chat, EngineClient.apply_template

    def stream_chat(self: EngineClient, payload: dict[str, Any], deadline: Any = None) -> Any:
        sent.append(payload)
        return real_stream(self, payload, deadline)

    def apply_template(self: EngineClient, payload: dict[str, Any]) -> str:
        counted.append("apply-template")
        return real_template(self, payload)

    monkeypatch.setattr(EngineClient, "stream_chat", stream_chat)  # the one request path
    monkeypatch.setattr(EngineClient, "apply_template", apply_template)  # the first half of every count
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=512, timeout=120, server_args=list(server_args)))
    try:
        n_ctx = engine.n_ctx
        assert n_ctx == _server_n_ctx(engine)
        ends = engine.info.ends_at_context
        assert ends is not bool(server_args)
        # A prompt that leaves little room (8-24 tokens), so that generation runs into the end quickly even on a
        # loaded machine.
        words = "one two three four five six seven eight nine ten".split()
        n = 300
        for _ in range(6):
            msgs = [{"role": "user", "content": "Repeat these words: " + " ".join(words[i % 10] for i in range(n))}]
            n_prompt = engine.count_prompt_tokens({"messages": msgs})
            room = n_ctx - n_prompt
            if 8 <= room <= 24:
                break
            n += room - 16
        assert 8 <= room <= 24, (n_prompt, n_ctx)

        for max_tokens in (10**6, None, room + 1):
            payload: dict[str, Any] = {"messages": msgs, "temperature": 0, "ignore_eos": True}
            if max_tokens is not None:
                payload["max_tokens"] = max_tokens
            counted.clear()
            result = engine.chat(payload, loop_guard=False)
            if ends:
                assert sent[-1].get("max_tokens") == max_tokens and counted == [], (sent[-1].get("max_tokens"), counted)
            else:
                assert sent[-1]["max_tokens"] <= room and counted, (max_tokens, sent[-1]["max_tokens"], room)
            assert result.usage is not None
            assert result.usage.prompt_tokens == n_prompt
            assert result.usage.prompt_tokens + result.usage.completion_tokens <= n_ctx
            assert result.finish_reason == "length", result

        events = list(engine.stream({"messages": msgs, "max_tokens": 10**6, "temperature": 0, "ignore_eos": True},
                                    loop_guard=False))
        usage = [e for e in events if isinstance(e, Usage)]
        assert usage and usage[-1].prompt_tokens + usage[-1].completion_tokens <= n_ctx

        # A small request is left as asked.
        engine.chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})
        assert sent[-1]["max_tokens"] == 5
        short = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
        engine.chat(short)
        if ends:  # no max_tokens: none is sent, the server's own end is the context's
            assert "max_tokens" not in sent[-1]
        else:  # the default is the whole room, as counted by the server
            assert sent[-1]["max_tokens"] == n_ctx - engine.count_prompt_tokens(short)
    finally:
        engine.unload()
