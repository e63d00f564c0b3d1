"""A peer in a process of its own (P11, P12): LangChain's ``ChatLlamaCpp`` or LlamaIndex's ``LlamaCPP``, both
llama-cpp-python in process, driven by JSON lines on stdin, one JSON line back on stdout per command.

In a child so that its llama.cpp threads and memory are not the bench's, and so that a call that hangs or ends the
process (llama-cpp-python's ``abatch`` on one model, issue 34) is bounded by the parent's deadline.

Commands: ``{"op": "load", "kind": "langchain"|"llamaindex", "model": PATH, "settings": {...}}`` (``settings``:
``None`` for the peer's defaults as a user gets them, else ``n_ctx``, ``threads``);
``{"op": "stream", "content": TEXT, "max_tokens": N, "ban": [TOKEN IDS] | null, "greedy": bool}`` (time to the
first and the last chunk, chunk count, text); ``{"op": "batch", "contents": [...], "max_tokens": N, "ban": ...,
"concurrent": bool}`` (LangChain ``abatch`` of all at once, or ``batch(max_concurrency=1)``: wall and chunk
counts); ``{"op": "eos"}`` (the model's end-of-generation token ids).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
import warnings
from typing import Any

warnings.filterwarnings("ignore")  # langchain-community's sunset notice on stderr

state: dict[str, Any] = {}


def load(kind: str, model: str, settings: dict[str, Any] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    if kind == "langchain":
        from langchain_community.chat_models import ChatLlamaCpp

        kw: dict[str, Any] = {"model_path": model, "verbose": False}
        if settings is not None:
            kw.update(n_ctx=settings["n_ctx"], n_threads=settings["threads"], n_threads_batch=settings["threads"])
        if settings is not None and "n_threads_batch" not in ChatLlamaCpp.model_fields:
            kw.pop("n_threads_batch")
        state["llm"] = ChatLlamaCpp(**kw)
        client = state["llm"].client
    else:
        from llama_index.llms.llama_cpp import LlamaCPP

        mk: dict[str, Any] = {}
        li: dict[str, Any] = {"model_path": model, "verbose": False}
        if settings is not None:
            li["context_window"] = settings["n_ctx"]
            mk.update(n_threads=settings["threads"], n_threads_batch=settings["threads"])
        state["llm"] = LlamaCPP(model_kwargs=mk, **li)
        client = state["llm"]._model
    state["kind"] = kind
    state["client"] = client
    return {"load_s": time.perf_counter() - t0, "n_ctx": client.n_ctx(), "n_threads": client.context_params.n_threads,
            "n_batch": client.context_params.n_batch}


def eos() -> dict[str, Any]:
    """Every end-of-generation token id of the loaded model (llama.cpp's own test: ``llama_vocab_is_eog``)."""
    import llama_cpp

    client = state["client"]
    vocab = llama_cpp.llama_model_get_vocab(client.model)
    ids = [i for i in range(client.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    return {"ids": ids}


def _kwargs(max_tokens: int, ban: list[int] | None, greedy: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_tokens": max_tokens}
    if greedy:
        kw.update(temperature=0.0, repeat_penalty=1.0, seed=42)
    if ban:
        kw["logit_bias"] = {int(t): -100.0 for t in ban}
    return kw


def stream(content: str, max_tokens: int, ban: list[int] | None, greedy: bool) -> dict[str, Any]:
    llm, kw = state["llm"], _kwargs(max_tokens, ban, greedy)
    text: list[str] = []
    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
    if state["kind"] == "langchain":
        for chunk in llm.stream(content, **kw):
            if chunk.content:
                last = time.perf_counter()
                first = first or last
                n += 1
                text.append(str(chunk.content))
    else:
        from llama_index.core.llms import ChatMessage

        # LlamaCPP takes sampling settings from generate_kwargs (the constructor's), not per call
        llm.generate_kwargs.update({k: v for k, v in kw.items() if k != "max_tokens"}, max_tokens=max_tokens)
        for resp in llm.stream_chat([ChatMessage(role="user", content=content)]):
            if resp.delta:
                last = time.perf_counter()
                first = first or last
                n += 1
                text.append(resp.delta)
    return {"t_first": first - t0, "t_last": last - t0, "chunks": n, "text": "".join(text)}


def batch(contents: list[str], max_tokens: int, ban: list[int] | None, concurrent: bool) -> dict[str, Any]:
    llm, kw = state["llm"], _kwargs(max_tokens, ban, True)
    t0 = time.perf_counter()
    if concurrent:
        out = asyncio.run(llm.abatch(contents, **kw))
    else:
        out = llm.batch(contents, config={"max_concurrency": 1}, **kw)
    wall = time.perf_counter() - t0
    return {"wall": wall, "lengths": [len(str(m.content)) for m in out],
            "tokens": [int((m.response_metadata.get("token_usage") or {}).get("completion_tokens") or 0) for m in out]}


def die_with_parent() -> None:
    """Linux: killed when the bench process ends, even in a call that never returns (a hung ``abatch``)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere: the parent's deadline kills it; a closed stdin ends it


def main() -> None:
    die_with_parent()
    # the protocol gets the real stdout; anything else printing to fd 1 (llama.cpp's C code) lands on stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "quit":
            break
        try:
            result = {"load": load, "eos": eos, "stream": stream, "batch": batch}[op](**cmd)
            result["ok"] = True
        except Exception as exc:  # reported to the parent, which decides what a failure means
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
