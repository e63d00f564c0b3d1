"""P22: a Responses API conversation as Codex holds one, three turns through the gateway (``/v1/responses``,
``store: true``): the first turn is Codex's first recorded request as it sent it (tests/fixtures/tools/codex/: its
instructions, 12 tools, ~8,600 prompt tokens with Qwen's template); each later turn sends only
``previous_response_id`` and what is new (an output for each function call the model made, as Codex sends it, and a
user message), so the gateway rebuilds the conversation from its store. The figure: the third turn's prompt tokens
evaluated ÷ its prompt tokens (goal <= 0.1: the stored conversation is rendered as it was, so llama-server reads its
prefix from the prompt cache, not again). Qwen2.5-Coder-0.5B, ``--ctx`` :data:`N_CTX`, replies of
:data:`MAX_TOKENS` tokens, temperature 0, not streamed (the figure is the server's, not the stream's).

Tokens evaluated come from llama-server's own log (the ``prompt eval time`` line of each task, P21's
:class:`~bench.scenarios.claude_replay.PromptLog`); the prompt's tokens from the reply's ``usage.input_tokens``. Each
round is a new conversation from the same first request: its first turn is read from the cache after round 1; the
first round's cold read is reported.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench import machine
from bench.config import GOALS, ROOT, Config
from bench.log import log
from bench.rounds import adaptive
from bench.scenarios.claude_replay import PromptLog, _log_of
from bench.scenarios.gateway import _behind, start_gateway, stop_gateway
from bench.stats import summary

FIXTURE = ROOT / "tests" / "fixtures" / "tools" / "codex" / "01-post-v1-responses.json"
MAX_TOKENS = 16
N_CTX = 32768
KEEP_ALIVE = 3600  # s
READ_TIMEOUT = 3600  # s: the cold read of the first request at one thread
TURNS = ("What is in notes.txt? Say it in one line.", "Thanks. And how many lines does it have?")


def first_body(model: str) -> dict[str, Any]:
    req = json.loads(FIXTURE.read_text())
    if req.get("path") != "/v1/responses" or not isinstance(req.get("body"), dict):
        raise RuntimeError(f"P22: {FIXTURE} is not a POST /v1/responses")
    return {**req["body"], "model": model, "stream": False, "store": True, "max_output_tokens": MAX_TOKENS,
            "temperature": 0}


def next_body(first: dict[str, Any], previous: dict[str, Any], text: str) -> dict[str, Any]:
    """The next turn as Codex sends one: the previous response's id, an output for each of its function calls, a
    user message; the same instructions, tools and settings."""
    outputs = [{"type": "function_call_output", "call_id": item["call_id"], "output": "(no output)"}
               for item in previous["output"] if item.get("type") == "function_call"]
    return {**{k: v for k, v in first.items() if k != "input"}, "previous_response_id": previous["id"],
            "input": [*outputs, {"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": text}]}]}


def turn(gw: httpx.Client, body: dict[str, Any], plog: PromptLog) -> tuple[dict[str, Any], int, float]:
    """One turn: the response, the prompt tokens llama-server evaluated for it, and its prompt time (s)."""
    plog.mark()
    r = gw.post("/v1/responses", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"P22: {r.status_code}: {r.text[:1000]}")
    response = r.json()
    if response.get("status") not in ("completed", "incomplete"):
        raise RuntimeError(f"P22: a response {response.get('status')}: {response.get('error')}")
    prompt, evaluated = plog.read()
    return response, evaluated, prompt


def bench_responses_replay(cfg: Config, model: Path) -> dict[str, Any]:
    proc, url, said = start_gateway(cfg, model, N_CTX, KEEP_ALIVE, "P22")
    gw = httpx.Client(base_url=url, timeout=READ_TIMEOUT)
    try:
        gw.post("/v1/responses", json={"model": model.stem, "input": "Hi", "max_output_tokens": 1,
                                       "store": False}).raise_for_status()  # loads the model
        server = _behind(url)
        plog = PromptLog(Path(_log_of(server["pid"])))
        pinning = machine.pin(server["pid"])
        first = first_body(model.stem)
        ratio: list[float] = []
        evaluated: list[list[int]] = []
        prompts: list[list[int]] = []
        cold: dict[str, float] = {}

        def step(r: int) -> None:
            t0 = time.perf_counter()
            response, n, prompt_s = turn(gw, first, plog)
            if r == 0:
                cold.update(prompt_s=prompt_s, evaluated=n, tokens=response["usage"]["input_tokens"],
                            wall_s=time.perf_counter() - t0)
            counts, sizes = [n], [int(response["usage"]["input_tokens"])]
            for text in TURNS:
                response, n, _ = turn(gw, next_body(first, response, text), plog)
                counts.append(n)
                sizes.append(int(response["usage"]["input_tokens"]))
            evaluated.append(counts)
            prompts.append(sizes)
            ratio.append(counts[-1] / sizes[-1])
            log(f"P22 round {r + 1}: turns of {sizes} prompt tokens, {counts} evaluated; the third's ratio "
                f"{ratio[-1]:.4f}")

        try:
            n = adaptive(cfg, "P22", step, lambda: ratio, GOALS["p22_prompt"])
        finally:
            machine.unpin(server["pid"])
        return {"model": model.name, "max_tokens": MAX_TOKENS, "n_ctx": N_CTX, "rounds": n, "pinning": pinning,
                "fixture": str(FIXTURE.relative_to(ROOT)), "cold": cold, "prompt_tokens": prompts,
                "evaluated": evaluated, "prompt_ratio": summary(ratio, GOALS["p22_prompt"])}
    except Exception:
        log("P22 failed; the gateway's last lines:\n" + "".join(said))
        raise
    finally:
        gw.close()
        stop_gateway(proc)
