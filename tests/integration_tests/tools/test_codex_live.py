"""Codex (pinned) run through `gguf-provider launch`, against the tools' gateway of its own module: a module of its
own, so that its request is its server's first and the prompt cache restores its ~8,600-token prompt (a server looks
for a saved prompt on its first 8 requests only: after the other tools' requests in test_tools_live.py it was read
cold, 140 s in a make test run here). Checked as test_tools_live.py checks the other tools."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration_tests.tools.conftest import QWEN
from tests.integration_tests.tools.test_tools_live import PROMPT, replies, run, tool_env, workspace
from tests.support.gateway import GatewayProc
from tests.support.tool_protocol import RecordingProxy, need_tool

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_codex_through_launch(tools_gw: GatewayProc, tmp_path: Path) -> None:
    """`gguf-provider launch codex MODEL --url GATEWAY -- exec --json PROMPT`: Codex (pinned) set up by launch alone
    (its `-c` overrides and key; no config file of ours in its home), over the Responses API. Its prompt is ~8,600
    tokens: ~3 min cold on 2 cores, seconds once the kept home's prompt cache holds it."""
    import shutil
    import sys

    exe = need_tool("codex")
    work, _ = workspace(tmp_path)
    # its home at a fixed path too: Codex names it in its prompt (a home under tmp_path, new each run, left the next
    # run only the first 3,642 of its 8,619 tokens to restore from the prompt cache)
    home = work.parent / "codex-home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    with RecordingProxy(tools_gw.url) as proxy:
        env = {**tool_env(work, home), "PATH": f"{exe.parent}{os.pathsep}{os.environ['PATH']}"}
        env.pop("CODEX_HOME", None)
        proc, took = run([sys.executable, "-m", "gguf_provider.cli", "launch", "codex", QWEN, "--url", proxy.url,
                          "--", "exec", "--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only", "--color",
                          "never", "--json", PROMPT], work, env, timeout=840)
    print(f"launch codex exec: exit {proc.returncode} in {took:.1f}s, {len(proxy.exchanges)} requests")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{tools_gw.log()}"
    assert f"through the gateway at {proxy.url}" in proc.stderr, proc.stderr[-2000:]
    assert not (home / ".codex" / "config.toml").exists()  # this run's settings are on its command line only
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert events and events[-1]["type"] == "turn.completed", events
    assert not [e for e in events if e["type"] in ("error", "turn.failed")], events
    assert events[-1]["usage"]["input_tokens"] > 5_000, events[-1]  # its whole prompt reached the model
    got = replies(proxy, "/v1/responses", tools_gw)
    assert got and all(r.error is None for r in got), [r.error for r in got]
    # each function call the model made was answered by Codex: its output in the next request's input
    calls = [b["call_id"] for r in got for b in r.blocks if b.get("type") == "function_call"]
    sent = [ex.request for ex in proxy.exchanges if ex.path == "/v1/responses" and isinstance(ex.request, dict)]
    answered = {i.get("call_id") for body in sent for i in (body.get("input") if isinstance(body.get("input"), list)
                                                           else []) if i.get("type") == "function_call_output"}
    assert set(calls) <= answered, (calls, answered)
    print(f"  {len(calls)} tool call(s); {[e['item'].get('text', '')[:100] for e in events if e['type'] == 'item.completed']}")
