"""P18: cache reuse in an agent loop (``cache_reuse``, llama-server's ``--cache-reuse``): prompt tokens the server
evaluated per turn (its ``timings.prompt_n``) with cache reuse ÷ without, in a 10-turn loop whose history is
summarised before turn 5.

The loop goes through ChatGGUF, as an agent would: a system prompt (the agent's instructions and tools), the user's
task, then each turn the model's reply (generated, ``max_tokens`` fixed, ``ignore_eos``) becomes an assistant
message with a tool call whose result (a few hundred tokens) follows it. Before turn 5 the history is summarised the
way LangChain's SummarizationMiddleware does it: the system prompt stays, a user message "Here is a summary of the
conversation to date: ..." replaces the older messages, and the last :data:`KEEP` messages are kept. The summary is a
fixed text (a model would write it; its length, not its words, is what counts here). Each variant is a server of its
own and keeps its own history (its own replies); token counts do not depend on machine load.

Two more loops show where cache reuse does help: the same agent loop with the older messages dropped before turn 5
and nothing inserted (LangChain's ``trim_messages``), and a chat with short messages that keeps a window of its last
5 messages from turn 5 on (a memory buffer). llama-server reuses a cached run only where the new prompt goes on with
it right after the shared start: a summary inserted before the kept messages is new text there, and nothing after
it is reused (bench/NOTES.md).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.config import GOALS, N_CTX, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import summary

TURNS, SUMMARY_TURN, KEEP, WINDOW = 10, 5, 4, 5
REPLY_TOKENS, RESULT_WORDS = 24, 260  # ~430 SmolLM2 tokens a tool result with its template
WORDS = ("def return import class self value index buffer parser token stream module config error retry socket "
         "request client server cache slot prompt model layer batch queue worker thread lock file path line").split()
SYSTEM = (
    "You are a coding agent working in a Python repository. You can call these tools: read_file(path) returns a "
    "file's text; search(query) returns matching lines with their paths; run_tests(selection) runs pytest and "
    "returns its summary; edit_file(path, old, new) replaces text. Work step by step: read before you edit, run the "
    "tests after every edit, and stop when the tests pass. Keep every reply short: say what you will do next and "
    "call one tool. Never invent a file's content: read it. Prefer small edits that keep the existing style, and "
    "explain a failing test before you change code for it. ") * 2
TASK = "The test test_parser_handles_empty_lines fails. Find out why and fix it."
SUMMARY = ("Here is a summary of the conversation to date:\n\nThe user asked to fix the failing test "
           "test_parser_handles_empty_lines. The agent read src/parser.py and tests/test_parser.py, searched for "
           "the empty-line handling in the tokenizer, and found that blank lines reach the token stream as empty "
           "tokens, which the parser rejects. It ran the tests once (one failure, 41 passed) and is now reading the "
           "tokenizer's buffer handling to decide where to skip blank lines.")


def tool_result(turn: int, seed: int) -> str:
    rnd = random.Random(seed * 100 + turn)
    lines = []
    words = 0
    while words < RESULT_WORDS:
        n = rnd.randint(6, 12)
        lines.append(f"{turn}:{len(lines) + 1}: " + " ".join(rnd.choice(WORDS) for _ in range(n)))
        words += n
    return "\n".join(lines)


def agent_loop(llm: Any, seed: int, *, mode: str = "summary") -> list[int]:
    """``timings.prompt_n`` of each turn of one loop; ``mode`` "summary" (SummarizationMiddleware), "trim" (the
    older messages dropped) or "none" (the history only grows)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    msgs: list[Any] = [SystemMessage(SYSTEM), HumanMessage(TASK)]
    evaluated: list[int] = []
    for turn in range(1, TURNS + 1):
        if turn == SUMMARY_TURN and mode != "none":
            kept = msgs[-KEEP:]
            msgs = [msgs[0], *([HumanMessage(SUMMARY)] if mode == "summary" else []), *kept]
        reply = llm.invoke(msgs, max_tokens=REPLY_TOKENS, ignore_eos=True)
        evaluated.append(int(reply.response_metadata["timings"]["prompt_n"]))
        call = {"name": "read_file", "args": {"path": f"src/module_{turn}.py"}, "id": f"call_{seed}_{turn}"}
        msgs += [AIMessage(reply.content, tool_calls=[call]),
                 ToolMessage(tool_result(turn, seed), tool_call_id=call["id"])]
    return evaluated


