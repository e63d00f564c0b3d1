"""The Responses API's translation and store, offline: what each request field and input item becomes, what is
refused in OpenAI's error shape, the stored conversations (the eviction rule, the key's scope, the files' modes),
and the stream events built from the chat layer's events, each validated by the openai SDK's own types. (The real
SDK against a real gateway: tests/integration_tests/test_gateway_responses.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from gguf_provider import chat
from gguf_provider.events import Completion, Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from gguf_provider.gateway import App, Settings, responses
from gguf_provider.gateway import app as app_module
from gguf_provider.gateway.common import WAITING, BadRequest, Waiting
from gguf_provider.gateway.responses_store import (
    DiskBackend,
    MemoryBackend,
    Missing,
    Record,
    ResponseStore,
    owner_of,
)
from gguf_provider.tools import ToolCall, tool_name
from tests.support.tool_protocol import check_responses_stream

FN = {"type": "function", "name": "get_weather", "description": "The weather.", "strict": True,
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_FN = {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                            "parameters": FN["parameters"]}}


def read(**body: Any) -> responses.Turn:
    return responses.read({"model": "m", "input": "hi", **body}, [])


def refusal(**body: Any) -> dict[str, Any]:
    """The 400 body a request is answered with."""
    with pytest.raises(BadRequest) as info:
        read(**body)
    r = responses.error(info.value)
    assert r.status_code == 400
    return dict(json.loads(bytes(r.body))["error"])


# --- input items -------------------------------------------------------------------------------------------------


def test_a_text_input_is_one_user_message() -> None:
    turn = read()
    assert turn.req.messages == [{"role": "user", "content": "hi"}]
    assert turn.input == [{"type": "message", "role": "user", "content": "hi"}]


def test_instructions_and_leading_system_items_make_one_system_message() -> None:
    items = [{"role": "developer", "content": "D1"}, {"type": "message", "role": "system",
                                                        "content": [{"type": "input_text", "text": "S"}]},
             {"role": "user", "content": "hi"}, {"role": "developer", "content": "later"}]
    turn = read(input=items, instructions="I")
    assert turn.req.messages == [{"role": "system", "content": "I\n\nD1\n\nS"}, {"role": "user", "content": "hi"},
                                 {"role": "system", "content": "later"}]  # a later one stays where it was sent
    assert read(input=items[2:3]).req.messages == [{"role": "user", "content": "hi"}]


def test_user_parts_text_images_and_audio() -> None:
    audio = {"data": "AAAA", "format": "wav"}
    items = [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"},
        {"type": "input_image", "image_url": "https://x.example/a.png", "detail": "low"},
        {"type": "input_audio", "input_audio": audio}]},
             {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]
    got = read(input=items).req.messages
    assert got[0]["content"] == [{"type": "text", "text": "What is it?"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                                 {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}},
                                 {"type": "input_audio", "input_audio": audio}]
    assert got[1] == {"role": "user", "content": "a\nb"}  # text parts only: one text
    assert refusal(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])["param"] == \
        "input[0].content[0]"
    assert "file ids" in refusal(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}])[
        "message"]


def test_calls_their_outputs_and_reasoning_become_chat_messages() -> None:
    items = [{"role": "user", "content": "weather?"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "R"}],
              "encrypted_content": None},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
             {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": {"city": "Rome"}},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "S"}]},
             {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]
    assert read(input=items).req.messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "R", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "no", "reasoning_content": "S"}]


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "item_reference", "id": "msg_1"}, "input[0].type"), ({"type": "web_search_call"}, "input[0].type"),
    ({"role": "tool", "content": "x"}, "input[0].role")])
def test_items_not_taken_are_refused_by_name(item: dict[str, Any], param: str) -> None:
    err = refusal(input=[item])
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert str(item.get("type") or item.get("role")) in err["message"]


# --- tools, tool_choice, text.format, reasoning, the other fields ---------------------------------------------


def test_function_tools_and_namespaces() -> None:
    ns = {"type": "namespace", "name": "agents", "description": "Sub-agents.",
          "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}]}
    turn = read(tools=[FN, ns, {"type": "web_search", "external_web_access": False}])
    assert turn.req.tools == [CHAT_FN, {"type": "function", "function": {"name": "spawn", "description": "",
                                                                          "parameters": {"type": "object"}}}]
    assert turn.spaces == {"spawn": "agents"} and turn.req.params["parallel_tool_calls"] is True
    assert turn.echo["tools"][2]["type"] == "web_search"  # returned as sent, not offered
    assert read(tools=[FN], parallel_tool_calls=False).req.params["parallel_tool_calls"] is False
    assert "declared twice" in refusal(tools=[FN, FN])["message"]


@pytest.mark.parametrize("kind", ["file_search", "computer_use_preview", "code_interpreter", "mcp", "custom",
                                  "image_generation", "local_shell", "shell", "apply_patch"])
def test_hosted_tools_are_refused_naming_their_type(kind: str) -> None:
    err = refusal(tools=[FN, {"type": kind, "name": "x"}])
    assert err == {"message": err["message"], "type": "invalid_request_error", "param": "tools[1].type",
                   "code": None}
    assert repr(kind) in err["message"]


@pytest.mark.parametrize(("choice", "normalized", "names"), [
    (None, None, ["get_weather", "other"]), ("auto", "auto", ["get_weather", "other"]),
    ("none", "none", ["get_weather", "other"]), ("required", "required", ["get_weather", "other"]),
    ({"type": "function", "name": "other"}, "name:other", ["get_weather", "other"]),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]}, "required",
     ["other"])])
def test_every_tool_choice(choice: Any, normalized: str | None, names: list[str]) -> None:
    turn = read(tools=[FN, {**FN, "name": "other"}], tool_choice=choice)
    assert turn.req.tool_choice == normalized and [tool_name(t) for t in turn.req.tools] == names
    assert turn.echo["tool_choice"] == (choice or "auto")


@pytest.mark.parametrize("choice", [{"type": "function", "name": "missing"}, {"type": "file_search"}, "sometimes",
                                    {"type": "allowed_tools", "mode": "auto", "tools": [{"name": "missing"}]}])
def test_tool_choice_refused_when_it_cannot_be_honoured(choice: Any) -> None:
    assert refusal(tools=[FN], tool_choice=choice)["param"] == "tool_choice"


def test_text_format_as_llama_servers_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert read().req.response_format is None
    assert read(text={"format": {"type": "text"}, "verbosity": "low"}).req.response_format is None
    assert read(text={"format": {"type": "json_object"}}).req.response_format == {"type": "json_object"}
    assert read(text={"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": True}}
                ).req.response_format == {"type": "json_schema",
                                          "json_schema": {"name": "A", "schema": schema, "strict": True}}
    assert refusal(text={"format": {"type": "json_schema"}})["param"] == "text.format"


@pytest.mark.parametrize(("effort", "reasoning"), [(None, None), ("none", False), ("minimal", False), ("low", "low"),
                                                   ("medium", "medium"), ("high", "high"), ("xhigh", True)])
def test_reasoning_effort_as_chat_completions_reasoning_effort(effort: str | None, reasoning: Any) -> None:
    assert read(reasoning={"effort": effort, "summary": "auto"}).req.reasoning == reasoning


def test_every_field_of_the_sdks_request_is_in_the_table() -> None:
    from typing import get_type_hints

    from openai.types.responses.response_create_params import ResponseCreateParamsBase

    assert not set(get_type_hints(ResponseCreateParamsBase)) - set(responses.FIELDS)


def test_fields_honoured_ignored_passed_on_or_refused() -> None:
    turn = read(max_output_tokens=7, temperature=0.2, top_p=0.9, top_k=5, include=["reasoning.encrypted_content"],
                client_metadata={"x": "1"}, prompt_cache_key="k", store=False, user="u", metadata={"a": "b"},
                service_tier="auto", truncation="auto", stream_options={"include_obfuscation": False},
                safety_identifier="s", max_tool_calls=3, background=False, top_logprobs=0)
    assert turn.req.params == {"max_tokens": 7, "temperature": 0.2, "top_p": 0.9, "top_k": 5}
    assert turn.store is False and turn.echo["metadata"] == {"a": "b"} and turn.echo["user"] == "u"
    assert {rule for rule, _ in responses.FIELDS.values()} == {"honoured", "ignored", "refused"}
    for name, value in [("background", True), ("conversation", "conv_1"), ("prompt", {"id": "p"}),
                        ("top_logprobs", 2), ("n", 2), ("moderation", {"model": "x"})]:
        err = refusal(**{name: value})
        assert err["param"] == name and f"`{name}`" in err["message"]
    assert "required" in refusal(input=[])["message"]
    assert read().req.time_bound == chat.DEFAULT_MAX_TIME  # no max_output_tokens: the default time bound


# --- the store ---------------------------------------------------------------------------------------------------


def record(id: str, previous: str | None = None, owner: str = "", size: int = 0) -> Record:
    return Record(id, owner, previous, [{"role": "user", "content": "x" * size}], {"id": id, "output": []})


def rid(n: int) -> str:
    return f"resp_{n:024x}"


def test_the_store_keeps_at_most_n_responses_least_recently_used_evicted() -> None:
    store = ResponseStore(max_responses=3)
    for n in range(3):
        store.put(record(rid(n)))
    assert store.get("", rid(0)) is not None  # used: now the most recent
    store.put(record(rid(3)))
    assert store.get("", rid(1)) is None and len(store) == 3
    assert {r for r in (rid(0), rid(2), rid(3)) if store.get("", r)} == {rid(0), rid(2), rid(3)}


def test_the_store_keeps_at_most_m_bytes_and_drops_a_record_over_them() -> None:
    one = len(record(rid(0), size=100).dump())
    store = ResponseStore(max_bytes=2 * one + 10)
    for n in range(3):
        store.put(record(rid(n), size=100))
    assert [n for n in range(3) if store.get("", rid(n))] == [1, 2] and store.bytes <= store.max_bytes
    assert store.put(record(rid(9), size=3 * one)) is False and store.get("", rid(9)) is None


def test_a_conversation_is_evicted_from_its_latest_turn_back() -> None:
    """Using a response uses its chain, the earlier turns last: a turn is evicted before those it continues."""
    store = ResponseStore(max_responses=3)
    store.put(record(rid(0)))
    store.put(record(rid(1), rid(0)))
    store.put(record(rid(2), rid(1)))
    store.put(record(rid(7)))  # another conversation
    assert [r.id for r in store.chain("", rid(1))] == [rid(0), rid(1)]
    with pytest.raises(Missing) as info:
        store.chain("", rid(2))
    assert (info.value.wanted, info.value.missing) == (rid(2), rid(2))
    store.delete("", rid(0))
    with pytest.raises(Missing) as info:
        store.chain("", rid(1))
    assert info.value.missing == rid(0)  # the earlier turn it needs is named


def test_records_are_scoped_to_the_api_key() -> None:
    store = ResponseStore()
    a, b = owner_of("key-a"), owner_of("key-b")
    assert a != b and "key-a" not in a and owner_of(None) == ""
    store.put(record(rid(1), owner=a))
    assert store.get(b, rid(1)) is None and store.get("", rid(1)) is None and store.get(a, rid(1)) is not None
    assert not store.delete(b, rid(1)) and store.get(a, rid(1)) is not None
    with pytest.raises(Missing):
        store.chain(b, rid(1))


@pytest.mark.parametrize("bad", ["../etc/passwd", "resp_x", "resp_" + "0" * 23 + "/", rid(1) + ".json"])
def test_ids_not_of_ours_are_unknown(bad: str) -> None:
    store = ResponseStore(MemoryBackend())
    store.put(record(rid(1)))
    assert store.get("", bad) is None


def test_on_disk_files_are_private_and_outlive_the_store(tmp_path: Path) -> None:
    where = tmp_path / "responses"
    store = ResponseStore(DiskBackend(where))
    store.put(record(rid(1), owner="o"))
    store.put(record(rid(2), rid(1), owner="o"))
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    files = sorted(where.iterdir())
    assert [f.name for f in files] == [f"{rid(1)}.json", f"{rid(2)}.json"]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    again = ResponseStore(DiskBackend(where), max_responses=1)  # a restart with a smaller bound evicts the oldest
    assert len(again) == 1 and len(list(where.iterdir())) == 1
    assert ResponseStore(DiskBackend(where)).get("o", rid(1)) is not None  # rid(1) was used last (the chain)
    assert again.delete("o", rid(1)) and not list(where.iterdir())
    os.chmod(where, 0o755)
    DiskBackend(where)
    assert stat.S_IMODE(where.stat().st_mode) == 0o700  # an existing dir is made private too


# --- the stream --------------------------------------------------------------------------------------------------


async def _events(evs: list[Event | Waiting], fail: Exception | None = None) -> AsyncIterator[Event | Waiting]:
    for ev in evs:
        yield ev
    if fail is not None:
        raise fail


def stream(evs: list[Event | Waiting], fail: Exception | None = None, **body: Any,
           ) -> tuple[list[dict[str, Any]], ResponseStore]:
    """The stream's events (each validated by the openai SDK), and the store it was kept in."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    store = ResponseStore()
    turn = responses.read({"model": "m", "input": "hi", **body}, [])
    out = responses._Stream(turn, "m")

    async def run() -> bytes:
        gw: Any = SimpleNamespace(responses=store)
        return b"".join([c async for c in responses._sse(_events(evs, fail), out, gw, "")])

    raw = asyncio.run(run()).decode()
    check_responses_stream(raw.encode())  # the integration tests' checker, on a stream known event by event
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    got = []
    for block in raw.split("\n\n")[:-1]:
        name, data = block.split("\n")
        obj = json.loads(data.removeprefix("data: "))
        assert name == f"event: {obj['type']}"
        # the SDK's ResponseError.code lists no context_length_exceeded, which OpenAI sends and Codex reads
        error = (obj.get("response") or {}).get("error") or {}
        adapter.validate_python(obj if error.get("code") != "context_length_exceeded" else
                                {**obj, "response": {**obj["response"], "error": {**error, "code": "server_error"}}})
        got.append(obj)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    return got, store


