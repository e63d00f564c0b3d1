"""The gateway's reading of requests as current tools send them (Claude Code's Anthropic fields, FIELD-NOTES §14),
model aliases, what an unexpected error becomes, and the lifeline (a client that leaves, a gateway that stops),
offline. The lifeline's cases run over a scripted ASGI app: they are the transport's, and the real gateway's are in
tests/integration_tests/test_gateway_lifeline.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gguf_provider.gateway import App, Settings, anthropic
from gguf_provider.gateway.aliases import Aliases
from gguf_provider.gateway.common import BadRequest, kind_of
from gguf_provider.gateway.lifeline import Lifeline, Stopping

USER = {"role": "user", "content": "hi"}


def request(**fields: Any) -> Any:
    return anthropic.chat_request({"model": "m", "max_tokens": 9, "messages": [USER], **fields})


def test_system_messages_inside_messages_join_the_system_prompt_in_order() -> None:
    got = anthropic.messages([{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}}], [
        USER, {"role": "system", "content": "B"}, {"role": "assistant", "content": "ok"},
        {"role": "system", "content": [{"type": "text", "text": "C"}]}, {"role": "user", "content": "again"}])
    assert got == [{"role": "system", "content": "A\n\nB\n\nC"}, USER, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "again"}]
    assert anthropic.messages(None, [USER, {"role": "system", "content": "S"}])[0] == {"role": "system",
                                                                                      "content": "S"}


def test_thinking_and_effort() -> None:
    assert (request().reasoning, request().reasoning_budget) == (None, None)
    on = request(thinking={"type": "enabled", "budget_tokens": 100})
    assert (on.reasoning, on.reasoning_budget) == (True, 100)
    assert request(thinking={"type": "adaptive"}, output_config={"effort": "high"}).reasoning == "high"
    assert request(thinking={"type": "adaptive"}, output_config={"effort": "max"}).reasoning == "high"
    assert request(thinking={"type": "adaptive"}).reasoning is True
    assert request(thinking={"type": "disabled"}, output_config={"effort": "low"}).reasoning is False
    with pytest.raises(BadRequest, match="thinking.type"):
        request(thinking={"type": "sometimes"})
    with pytest.raises(BadRequest, match="effort"):
        request(output_config={"effort": "extreme"})


TOOL = {"name": "f", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(("choice", "normalized", "parallel"), [
    (None, None, True), ({"type": "auto"}, "auto", True), ({"type": "any"}, "required", True),
    ({"type": "none"}, "none", True), ({"type": "tool", "name": "f"}, "name:f", True),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ({"type": "tool", "name": "f", "disable_parallel_tool_use": True}, "name:f", False)])
def test_every_tool_choice(choice: Any, normalized: str | None, parallel: bool) -> None:
    req = request(tools=[TOOL], tool_choice=choice)
    assert req.tool_choice == normalized and req.params["parallel_tool_calls"] is parallel
    assert "parallel_tool_calls" not in request().params  # no tools: nothing to say


def test_tool_choice_refused_when_malformed() -> None:
    with pytest.raises(BadRequest, match="name"):
        request(tools=[TOOL], tool_choice={"type": "tool"})
    with pytest.raises(BadRequest, match="tool_choice.type"):
        request(tools=[TOOL], tool_choice={"type": "some"})


def test_fields_honoured_ignored_or_refused() -> None:
    req = request(stop_sequences=["END"], top_k=5, temperature=0.2, top_p=0.9, metadata={"user_id": "{}"},
                  context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}, service_tier="auto",
                  cache_control={"type": "ephemeral"},
                  output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert req.params == {"max_tokens": 9, "stop": ["END"], "top_k": 5, "temperature": 0.2, "top_p": 0.9}
    assert req.response_format == {"type": "json_schema", "json_schema": {"name": "output",
                                                                          "schema": {"type": "object"}}}
    for name, value in (("container", "c1"), ("mcp_servers", [{"type": "url", "url": "https://x"}])):
        with pytest.raises(BadRequest, match=f"`{name}`"):
            request(**{name: value})
    request(mcp_servers=[], container=None)  # empty: nothing asked


def test_server_tools_and_blocks_that_cannot_be_honoured_are_named() -> None:
    with pytest.raises(BadRequest, match="'web_search'.*web_search_20250305"):
        request(tools=[TOOL, {"type": "web_search_20250305", "name": "web_search"}])
    request(tools=[{**TOOL, "type": "custom"}])
    with pytest.raises(BadRequest, match="'document'.*document's text"):
        anthropic.messages(None, [{"role": "user", "content": [{"type": "document", "source": {}}]}])
    with pytest.raises(BadRequest, match="'search_result'"):
        anthropic.messages(None, [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "search_result"}]}]}])
    with pytest.raises(BadRequest, match="role is user, assistant or system"):
        anthropic.messages(None, [{"role": "tool", "content": "x"}])


def test_aliases(tmp_path: Path) -> None:
    file = tmp_path / "aliases"
    file.write_text("# Claude Code's names\nclaude-*haiku* = Small  # its fast model\n\nclaude-* = Big\n")
    aliases = Aliases.parse(["gpt-4o=Mid"], file)
    assert [aliases.resolve(n) for n in ("claude-haiku-4-5", "claude-sonnet-4-5", "gpt-4o", "Qwen")] == \
        ["Small", "Big", "Mid", "Qwen"]
    with pytest.raises(ValueError, match="PATTERN=MODEL"):
        Aliases.parse(["claude-*"])
    file.write_text("nothing here\n")
    with pytest.raises(ValueError, match=f"{file}:1"):
        Aliases.parse([], file)
    with pytest.raises(ValueError, match="No such file"):
        Aliases.parse([], tmp_path / "missing")


def test_an_alias_reaches_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool asks the runtime for the model the alias names (confine is the first thing it asks)."""
    from gguf_provider.gateway import pool as pool_module
    from gguf_provider.runtime import default

    asked: list[str] = []

    def confine(name: str) -> None:
        asked.append(name)
        raise BadRequest("stop here")

    monkeypatch.setattr(default(), "confine", confine)
    p = pool_module.ModelPool(aliases=Aliases.parse(["claude-*=Local"]))

    async def use() -> None:
        async with p.use("claude-opus-4"):
            pass

    with pytest.raises(BadRequest):
        asyncio.run(use())
    assert asked == ["Local"]


