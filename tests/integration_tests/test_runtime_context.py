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
def test_max_tokens_sent_never_exceeds_room(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    real_stream = EngineClient.stream_chat

    def stream_chat(self: EngineClient, payload: dict[str, Any], deadline: Any = None) -> Any:
        sent.append(payload)
        return real_stream(self, payload, deadline)

    monkeypatch.setattr(EngineClient, "stream_chat", stream_chat)  # the one request path
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=512, timeout=120))
    try:
        n_ctx = engine.n_ctx
        assert n_ctx == _server_n_ctx(engine)
        # A prompt that leaves little room (8-24 tokens), so that generation runs into the cap quickly even on a
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
            payload: dict[str, Any] = {"messages": msgs, "temperature": 0}
            if max_tokens is not None:
                payload["max_tokens"] = max_tokens
            result = engine.chat(payload)
            assert sent[-1]["max_tokens"] <= room, (max_tokens, sent[-1]["max_tokens"], room)
            assert result.usage is not None
            assert result.usage.prompt_tokens + result.usage.completion_tokens <= n_ctx

        events = list(engine.stream({"messages": msgs, "max_tokens": 10**6, "temperature": 0}))
        assert sent[-1]["max_tokens"] <= room
        usage = [e for e in events if isinstance(e, Usage)]
        assert usage and usage[-1].prompt_tokens + usage[-1].completion_tokens <= n_ctx

        # A small request is left as asked.
        engine.chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})
        assert sent[-1]["max_tokens"] == 5
        # No max_tokens, short prompt: the default is the whole room, as counted by the server.
        short = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
        engine.chat(short)
        assert sent[-1]["max_tokens"] == n_ctx - engine.count_prompt_tokens(short)
    finally:
        engine.unload()
