"""The gateway (`gguf-provider serve` with no model) through each protocol's own clients: the openai SDK, LangChain's
ChatOpenAI / OpenAIEmbeddings, LlamaIndex's OpenAILike; the anthropic SDK and ChatAnthropic; the ollama client and
ChatOllama / OllamaEmbeddings. One gateway process serves the module, over the real test models.

Replies are compared with the same request made by ChatGGUF on the same server (greedy, so the same text), or
constrained (a forced tool call, a JSON schema), never pinned: a model's greedy text differs between CPUs.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.support.clients import closed_after_test
from tests.support.gateway import GatewayProc, gateway
from tests.support.runtime import reap, wait_until
from tests.support.timing import REACT

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct.Q4_1"
QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"
MINILM = "all-MiniLM-L6-v2.F16"
RERANKER = "all-MiniLM-L6-v2-rerank-test.Q8_0"
N_CTX = 2048  # every server the gateway starts (--ctx): small, so an over-long prompt is cheap to make
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL_SCHEMA = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
    "required": ["city"]}}, "required": ["name", "arguments"]}
# Stream-vs-whole comparisons: both computed from scratch (a cached prompt can change greedy text,
# tests/integration_tests/test_prompt_cache.py), or, where a protocol cannot say so (Ollama), the reply constrained.
NO_CACHE = {"cache_prompt": False}
ONE_COLOUR = {"type": "object", "properties": {"colour": {"const": "red"}}, "required": ["colour"],
              "additionalProperties": False}
# A 1x1 PNG (red).
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c49444154789c63f8cfc000000301"
    "0100c9fe92ef0000000049454e44ae426082")).decode()


@pytest.fixture(scope="module")
def gw(smollm2_path: Path, qwen_path: Path, minilm_path: Path, reranker_path: Path) -> Iterator[GatewayProc]:
    # -v: the runtime's log of what it does (each server start: "starting llama-server for ...") in the output
    with gateway(smollm2_path.parent, "--ctx", str(N_CTX), "-v") as g:
        yield g


T = TypeVar("T")


def long_prompt() -> str:
    return "word " * (N_CTX * 2)  # well over the context in any tokenizer


# --- OpenAI ----------------------------------------------------------------------------------------------------


def openai_client(gw: GatewayProc) -> Any:
    import openai

    return closed_after_test(openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0))


def test_openai_sdk_chat_stream_and_whole_agree(gw: GatewayProc) -> None:
    client = openai_client(gw)
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=24,
                                           extra_body=NO_CACHE)
    assert whole.object == "chat.completion" and whole.model == SMOL
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body=NO_CACHE))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # greedy, one server: the same reply
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]


def test_a_model_a_script_holds_is_the_one_the_gateway_serves(gw: GatewayProc, smollm2_path: Path) -> None:
    """A script (ChatGGUF, the gateway's runtime home) loads SmolLM2 with the gateway's options first; the gateway's
    request is answered by that server, and the two replies (greedy, no prompt cache) are the same."""
    import subprocess
    import sys

    code = ("import json,sys\nfrom gguf_provider.langchain import ChatGGUF\n"
            f"llm = ChatGGUF(model={str(smollm2_path)!r}, n_ctx={N_CTX}, temperature=0, max_tokens=20, "
            "model_kwargs={'cache_prompt': False}).load()\n"
            "print(llm.engine.info.pid, flush=True)\nq = sys.stdin.readline().strip()\n"
            "print(json.dumps(llm.invoke(q).content), flush=True)\nllm.unload()\n")
    script = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=gw.env)
    try:
        assert script.stdout is not None and script.stdin is not None
        pid = int(script.stdout.readline())
        question = "What is the capital of France?"
        via = openai_client(gw).chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=20,
            extra_body={"cache_prompt": False})
        shown = json.loads(subprocess.run([sys.executable, "-m", "gguf_provider.cli", "ps", "--json"], env=gw.env,
                                          capture_output=True, text=True, timeout=60).stdout)
        (row,) = [r for r in shown["servers"] if r["pid"] == pid]
        assert row["gateway"] == gw.url and len(row["holders"]) == 2  # the script and the gateway
        script.stdin.write(question + "\n")
        script.stdin.flush()
        assert via.choices[0].message.content == json.loads(script.stdout.readline())
    finally:
        reap(script)


def test_openai_sdk_forced_tool_call_streamed(gw: GatewayProc) -> None:
    client = openai_client(gw)
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    whole = client.chat.completions.create(model=QWEN, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="required", temperature=0, extra_body=NO_CACHE)
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    assert whole.choices[0].finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(model=QWEN, messages=messages, tools=[WEATHER_TOOL],
                                                 tool_choice="required", temperature=0, stream=True,
                                                 extra_body=NO_CACHE))
    parts = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert parts[0].function.name == "get_weather" and parts[0].id
    assert json.loads("".join(p.function.arguments or "" for p in parts)) == json.loads(call.function.arguments)


def test_openai_sdk_structured_output(gw: GatewayProc) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}},
              "required": ["colour"]}
    reply = openai_client(gw).chat.completions.create(
        model=QWEN, messages=[{"role": "user", "content": "Give a colour as JSON."}], temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert isinstance(json.loads(reply.choices[0].message.content)["colour"], str)


def test_openai_sdk_errors_in_openai_shape(gw: GatewayProc) -> None:
    import openai

    client = openai_client(gw)
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as over:
        client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": long_prompt()}])
    assert over.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert "context" in str(over.value)


def test_images_start_the_model_with_its_projector(gw: GatewayProc) -> None:
    """An image part starts the model with the projector beside it (the test projector, random weights: the reply
    means nothing, but the image went through), in OpenAI's and Ollama's forms."""
    image = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    client = openai_client(gw)
    text = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "What is this?"}],
                                          max_tokens=8, temperature=0)
    reply = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": image}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.content is not None
    assert text.usage is not None and reply.usage is not None
    assert reply.usage.prompt_tokens > text.usage.prompt_tokens  # the image's tokens are in the prompt
    seen = ollama_client(gw).chat(model=SMOL, messages=[{"role": "user", "content": "What is this?",
                                                         "images": [PNG]}], options={"num_predict": 8})
    assert seen.done and seen.prompt_eval_count == reply.usage.prompt_tokens
    # An image URL on this machine is not fetched (media.py's rules): a 400 naming why, in OpenAI's shape.
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=SMOL, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"{gw.url}/api/version"}}]}])
    assert "refused" in str(refused.value) or "not fetched" in str(refused.value)


def test_openai_sdk_default_max_tokens_is_capped_at_the_context(gw: GatewayProc) -> None:
    """No max_tokens, as users send: the reply ends by itself or at the context, never an error."""
    reply = openai_client(gw).chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Say hello."}], temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.total_tokens <= N_CTX


def test_openai_sdk_models_lists_the_models_dir(gw: GatewayProc) -> None:
    ids = {m.id for m in openai_client(gw).models.list()}
    assert {SMOL, QWEN, MINILM, RERANKER} <= ids


def test_openai_sdk_embeddings_and_completions(gw: GatewayProc) -> None:
    client = openai_client(gw)
    vectors = client.embeddings.create(model=MINILM, input=["a cat", "a dog"])
    assert [len(d.embedding) for d in vectors.data] == [384, 384]
    text = client.completions.create(model=SMOL, prompt="One, two, three,", max_tokens=8, temperature=0)
    assert text.choices[0].text and text.model == SMOL


def test_rerank_endpoint(gw: GatewayProc) -> None:
    r = httpx.post(f"{gw.url}/v1/rerank", json={"model": RERANKER, "query": "pandas", "top_n": 1,
                                                "documents": ["Pandas eat bamboo.", "Cats purr."]}, timeout=120)
    assert r.status_code == 200, r.text
    (best,) = r.json()["results"]
    assert best["index"] in (0, 1) and isinstance(best["relevance_score"], float)


def test_langchain_chat_openai_and_embeddings(gw: GatewayProc) -> None:
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    llm = ChatOpenAI(model=SMOL, base_url=f"{gw.url}/v1", api_key="unused", temperature=0, max_tokens=20,  # type: ignore[arg-type]
                     extra_body=NO_CACHE)
    whole = llm.invoke("Name a fruit.")
    streamed = "".join(str(c.content) for c in llm.stream("Name a fruit."))
    assert whole.content and streamed == whole.content
    emb = OpenAIEmbeddings(model=MINILM, base_url=f"{gw.url}/v1", api_key="unused",  # type: ignore[arg-type]
                           check_embedding_ctx_length=False)
    assert len(emb.embed_query("hello")) == 384


def test_langchain_chat_openai_async_tool_call(gw: GatewayProc) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=QWEN, base_url=f"{gw.url}/v1", api_key="unused", temperature=0)  # type: ignore[arg-type]
    msg = asyncio.run(llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").ainvoke("Weather in Oslo?"))
    assert [tc["name"] for tc in msg.tool_calls] == ["get_weather"]
    assert isinstance(msg.tool_calls[0]["args"]["city"], str)


def test_llama_index_openai_like(gw: GatewayProc) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model=SMOL, api_base=f"{gw.url}/v1", api_key="unused", is_chat_model=True, temperature=0,
                     max_tokens=20, context_window=N_CTX, additional_kwargs={"extra_body": NO_CACHE})
    whole = llm.chat([ChatMessage(role="user", content="Name a fruit.")])
    streamed = "".join(r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content="Name a fruit.")]))
    assert whole.message.content and streamed == whole.message.content


# --- Anthropic -------------------------------------------------------------------------------------------------


GREEDY = {"temperature": 0}  # this anthropic SDK has no temperature keyword (newer Claude models take none)


def anthropic_client(gw: GatewayProc) -> Any:
    import anthropic

    return closed_after_test(anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0))


def test_anthropic_sdk_create_and_stream_agree(gw: GatewayProc) -> None:
    client = anthropic_client(gw)
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.messages.create(model=SMOL, max_tokens=24, messages=messages, extra_body={**GREEDY, **NO_CACHE},
                                   system="You are terse.")
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens")
    (block,) = whole.content
    assert block.type == "text" and block.text
    assert whole.usage.output_tokens > 0 and whole.usage.input_tokens > 0
    with client.messages.stream(model=SMOL, max_tokens=24, messages=messages, extra_body={**GREEDY, **NO_CACHE},
                                system="You are terse.") as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_anthropic_sdk_tool_use_and_result_round_trip(gw: GatewayProc) -> None:
    client = anthropic_client(gw)
    tool = {"name": "get_weather", "description": "Get the current weather in a city.",
            "input_schema": WEATHER_TOOL["function"]["parameters"]}  # type: ignore[index]
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = client.messages.create(model=QWEN, max_tokens=200, messages=ask, tools=[tool],
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    with client.messages.stream(model=QWEN, max_tokens=200, messages=ask, tools=[tool],
                                tool_choice={"type": "any"}, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content if b.type == "tool_use"] == ["tool_use"]
    # The result goes back as Anthropic's tool_result block; the reply is prose.
    follow = [*ask, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": "Sunny, 21 degrees."}]}]
    answer = client.messages.create(model=QWEN, max_tokens=60, messages=follow, tools=[tool], extra_body=GREEDY)
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_anthropic_sdk_count_tokens_and_errors(gw: GatewayProc) -> None:
    import anthropic

    client = anthropic_client(gw)
    short = client.messages.count_tokens(model=SMOL, messages=[{"role": "user", "content": "Hello"}])
    longer = client.messages.count_tokens(model=SMOL, messages=[{"role": "user", "content": "Hello " * 50}])
    assert 0 < short.input_tokens < longer.input_tokens
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as over:
        client.messages.create(model=SMOL, max_tokens=5, messages=[{"role": "user", "content": long_prompt()}])
    assert over.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "context" in str(over.value)


def test_langchain_chat_anthropic(gw: GatewayProc) -> None:
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(model=SMOL, base_url=gw.url, api_key="unused", temperature=0, max_tokens=20,  # type: ignore[call-arg,arg-type]
                        model_kwargs={"extra_body": NO_CACHE})
    whole = llm.invoke("Name a fruit.")
    streamed = "".join(c.text for c in llm.stream("Name a fruit."))
    assert whole.text and streamed == whole.text
    tool_llm = ChatAnthropic(model=QWEN, base_url=gw.url, api_key="unused", temperature=0, max_tokens=200)  # type: ignore[call-arg,arg-type]
    msg = tool_llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke("Weather in Oslo?")
    assert [tc["name"] for tc in msg.tool_calls] == ["get_weather"]


# --- Ollama ----------------------------------------------------------------------------------------------------


def ollama_client(gw: GatewayProc) -> Any:
    import ollama

    return closed_after_test(ollama.Client(host=gw.url))


def test_ollama_client_chat_stream_and_whole_agree(gw: GatewayProc) -> None:
    """Ollama's options have no ``cache_prompt``, so the reply is constrained to one value (a schema with a
    ``const``): the streamed pieces must make the same JSON as the whole reply, whatever the prompt cache did."""
    client = ollama_client(gw)
    messages = [{"role": "user", "content": "Name a colour."}]
    options = {"temperature": 0, "num_predict": 24}
    whole = client.chat(model=SMOL, messages=messages, options=options, stream=False, format=ONE_COLOUR)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.content
    assert whole.eval_count and whole.prompt_eval_count
    parts = list(client.chat(model=SMOL, messages=messages, options=options, stream=True, format=ONE_COLOUR))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert json.loads("".join(p.message.content or "" for p in parts)) == json.loads(whole.message.content) == \
        {"colour": "red"}
    gen = client.generate(model=SMOL, prompt="Name three colours.", options=options, stream=False)
    assert gen.done and gen.response


def test_ollama_client_listing_show_ps_version(gw: GatewayProc) -> None:
    client = ollama_client(gw)
    names = {m.model for m in client.list().models}
    assert {SMOL, QWEN, MINILM} <= names
    shown = client.show(SMOL)
    assert shown.details.format == "gguf" and shown.details.family == "llama"
    assert "completion" in (shown.capabilities or [])
    client.chat(model=SMOL, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert SMOL in {m.model for m in client.ps().models}
    assert httpx.get(f"{gw.url}/api/version").json()["version"]


def test_ollama_client_num_ctx_keep_alive_and_errors(gw: GatewayProc) -> None:
    import ollama

    client = ollama_client(gw)
    reply = client.chat(model=SMOL, messages=[{"role": "user", "content": "hi"}],
                        options={"num_ctx": 1024, "num_predict": 4}, keep_alive=0)
    assert reply.done
    # keep_alive 0: the server it started for that context stops at once (no other process holds it)
    wait_until(lambda: not [p for p in gw.servers() if "1024" in p.cmdline()], REACT)
    with pytest.raises(ollama.ResponseError) as nf:
        client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert nf.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as over:
        client.chat(model=SMOL, messages=[{"role": "user", "content": long_prompt()}])
    assert over.value.status_code == 400 and "context" in over.value.error


def test_ollama_embed_and_old_embeddings(gw: GatewayProc) -> None:
    client = ollama_client(gw)
    out = client.embed(model=MINILM, input=["a cat", "a dog"])
    assert [len(v) for v in out.embeddings] == [384, 384]
    old = client.embeddings(model=MINILM, prompt="a cat")
    assert list(old.embedding) == pytest.approx(out.embeddings[0], abs=1e-5)


def test_ollama_tool_call_and_structured_output(gw: GatewayProc) -> None:
    """A JSON schema holds the reply to a get_weather call written as JSON; healing makes it Ollama's tool call."""
    client = ollama_client(gw)
    reply = client.chat(model=QWEN, messages=[{"role": "user", "content": "What's the weather in Paris?"}],
                        tools=[WEATHER_TOOL], format=CALL_SCHEMA, options={"temperature": 0}, stream=False)
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments["city"], str)
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}},
              "required": ["colour"]}
    fmt = client.chat(model=QWEN, messages=[{"role": "user", "content": "A colour as JSON."}], format=schema,
                      options={"temperature": 0})
    assert isinstance(json.loads(fmt.message.content)["colour"], str)