def test_only_typed_request_errors_are_4xx(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    assert kind_of(ValueError("a bug"))[0] == 500 and kind_of(KeyError("x"))[0] == 500
    assert kind_of(BadRequest("x"))[0] == 400 and kind_of(Stopping("x")) == (503, "unavailable")

    def broken(body: dict[str, Any]) -> Any:
        return {}["missing"]

    monkeypatch.setattr(anthropic, "chat_request", broken)
    c = TestClient(App(Settings(port=11480)), base_url="http://127.0.0.1:11480")
    with caplog.at_level(logging.INFO, logger="gguf_provider.gateway"):
        r = c.post("/v1/messages", json={"model": "m", "max_tokens": 1, "messages": [USER]})
    assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None and "/v1/messages" in errors[0].getMessage()
    # a max_time the chat layer refuses is the request's error, not a bug
    r = c.post("/v1/chat/completions", json={"model": "m", "messages": [USER], "max_time": -1})
    assert r.status_code == 400 and "max_time" in r.json()["error"]["message"]


# --- the lifeline, over a scripted app ------------------------------------------------------------------------


class Script:
    """An ASGI app that starts a response (or not) and then waits until cancelled."""

    def __init__(self, start: bool) -> None:
        self.start = start
        self.cancelled = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        if self.start:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"data: {\"a\":1}", "more_body": True})
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def line_for(app: Script) -> Lifeline:
    def answer(path: str, exc: BaseException) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"error": str(exc), "path": path}, status_code=kind_of(exc)[0])

    return Lifeline(app, answer, lambda path, exc: b'data: {"error":"%s"}\n\n' % str(exc).encode())


async def drive(line: Lifeline, then: str) -> list[dict[str, Any]]:
    """One request through ``line``; ``then``: the client leaves ("leave") or the gateway stops ("stop")."""
    sent: list[dict[str, Any]] = []
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": b"{}", "more_body": False})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    task = asyncio.ensure_future(line(scope, inbox.get, send))
    await asyncio.sleep(0.05)
    if then == "leave":
        inbox.put_nowait({"type": "http.disconnect"})
    else:
        line.stop()
    await asyncio.wait_for(task, 5)
    return sent


@pytest.mark.parametrize("start", [False, True])
def test_a_client_that_leaves_cancels_its_work(start: bool) -> None:
    app = Script(start)

    async def go() -> list[dict[str, Any]]:
        sent = await drive(line_for(app), "leave")
        assert app.cancelled.is_set()
        return sent

    sent = asyncio.run(go())
    assert len(sent) == (2 if start else 0)  # nothing more is written to a client that is gone


def test_a_stop_answers_a_request_not_started_with_503() -> None:
    app = Script(False)
    sent = asyncio.run(drive(line_for(app), "stop"))
    assert sent[0]["status"] == 503 and b"stopping" in sent[1]["body"] and app.cancelled.is_set()
    assert sent[-1].get("more_body", False) is False


def test_a_stop_ends_a_started_stream_with_an_error_event_on_its_own_line() -> None:
    app = Script(True)
    sent = asyncio.run(drive(line_for(app), "stop"))
    assert app.cancelled.is_set()
    last = sent[-1]
    assert last["body"].startswith(b"\n\ndata: {\"error\":\"the gateway is stopping") and not last["more_body"]


def test_requests_after_a_stop_are_refused() -> None:
    app = Script(False)
    line = line_for(app)

    async def go() -> list[dict[str, Any]]:
        line.stop()
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        await line({"type": "http", "method": "GET", "path": "/api/tags", "headers": []}, receive, send)
        return sent

    assert asyncio.run(go())[0]["status"] == 503