def chat_window_loop(llm: Any, seed: int) -> list[int]:
    """``timings.prompt_n`` of each turn of a chat with short messages that keeps a window of its last
    :data:`WINDOW` messages (and the system prompt) from turn :data:`SUMMARY_TURN` on, as a memory buffer does."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    rnd = random.Random(seed)
    system = SystemMessage("You are a friendly assistant who answers briefly. " * 12)
    msgs: list[Any] = [system]
    evaluated: list[int] = []
    for turn in range(1, TURNS + 1):
        msgs.append(HumanMessage(f"Question {turn}: " + " ".join(rnd.choice(WORDS) for _ in range(25))))
        if turn >= SUMMARY_TURN:
            msgs = [system, *msgs[-WINDOW:]]
        reply = llm.invoke(msgs, max_tokens=REPLY_TOKENS, ignore_eos=True)
        evaluated.append(int(reply.response_metadata["timings"]["prompt_n"]))
        msgs.append(AIMessage(reply.content))
    return evaluated


def run_pair(model: Path, chunk: int, seed: int, *, mode: str = "summary") -> dict[str, list[int]]:
    """One loop on a server with cache reuse (``chunk``) and one on a server without (two servers: it is part of
    the identity); the prompt cache is off so that a server started later restores nothing."""
    from gguf_provider import ChatGGUF

    common: dict[str, Any] = dict(model_path=str(model), n_ctx=N_CTX, temperature=0, seed=42, keep_alive=0,
                                  prompt_cache=False)
    on = ChatGGUF(**common, cache_reuse=chunk)
    off = ChatGGUF(**common, cache_reuse=0)
    try:
        if mode == "window":
            return {"on": chat_window_loop(on, seed), "off": chat_window_loop(off, seed)}
        return {"on": agent_loop(on, seed, mode=mode), "off": agent_loop(off, seed, mode=mode)}
    finally:
        for llm in (on, off):
            llm.unload()


def after_change(res: dict[str, list[int]]) -> float:
    """Tokens evaluated from the turn of the summary (or trim) to the last, with cache reuse ÷ without."""
    i = SUMMARY_TURN - 1
    return sum(res["on"][i:]) / sum(res["off"][i:])


def at_change(res: dict[str, list[int]]) -> float:
    """Tokens evaluated in the turn of the summary (or trim), with cache reuse ÷ without."""
    i = SUMMARY_TURN - 1
    return res["on"][i] / res["off"][i]


MODES = {"summary": "agent loop summarised", "trim": "agent loop trimmed", "window": f"chat window of {WINDOW} messages"}


def bench_cache_reuse(cfg: Config, model: Path, chunk: int) -> dict[str, Any]:
    """P18 on ``model``: the summarised agent loop, the trimmed one and the chat window, two rounds each (each round
    its own tool results or questions; token counts, not times, so a few show that they hold)."""
    out: dict[str, Any] = {"model": model.name, "chunk": chunk, "turns": TURNS, "summary_turn": SUMMARY_TURN,
                           "keep": KEEP, "window_messages": WINDOW, "reply_tokens": REPLY_TOKENS}
    rounds = replace(cfg, rounds=min(cfg.rounds, 2), max_rounds=min(cfg.max_rounds, 2))
    for mode in MODES:
        loops: list[dict[str, list[int]]] = []

        def step(r: int, mode: str = mode, loops: list[dict[str, list[int]]] = loops) -> None:
            res = run_pair(model, chunk, seed=r, mode=mode)
            loops.append(res)
            log(f"P18 {mode} round {r}: prompt_n with cache reuse {res['on']}, without {res['off']}: turn "
                f"{SUMMARY_TURN} {at_change(res):.3f}, turns {SUMMARY_TURN}-{TURNS} {after_change(res):.3f}")

        adaptive(rounds, f"P18 {mode}", step, lambda: [], None, least=1)
        # The goal is the agent loops' (the issue's); the chat window's figure is in results.md and bench/NOTES.md.
        out[mode] = {"at_change": summary([at_change(x) for x in loops], GOALS["p18"] if mode != "window" else None),
                     "after_change": summary([after_change(x) for x in loops]),
                     "per_turn": [on / off for on, off in zip(loops[0]["on"], loops[0]["off"], strict=True)],
                     "loops": loops}
    return out