def test_a_streamed_reply_is_the_event_sequence_the_sdk_reads() -> None:
    from openai.types.responses import Response

    evs: list[Event | Waiting] = [
        WAITING, ReasoningDelta("thin"), ReasoningDelta("king"), TextDelta("Hel"), TextDelta("lo"),
        ToolCallDelta(0, "call_1", "get_weather", '{"city"'), ToolCallDelta(0, None, None, ':"Paris"}'),
        Finish("tool_calls"), Usage(40, 10, 50, 30)]
    got, store = stream(evs, tools=[FN])
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.in_progress",  # the second: a keep-alive
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    done = Response.model_validate(got[-1]["response"])
    assert done.status == "completed" and done.output_text == "Hello" and done.usage is not None
    assert [o.type for o in done.output] == ["reasoning", "message", "function_call"]
    call = done.output[2]
    assert call.type == "function_call" and call.call_id == "call_1" and json.loads(call.arguments) == {"city": "Paris"}
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (40, 10, 50)
    assert done.usage.input_tokens_details.cached_tokens == 30
    assert 0 < done.usage.output_tokens_details.reasoning_tokens < 10
    kept = store.get("", done.id)
    assert kept is not None and kept.response == got[-1]["response"] and kept.input == [
        {"type": "message", "role": "user", "content": "hi"}]


