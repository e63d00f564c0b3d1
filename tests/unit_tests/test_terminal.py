"""The terminal chat's input and commands, offline (the replies, Ctrl-C and the pty: tests/integration_tests/
test_terminal_chat.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gguf_provider.terminal import Session


def session(lines: list[str]) -> tuple[Session, io.StringIO]:
    it = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    return Session(engine=None, read=read, out=out), out  # type: ignore[arg-type]  (no reply is asked for)


def test_several_lines_between_triple_quotes_or_after_backslashes() -> None:
    s, _ = session(['"""', "one", "two", '"""', '"""inline start', 'end"""', "a \\", "b", "   "])
    assert s.message() == "one\ntwo"
    assert s.message() == "inline start\nend"
    assert s.message() == "a \nb"
    assert s.message() is None  # blank: nothing sent


def test_commands(tmp_path: Path) -> None:
    s, out = session([])
    assert s.command("/set temperature 0.2") is None and s.params == {"temperature": 0.2}
    s.command("/set stop [\"END\"]")
    assert s.params["stop"] == ["END"]
    s.command("/set")
    assert "usage: /set NAME VALUE" in out.getvalue()
    s.command("/system Be brief.")
    assert s.system == "Be brief."
    s.messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = tmp_path / "c.json"
    s.command(f"/save {path}")
    assert json.loads(path.read_text()) == {"system": "Be brief.", "messages": s.messages}
    s.command("/reset")
    assert s.messages == [] and s.system == "Be brief."
    s.command("/system")
    assert s.system is None
    s.command(f"/load {path}")
    assert s.system == "Be brief." and len(s.messages) == 2
    path.write_text("[1, 2]")
    s.command(f"/load {path}")
    assert "could not load" in out.getvalue() and len(s.messages) == 2  # kept
    s.command("/nope")
    assert "unknown command /nope" in out.getvalue()
    assert s.command("/exit") == "exit" and s.command("/bye") == "exit"
    s.command("/help")
    assert "/system TEXT" in out.getvalue()


def test_run_leaves_on_ctrl_d_and_stays_on_ctrl_c() -> None:
    class Engine:
        model_name, n_ctx = "m", 1024

    calls: list[str] = []
    script: list[Callable[[], str]] = [lambda: (_ for _ in ()).throw(KeyboardInterrupt()), lambda: "/help"]

    def read(prompt: str) -> str:
        calls.append(prompt)
        if not script:
            raise EOFError
        return script.pop(0)()

    out = io.StringIO()
    s: Any = Session(Engine(), read=read, out=out)  # type: ignore[arg-type]
    assert s.run() == 0
    assert "Ctrl-D or /exit" in out.getvalue() and "/reset" in out.getvalue() and len(calls) == 3
