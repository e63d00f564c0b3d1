"""P13/P14 child: one LangChain chat model in a fresh process, ours (``ChatGGUF``) or theirs (``ChatLlamaCpp``).

``python bench/peer_start_child.py first SETTINGS_JSON``: construct, ``.load()``, stream once; print one JSON line of
timings from process start (``$BENCH_T0``, epoch seconds) to the first streamed token, and the split (interpreter
start, import, load: spawn, attach or model load, then the request to the first token). Ours' ``.load()`` is what the
first call does itself; it is called on its own only to split the time.

``python bench/peer_start_child.py hold SETTINGS_JSON``: construct and ``.invoke`` once, print one JSON line (pid,
context size), then wait for stdin to close (the parent measures the memory meanwhile).

SETTINGS_JSON: ``{"side": "ours"|"theirs", "model": path, "threads": n, "n_ctx": n|null, "n_batch": n|null,
"verbose": bool|null}``; a null is left to the client's own default.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

T0 = float(os.environ.get("BENCH_T0") or time.time())
PROMPT = "Say hi."


def make(s: dict[str, Any], max_tokens: int) -> tuple[Any, float]:
    """The chat model of ``s`` (its import timed): ChatGGUF as a user writes it, or ChatLlamaCpp."""
    common: dict[str, Any] = {"temperature": 0, "max_tokens": max_tokens, "seed": 42}
    if s.get("n_ctx") is not None:
        common["n_ctx"] = s["n_ctx"]
    n = str(s["threads"])
    if s["side"] == "ours":
        from gguf_provider.langchain import ChatGGUF

        t_import = time.time()
        common["server_args"] = ("-t", n, "-tb", n)
        return ChatGGUF(model=s["model"], **common), t_import
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain_community's sunset notice
    from langchain_community.chat_models import ChatLlamaCpp

    t_import = time.time()
    extra = {k: s[k] for k in ("n_batch", "verbose") if s.get(k) is not None}
    # The model loads (llama_cpp imported) in the constructor, as it does for a user.
    return ChatLlamaCpp(model_path=s["model"], n_threads=int(n), **common, **extra), t_import


def first(s: dict[str, Any]) -> None:
    t_start = time.time()
    llm, t_import = make(s, max_tokens=4)
    if s["side"] == "ours":
        llm.load()  # what the first .stream() does itself (spawn or attach); here on its own, to split the time
    t_load = time.time()
    t_first = 0.0
    for chunk in llm.stream(PROMPT):
        if chunk.content:
            t_first = time.time()
            break
    if not t_first:
        raise SystemExit("no token streamed")
    out = {"total": t_first - T0, "startup": t_start - T0, "import": t_import - t_start, "load": t_load - t_import,
           "request": t_first - t_load}
    if s["side"] == "ours":
        out["server_pid"] = llm.engine.info.pid
        llm.unload()
    print(json.dumps(out), flush=True)


def hold(s: dict[str, Any]) -> None:
    llm, _ = make(s, max_tokens=8)
    llm.invoke(PROMPT)
    if s["side"] == "ours":
        info: dict[str, Any] = {"server_pid": llm.engine.info.pid, "n_ctx": llm.engine.info.n_ctx}
    else:
        info = {"n_ctx": llm.client.n_ctx()}
    print(json.dumps({"pid": os.getpid(), **info}), flush=True)
    sys.stdin.read()  # until the parent closes it
    if s["side"] == "ours":
        llm.unload()


def main() -> None:
    mode, settings = sys.argv[1], json.loads(sys.argv[2])
    if mode == "first":
        first(settings)
    elif mode == "hold":
        hold(settings)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