def test_langchain_chat_ollama_and_embeddings(gw: GatewayProc) -> None:
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    def closing(model: T) -> T:  # ChatOllama and OllamaEmbeddings have no close(): their ollama client is closed
        closed_after_test(model._client)  # type: ignore[attr-defined]
        return model

    llm = closing(ChatOllama(model=SMOL, base_url=gw.url, temperature=0, num_predict=24, format=ONE_COLOUR))
    whole = llm.invoke("Name a colour.")  # constrained: see test_ollama_client_chat_stream_and_whole_agree
    streamed = "".join(str(c.content) for c in llm.stream("Name a colour."))
    assert json.loads(streamed) == json.loads(str(whole.content)) == {"colour": "red"}
    tools = closing(ChatOllama(model=QWEN, base_url=gw.url, temperature=0, format=CALL_SCHEMA))
    msg = tools.bind_tools([WEATHER_TOOL]).invoke("What's the weather in Paris?")
    assert [tc["name"] for tc in msg.tool_calls] == ["get_weather"]
    emb = closing(OllamaEmbeddings(model=MINILM, base_url=gw.url))
    assert len(emb.embed_query("hello")) == 384
    colour = {"title": "Colour", "type": "object", "required": ["colour"],
              "properties": {"colour": {"type": "string", "maxLength": 20}}}
    structured = closing(ChatOllama(model=QWEN, base_url=gw.url, temperature=0)).with_structured_output(colour)
    assert isinstance(structured.invoke("Give a colour.")["colour"], str)  # type: ignore[index]


