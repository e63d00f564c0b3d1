"""llama-server answers recorded by ``scripts/capture_replays.py`` (tests/unit_tests/replays/*.json), replayed
through an ``httpx.MockTransport`` so the adapters run end to end with no binary and no model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPLAYS = Path(__file__).resolve().parents[1] / "unit_tests" / "replays"
BASE_URL = "http://replayed-llama-server:8080"


@dataclass
class Replay:
    """Answers each request with the recorded answer for its method and path; keeps what was sent."""

    exchanges: list[dict[str, Any]]
    sent: list[tuple[str, str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append((request.method, request.url.path, body))
        for ex in self.exchanges:
            if ex["method"] == request.method and ex["path"] == request.url.path:
                return httpx.Response(ex["status"], headers={"content-type": ex["content_type"]},
                                      content=ex["body"].encode())
        return httpx.Response(404, json={"error": {"message": f"nothing recorded for {request.url.path}"}})

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def bodies(self, path: str) -> list[Any]:
        return [body for _, p, body in self.sent if p == path]


def load_replay(name: str) -> Replay:
    return Replay(json.loads((REPLAYS / f"{name}.json").read_text()))


def with_reply(replay: Replay, text: str, *, finish: str = "stop", piece: int = 3,
               timings: dict[str, float] | None = None) -> Replay:
    """``replay`` whose chat answer streams ``text`` instead, ``piece`` characters a chunk (as tokens arrive),
    ending with ``finish`` (and llama-server's ``timings``): for replies a small model will not write (healing's
    corpus) or conditions it cannot be put in cheaply, in the recorded shape."""
    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        return "data: " + json.dumps({"choices": [{"finish_reason": reason, "index": 0, "delta": delta}],
                                      "object": "chat.completion.chunk", "model": "replayed"}) + "\n\n"

    pieces = [text[i:i + piece] for i in range(0, len(text), piece)]
    body = chunk({"role": "assistant", "content": None}) + "".join(chunk({"content": p}) for p in pieces)
    body += chunk({}, finish) + "data: " + json.dumps({
        "choices": [], "object": "chat.completion.chunk", "model": "replayed",
        "usage": {"completion_tokens": len(pieces), "prompt_tokens": 10, "total_tokens": 10 + len(pieces)},
        **({"timings": timings} if timings else {})})
    body += "\n\ndata: [DONE]\n\n"
    exchanges = [ex if ex["path"] != "/v1/chat/completions" else {**ex, "body": body} for ex in replay.exchanges]
    return Replay(exchanges)
