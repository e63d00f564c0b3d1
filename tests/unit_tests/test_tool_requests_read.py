"""The requests real tools sent (tests/fixtures/tools/, recorded from Claude Code, opencode, aider and Codex), read by the
gateway's translation offline: every top-level field is one the gateway declares honoured or ignored, none is
refused, and what the tool asked for reaches the chat layer (the replay against a real gateway:
tests/integration_tests/tools/test_tool_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gguf_provider.gateway import anthropic, openai, responses

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tools"
RECORDED = sorted(FIXTURES.glob("*/*.json"))
# Sampling fields llama-server takes as they are (passed on by both protocols).
SAMPLING = {"temperature", "top_p", "top_k"}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_every_tool_was_recorded() -> None:
    assert {p.parent.name for p in RECORDED} >= {"claude", "opencode", "aider", "codex"}


@pytest.mark.parametrize("path", [p for p in RECORDED if load(p)["path"] == "/v1/messages"], ids=lambda p: p.stem)
def test_claude_codes_requests_are_read_field_by_field(path: Path) -> None:
    body = load(path)["body"]
    unknown = set(body) - anthropic.HONOURED - anthropic.IGNORED - SAMPLING
    assert not unknown, f"fields the gateway does not declare: {unknown}"
    assert not set(body) & set(anthropic.REFUSED)
    req = anthropic.chat_request(body)
    # one leading system message: `system` and the system-role messages Claude Code puts inside `messages`
    roles = [m["role"] for m in req.messages]
    assert roles[0] == "system" and "system" not in roles[1:]
    inside = [m for m in body["messages"] if m["role"] == "system"]
    assert inside and all(m["content"] in req.messages[0]["content"] for m in inside)
    assert len(req.tools) == len(body["tools"]) and req.params["max_tokens"] == body["max_tokens"]
    assert req.params["parallel_tool_calls"] is True
    assert req.reasoning == ("high" if body.get("output_config", {}).get("effort") == "high" else True)
    assert not set(req.params) & (anthropic.IGNORED | anthropic.HONOURED - {"max_tokens"})
    assert not req.messages[0]["content"].startswith("x-anthropic-billing-header")  # its billing tag dropped
    results = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result"]
    assert len([m for m in req.messages if m["role"] == "tool"]) == len(results)


@pytest.mark.parametrize("path", [p for p in RECORDED if load(p)["path"] == "/v1/chat/completions"],
                         ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_openai_clients_requests_are_read(path: Path) -> None:
    body = load(path)["body"]
    req = openai.chat_request(body)
    assert req.messages == body["messages"] and len(req.tools) == len(body.get("tools", []))
    assert not set(req.params) - SAMPLING - {"max_tokens"}, req.params


def test_claude_codes_turns_share_their_system_prompt() -> None:
    """Its billing tag (the first system block) changes with each prompt; dropped, the next turn's system prompt is
    the first's, so llama-server's prompt cache reuses the long prefix (bench P21)."""
    first, second = (anthropic.chat_request(load(p)["body"]) for p in RECORDED
                     if load(p)["path"] == "/v1/messages")
    tags = [load(p)["body"]["system"][0]["text"] for p in RECORDED if load(p)["path"] == "/v1/messages"]
    assert tags[0] != tags[1] and all(t.startswith("x-anthropic-billing-header:") for t in tags)
    assert first.messages[0] == second.messages[0]


@pytest.mark.parametrize("path", [p for p in RECORDED if load(p)["path"] == "/v1/responses"], ids=lambda p: p.stem)
def test_codexs_requests_are_read_field_by_field(path: Path) -> None:
    """Codex 0.171 (Responses API only): every field declared, none refused; its developer messages lead the
    prompt as one system message; its namespace's functions are offered by name, its web_search tool is not; its
    session ids (client_metadata, prompt_cache_key) and include do not reach llama-server; store false."""
    body = load(path)["body"]
    assert not set(body) - set(responses.FIELDS), set(body) - set(responses.FIELDS)
    assert not [k for k in body if responses.FIELDS[k][0] == "refused"]
    turn = responses.read(body, [])
    req = turn.req
    developer = [i for i in body["input"] if i.get("role") == "developer"]
    assert req.messages[0]["role"] == "system" and "system" not in [m["role"] for m in req.messages[1:]]
    assert all(p["text"] in req.messages[0]["content"] for i in developer for p in i["content"])
    space = next(t for t in body["tools"] if t["type"] == "namespace")
    functions = [f["name"] for t in body["tools"] for f in (t["tools"] if t["type"] == "namespace" else [t])
                 if t["type"] != "web_search"]
    assert [t["function"]["name"] for t in req.tools] == functions
    assert turn.spaces == {t["name"]: space["name"] for t in space["tools"]}
    assert {t["type"] for t in body["tools"]} - {"function", "namespace"} == {"web_search"}
    assert req.params == {"max_tokens": None, "parallel_tool_calls": True} and turn.store is False
    assert req.tool_choice == "auto" and req.reasoning is None  # reasoning {summary: auto}: the model's default
    calls = [i for i in body["input"] if i["type"] == "function_call"]
    outputs = [i for i in body["input"] if i["type"] == "function_call_output"]
    assert [m for m in req.messages if m["role"] == "tool"] == [
        {"role": "tool", "tool_call_id": o["call_id"], "content": o["output"]} for o in outputs]
    assert [c["id"] for m in req.messages for c in m.get("tool_calls", ())] == [c["call_id"] for c in calls]


def test_codexs_turns_share_their_prompt() -> None:
    """Its second turn's messages begin with its first turn's: llama-server's prompt cache reuses them."""
    first, second = (responses.read(load(p)["body"], []).req.messages for p in RECORDED
                     if load(p)["path"] == "/v1/responses")
    assert second[:len(first)] == first