def test_a_cut_reply_is_incomplete_and_an_empty_one_has_an_empty_message() -> None:
    got, store = stream([TextDelta("a b"), Finish("length"), Usage(5, 3, 8)], max_output_tokens=3, store=False)
    assert got[-1]["type"] == "response.incomplete" and len(store) == 0
    done = got[-1]["response"]
    assert done["incomplete_details"] == {"reason": "max_output_tokens"} and done["output"][0]["status"] == "incomplete"
    got, _ = stream([Finish("stop"), Usage(2, 0, 2)])
    assert got[-1]["response"]["output"][0]["content"][0]["text"] == "" and got[-1]["type"] == "response.completed"


def test_a_failure_after_the_head_is_a_failed_response() -> None:
    from gguf_provider.errors import ContextOverflowError

    got, store = stream([TextDelta("a")], fail=ContextOverflowError("the prompt is 9,000 tokens"))
    assert got[-1]["type"] == "response.failed" and len(store) == 0
    assert got[-1]["response"]["error"]["code"] == "context_length_exceeded"
    assert got[-1]["response"]["status"] == "failed"


def test_a_namespaced_call_says_its_namespace() -> None:
    ns = {"type": "namespace", "name": "agents", "description": "", "tools": [{"type": "function", "name": "spawn"}]}
    got, _ = stream([ToolCallDelta(0, None, "spawn", "{}"), Finish("tool_calls"), Usage(2, 1, 3)], tools=[ns])
    item = got[-1]["response"]["output"][0]
    assert item["namespace"] == "agents" and item["name"] == "spawn" and item["call_id"].startswith("call_")


