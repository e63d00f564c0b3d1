"""One gateway for the tests with real coding tools: the recorded requests (test_tool_fixtures.py) and the tools
themselves (test_tools_live.py) go to the same gateway and the same llama-server holding Qwen2.5-Coder-0.5B, so a
prompt read once stays in its cache for what follows it (package scope: both modules, then it stops)."""

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


@pytest.fixture(scope="package")
def tools_gw(qwen_path: Path) -> Iterator[GatewayProc]:
    # --keep-alive: the server stays loaded between the tests (the support module's default, 0, would stop it
    # after each reply and the next test would read its prompt again).
    with gateway(qwen_path.parent, "--ctx", str(N_CTX), "--keep-alive", "1800",
                 env={"GGUF_PROVIDER_HOME": str(kept_home())}) as g:
        yield g

