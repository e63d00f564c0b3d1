"""Record real llama-server answers for the offline unit tests (``tests/unit_tests/replays/*.json``).

Starts our llama-server build on SmolLM2-135M (chat, and ``--embedding``) and on Qwen2.5-Coder-0.5B (a template
with tools), sends the requests the adapters send, and stores each answer as the server gave it: status, content
type and body (an SSE stream verbatim). Re-run after a llama.cpp update: ``python scripts/capture_replays.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gguf_provider.engine import Engine, EngineConfig  # noqa: E402
from scripts.test_models import ensure  # noqa: E402

OUT = ROOT / "tests" / "unit_tests" / "replays"
USER = [{"role": "user", "content": "Say hi"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def record(engine: Engine, calls: list[tuple[str, str, dict[str, Any] | None]]) -> list[dict[str, Any]]:
    http = engine.client.http
    out = []
    for method, path, body in calls:
        r = http.request(method, path, json=body)
        out.append({"method": method, "path": path, "request": body, "status": r.status_code,
                    "content_type": r.headers.get("content-type", ""), "body": r.text})
    return out


def chat_calls(payload: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
    template = {k: payload[k] for k in ("messages", "tools") if k in payload}
    stream = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    return [("GET", "/health", None), ("GET", "/props", None), ("POST", "/apply-template", template),
            ("POST", "/v1/chat/completions", stream)]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    smol, qwen = str(ensure("smollm2")), str(ensure("qwen"))
    jobs: dict[str, tuple[EngineConfig, list[tuple[str, str, dict[str, Any] | None]]]] = {
        "smollm2_chat": (EngineConfig(model_path=smol, n_ctx=2048, keep_alive=0),
                         chat_calls({"messages": USER, "max_tokens": 12, "temperature": 0})),
        # SmolLM2 at temperature 0 falls into a loop ("36. The moon is a terrestrial planet ..." and on)
        "smollm2_loop": (EngineConfig(model_path=smol, n_ctx=2048, keep_alive=0),
                         chat_calls({"messages": [{"role": "user", "content": "List facts about the moon."}],
                                     "max_tokens": 700, "temperature": 0})),
        "qwen_tool_call": (EngineConfig(model_path=qwen, n_ctx=2048, keep_alive=0),
                           chat_calls({"messages": [{"role": "user", "content": "Weather in Rome?"}],
                                       "tools": [WEATHER], "tool_choice": "auto", "max_tokens": 48,
                                       "temperature": 0})),
        "smollm2_embeddings": (EngineConfig(model_path=smol, n_ctx=512, embedding=True, pooling="mean",
                                            keep_alive=0),
                               [("GET", "/health", None), ("GET", "/props", None),
                                ("POST", "/v1/embeddings", {"input": ["hello", "world"]})]),
    }
    for name, (config, calls) in jobs.items():
        engine = Engine(config)
        try:
            exchanges = record(engine, calls)
            # /tokenize of the templated prompt: what the engine counts when no max_tokens is given
            for ex in exchanges:
                if ex["path"] == "/apply-template":
                    prompt = json.loads(ex["body"])["prompt"]
                    exchanges += record(engine, [("POST", "/tokenize", {"content": prompt, "add_special": True,
                                                                         "parse_special": True})])
        finally:
            engine.unload()
        (OUT / f"{name}.json").write_text(json.dumps(exchanges, indent=1) + "\n")
        print(f"{name}: {len(exchanges)} exchanges")


if __name__ == "__main__":
    main()
