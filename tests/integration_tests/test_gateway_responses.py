"""OpenAI's Responses API on a real gateway (`gguf-provider serve` with no model) through the real `openai` SDK (and
the Agents SDK where it is installed), over the real test models: whole and streamed replies, a function tool,
structured output, a conversation continued by ``previous_response_id``, the stored responses read and deleted.

Structure is asserted, never the model's text: greedy text differs between CPUs. Codex's recorded requests are
replayed with the other tools' in tests/integration_tests/tools/test_tool_fixtures.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support.clients import closed_after_test
from tests.support.gateway import GatewayProc, gateway

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct.Q4_1"
QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"
N_CTX = 2048
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"]}, "strict": False}
ONE_COLOUR = {"type": "object", "properties": {"colour": {"const": "red"}}, "required": ["colour"],
              "additionalProperties": False}
# ~300 tokens the first turn holds: a later turn's prompt that counts more holds them
STORY = " ".join(["The lighthouse keeper counted ships every night and wrote their names in a book."] * 20)


@pytest.fixture(scope="module")
def gw(smollm2_path: Path, qwen_path: Path) -> Iterator[GatewayProc]:
    with gateway(smollm2_path.parent, "--ctx", str(N_CTX), "-v") as g:
        yield g


def client(gw: GatewayProc) -> Any:
    import openai

    return closed_after_test(openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0))


def assert_usage(r: Any, bound: int) -> None:
    u = r.usage
    assert u is not None and u.input_tokens > 0 and 0 < u.output_tokens <= bound
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0


def test_a_whole_response(gw: GatewayProc) -> None:
    r = client(gw).responses.create(model=SMOL, input="Name three colours.", instructions="Answer briefly.",
                                    max_output_tokens=16, temperature=0, metadata={"case": "whole"})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == SMOL
    assert r.status in ("completed", "incomplete") and r.instructions == "Answer briefly."
    assert [o.type for o in r.output] == ["message"] and r.output_text.strip()
    assert (r.incomplete_details is not None) == (r.status == "incomplete")
    assert r.metadata == {"case": "whole"} and r.max_output_tokens == 16 and r.store is True
    assert_usage(r, 16)


def test_a_streamed_response_is_the_event_sequence(gw: GatewayProc) -> None:
    events = list(client(gw).responses.create(model=SMOL, input="Name three colours.", max_output_tokens=16,
                                              temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds.index("response.output_item.added") < kinds.index("response.content_part.added") < \
        kinds.index("response.output_text.delta") < kinds.index("response.output_text.done") < \
        kinds.index("response.content_part.done") < kinds.index("response.output_item.done")
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    assert_usage(final, 16)


def test_the_sdks_stream_helper_and_structured_output(gw: GatewayProc) -> None:
    """``responses.stream`` accumulates the events and parses the JSON the schema constrained."""
    from pydantic import BaseModel

    class Colour(BaseModel):
        colour: Literal["red"]

    with client(gw).responses.stream(model=QWEN, input="Give a colour as JSON.", text_format=Colour,
                                     temperature=0) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and final.output_parsed == Colour(colour="red")
    plain = client(gw).responses.create(model=QWEN, input="Give a colour as JSON.", temperature=0, text={
        "format": {"type": "json_schema", "name": "colour", "schema": ONE_COLOUR, "strict": True}})
    assert json.loads(plain.output_text) == {"colour": "red"} and plain.text.format.type == "json_schema"


def test_a_function_call_and_its_output(gw: GatewayProc) -> None:
    c = client(gw)
    first = c.responses.create(model=QWEN, input="What's the weather in Paris?", tools=[WEATHER],
                               tool_choice="required", temperature=0, max_output_tokens=64)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    assert isinstance(json.loads(call.arguments)["city"], str)
    streamed = list(c.responses.create(model=QWEN, input="What's the weather in Oslo?", tools=[WEATHER],
                                       tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                       max_output_tokens=64, stream=True))
    done = [e.item for e in streamed if e.type == "response.output_item.done"]
    args = "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta")
    assert done[-1].type == "function_call" and json.loads(args) == json.loads(done[-1].arguments)
    # the call's result, sent back on the stored conversation: the model answers (or calls again)
    after = c.responses.create(model=QWEN, previous_response_id=first.id, tools=[WEATHER], temperature=0,
                               max_output_tokens=32, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                             "output": "Sunny, 21 C."}])
    assert after.status in ("completed", "incomplete") and after.previous_response_id == first.id
    assert after.usage is not None and after.usage.input_tokens > 0 and after.output


def test_a_conversation_over_three_turns(gw: GatewayProc) -> None:
    """Each turn continues the stored one before it: the third's prompt holds the first turn's text (its tokens
    count more than it), and starts as the second's did, so llama-server reads it from the prompt cache."""
    c = client(gw)
    one = c.responses.create(model=SMOL, input=f"{STORY}\nRemember this story.", max_output_tokens=8, temperature=0)
    two = c.responses.create(model=SMOL, previous_response_id=one.id, input="What did the keeper count?",
                             max_output_tokens=8, temperature=0)
    three = c.responses.create(model=SMOL, previous_response_id=two.id, input="And what did he write?",
                               max_output_tokens=8, temperature=0)
    u1, u2, u3 = one.usage, two.usage, three.usage
    assert u1 is not None and u2 is not None and u3 is not None
    assert u1.input_tokens > 300 and u3.input_tokens > u2.input_tokens + u2.output_tokens > u1.input_tokens
    assert u3.input_tokens_details.cached_tokens >= u2.input_tokens - 4  # the same prefix, byte for byte
    got = c.responses.retrieve(three.id)
    assert got.id == three.id and got.previous_response_id == two.id and got.output_text == three.output_text
    assert c.responses.retrieve(two.id).previous_response_id == one.id
    items = c.responses.input_items.list(three.id)  # the SDK parses each as its item type
    assert [i.type for i in items.data] == ["message"] and items.has_more is False
    msg = items.data[0]
    assert msg.type == "message" and msg.role == "user" and msg.content[0].text == "And what did he write?"
    assert msg.id == items.first_id == items.last_id