def test_the_stops_error_event_follows_the_streams_numbering() -> None:
    from gguf_provider.gateway.lifeline import Stopping

    out = responses._Stream(read(), "m")
    out.start()
    raw = app_module._stream_error({"path": "/v1/responses", responses.SCOPE_KEY: out}, Stopping("stopping"))
    event = json.loads(raw.decode().split("data: ", 1)[1])
    assert event["type"] == "error" and event["sequence_number"] == 2 and event["message"] == "stopping"


# --- the endpoints, over a scripted model --------------------------------------------------------------------


class Model:
    """Stands in for the model: each request's chat request is kept; the reply is ``reply``'s."""

    def __init__(self) -> None:
        self.asked: list[chat.ChatRequest] = []
        self.reply = "ok"

    async def acomplete(self, engine: Any, req: chat.ChatRequest) -> Completion:
        self.asked.append(req)
        calls = [ToolCall("call_1", "get_weather", '{"city":"Oslo"}')] if req.tool_choice == "required" else []
        return Completion(content="" if calls else self.reply, tool_calls=calls,
                          finish_reason="tool_calls" if calls else "stop",
                          usage=Usage(10 * len(self.asked), 2, 10 * len(self.asked) + 2))

    async def astream(self, engine: Any, req: chat.ChatRequest) -> AsyncIterator[Event]:
        self.asked.append(req)
        for ev in (TextDelta(self.reply), Finish("stop"), Usage(3, 1, 4)):
            yield ev


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Model:
    m = Model()
    monkeypatch.setattr(chat, "acomplete", m.acomplete)
    monkeypatch.setattr(chat, "astream", m.astream)
    return m