def test_ollama_pull_of_a_cached_or_missing_repo(gw: GatewayProc) -> None:
    """Offline (the module's gateway runs with HF_HUB_OFFLINE=1), a pull says why in Ollama's error shape."""
    import ollama

    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client(gw).pull("someone/Nothing-GGUF:Q4_K_M")
    assert "offline" in refused.value.error.lower()


# --- the guard -------------------------------------------------------------------------------------------------


def test_dns_rebinding_origin_and_path_walks_are_refused(gw: GatewayProc) -> None:
    body = {"model": SMOL, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers={"Host": "attacker.example"})
    assert r.status_code == 403 and "Host" in r.json()["error"]["message"]
    r = httpx.post(f"{gw.url}/api/chat", json=body, headers={"Origin": "http://attacker.example"})
    assert r.status_code == 403 and "--allow-origin" in r.json()["error"]
    for name in ("../../../etc/passwd", "/etc/passwd", "/etc/hostname.gguf", "a/../../b", "..", "~/x.gguf"):
        r = httpx.post(f"{gw.url}/v1/messages", json={**body, "model": name, "max_tokens": 4})
        assert r.status_code == 404, (name, r.text)
        assert r.json()["error"]["type"] == "not_found_error"


def test_body_bound(gw: GatewayProc) -> None:
    big = b'{"model": "x", "messages": [], "pad": "' + b"a" * (65 * 2**20) + b'"}'
    r = httpx.post(f"{gw.url}/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_concurrent_streams_are_all_served(gw: GatewayProc) -> None:
    """32 streams at once on one model: every one completes, none errors."""
    import openai

    async def one(client: Any, i: int) -> str:
        stream = await client.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": f"Count to {i % 5 + 3}."}], max_tokens=16,
            temperature=0, stream=True)
        reasons = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
        assert len(reasons) == 1
        return reasons[0]

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=600) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    assert len(asyncio.run(main())) == 32


