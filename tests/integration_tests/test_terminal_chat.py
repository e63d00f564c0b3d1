"""`gguf-provider chat MODEL` driven in a real terminal (a pty, through pexpect): streamed replies, several lines of
input, the commands, Ctrl-C that stops a reply and keeps the chat, the thinking shown apart, nothing left running."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pexpect
import pytest

from tests.support.runtime import ROOT, RuntimeEnv, wait_until

pytestmark = pytest.mark.slow
STEP = 120  # seconds for one reply or command: a cold start and a short reply take seconds here


def spawn(rt: RuntimeEnv, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "gguf_provider.cli", "chat", str(rt.model), "--ctx", "1024", *args],
                          cwd=str(ROOT), encoding="utf-8", timeout=STEP, dimensions=(40, 200))
    child.expect("chatting with")
    child.expect_exact(">>> ")
    return child


def ask(child: pexpect.spawn, line: str) -> str:
    """What the chat printed for ``line`` until its next prompt."""
    child.sendline(line)
    child.expect_exact(">>> ")
    return str(child.before)


@pytest.mark.timeout(STEP * 12)
def test_a_chat_in_the_terminal(rt: RuntimeEnv, tmp_path: Path) -> None:
    child = spawn(rt)
    try:
        assert "temperature = 0" in ask(child, "/set temperature 0")
        first = ask(child, "Say hello.")
        assert first.split("\n", 1)[1].strip()  # a reply came after the echoed line
        # several lines between """ lines: one message
        child.sendline('"""')
        child.expect_exact("... ")
        child.sendline("Line one")
        child.expect_exact("... ")
        out = ask(child, 'line two."""')
        assert out.strip()
        assert "system prompt set" in ask(child, "/system You answer in one word.")
        saved = tmp_path / "chat.json"
        assert "saved 4 messages" in ask(child, f"/save {saved}")
        data = json.loads(saved.read_text())
        assert data["system"] == "You answer in one word."
        assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
        assert data["messages"][2]["content"] == "Line one\nline two."
        assert all(m["content"] for m in data["messages"])
        assert "conversation forgotten" in ask(child, "/reset")
        assert "loaded 4 messages" in ask(child, f"/load {saved}")
        assert "could not load" in ask(child, f"/load {tmp_path / 'missing.json'}")
        assert "unknown command" in ask(child, "/frobnicate")

        # Ctrl-C during a long reply stops it; the chat goes on, with the stopped reply in its history.
        ask(child, "/set ignore_eos true")
        ask(child, "/set max_tokens 900")
        child.sendline("Count from one to a thousand.")
        child.expect(r"Count from one to a thousand\.\r\n")
        child.expect(r"\S")  # the reply has begun
        child.sendintr()
        child.expect_exact("(stopped)")
        child.expect_exact(">>> ")
        ask(child, "/set ignore_eos false")
        ask(child, "/set max_tokens 20")
        assert ask(child, "And now?").split("\n", 1)[1].strip()
        assert "saved 8 messages" in ask(child, f"/save {saved}")  # the stopped reply was kept
        assert json.loads(saved.read_text())["messages"][5]["content"]

        # Ctrl-C at the prompt does not leave; /exit does.
        child.sendintr()
        child.expect_exact("Ctrl-D or /exit")
        child.expect_exact(">>> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    wait_until(lambda: rt.servers() == [], 30)  # keep_alive 0 here: its server stopped with it


@pytest.mark.timeout(STEP * 3)
def test_thinking_is_shown_apart_and_ctrl_d_leaves(rt: RuntimeEnv, llama_src: Path) -> None:
    """SmolLM2 with Qwen3.5's template (its generation prompt opens ``<think>``): the thinking is printed first,
    under "thinking:", then the answer."""
    template = llama_src / "models" / "templates" / "Qwen3.5-4B.jinja"
    child = spawn(rt, "--chat-template-file", str(template), "--system", "Be brief.")
    try:
        ask(child, "/set max_tokens 40")
        out = ask(child, "What is 2 + 2?")
        assert "thinking: " in out
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
