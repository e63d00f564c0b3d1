"""P11/P12: ours against llama-cpp-python in process, what LangChain and LlamaIndex users install instead.

Pairs: ChatGGUF ÷ LangChain's ``ChatLlamaCpp`` and GGUF ÷ LlamaIndex's ``LlamaCPP``, the peers built from the very
sdist our llama-server is built from (scripts/bench_peers.py), each peer in a process of its own
(bench/peer_worker.py) with a deadline on every call. Same model file, llama.cpp threads (``cfg.peer_threads``),
context and greedy sampling; the end-of-generation tokens banned on both sides (ours ``ignore_eos``, theirs a
``logit_bias`` of -100 on every EOG id), so every stream is exactly ``max_tokens`` long. Decode tok/s is measured
by each client alike: chunks after the first ÷ the time from the first chunk to the last.

- P11: one stream at a time, rounds interleaved (order reversed every other round), on SmolLM2 and on
  Qwen2.5-Coder-1.5B; plus each side with its defaults as a user gets them (ours: speculation "auto"; theirs: its
  own defaults, n_ctx 512 for ChatLlamaCpp), only ``max_tokens`` set, on P7/P8's code-edit and chat tasks.
- P12: four requests at once on the 1.5B (``abatch``), aggregate tok/s. ChatLlamaCpp's ``abatch`` runs four
  threads on one ``Llama`` (not thread-safe): tried once under a deadline, and what a user must fall back to
  (``batch`` with ``max_concurrency=1``) is what ours is compared with. Our batching gain (four at once ÷ one
  stream) is reported on both models.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.config import BATCH, GOALS, ROOT, Config
from bench.log import log
from bench.rounds import adaptive, late
from bench.scenarios.speculative import (
    CHAT_TASK,
    CHAT_TOKENS,
    CHAT_TOPICS,
    EDIT_SOURCE,
    EDIT_TASK,
    EDIT_TOKENS,
)
from bench.stats import summary

P11_CTX = 2048
P11_TOKENS = 256
P12_TOKENS = 64  # each of the four requests: P5's 128 made P12 9 minutes of `make bench`
STREAM_TASK = "Write a long story about {topic}."
FRAMEWORKS = {"langchain": ("ChatGGUF", "ChatLlamaCpp"), "llamaindex": ("GGUF", "LlamaCPP")}


class PeerDied(RuntimeError):
    """The peer's process hung past its deadline or ended: it is gone (killed if it hung)."""


class Peer:
    """One peer worker process (bench/peer_worker.py), loaded with one model."""

    def __init__(self, kind: str, model: Path, settings: dict[str, Any] | None, deadline: float = 600.0) -> None:
        self.kind, self.model, self.settings = kind, model, settings
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
        # a session of its own: a killed worker's forked children (seen after a hung abatch) go with it
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "peer_worker.py")], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self.info = self.call({"op": "load", "kind": kind, "model": str(model), "settings": settings}, deadline)

    def call(self, cmd: dict[str, Any], deadline: float) -> dict[str, Any]:
        """The reply to ``cmd``; PeerDied if none came within ``deadline`` seconds (the process is then killed)."""
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise PeerDied(f"ended (exit {self.proc.poll()})") from exc
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(deadline):
                self.close()
                raise PeerDied(f"no answer in {deadline:.0f} s: killed")
        finally:
            sel.close()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(10)
            raise PeerDied(f"ended (exit {code}, signal {-code if code < 0 else 'none'})")
        reply: dict[str, Any] = json.loads(line)
        if not reply.pop("ok"):
            raise RuntimeError(f"{self.kind} peer: {reply['error']}\n{reply.get('trace', '')}")
        return reply

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and anything it forked
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ours(kind: str, model: Path, settings: dict[str, Any] | None, **fields: Any) -> Any:
    """Our adapter as a user makes it; ``settings`` as the peer's (threads, context), or None for our defaults."""
    kw: dict[str, Any] = {"model": str(model), "keep_alive": 0, **fields}  # no server outlives its scenario
    if settings is not None:
        n = str(settings["threads"])
        kw.update(n_ctx=settings["n_ctx"], server_args=["-t", n, "-tb", n], speculative=False)
    if kind == "langchain":
        from gguf_provider.langchain import ChatGGUF

        return ChatGGUF(**kw)
    from gguf_provider.llama_index import GGUF

    return GGUF(**kw)


