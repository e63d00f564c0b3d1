"""The gateway's translation and guard, offline: what each protocol's requests become, and what is refused before
any model is touched. (The real clients against a real gateway: tests/integration_tests/test_gateway.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gguf_provider.errors import ModelNotFoundError
from gguf_provider.gateway import DEFAULT_PORT, App, Settings, anthropic, ollama, openai
from gguf_provider.gateway.common import BadRequest
from gguf_provider.runtime import default as runtime


def client(**settings: Any) -> TestClient:
    settings.setdefault("port", 11480)
    return TestClient(App(Settings(**settings)), base_url=f"http://127.0.0.1:{settings['port']}")


def test_cli_default_port_is_the_gateways() -> None:
    from gguf_provider import cli

    assert cli.DEFAULT_GATEWAY_PORT == DEFAULT_PORT != 11434  # not Ollama's


def test_non_loopback_needs_a_key() -> None:
    with pytest.raises(ValueError, match="--api-key-file"):
        Settings(host="0.0.0.0")
    Settings(host="0.0.0.0", api_key="k")
    Settings(host="::1")


@pytest.mark.parametrize("host", ["evil.example", "evil.example:11480", "127.0.0.1:9999", "localhost.evil:11480"])
def test_a_foreign_host_is_refused(host: str) -> None:
    r = client().get("/v1/models", headers={"Host": host})
    assert r.status_code == 403 and "DNS-rebinding" in r.json()["error"]["message"]


def test_each_protocol_refuses_in_its_own_shape() -> None:
    c = client(api_key="k")
    assert c.get("/v1/models").json()["error"]["code"] == "invalid_api_key"
    assert c.post("/v1/messages", json={}).json() == {"type": "error", "error": {
        "type": "authentication_error", "message": c.post("/v1/messages", json={}).json()["error"]["message"]}}
    assert isinstance(c.get("/api/tags").json()["error"], str)
    assert c.get("/api/tags", headers={"x-api-key": "k"}).status_code == 200
    assert c.get("/api/tags", headers={"Authorization": "Bearer k"}).status_code == 200


def test_origins_refused_unless_allowed() -> None:
    assert client().get("/api/version", headers={"Origin": "https://a.example"}).status_code == 403
    allowed = client(allow_origins=("https://a.example",))
    r = allowed.get("/api/version", headers={"Origin": "https://a.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://a.example"
    pre = allowed.options("/v1/chat/completions", headers={"Origin": "https://a.example",
                                                           "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200


def test_body_over_the_bound_is_refused_declared_or_not() -> None:
    c = client(max_body=1000)
    assert c.post("/v1/chat/completions", content=b"x" * 2000).status_code == 413

    def chunks() -> Any:
        for _ in range(4):
            yield b"y" * 400

    r = c.post("/api/chat", content=chunks())  # chunked: no Content-Length
    assert r.status_code == 413 and "--max-body" in r.json()["error"]


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "/etc/hostname.gguf", "a/../../b", ".hidden",
                                  "org/.git", "~/model.gguf", "..\\..\\x"])
def test_names_outside_the_models_are_not_looked_at(name: str) -> None:
    with pytest.raises(ModelNotFoundError, match="not a model this endpoint serves"):
        runtime().confine(name)


def test_names_that_are_models_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    (models / "sub" / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("GGUF_PROVIDER_MODELS", str(models))
    for name in ("SmolLM2-135M-Instruct", "org/Repo-GGUF:Q4_K_M", "hf.co/org/repo", str(models / "sub" / "m.gguf")):
        runtime().confine(name)


def test_bad_requests_are_400_in_protocol_shape() -> None:
    c = client()
    r = c.post("/v1/chat/completions", content=b"not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = c.post("/v1/chat/completions", json={"model": "m"})
    assert r.status_code == 400 and "`messages` is required" in r.json()["error"]["message"]
    r = c.post("/v1/messages", json={"model": "m", "messages": []})
    assert r.status_code == 400 and "`max_tokens` is required" in r.json()["error"]["message"]
    r = c.post("/api/chat", json={"model": "m", "messages": [], "options": {"num_ctxx": 5}})
    assert r.status_code == 400 and "num_ctxx" in r.json()["error"]


def test_openai_request_translation() -> None:
    req = openai.chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "max_completion_tokens": 9, "temperature": 0.2, "top_k": 5,
                               "reasoning_effort": "low", "tool_choice": "required", "tools": [{"x": 1}],
                               "response_format": {"type": "text"}, "stream": True})
    assert req.params == {"max_tokens": 9, "temperature": 0.2, "top_k": 5}
    assert req.reasoning == "low" and req.tool_choice == "required" and req.response_format is None
    with pytest.raises(BadRequest, match="`n` must be 1"):
        openai.chat_request({"messages": [], "n": 2})


def test_anthropic_messages_become_openai_messages() -> None:
    got = anthropic.messages([{"type": "text", "text": "Be brief."}], [
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "Calling."},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                                     {"type": "text", "text": "And?"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "is_error": True,
                                      "content": [{"type": "text", "text": "boom"}]}]},
    ])
    assert got == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "Calling.", "reasoning_content": "hm", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "user", "content": "And?"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
    ]
    req = anthropic.chat_request({"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "x"}],
                                  "thinking": {"type": "enabled", "budget_tokens": 64}, "stop_sequences": ["END"],
                                  "tool_choice": {"type": "any"}, "tools": [{"name": "f", "input_schema": {}}]})
    assert req.params == {"max_tokens": 7, "stop": ["END"], "parallel_tool_calls": True}
    assert req.reasoning is True and req.reasoning_budget == 64 and req.tool_choice == "required"
    assert req.tools == [{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}]
    with pytest.raises(BadRequest, match="document"):
        anthropic.messages(None, [{"role": "user", "content": [{"type": "document", "source": {}}]}])


@pytest.mark.parametrize(("value", "seconds"), [(None, None), (0, 0.0), ("0", 0.0), (30, 30.0), ("5m", 300.0),
                                                ("1h", 3600.0), ("300ms", 0.3), (-1, float("inf")),
                                                ("-1m", float("inf"))])
def test_ollama_keep_alive(value: Any, seconds: float | None) -> None:
    assert ollama.keep_alive(value) == seconds


def test_ollama_messages_and_options() -> None:
    got = ollama.messages([
        {"role": "user", "content": "see", "images": ["iVBORw0KGgo="]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "42"},
    ])
    assert got[0]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert got[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": json.dumps({"a": 1})}
    assert got[2]["tool_call_id"] == got[1]["tool_calls"][0]["id"]
    req, n_ctx = ollama.chat_request({"options": {"num_ctx": 4096, "num_predict": 8, "temperature": 0, "stop": ["x"]},
                                      "format": "json", "think": "high"}, [])
    assert n_ctx == 4096 and req.params == {"max_tokens": 8, "temperature": 0, "stop": ["x"]}
    assert req.response_format == {"type": "json_object"} and req.reasoning == "high"


def test_a_request_never_reads_a_local_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """`file:` in the environment's media setting (a notebook's choice) is not the gateway's: its clients are other
    programs. The rest of the setting holds."""
    from gguf_provider.gateway.pool import ModelPool
    from gguf_provider.media import FetchPolicy

    monkeypatch.setenv("GGUF_PROVIDER_MEDIA_ALLOW_HOSTS", "file:,10.0.0.0/8")
    policy = FetchPolicy.parse(ModelPool().config("m", "chat", None).media_allow_hosts)
    assert not policy.files and policy.networks
    monkeypatch.setenv("GGUF_PROVIDER_MEDIA_ALLOW_HOSTS", "file:")
    assert not FetchPolicy.parse(ModelPool().config("m", "chat", None).media_allow_hosts).files
