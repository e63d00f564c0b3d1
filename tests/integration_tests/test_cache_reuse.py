"""Cache reuse (``cache_reuse``, llama-server's ``--cache-reuse``) on real llama-servers and SmolLM2, through ChatGGUF.

An agent's history whose older messages were dropped (the prompt's start changed, the tail kept) is sent to two
servers that saw the whole history before: one started with nothing set (cache reuse on by default) and one with
``cache_reuse=0``. The server's own ``timings.prompt_n`` says how many prompt tokens it evaluated: with cache reuse
the kept messages come from the cache, shifted into place; without it they are processed again. The assertion is
structural (at least half of the kept messages' tokens reused), never a pinned count. bench P18 measures a whole
agent loop (bench/scenarios/cache_reuse.py).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from gguf_provider import ChatGGUF
from gguf_provider.runtime._serve.server_options import DEFAULT_CACHE_REUSE
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow

WORDS = "def return import class self value index buffer parser token stream module config error retry".split()
SYSTEM = ("You are a coding agent. Tools: read_file(path) returns a file's text; run_tests() runs pytest. Read "
          "before you edit, run the tests after each edit, keep every reply short and call one tool. ") * 5


def tool_result(turn: int) -> str:
    rnd = random.Random(turn)
    return "\n".join(f"{turn}:{i}: " + " ".join(rnd.choice(WORDS) for _ in range(10)) for i in range(24))


def history(turns: int = 3) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    msgs: list[Any] = [SystemMessage(SYSTEM), HumanMessage("The parser test fails: find out why and fix it.")]
    for turn in range(1, turns + 1):
        call = {"name": "read_file", "args": {"path": f"src/module_{turn}.py"}, "id": f"call_{turn}"}
        msgs += [AIMessage(f"I will read src/module_{turn}.py next.", tool_calls=[call]),
                 ToolMessage(tool_result(turn), tool_call_id=call["id"])]
    return msgs


def evaluated(llm: ChatGGUF, msgs: list[Any]) -> int:
    reply = llm.invoke(msgs, max_tokens=8)
    return int(reply.response_metadata["timings"]["prompt_n"])


def test_a_trimmed_history_reuses_the_kept_messages_by_default(rt: RuntimeEnv) -> None:
    common: dict[str, Any] = dict(model_path=str(rt.model), n_ctx=4096, temperature=0, seed=7)
    default, off = ChatGGUF(**common), ChatGGUF(**common, cache_reuse=0)
    assert default.cache_reuse == DEFAULT_CACHE_REUSE
    msgs = history()
    for llm in (default, off):
        evaluated(llm, msgs)  # the whole history is in each server's cache
    lines = {" ".join(p.cmdline()) for p in rt.servers()}
    assert len(lines) == 2 and sum(f"--cache-reuse {DEFAULT_CACHE_REUSE}" in line for line in lines) == 1, lines  # two servers

    trimmed = [msgs[0], *msgs[-4:]]  # the task and the first tool call dropped, the last two calls kept
    kept = default.get_num_tokens_from_messages(trimmed) - default.get_num_tokens_from_messages(trimmed[:1])
    with_reuse, without = evaluated(default, trimmed), evaluated(off, trimmed)
    print(f"kept messages: {kept} tokens; evaluated with cache reuse {with_reuse}, without {without}")
    assert without >= kept // 2  # without it the kept messages are processed again
    assert without - with_reuse >= kept // 2, (with_reuse, without, kept)  # at least half of them reused