def greedy_fields(max_tokens: int, kind: str) -> dict[str, Any]:
    extras = "model_kwargs" if kind == "langchain" else "additional_kwargs"
    return {"temperature": 0.0, "repeat_penalty": 1.0, "seed": 42, "max_tokens": max_tokens, "loop_guard": False,
            "max_time": None, extras: {"ignore_eos": True}}


def stream_ours(llm: Any, kind: str, content: str) -> dict[str, Any]:
    """The same figures the peer worker reports: time to the first and the last chunk, chunks, text."""
    text: list[str] = []
    t0 = time.perf_counter()
    first = last = 0.0
    n = tokens = 0
    if kind == "langchain":
        pieces = ((str(c.content), (c.usage_metadata or {}).get("output_tokens", 0)) for c in llm.stream(content))
    else:
        from llama_index.core.llms import ChatMessage

        pieces = ((r.delta or "", (r.additional_kwargs or {}).get("completion_tokens", 0))
                  for r in llm.stream_chat([ChatMessage(role="user", content=content)]))
    for piece, used in pieces:
        tokens = used or tokens
        if piece:
            last = time.perf_counter()
            first = first or last
            n += 1
            text.append(piece)
    # a speculating server may send several tokens in one chunk: count the tokens it reports
    return {"t_first": first - t0, "t_last": last - t0, "chunks": n, "tokens": tokens or n, "text": "".join(text)}


def decode_tok_s(r: dict[str, Any]) -> float:
    """Tokens after the first ÷ the time from the first chunk to the last (the peer sends a chunk per token)."""
    span = r["t_last"] - r["t_first"]
    return (r.get("tokens", r["chunks"]) - 1) / span if span > 0 else 0.0


def bench_single(cfg: Config, models: dict[str, Path]) -> dict[str, Any]:
    """P11's fixed comparison, per model: decode tok/s ours ÷ theirs, per framework."""
    out: dict[str, Any] = {"tokens": P11_TOKENS, "n_ctx": P11_CTX, "threads": cfg.peer_threads, "models": {}}
    for label, model in models.items():
        out["models"][label] = _single(cfg, label, model)
    return out


def _single(cfg: Config, label: str, model: Path) -> dict[str, Any]:
    settings = {"n_ctx": P11_CTX, "threads": cfg.peer_threads}
    peers = {k: Peer(k, model, settings) for k in FRAMEWORKS}
    mine: dict[str, Any] = {}
    try:
        ban = peers["langchain"].call({"op": "eos"}, 60)["ids"]
        mine.update({k: ours(k, model, settings, **greedy_fields(P11_TOKENS, k)) for k in FRAMEWORKS})
        res: dict[str, dict[str, list[dict[str, Any]]]] = {k: {"ours": [], "theirs": []} for k in FRAMEWORKS}
        stream_ours(mine["langchain"], "langchain", "Hi")  # the server starts here, not in round 1

        def step(r: int) -> None:
            content = STREAM_TASK.format(topic=CHAT_TOPICS[r % len(CHAT_TOPICS)])
            for k in FRAMEWORKS:
                for side in ["ours", "theirs"] if r % 2 == 0 else ["theirs", "ours"]:
                    if side == "ours":
                        res[k][side].append(stream_ours(mine[k], k, content))
                    else:
                        res[k][side].append(peers[k].call({"op": "stream", "content": content,
                                                           "max_tokens": P11_TOKENS, "ban": ban, "greedy": True},
                                                          600))
            log(f"P11 {label} round {r + 1}: " + ", ".join(
                f"{FRAMEWORKS[k][0]} {decode_tok_s(res[k]['ours'][-1]):.1f} vs {FRAMEWORKS[k][1]} "
                f"{decode_tok_s(res[k]['theirs'][-1]):.1f} tok/s" for k in FRAMEWORKS))

        def ratios(k: str) -> list[float]:
            return [decode_tok_s(o) / decode_tok_s(t) for o, t in zip(res[k]["ours"], res[k]["theirs"], strict=True)]

        def worst() -> list[float]:  # more rounds while either framework's verdict is within noise
            return [min(x) for x in zip(*(ratios(k) for k in FRAMEWORKS), strict=True)]

        # the 1.5B streams at ~9 tok/s on one thread: 2 rounds (+2 while within noise), ~2 min a round
        small = model.stat().st_size < 500e6
        rounds = min(cfg.rounds, 4) if small else 2
        adaptive(replace(cfg, rounds=rounds, max_rounds=min(cfg.max_rounds, 2 * rounds)), f"P11 {label}", step,
                 worst, GOALS["p11"])
        per_model: dict[str, Any] = {"file": model.name}
        for k, pair in FRAMEWORKS.items():
            o, t = res[k]["ours"], res[k]["theirs"]
            per_model[k] = {
                "pair": list(pair),
                "ratio": summary(ratios(k), GOALS["p11"]),
                "ours_tok_s": summary([decode_tok_s(a) for a in o]),
                "theirs_tok_s": summary([decode_tok_s(b) for b in t]),
                "ttft_ratio": summary([a["t_first"] / b["t_first"] for a, b in zip(o, t, strict=True)]),
                "chunks": [[a["chunks"] for a in o], [b["chunks"] for b in t]],
                "same_text": sum(a["text"] == b["text"] for a, b in zip(o, t, strict=True)),
                "peer": peers[k].info,
            }
        return per_model
    finally:
        for p in peers.values():
            p.close()
        for m in mine.values():
            m.unload()


