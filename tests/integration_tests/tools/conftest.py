"""A gateway for the tests with real coding tools, one for each module (the recorded requests, test_tool_fixtures.py;
the tools themselves, test_tools_live.py; Codex through launch, test_codex_live.py), each holding Qwen2.5-Coder-0.5B in one llama-server, so that a prompt
read once stays in its cache for the module's later requests. Each stops at the end of its module, which saves its
server's idle slots into the kept home's prompt cache (runtime/_serve/prompt_cache.py): one gateway for both
modules let the live tools' requests take over the slot of Claude Code's 24-tool prompt before the stop, and only
the last, short prompts were saved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProc, gateway

QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"
N_CTX = 32768  # Claude Code's request alone is ~18,600 tokens with Qwen2.5's template


def kept_home() -> Path:
    """The tools' gateway's home, kept under the user cache dir between runs (as the builds and models are): its
    prompt cache holds the long prompts these tests read (Claude Code's ~18,600 tokens take minutes on 2 cores), so a
    warm run finds them on disk and reads only what changed."""
    import platformdirs

    home = Path(platformdirs.user_cache_dir("gguf-provider")) / "test-fixtures" / "tools-gateway-home"
    home.mkdir(parents=True, exist_ok=True)
    return home


@pytest.fixture(scope="module")
def tools_gw(qwen_path: Path) -> Iterator[GatewayProc]:
    """The module's gateway; at its end, it must have started one llama-server in all (its -v log says each start):
    a second means a prompt read again from scratch, and the first one lost to its runtime (a running server once
    taken for gone: runtime/_common/process.py, CREATE_TIME_SLACK)."""
    # --keep-alive: the server stays loaded between the tests (the support module's default, 0, would stop it
    # after each reply and the next test would read its prompt again). --cache-ram 0: with llama-server's host-RAM
    # prompt cache on, a task that starts moves the other idle slots' prompts into that cache (seen with this
    # build: a slot's save then holds 0 tokens), so the stop's save found only the slots used last; without it each
    # slot keeps its prompt (the unified KV cache holds all of this module's) and the stop saves them all.
    with gateway(qwen_path.parent, "-v", "--ctx", str(N_CTX), "--keep-alive", "1800", "--server-arg=--cache-ram",
                 "--server-arg=0", env={"GGUF_PROVIDER_HOME": str(kept_home())}) as g:
        yield g
    output = list(g.output)  # after the stop (its saves included)
    for line in output:  # in the run's log (pytest -s): what was restored and saved, for the next run's speed
        if "prompt cache:" in line:
            print(line.rstrip())
    starts = [line for line in output if "starting llama-server for" in line]
    assert len(starts) == 1, f"{len(starts)} llama-server starts for one model: {''.join(output[-60:])}"

