"""How long an async call of gguf-provider blocks its event loop, measured in a fresh interpreter.

``python tests/support/loop_probe.py SCENARIO '{"model": ..., ...}'`` runs one async entry point (a cold start: the
test's home has no server) beside a ticker task that sleeps 10 ms at a time on the same loop, and prints one JSON
line: the longest gap between two ticks beyond their 10 ms (``stall``, seconds; ``blocked``: less the garbage
collections in it), the call's time, its error type, and what the scenario checked. The ``control`` scenario makes
the same cold start and call with the sync API in a worker thread: what this machine's load and the GIL alone do
to a loop that nothing blocks. A fresh interpreter, as a user's program is: the first call's imports count too
(what was imported before the loop ran, the adapters and their frameworks, does not).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

TICK = 0.010


class Collections:
    """When CPython's cyclic garbage collector ran: a collection stops every thread (a full one of a heap with
    LangChain and LlamaIndex imported takes ~150 ms on a 2-core machine), whichever thread's allocation triggered
    it. A user's program pays it with or without us, so a tick's lateness is also counted without it."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []
        self._open: float | None = None  # the start of the collection running now

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._open = time.monotonic()
        else:
            self.spans.append((self._open or 0.0, time.monotonic(), info["generation"]))
            self._open = None

    def within(self, start: float, end: float) -> float:
        """Seconds of collection between ``start`` and ``end``. A collection whose "stop" callback has not run yet
        counts until ``end``: the GIL may pass to the loop as soon as that callback's bytecode starts."""
        spans = [(a, b) for a, b, _ in self.spans] + ([(self._open, end)] if self._open is not None else [])
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


class Ticker:
    """A task that wakes every ``TICK`` and keeps the longest lateness; a thread beside it samples what the loop's
    thread was running while a tick is late (the first such stack of each stall is reported: what blocked)."""

    LATE = 0.100

    def __init__(self, collections: Collections) -> None:
        self.collections = collections
        self.stall = 0.0  # the longest lateness of a tick
        self.blocked = 0.0  # ... less the garbage collections in it: what blocked the loop besides the collector
        self.ticks = 0
        self.last = time.monotonic()
        self.stacks: list[str] = []
        self.stalls: list[tuple[float, float, list[tuple[float, float]]]] = []  # each lateness over LATE, and when it ended
        self.started = time.monotonic()
        self._thread = threading.get_ident()
        self._stop = threading.Event()

    async def run(self) -> None:
        threading.Thread(target=self._sample, daemon=True).start()
        try:
            while True:
                await asyncio.sleep(TICK)
                now = time.monotonic()
                late = now - self.last - TICK
                self.stall = max(self.stall, late)
                self.blocked = max(self.blocked, late - self.collections.within(self.last, now))
                if late > self.LATE:
                    self.stalls.append((round(late, 3), round(now - self.started, 3),
                                        [(round(a - self.started, 3), round(b - self.started, 3))
                                         for a, b, _ in self.collections.spans if b - a > 0.01]))
                self.ticks += 1
                self.last = now
        finally:
            self._stop.set()

    def _sample(self) -> None:
        reported = 0.0
        while not self._stop.wait(0.005):
            last = self.last
            if time.monotonic() - last > TICK + self.LATE and last != reported and len(self.stacks) < 5:
                frames = sys._current_frames()
                frame = frames.get(self._thread)
                if frame is not None:
                    reported = last
                    others = [f"--- thread {ident}:\n" + "".join(traceback.format_stack(f)[-6:])
                              for ident, f in frames.items() if ident not in (self._thread, threading.get_ident())]
                    self.stacks.append("".join(traceback.format_stack(frame)[-60:]) + "".join(others))


