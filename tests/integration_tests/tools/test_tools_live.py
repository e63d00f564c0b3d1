"""The real coding tools (scripts/test_tools.py installs them, pinned) run once each, non-interactively, against the
gateway holding Qwen2.5-Coder-0.5B: Claude Code (`claude -p`, Anthropic Messages), opencode (`opencode run`,
OpenAI chat completions through @ai-sdk/openai-compatible) and aider (OpenAI chat completions through litellm).

Each run goes through a recording proxy (tests/support/tool_protocol.py), so every reply the tool got is checked as
its protocol says (a 2xx whose stream is the protocol's event sequence, or a well-formed error), besides the tool's
own account: it exited 0, its output parses and says it succeeded, and each tool call the model made was executed
(a result for each call). The model's skill is not tested: what it says or whether it calls a tool at all is its
own; the protocol is what must hold.

The tools' output is bounded as a user would bound it (Claude Code's CLAUDE_CODE_MAX_OUTPUT_TOKENS, opencode's
model ``limit.output``), so that a 0.5B model cannot keep a test going for 32,000 tokens; their prompts are whole.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from scripts.record_tool_requests import NOTES, aider_cmd, claude_env, write_opencode_config
from tests.integration_tests.tools.conftest import QWEN
from tests.support.gateway import GatewayProc
from tests.support.tool_protocol import RecordingProxy, Reply, check_exchange, need_tool

pytestmark = pytest.mark.slow

PROMPT = "Read notes.txt and tell me the launch code it contains. Answer with the number only."
EDIT = "Add a line 'Checked.' at the end of notes.txt."
MAX_OUTPUT = 512  # each tool's own bound on a reply's tokens
# Claude Code's built-in tools here: with all 24 its first prompt is ~18,800 tokens, read at 40-55 tokens/s on two
# cores (the make test run of this stop): Claude Code gave up on each request after ~5 min with no byte of the reply
# and sent it again, from scratch, so the run never ended. Its whole 24-tool request is replayed by
# test_tool_fixtures.py; here it runs with the tools the task needs (`--tools`, its own option).
CLAUDE_TOOLS = "Read,Edit"


def workspace(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh project dir at a fixed path (the tools put it in their prompts, before their tools: a path that
    changed each run would keep the prompt cache of the last run from being reused), and a private home."""
    import shutil

    work, home = Path(tempfile.gettempdir()) / f"gguf-provider-tool-{os.getuid()}" / "work", tmp_path / "home"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    home.mkdir()
    (work / "notes.txt").write_text(NOTES)
    return work, home