def gateway(**settings: Any) -> TestClient:
    app = App(Settings(port=11480, **settings))

    @asynccontextmanager
    async def use(name: str, kind: str = "chat", **_: Any) -> AsyncIterator[Any]:
        yield object()

    app.inner.state.gateway.pool.use = use
    return TestClient(app, base_url="http://127.0.0.1:11480")


@pytest.fixture
def client() -> Iterator[TestClient]:
    with gateway() as c:
        yield c


def test_previous_response_id_continues_with_the_same_messages_first(client: TestClient, model: Model) -> None:
    first = client.post("/v1/responses", json={"model": "m", "input": "one", "instructions": "Be brief.",
                                               "tools": [FN], "tool_choice": "required"}).json()
    assert first["output"][0]["type"] == "function_call" and first["status"] == "completed"
    second = client.post("/v1/responses", json={
        "model": "m", "previous_response_id": first["id"], "instructions": "Be brief.", "tools": [FN],
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}).json()
    third = client.post("/v1/responses", json={"model": "m", "previous_response_id": second["id"],
                                               "input": "three", "stream": True})
    assert third.status_code == 200 and "response.completed" in third.text
    one, two, three = (r.messages for r in model.asked)
    assert two[:len(one)] == one  # the same rendering, turn after turn: the prompt cache's prefix
    assert three[:len(two) - 1] == two[1:] and three[0] == {"role": "user", "content": "one"}  # no instructions
    assert [m["role"] for m in model.asked[2].messages] == ["user", "assistant", "tool", "assistant", "user"]
    got = client.get(f"/v1/responses/{second['id']}").json()
    assert got == second and got["previous_response_id"] == first["id"]