def test_requests_for_a_loading_model_wait_for_one_load(gw: GatewayProc) -> None:
    """Four first requests at once for a model no server holds: one server starts, and every request is answered.

    "No server holds it" is made so first (the module's other tests may have left one within its hold: unloaded
    with Ollama's keep_alive 0, and waited for); the starts are counted in the runtime's own log of them (the
    gateway runs with -v), not from processes or a command line (a server may stop after its hold)."""
    import ollama

    def qwen_servers() -> set[int]:
        return {p.pid for p in gw.servers() if any(QWEN in a for a in p.cmdline())}

    def starts() -> int:
        return sum(f"starting llama-server for {QWEN}.gguf" in line for line in list(gw.output))

    client = closed_after_test(ollama.Client(host=gw.url))
    client.chat(model=QWEN, messages=[], keep_alive=0)  # the gateway's lease on it given back, its server stopped
    wait_until(lambda: not qwen_servers(), REACT)
    before = starts()
    async def main() -> list[Any]:
        async with ollama.AsyncClient(host=gw.url) as aclient:
            return await asyncio.gather(*(aclient.chat(model=QWEN, messages=[{"role": "user", "content": "hi"}],
                                                       options={"num_ctx": 1536, "num_predict": 4}) for _ in range(4)))

    assert all(r.done for r in asyncio.run(main()))
    wait_until(lambda: starts() > before, REACT)  # the line went out before the server answered: the pipe's lag
    assert starts() - before == 1, gw.log()