def bench_defaults(cfg: Config, model: Path) -> dict[str, Any]:
    """P11's second part: each side with its defaults, only ``max_tokens`` set (P7/P8's), on P7/P8's tasks."""
    edit = EDIT_TASK.format(source=EDIT_SOURCE.read_text())
    tasks = {"code edit": (edit, EDIT_TOKENS), "chat": (CHAT_TASK, CHAT_TOKENS)}
    out: dict[str, Any] = {"model": model.name, "tasks": {}}
    peers = {k: Peer(k, model, None) for k in FRAMEWORKS}
    mine = {(k, n): ours(k, model, None, max_tokens=n) for k in FRAMEWORKS for n in (EDIT_TOKENS, CHAT_TOKENS)}
    try:
        out["peer"] = {k: p.info for k, p in peers.items()}
        for task, (content, n) in tasks.items():
            rec: dict[str, Any] = {}
            for k in FRAMEWORKS:
                o: list[dict[str, Any]] = []
                t: list[dict[str, Any]] = []
                error = None
                for r in range(max(2, cfg.rounds // 4)):
                    if r >= 1 and late(cfg, f"P11 defaults, {task}, {k}", r):
                        break
                    text = content.format(topic=CHAT_TOPICS[-1 - r]) if task == "chat" else content
                    for side in (["ours", "theirs"] if r % 2 == 0 else ["theirs", "ours"]):
                        if side == "ours":
                            o.append(stream_ours(mine[(k, n)], k, text))
                        elif error is None:
                            try:
                                t.append(peers[k].call({"op": "stream", "content": text, "max_tokens": n,
                                                        "ban": None, "greedy": False}, 900))
                            except RuntimeError as exc:  # e.g. the prompt does not fit the default context
                                error = str(exc).splitlines()[0][:300]
                rec[k] = {"pair": list(FRAMEWORKS[k]), "ours_tok_s": summary([decode_tok_s(a) for a in o]),
                          "ours_wall_s": summary([a["t_last"] for a in o])}
                if t:
                    rec[k].update(theirs_tok_s=summary([decode_tok_s(b) for b in t]),
                                  theirs_wall_s=summary([b["t_last"] for b in t]),
                                  ratio=summary([decode_tok_s(a) / decode_tok_s(b)  # theirs may stop early
                                                 for a, b in zip(o, t, strict=False)]))
                if error:
                    rec[k]["theirs_error"] = error
                log(f"P11 defaults, {task}, {k}: ours {rec[k]['ours_tok_s']['median']:.1f} tok/s, theirs "
                    + (f"{rec[k]['theirs_tok_s']['median']:.1f} tok/s" if t else f"failed: {error}"))
            out["tasks"][task] = rec
    finally:
        for p in peers.values():
            p.close()
        for m in mine.values():
            m.unload()
    return out


async def _abatch_ours(llm: Any, contents: list[str]) -> float:
    t0 = time.perf_counter()
    await llm.abatch(contents)
    return time.perf_counter() - t0


def bench_concurrent(cfg: Config, models: dict[str, Path], large: str) -> dict[str, Any]:
    """P12: four requests at once, aggregate tok/s, ours (``abatch``) ÷ theirs on ``models[large]``; our batching
    gain (four at once ÷ one stream, ``P12_TOKENS`` each) on every model."""
    out: dict[str, Any] = {"tokens": P12_TOKENS, "requests": BATCH, "gain": {}, "model": models[large].name}
    for label, model in models.items():
        one, four, theirs = _concurrent(cfg, label, model, out if label == large else None)
        out["gain"][label] = {"ratio": summary([f / o for f, o in zip(four, one, strict=True)]),
                              "one_tok_s": summary(one), "four_tok_s": summary(four)}
        if label == large:
            out["ratio"] = summary([f / t for f, t in zip(four, theirs, strict=True)], GOALS["p12"])
            out["theirs_tok_s"] = summary(theirs)
            out["ours_tok_s"] = summary(four)
    return out


def _concurrent(cfg: Config, label: str, model: Path, out: dict[str, Any] | None
                ) -> tuple[list[float], list[float], list[float]]:
    """Aggregate tok/s per round: ours one stream, ours four at once, and (``out`` given) theirs, whose concurrent
    call is tried once first (the outcome goes to ``out``)."""
    settings = {"n_ctx": P11_CTX, "threads": cfg.peer_threads}
    contents = [STREAM_TASK.format(topic=t) for t in CHAT_TOPICS[10:10 + BATCH]]
    cmd = {"op": "batch", "contents": contents, "max_tokens": P12_TOKENS, "concurrent": False}
    one: list[float] = []
    four: list[float] = []
    theirs: list[float] = []
    llm = ours("langchain", model, settings, **greedy_fields(P12_TOKENS, "langchain"))
    peer = Peer("langchain", model, settings) if out is not None else None
    try:
        llm.invoke("Hi")
        if peer is not None and out is not None:
            cmd["ban"] = peer.call({"op": "eos"}, 60)["ids"]
            seq = peer.call(cmd, 900)
            theirs.append(BATCH * P12_TOKENS / seq["wall"])
            deadline = seq["wall"] + 30  # four at once should not take longer than one after another
            try:
                conc = peer.call({**cmd, "concurrent": True}, deadline)
                out["theirs_abatch"] = {"outcome": "answered", "wall_s": conc["wall"], "lengths": conc["lengths"],
                                        "tok_s": BATCH * P12_TOKENS / conc["wall"]}
            except (PeerDied, RuntimeError) as exc:
                out["theirs_abatch"] = {"outcome": str(exc).splitlines()[0][:300], "deadline_s": deadline}
                peer.close()
                peer = Peer("langchain", model, settings)
            log(f"P12 ChatLlamaCpp abatch of {BATCH}: {out['theirs_abatch']['outcome']}")

        def step(r: int) -> None:
            t0 = time.perf_counter()
            llm.invoke(contents[r % BATCH])
            one.append(P12_TOKENS / (time.perf_counter() - t0))
            four.append(BATCH * P12_TOKENS / asyncio.run(_abatch_ours(llm, contents)))
            if peer is not None and r > 0:  # round 0's was measured above
                theirs.append(BATCH * P12_TOKENS / peer.call(cmd, 900)["wall"])
            log(f"P12 {label} round {r + 1}: ours one stream {one[-1]:.1f}, four at once {four[-1]:.1f} tok/s"
                + (f"; ChatLlamaCpp batch(max_concurrency=1) {theirs[-1]:.1f} tok/s" if peer else ""))

        rounds = 2  # + 2 while within noise: P12 on the 1.5B is ~3 minutes a round
        adaptive(replace(cfg, rounds=rounds, max_rounds=rounds + 2), f"P12 {label}", step,
                 lambda: [f / t for f, t in zip(four, theirs, strict=True)], GOALS["p12"] if peer else None)
    finally:
        if peer is not None:
            peer.close()
        llm.unload()
    return one, four, theirs


def rows(p11: dict[str, Any] | None, p12: dict[str, Any] | None) -> list[tuple[str, str, dict[str, Any], int, str]]:
    out: list[tuple[str, str, dict[str, Any], int, str]] = []
    if p11:
        for label, m in p11["models"].items():
            for k in FRAMEWORKS:
                a, b = m[k]["pair"]
                out.append((f"P11 decode tok/s, ours ÷ llama-cpp-python in process ({label})", f"{a} ÷ {b}",
                            m[k]["ratio"], 3, ""))
        for task, rec in p11.get("defaults", {}).get("tasks", {}).items():
            for k in FRAMEWORKS:
                if "ratio" in rec[k]:
                    a, b = rec[k]["pair"]
                    out.append((f"P11 {task} decode tok/s with each side's defaults "
                                f"({p11['defaults']['model']})", f"{a} ÷ {b}", rec[k]["ratio"], 3, ""))
    if p12:
        if "ratio" in p12:
            theirs = ("abatch" if p12.get("theirs_abatch", {}).get("outcome") == "answered"
                      else "batch(max_concurrency=1): its abatch fails")
            out.append((f"P12 {p12['requests']} requests at once, aggregate tok/s, ours ÷ theirs ({p12['model']})",
                        f"ChatGGUF abatch ÷ ChatLlamaCpp {theirs}", p12["ratio"], 2, ""))
        for label, g in p12["gain"].items():
            out.append((f"P12 our batching gain, {p12['requests']} at once ÷ one stream ({label})", "ChatGGUF",
                        g["ratio"], 2, ""))
    return out


def notes(p11: dict[str, Any] | None, p12: dict[str, Any] | None) -> list[str]:
    lines: list[str] = []
    if p11:
        for label, m in p11["models"].items():
            lines.append(f"P11 {label} ({m['file']}, {p11['tokens']} tokens, n_ctx {p11['n_ctx']}, "
                         f"{p11['threads']} thread(s) each, greedy, end tokens banned): " + "; ".join(
                             f"{m[k]['pair'][0]} {m[k]['ours_tok_s']['median']:.1f} vs {m[k]['pair'][1]} "
                             f"{m[k]['theirs_tok_s']['median']:.1f} tok/s, first chunk ours ÷ theirs "
                             f"{m[k]['ttft_ratio']['median']:.2f}, same text in {m[k]['same_text']} of "
                             f"{m[k]['ratio']['n']} rounds" for k in FRAMEWORKS) + ".")
        d = p11.get("defaults")
        if d:
            for task, rec in d["tasks"].items():
                lines.append(f"P11 defaults, {task} ({d['model']}): " + "; ".join(
                    f"{rec[k]['pair'][0]} {rec[k]['ours_tok_s']['median']:.1f} tok/s "
                    f"({rec[k]['ours_wall_s']['median']:.1f} s a request) vs {rec[k]['pair'][1]} "
                    + (f"{rec[k]['theirs_tok_s']['median']:.1f} tok/s ({rec[k]['theirs_wall_s']['median']:.1f} s)"
                       if "theirs_tok_s" in rec[k] else f"failed: {rec[k].get('theirs_error')}")
                    for k in FRAMEWORKS) + ".")
            lines.append("P11 peers' defaults: " + "; ".join(
                f"{FRAMEWORKS[k][1]} n_ctx {i['n_ctx']}, n_threads {i['n_threads']}, n_batch {i['n_batch']}"
                for k, i in d["peer"].items()) + ".")
    if p12:
        ab = p12.get("theirs_abatch", {})
        lines.append(f"P12 ({p12['model']}, {p12['requests']} × {p12['tokens']} tokens): ChatGGUF abatch "
                     f"{p12['ours_tok_s']['median']:.1f} tok/s in aggregate, ChatLlamaCpp batch(max_concurrency=1) "
                     f"{p12['theirs_tok_s']['median']:.1f}; ChatLlamaCpp abatch: {ab.get('outcome')}"
                     + (f" ({ab['tok_s']:.1f} tok/s)" if "tok_s" in ab else "") + ". Our gain, four at once ÷ one "
                     "stream: " + ", ".join(f"{label} {g['four_tok_s']['median']:.1f} ÷ {g['one_tok_s']['median']:.1f}"
                                            for label, g in p12["gain"].items()) + " tok/s.")
    return lines