class Callbacks:
    """The longest single step the loop ran (a callback, or a task's step between two awaits): how long our code
    held the loop itself, whatever the OS and the GIL did around it. Times ``asyncio.Handle._run``, which every
    callback and task step goes through."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.where = ""
        self._run = asyncio.events.Handle._run

    def __enter__(self) -> Callbacks:
        run, me = self._run, self

        def timed(handle: asyncio.Handle) -> None:
            t0 = time.perf_counter()
            run(handle)
            took = time.perf_counter() - t0
            if took > me.longest:
                owner = getattr(getattr(handle, "_callback", None), "__self__", None)  # a task's step: name its coroutine
                coro = owner.get_coro() if isinstance(owner, asyncio.Task) else None
                me.longest, me.where = took, getattr(coro, "__qualname__", None) or repr(handle)[:300]

        asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._run  # type: ignore[method-assign]


async def measure(call: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    with Callbacks() as steps, Collections() as collections:
        out = await _measure(call, collections)
    out["longest_step"], out["longest_step_in"] = steps.longest, steps.where
    out["collections"] = [(round(b - a, 3), g) for a, b, g in collections.spans if b - a > 0.010]
    return out


async def _measure(call: Callable[[], Awaitable[Any]], collections: Collections) -> dict[str, Any]:
    ticker = Ticker(collections)
    task = asyncio.create_task(ticker.run())
    await asyncio.sleep(3 * TICK)  # the ticker runs before the call starts
    t0 = time.monotonic()
    out: dict[str, Any] = {"error": None}
    try:
        out["result"] = await call()
    except Exception as exc:  # the scenario may expect one: reported, judged by the test
        out["error"] = type(exc).__name__
        out["message"] = str(exc)[:2000]
    out["took"] = time.monotonic() - t0
    await asyncio.sleep(3 * TICK)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    out["stall"], out["blocked"], out["ticks"] = ticker.stall, ticker.blocked, ticker.ticks
    out["stalls"], out["stacks"] = ticker.stalls, ticker.stacks
    return out


def chat_model(cfg: dict[str, Any]) -> Any:
    from gguf_provider import ChatGGUF

    return ChatGGUF(model=cfg["model"], max_tokens=8, keep_alive=0, **cfg.get("options", {}))


async def scenario(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    model = cfg["model"]
    if name == "lc_ainvoke":
        llm = chat_model(cfg)
        return await measure(lambda: _text(llm.ainvoke("Say hi.")))
    if name == "lc_astream":
        llm = chat_model(cfg)

        async def stream() -> str:
            return "".join([str(c.content) async for c in llm.astream("Say hi.")])

        return await measure(stream)
    if name in ("li_achat", "li_astream_chat", "li_acomplete"):
        from llama_index.core.llms import ChatMessage

        from gguf_provider import GGUF

        li = GGUF(model=model, max_tokens=8, keep_alive=0)
        msgs = [ChatMessage(role="user", content="Say hi.")]

        async def li_call() -> str:
            if name == "li_achat":
                return str((await li.achat(msgs)).message.content)
            if name == "li_acomplete":
                return str((await li.acomplete("Say hi.")).text)
            return "".join([r.delta or "" async for r in await li.astream_chat(msgs)])

        return await measure(li_call)
    if name == "lc_aembed":
        from gguf_provider import GGUFEmbeddings

        emb = GGUFEmbeddings(model=model, keep_alive=0)
        return await measure(lambda: _len(emb.aembed_query("hello")))
    if name == "li_aembed":
        from gguf_provider import GGUFEmbedding

        li_emb = GGUFEmbedding(model=model, keep_alive=0)
        return await measure(lambda: _len(li_emb.aget_query_embedding("hello")))
    if name == "lc_arerank":
        from langchain_core.documents import Document

        from gguf_provider import GGUFRerank

        rr = GGUFRerank(model=model, keep_alive=0, top_n=1)
        docs = [Document(page_content="Pandas eat bamboo."), Document(page_content="Cats purr.")]
        return await measure(lambda: _len(rr.acompress_documents(docs, "What do pandas eat?")))
    if name == "li_arerank":
        from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

        from gguf_provider import GGUFRerankPostprocessor

        pp = GGUFRerankPostprocessor(model=model, keep_alive=0, top_n=1)
        nodes = [NodeWithScore(node=TextNode(text=t)) for t in ("Pandas eat bamboo.", "Cats purr.")]
        return await measure(lambda: _len(pp.apostprocess_nodes(nodes, QueryBundle("What do pandas eat?"))))
    if name == "cancel":
        return await cancelled_start(cfg)
    if name == "control":
        return await measure(lambda: asyncio.to_thread(sync_call, cfg))
    raise SystemExit(f"unknown scenario {name}")


def sync_call(cfg: dict[str, Any]) -> Any:
    """The same cold start and call, made with the sync API in a worker thread: a loop waiting on it is blocked by
    nothing but the machine and the GIL (the control of a scenario)."""
    from gguf_provider.engine import Engine, EngineConfig

    kind = cfg.get("kind", "chat")
    engine = Engine(EngineConfig(model=cfg["model"], keep_alive=0, embedding=kind == "embedding",
                                 rerank=kind == "rerank", **cfg.get("options", {})))
    try:
        if kind == "embedding":
            return len(engine.embed(["hello"])[0])
        if kind == "rerank":
            return len(engine.rerank("What do pandas eat?", ["Pandas eat bamboo.", "Cats purr."], top_n=1))
        return engine.chat({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}).content
    finally:
        engine.unload()


async def cancelled_start(cfg: dict[str, Any]) -> dict[str, Any]:
    """A cold ``ainvoke`` cancelled while its server loads: the cancellation waits for the start to be undone."""
    from gguf_provider.runtime._serve import registry

    llm = chat_model(cfg)
    seen: dict[str, Any] = {}

    async def call() -> None:
        task = asyncio.create_task(llm.ainvoke("Say hi."))
        while not seen:  # the server is spawned and registered: the load is under way
            entries = await asyncio.to_thread(registry.read)
            seen.update({k: e.pid for k, e in entries.items()})
            if task.done():
                raise AssertionError("the call ended before its server was seen starting")
            await asyncio.sleep(0.005)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            seen["cancelled"] = True

    out = await measure(call)
    entries = await asyncio.to_thread(registry.read)
    out["seen"] = seen
    out["registered_after"] = sorted(entries)
    return out


async def _text(aw: Awaitable[Any]) -> str:
    return str((await aw).content)


async def _len(aw: Awaitable[Any]) -> int:
    return len(await aw)


def main() -> None:
    name, cfg = sys.argv[1], json.loads(sys.argv[2])
    # The adapters and their frameworks are imported before the loop runs, as a program's imports are.
    import gguf_provider.langchain.chat_models
    import gguf_provider.llama_index.llms  # noqa: F401

    out = asyncio.run(scenario(name, cfg))
    print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