def test_the_memory_budget_evicts_what_the_gateway_no_longer_uses(smollm2_path: Path) -> None:
    """One model at a time ($GGUF_PROVIDER_MAX_MODELS=1), servers kept 600 s once idle: a second model evicts the
    first, whether the gateway still held it (it gives back what no request uses) or had let it go."""
    import ollama

    env = {"GGUF_PROVIDER_MAX_MODELS": "1", "GGUF_PROVIDER_KEEP_ALIVE": "600"}
    with gateway(smollm2_path.parent, "--ctx", "1024", env=env) as g:
        client = closed_after_test(ollama.Client(host=g.url))

        def serving() -> list[str]:
            return [Path(p.cmdline()[p.cmdline().index("-m") + 1]).stem for p in g.servers()]

        assert client.chat(model=SMOL, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2}).done
        assert serving() == [SMOL]
        # held (its ten seconds after the last request): given back to make room
        assert client.chat(model=QWEN, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2}).done
        wait_until(lambda: serving() == [QWEN], REACT)
        # let go at once (keep_alive 0.1 s), then idle on its own: evicted by the budget
        client.chat(model=SMOL, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2},
                    keep_alive="100ms")
        wait_until(lambda: serving() == [SMOL], REACT)
        assert client.chat(model=QWEN, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2}).done
        wait_until(lambda: serving() == [QWEN], REACT)