def test_an_evicted_id_is_openais_error_not_a_fresh_start(smollm2_path: Path) -> None:
    """A gateway keeping two responses (`--responses-max 2`): the third stored evicts the least recently used; the
    SDK gets OpenAI's errors for it (400 previous_response_not_found, 404 on retrieve), the others stay."""
    import openai

    with gateway(smollm2_path.parent, "--ctx", str(N_CTX), "--responses-max", "2") as small:
        c = client(small)
        a, b, d = (c.responses.create(model=SMOL, input=t, max_output_tokens=2) for t in ("a", "b", "d"))
        with pytest.raises(openai.BadRequestError) as info:
            c.responses.create(model=SMOL, input="more", previous_response_id=a.id, max_output_tokens=2)
        assert info.value.body["code"] == "previous_response_not_found", info.value.body
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(a.id)
        assert c.responses.retrieve(b.id).id == b.id and c.responses.retrieve(d.id).id == d.id
        went_on = c.responses.create(model=SMOL, input="more", previous_response_id=d.id, max_output_tokens=2)
        assert went_on.previous_response_id == d.id


def test_unknown_and_deleted_ids(gw: GatewayProc) -> None:
    import openai

    c = client(gw)
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model=SMOL, input="hi", previous_response_id="resp_" + "0" * 24, max_output_tokens=4)
    assert info.value.body["param"] == "previous_response_id" and "not found" in info.value.body["message"]
    made = c.responses.create(model=SMOL, input="hi", max_output_tokens=4)
    c.responses.delete(made.id)
    for call in (lambda: c.responses.retrieve(made.id), lambda: c.responses.delete(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model=SMOL, input="more", previous_response_id=made.id, max_output_tokens=4)
    unstored = c.responses.create(model=SMOL, input="hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as refused:
        c.responses.create(model=SMOL, input="hi", tools=[{"type": "file_search", "vector_store_ids": ["vs"]}])
    assert refused.value.body["param"] == "tools[0].type"


def test_the_defaults_bound_a_reply(gw: GatewayProc) -> None:
    """No max_output_tokens, no temperature: the reply still ends, at its end or at the context's."""
    r = client(gw).responses.create(model=SMOL, input="Say hello.")
    assert r.status in ("completed", "incomplete") and r.usage is not None
    assert 0 < r.usage.total_tokens <= N_CTX


AGENT = """
import asyncio, json, sys
import agents
from openai import AsyncOpenAI

agents.set_tracing_disabled(True)
called = []

@agents.function_tool
def get_weather(city: str) -> str:
    \"\"\"Get the current weather in a city.\"\"\"
    called.append(city)
    return f"Sunny in {city}."

async def main():
    async with AsyncOpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0) as client:
        agent = agents.Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                             model=agents.OpenAIResponsesModel(model=sys.argv[2], openai_client=client),
                             model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                                 max_tokens=64))
        result = await agents.Runner.run(agent, "What's the weather in Paris?", max_turns=4)
    print(json.dumps({"called": called, "final": result.final_output}))

asyncio.run(main())
"""


def test_an_agent_calls_its_tool_through_the_gateway(gw: GatewayProc) -> None:
    """The OpenAI Agents SDK's default model (OpenAIResponsesModel) against the gateway, one tool call. openai-agents
    0.24 needs openai 3, which the test extra's llama-index-llms-openai refuses: it runs in a venv of its own
    (scripts/test_tools.py ``agents``), as aider does."""
    import subprocess

    from tests.support.tool_protocol import need_tool

    python = need_tool("agents")
    out = subprocess.run([str(python), "-c", AGENT, f"{gw.url}/v1", QWEN], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["called"] and isinstance(got["final"], str)
