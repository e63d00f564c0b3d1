"""A client process for the runtime tests: acquires a server through an Engine, prints one JSON line, waits.

Usage: ``python tests/support/runtime_child.py '<json config>'``. Config keys: ``model`` (path), ``n_ctx``,
``shared`` (default true), ``keep_alive`` (default 0), ``chat`` (default true: one real chat completion),
``wait_go`` (default false: read one line from stdin before acquiring, so racing children start together),
``stream`` (default false: after the load, stream a reply of up to 4096 tokens, EOS ignored, and print
``{"streaming": ...}`` once the first text arrives, so that a test can kill the child mid-request).

Prints ``{"client_pid", "server_pid", "key", "alias", "address", "answer"}`` (or ``{"error", "message"}`` and exits
1), then waits until stdin gets a line or is closed and exits normally (the lease is released at exit).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.events import TextDelta


def main(argv: list[str]) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # Child.wait's report of where a slow exit is stuck
    cfg = json.loads(argv[0])
    if cfg.get("wait_go"):
        print(json.dumps({"ready": os.getpid()}), flush=True)
        sys.stdin.readline()
    try:
        engine = Engine(EngineConfig(model_path=cfg["model"], n_ctx=cfg.get("n_ctx", 2048),
                                     shared=cfg.get("shared", True), keep_alive=cfg.get("keep_alive", 0),
                                     timeout=60))
        info = engine.load()
        answer = ""
        if cfg.get("chat", True):
            answer = engine.chat({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                                  "temperature": 0}).content
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 1
    print(json.dumps({"client_pid": os.getpid(), "server_pid": info.pid, "key": info.key, "alias": info.alias,
                      "address": info.address.describe(), "answer": answer}), flush=True)
    if cfg.get("stream"):
        payload = {"messages": [{"role": "user", "content": "Count from one to one thousand in words."}],
                   "max_tokens": 4096, "ignore_eos": True, "temperature": 0}
        said = False
        for event in engine.stream(payload, loop_guard=False):
            if isinstance(event, TextDelta) and not said:
                print(json.dumps({"streaming": event.text}), flush=True)
                said = True
        print(json.dumps({"streamed": True}), flush=True)
    sys.stdin.readline()
    engine.unload()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