def test_key_required_off_loopback_and_checked(tmp_path: Path, smollm2_path: Path) -> None:
    import subprocess
    import sys

    from tests.support.runtime import ROOT

    bare = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bare.returncode == 2 and "--api-key-file" in bare.stderr
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    key.chmod(0o644)
    loose = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "serve", "--port", "0", "--api-key-file",
                            str(key)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert loose.returncode == 2 and "chmod 600" in loose.stderr
    key.chmod(0o600)
    with gateway(smollm2_path.parent, "--api-key-file", str(key)) as g:
        assert "s3cret" not in " ".join(g.proc.args)  # type: ignore[arg-type]
        def get(path: str, **headers: str) -> int:  # the listing reads each model's header: not 5 s on a busy machine
            return httpx.get(f"{g.url}{path}", headers=headers, timeout=REACT).status_code

        assert get("/v1/models") == 401
        assert get("/v1/models", Authorization="Bearer wrong") == 401
        assert get("/v1/models", Authorization="Bearer s3cret-key") == 200
        assert get("/api/tags", **{"x-api-key": "s3cret-key"}) == 200


# --- what the adapters guarantee, through the gateway ------------------------------------------------------------

LOOP_GRAMMAR = 'root ::= line root\nline ::= [1-9] [0-9]? ". The moon is a terrestrial planet made of rock and metal.\\n"'


