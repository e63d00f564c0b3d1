"""A streamed reply whose prompt takes long to read sends its head and keep-alives at once, in each protocol's own
shape, and the protocols' own clients read through them (issue 61: Claude Code, on Node's fetch, gave up on a
connection silent for 5 minutes and sent its whole ~18,800-token request again, from scratch, on another slot).

The gateway here waits :data:`WAIT` seconds for a stream's first event (the default is 10 s). Each prompt is new
(no cached prefix shortens it) and as long as :data:`WAITS` waits take to read at the prompt speed measured on this
server first (its own timings of a cold prompt), so every stream below starts with keep-alives on any machine, a
GPU's included. Nothing here is timed: the order of what arrives is the assertion.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.clients import closed_after_test
from tests.support.gateway import GatewayProc, gateway

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct.Q4_1"
QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"
N_CTX = 8192
WAIT = 0.01  # --stream-keepalive: the smallest the CLI takes
WAITS = 50  # a prompt's reading time, in waits: the head cannot come with the first event
TIMEOUT = 300  # a hang guard: a prompt here takes WAITS * WAIT = 0.5 s at the speed measured; 600x

_VOCAB = "river stone light window garden paper music engine forest market silver morning letter bridge".split()


def prompt(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return f"{seed}: " + " ".join(rng.choice(_VOCAB) for _ in range(words)) + "\nSay hello."


@pytest.fixture(scope="module")
def gw(smollm2_path: Path, qwen_path: Path) -> Iterator[GatewayProc]:
    with gateway(smollm2_path.parent, "--ctx", str(N_CTX), "--stream-keepalive", str(WAIT)) as g:
        yield g


@pytest.fixture(scope="module")
def words(gw: GatewayProc) -> int:
    """Words of a prompt that takes :data:`WAITS` waits to read here (a word is a token or more), at most half the
    context."""
    r = httpx.post(gw.url + "/v1/chat/completions", timeout=TIMEOUT, json={
        "model": SMOL, "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt(0, 300)}]})
    last = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")][-1]
    tps = float(last["timings"]["prompt_per_second"])
    n = int(tps * WAITS * WAIT) + 1
    assert n <= N_CTX // 2, f"{tps:.0f} prompt tokens/s: too fast to tell the head from the first token here"
    return n


def sse(gw: GatewayProc, path: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The stream's lines in order as (field, value): comments as ("", text)."""
    out: list[tuple[str, str]] = []
    with httpx.stream("POST", gw.url + path, json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                name, _, value = line.partition(":")
                out.append((name, value.strip()))
    return out


def test_anthropic_pings_before_the_first_token_and_the_sdk_reads_through(gw: GatewayProc, words: int) -> None:
    lines = sse(gw, "/v1/messages", {"model": SMOL, "max_tokens": 8, "stream": True,
                                     "messages": [{"role": "user", "content": prompt(1, words)}]})
    events = [v for k, v in lines if k == "event"]
    assert events[0] == "message_start", events
    # The first event after the pings: a content block, or the end when the model stopped at once (its text is
    # not this test's: a stop as the first token is a reply too).
    first_after = next(i for i, e in enumerate(events) if i > 0 and e != "ping")
    assert first_after > 1 and events[first_after] in ("content_block_start", "message_delta"), events
    assert events[-1] == "message_stop", events
    pings = [json.loads(v) for (k, v), (k0, v0) in zip(lines[1:], lines, strict=False)
             if k == "data" and k0 == "event" and v0 == "ping"]
    assert pings and all(p == {"type": "ping"} for p in pings), pings

    import anthropic

    client = closed_after_test(anthropic.Anthropic(base_url=gw.url, api_key="unused", timeout=TIMEOUT, max_retries=0))
    with client.messages.stream(model=SMOL, max_tokens=8,
                                messages=[{"role": "user", "content": prompt(2, words)}]) as stream:
        message = stream.get_final_message()
    assert message.stop_reason in ("max_tokens", "end_turn"), message
    assert message.usage.output_tokens >= 1


def test_openai_comments_before_the_first_chunk_and_the_sdk_reads_through(gw: GatewayProc, words: int) -> None:
    lines = sse(gw, "/v1/chat/completions", {"model": SMOL, "max_tokens": 8, "stream": True,
                                             "messages": [{"role": "user", "content": prompt(3, words)}]})
    first_data = next(i for i, (k, _) in enumerate(lines) if k == "data")
    assert first_data >= 1 and all(k == "" for k, _ in lines[:first_data]), lines[:first_data + 1]
    assert {v for _, v in lines[:first_data]} == {"keep-alive"}
    assert lines[-1] == ("data", "[DONE]")

    import openai

    client = closed_after_test(openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0))
    chunks = list(client.chat.completions.create(model=SMOL, max_tokens=8, stream=True,
                                                 messages=[{"role": "user", "content": prompt(4, words)}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_ollama_empty_pieces_before_the_first_token_and_the_client_reads_through(gw: GatewayProc,
                                                                                 words: int) -> None:
    pieces = []
    with httpx.stream("POST", gw.url + "/api/chat", timeout=TIMEOUT, json={
            "model": SMOL, "options": {"num_predict": 8},
            "messages": [{"role": "user", "content": prompt(5, words)}]}) as r:
        assert r.status_code == 200
        pieces = [json.loads(line) for line in r.iter_lines() if line]
    empty = 0
    while pieces[empty]["message"]["content"] == "" and not pieces[empty]["done"]:
        empty += 1
    assert empty >= 1, pieces[:3]
    assert all(p["message"] == {"role": "assistant", "content": ""} and p["model"] == SMOL for p in pieces[:empty])
    assert pieces[-1]["done"] is True

    import ollama

    client = closed_after_test(ollama.Client(host=gw.url, timeout=TIMEOUT))
    parts = list(client.chat(model=SMOL, stream=True, options={"num_predict": 8},
                             messages=[{"role": "user", "content": prompt(6, words)}]))
    assert parts[-1].done and parts[-1].eval_count >= 1


def unload(gw: GatewayProc) -> None:
    """Ollama's way to unload Qwen: nothing of it is loaded after this."""
    r = httpx.post(gw.url + "/api/generate", json={"model": QWEN, "keep_alive": 0}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text


def test_an_error_after_the_head_is_the_protocols_error_event(gw: GatewayProc) -> None:
    """Qwen, not loaded yet: its load (a process start and a model read, ~1 s measured here) outlasts the wait, so
    the head goes out first and the over-long prompt's error comes in the stream, as Anthropic's API sends an
    error that comes late."""
    unload(gw)
    lines = sse(gw, "/v1/messages", {"model": QWEN, "max_tokens": 8, "stream": True,
                                     "messages": [{"role": "user", "content": "word " * (2 * N_CTX)}]})
    events = [v for k, v in lines if k == "event"]
    assert events[0] == "message_start" and events[-1] == "error", events
    error = json.loads(lines[-1][1])
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert "context" in error["error"]["message"], error

    import anthropic

    client = closed_after_test(anthropic.Anthropic(base_url=gw.url, api_key="unused", timeout=TIMEOUT, max_retries=0))
    unload(gw)
    with pytest.raises(anthropic.APIStatusError) as raised:
        with client.messages.stream(model=QWEN, max_tokens=8,
                                    messages=[{"role": "user", "content": "word " * (2 * N_CTX)}]) as stream:
            stream.get_final_message()
    assert "context" in str(raised.value)