def test_unknown_and_deleted_ids_are_openais_errors(client: TestClient, model: Model) -> None:
    r = client.post("/v1/responses", json={"model": "m", "input": "x", "previous_response_id": rid(5)})
    assert r.status_code == 400 and r.json() == {"error": {
        "message": f"Previous response with id '{rid(5)}' not found.", "type": "invalid_request_error",
        "param": "previous_response_id", "code": "previous_response_not_found"}}
    made = client.post("/v1/responses", json={"model": "m", "input": "x"}).json()
    assert client.delete(f"/v1/responses/{made['id']}").json() == {"id": made["id"], "object": "response",
                                                                   "deleted": True}
    for r in (client.get(f"/v1/responses/{made['id']}"), client.delete(f"/v1/responses/{made['id']}")):
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    unstored = client.post("/v1/responses", json={"model": "m", "input": "x", "store": False}).json()
    assert client.get(f"/v1/responses/{unstored['id']}").status_code == 404
    assert client.post("/v1/responses", json={"model": "m", "input": "x", "tools": [
        {"type": "file_search"}]}).json()["error"]["param"] == "tools[0].type"


def test_another_key_cannot_read_a_stored_response(tmp_path: Path, model: Model) -> None:
    where = str(tmp_path / "responses")
    with gateway(api_key="a", responses_dir=where) as a:
        made = a.post("/v1/responses", json={"model": "m", "input": "x"}, headers={"Authorization": "Bearer a"})
        rid_ = made.json()["id"]
        assert a.get(f"/v1/responses/{rid_}", headers={"x-api-key": "a"}).status_code == 200
    with gateway(api_key="b", responses_dir=where) as b:  # the same store, restarted with another key
        assert b.get(f"/v1/responses/{rid_}", headers={"x-api-key": "b"}).status_code == 404
        assert b.post("/v1/responses", json={"model": "m", "input": "y", "previous_response_id": rid_},
                      headers={"x-api-key": "b"}).status_code == 400
    with gateway(api_key="a", responses_dir=where) as a:
        assert a.get(f"/v1/responses/{rid_}", headers={"x-api-key": "a"}).status_code == 200


def test_a_whole_reply_is_the_response_object(client: TestClient, model: Model) -> None:
    from openai.types.responses import Response

    body = client.post("/v1/responses", json={"model": "m", "input": "x", "metadata": {"k": "v"},
                                              "max_output_tokens": 5, "temperature": 0}).json()
    r = Response.model_validate(body)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed" and r.model == "m"
    assert r.output_text == "ok" and r.metadata == {"k": "v"} and r.max_output_tokens == 5 and r.store is True
    assert r.usage is not None and r.usage.total_tokens == 12 and r.incomplete_details is None


def test_a_cut_whole_reply_is_incomplete() -> None:
    done = Completion(content="a b", reasoning="hm", finish_reason="length", usage=Usage(3, 4, 7))
    items = responses.output_items(done, {})
    assert [i["type"] for i in items] == ["reasoning", "message"] and items[-1]["status"] == "incomplete"
    assert responses.cut("length") and responses.cut("repetition") and not responses.cut("tool_calls")


def test_the_input_items_of_a_response_listed_and_paged(client: TestClient, model: Model) -> None:
    made = client.post("/v1/responses", json={"model": "m", "input": [
        {"type": "message", "role": "user", "content": "a"},
        {"type": "message", "role": "assistant", "content": "b"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "c"}], "id": "msg_mine"}]}).json()
    url = f"/v1/responses/{made['id']}/input_items"
    desc = client.get(url).json()
    assert [i["id"] for i in desc["data"]][0] == "msg_mine" and desc["has_more"] is False
    assert desc["first_id"] == "msg_mine" and desc["last_id"] == desc["data"][-1]["id"]
    asc = client.get(url, params={"order": "asc"}).json()["data"]
    assert asc == desc["data"][::-1]
    assert asc[0]["content"] == [{"type": "input_text", "text": "a"}] and asc[0]["status"] == "completed"
    assert asc[1]["content"] == [{"type": "output_text", "text": "b", "annotations": []}]
    assert client.get(url).json() == desc  # the ids made for the client's items are the same each time
    page = client.get(url, params={"order": "asc", "limit": 1, "after": asc[0]["id"]}).json()
    assert [i["id"] for i in page["data"]] == [asc[1]["id"]] and page["has_more"] is True
    for bad in ({"limit": 0}, {"limit": "x"}, {"order": "up"}, {"after": "msg_none"}):
        r = client.get(url, params=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad)), (bad, r.json())
    assert client.get("/v1/responses/resp_0000/input_items").status_code == 404