def tool_env(work: Path, home: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "PWD": str(work), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local/state")}
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        env.pop(var, None)
    return env


def run(cmd: list[str], work: Path, env: dict[str, str], timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - t0


def replies(proxy: RecordingProxy, path: str, gw: GatewayProc) -> list[Reply]:
    """Every chat reply the tool got, each checked as its protocol says; at least one, none cut short by the gateway.
    A reply the tool itself stopped reading (it closed the connection: :attr:`Exchange.left`) is not one it got; the
    tool's own exit status and output say whether it missed anything."""
    chats = [ex for ex in proxy.exchanges if ex.path == path]
    assert any(ex.complete for ex in chats), \
        f"the tool got no whole {path}: {[(e.method, e.path, e.complete, e.left) for e in proxy.exchanges]}"
    out = []
    for ex in proxy.exchanges:
        if ex.left:
            continue
        assert ex.complete, f"{ex.method} {ex.path}: the reply did not reach the tool whole\n{gw.log()}"
        reply = check_exchange(ex)
        if reply is not None:
            out.append(reply)
    return out


@pytest.mark.timeout(1900)
def test_claude_code(tools_gw: GatewayProc, tmp_path: Path) -> None:
    """`claude -p` with the tools of CLAUDE_TOOLS (why not all 24: there). Its system prompt, system message,
    thinking, effort and context management are as it sends them."""
    exe = need_tool("claude")
    work, home = workspace(tmp_path)
    with RecordingProxy(tools_gw.url) as proxy:
        # API_TIMEOUT_MS: its default, 600 s, is less than reading its prompt takes on two busy cores (it would retry)
        env = {**tool_env(work, home), **claude_env(proxy.url), "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT),
               "API_TIMEOUT_MS": str(1800 * 1000)}
        proc, took = run([str(exe), "-p", PROMPT, "--model", QWEN, "--output-format", "stream-json", "--verbose",
                          "--tools", CLAUDE_TOOLS], work, env, timeout=1800)
    print(f"claude -p: exit {proc.returncode} in {took:.1f}s, {len(proxy.exchanges)} requests")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{tools_gw.log()}"
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    result = events[-1]
    assert result["type"] == "result" and result["subtype"] == "success" and result["is_error"] is False, result
    got = replies(proxy, "/v1/messages", tools_gw)
    assert all(r.error is None for r in got), [r.error for r in got]
    usage = result["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"] > 1_000
    assert usage["output_tokens"] > 0, usage
    # each tool call the model made was run by Claude Code: a tool_result for each tool_use
    uses = [b["id"] for e in events if e["type"] == "assistant" for b in e["message"]["content"]
            if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for e in events if e["type"] == "user"
               for b in (e["message"]["content"] if isinstance(e["message"]["content"], list) else [])
               if b.get("type") == "tool_result"]
    assert sorted(uses) == sorted(results), (uses, results)
    assert uses == [b["id"] for r in got for b in r.blocks if b["type"] == "tool_use"]  # the gateway's, as sent
    print(f"  {len(uses)} tool call(s); result: {result.get('result', '')[:200]!r}")


@pytest.mark.timeout(1300)
def test_opencode(tools_gw: GatewayProc, tmp_path: Path) -> None:
    """`opencode run --format json` (a title request, then its agent with 10 tools, ~8,000 tokens). Measured on the
    2-core dev machine with another llama-server busy: 225 s (FIELD-NOTES §14: 2.4 min)."""
    exe = need_tool("opencode")
    work, home = workspace(tmp_path)
    with RecordingProxy(tools_gw.url) as proxy:
        write_opencode_config(work, proxy.url, output_limit=MAX_OUTPUT)
        env = {**tool_env(work, home), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1"}
        proc, took = run([str(exe), "run", "--format", "json", PROMPT], work, env, timeout=1200)
    print(f"opencode run: exit {proc.returncode} in {took:.1f}s, {len(proxy.exchanges)} requests")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{tools_gw.log()}"
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert not [e for e in events if e["type"] == "error"], events
    finishes = [e["part"] for e in events if e["type"] == "step_finish"]
    assert finishes and finishes[-1]["tokens"]["input"] > 0, finishes
    got = replies(proxy, "/v1/chat/completions", tools_gw)
    assert all(r.error is None for r in got), [r.error for r in got]
    # each tool call the model made was run by opencode (completed, or its own error, such as a bad argument)
    tools: list[dict[str, Any]] = [e["part"] for e in events if e["type"] == "tool_use"]
    assert all(t["state"]["status"] in ("completed", "error") for t in tools), tools
    calls = [c for r in got for c in r.blocks[0]["tool_calls"].values()]
    assert [t["callID"] for t in tools] == [c["id"] for c in calls], (tools, calls)
    print(f"  {len(tools)} tool call(s); text: {[e['part']['text'][:100] for e in events if e['type'] == 'text']}")


@pytest.mark.timeout(300)
def test_aider(tools_gw: GatewayProc, tmp_path: Path) -> None:
    """`aider --message` editing a file (its `whole` edit format). Measured on the 2-core dev machine with another
    llama-server busy: 28 s (FIELD-NOTES §14: 18 s)."""
    exe = need_tool("aider")
    work, home = workspace(tmp_path)
    with RecordingProxy(tools_gw.url) as proxy:
        env = {**tool_env(work, home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        proc, took = run(aider_cmd(str(exe), proxy.url, EDIT), work, env, timeout=240)
    print(f"aider: exit {proc.returncode} in {took:.1f}s, {len(proxy.exchanges)} requests")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{tools_gw.log()}"
    got = replies(proxy, "/v1/chat/completions", tools_gw)
    assert all(r.error is None for r in got), [r.error for r in got]
    out = proc.stdout
    if any(r.stop == "length" for r in got):
        # a reply ended at a bound (a 0.5B model's loop, which the gateway's loop guard ends as "length", seen in a
        # make test run here): aider's own account of that is its token-limit notice, not its usage line
        assert "has hit a token limit!" in out, out[-2000:]
    else:
        assert re.search(r"^Tokens: [\d.,k]+ sent, [\d.,k]+ received", out, re.M), out[-2000:]  # its own account
    assert "litellm." not in out + proc.stderr, out[-2000:]  # aider prints an API error and still exits 0
    # each edit the model's reply held was applied: the files aider says it wrote are there (the 0.5B model may
    # well name another file than notes.txt: its skill is not tested)
    edited = re.findall(r"^Applied edit to (.+)$", out, re.M)
    for name in edited:
        assert (work / name.strip()).is_file(), (name, out[-2000:])
    if "notes.txt" in [n.strip() for n in edited]:
        assert (work / "notes.txt").read_text() != NOTES
    print(f"  {out.strip().splitlines()[-1][:200]!r}")