def test_the_loop_guard_stops_a_looping_reply(gw: GatewayProc) -> None:
    """A grammar with no way out but the guard, and no max_tokens (the default): the reply ends at the loop, long
    before the context does, with finish_reason "length" (OpenAI's word for a cut reply)."""
    reply = openai_client(gw).chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "List facts about the moon."}], temperature=0,
        extra_body={"grammar": LOOP_GRAMMAR})
    assert reply.choices[0].finish_reason == "length"
    # A stopped stream has no usage when the guard closed it before the server's last chunk; words <= tokens.
    assert reply.usage is None or reply.usage.completion_tokens < N_CTX // 2
    text = reply.choices[0].message.content or ""
    assert text and len(text.split()) < N_CTX // 2


def test_max_time_bounds_a_reply(gw: GatewayProc) -> None:
    reply = openai_client(gw).chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Count upwards from one."}], temperature=0,
        max_tokens=N_CTX - 100, extra_body={"ignore_eos": True, "max_time": 0.5})
    assert reply.choices[0].finish_reason == "length"
    # A reply closed by the timer has no usage (the server never finished it); words are at most tokens.
    assert reply.usage is None or reply.usage.completion_tokens < N_CTX - 100
    assert len((reply.choices[0].message.content or "").split()) < N_CTX - 100


def test_reasoning_apart_from_the_answer_in_each_protocol(smollm2_path: Path, llama_src: Path) -> None:
    """SmolLM2 with Qwen3.5's template (its generation prompt opens ``<think>``): the thinking comes apart from
    the answer as OpenAI's reasoning_content, Anthropic's thinking block and Ollama's thinking field."""
    template = llama_src / "models" / "templates" / "Qwen3.5-4B.jinja"
    with gateway(smollm2_path.parent, "--ctx", "1024", "--chat-template-file", str(template)) as g:
        ask = [{"role": "user", "content": "What is 2 + 2?"}]
        o = openai_client(g).chat.completions.create(model=SMOL, messages=ask, max_tokens=30, temperature=0)
        assert getattr(o.choices[0].message, "reasoning_content", None)
        a = anthropic_client(g).messages.create(model=SMOL, messages=ask, max_tokens=30, extra_body=GREEDY)
        assert a.content[0].type == "thinking" and a.content[0].thinking
        with anthropic_client(g).messages.stream(model=SMOL, messages=ask, max_tokens=30, extra_body=GREEDY) as s:
            kinds = [e.content_block.type for e in s if e.type == "content_block_start"]
        assert kinds[0] == "thinking"
        oll = ollama_client(g).chat(model=SMOL, messages=ask, options={"num_predict": 30, "temperature": 0})
        assert oll.message.thinking


def test_ollama_pull_streams_progress_then_serves_the_model(smollm2_path: Path, hub: Any) -> None:
    """`ollama pull` of a repo on the local Hugging Face endpoint: Ollama's progress lines (byte counts of the
    file), then success; the model is then listed and answers. A second pull of the cached model downloads nothing."""
    import ollama

    from tests.support.hf_repos import MAIN

    name = f"{MAIN}:Q8_0"
    with gateway(smollm2_path.parent, env={"HF_HUB_OFFLINE": "0"}) as g:
        client = closed_after_test(ollama.Client(host=g.url))
        parts = list(client.pull(name, stream=True))
        assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
        sized = [p for p in parts if p.total]
        assert sized and sized[-1].completed == sized[-1].total > 1_000_000
        assert name in {m.model for m in client.list().models}
        assert client.chat(model=name, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}).done
        assert len(hub.downloads_of(MAIN, "SmolLM2-135M-Instruct-Q8_0.gguf")) == 1
        again = list(client.pull(name, stream=True))
        assert again[-1].status == "success"
        assert len(hub.downloads_of(MAIN, "SmolLM2-135M-Instruct-Q8_0.gguf")) == 1
