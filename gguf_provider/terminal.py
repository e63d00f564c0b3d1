"""``gguf-provider chat MODEL``: a chat in the terminal, as ``ollama run`` has one.

Replies stream as they come, the model's thinking shown apart (dimmed) before the answer; Ctrl-C stops a reply and
keeps the chat; input of several lines goes between two ``\"\"\"`` lines (or ends lines with ``\\``). The model runs
on the shared server, as every other client's does. Commands: :data:`HELP`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any, TextIO

from . import advice, chat
from .engine import Engine
from .errors import GGUFProviderError
from .events import Finish, ReasoningDelta, TextDelta

HELP = """\
/system TEXT     set the system prompt (the history is kept)
/set NAME VALUE  a sampling setting for the next replies: temperature 0.2, max_tokens 200, top_k 40, ...
/reset           forget the conversation (the system prompt stays)
/save FILE       write the conversation to FILE (JSON)
/load FILE       read a conversation written by /save
/exit            leave (also /bye, Ctrl-D)
\"\"\"              start or end a message of several lines; a line ending in \\ goes on on the next
Ctrl-C stops a reply and keeps the chat."""
PROMPT, MORE = ">>> ", "... "
DIM, RESET = "\033[2m", "\033[0m"


class Session:
    """One terminal chat: its history and settings, and how it reads and writes."""

    def __init__(self, engine: Engine, *, system: str | None = None, read: Callable[[str], str] = input,
                 out: TextIO = sys.stdout) -> None:
        self.engine = engine
        self.system = system
        self.messages: list[dict[str, Any]] = []
        self.params: dict[str, Any] = {}
        self.read = read
        self.out = out
        self.color = out.isatty()

    # -- the loop ---------------------------------------------------------------------------------------------

    def run(self) -> int:
        self.say(f"chatting with {self.engine.model_name} (context {self.engine.n_ctx}); /help for commands, "
                 "Ctrl-D or /exit to leave")
        while True:
            try:
                text = self.message()
            except EOFError:
                self.say("")
                return 0
            except KeyboardInterrupt:
                self.say("\n(use Ctrl-D or /exit to leave)")
                continue
            if text is None:
                continue
            if text.startswith("/"):
                if self.command(text) == "exit":
                    return 0
                continue
            self.reply(text)

    def message(self) -> str | None:
        """The next message (several lines between \"\"\" lines, or lines ending in \\); None for an empty one."""
        line = self.read(PROMPT)
        if line.strip() == '"""' or (line.startswith('"""') and not line.rstrip().endswith('"""')):
            lines = [line.strip()[3:]] if line.strip() != '"""' else []
            while True:
                more = self.read(MORE)
                if more.rstrip().endswith('"""'):
                    lines.append(more.rstrip()[:-3])
                    break
                lines.append(more)
            text = "\n".join(lines).strip("\n")
        else:
            lines = [line]
            while lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1]
                lines.append(self.read(MORE))
            text = "\n".join(lines)
        return text if text.strip() else None

    def reply(self, text: str) -> None:
        """Stream the model's reply to ``text``; Ctrl-C stops it (what came is kept in the history)."""
        self.messages.append({"role": "user", "content": text})
        sent = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        request = chat.ChatRequest(messages=sent, params=dict(self.params))
        answer: list[str] = []
        thinking = False
        reason = None
        try:
            with closing(chat.stream(self.engine, request)) as events:
                for ev in events:
                    if isinstance(ev, ReasoningDelta):
                        if not thinking:
                            thinking = True
                            self.write(self.dim("thinking: "))
                        self.write(self.dim(ev.text))
                    elif isinstance(ev, TextDelta):
                        if thinking:
                            thinking = False
                            self.write("\n\n")
                        answer.append(ev.text)
                        self.write(ev.text)
                    elif isinstance(ev, Finish):
                        reason = ev.reason
        except KeyboardInterrupt:
            self.write(self.dim(" (stopped)"))
            reason = "stopped"
        except GGUFProviderError as exc:
            self.messages.pop()
            self.say(f"\nerror: {advice.render(str(exc), 'cli')}")
            return
        if reason == "length":
            self.write(self.dim(" (cut: max_tokens, the context or max_time)"))
        elif reason == "repetition":
            self.write(self.dim(" (stopped: the reply became a loop)"))
        self.say("\n")
        self.messages.append({"role": "assistant", "content": "".join(answer)})

    # -- commands ---------------------------------------------------------------------------------------------

    def command(self, line: str) -> str | None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/bye", "/quit"):
            return "exit"
        if name in ("/help", "/?"):
            self.say(HELP)
        elif name == "/system":
            self.system = arg or None
            self.say("system prompt set" if arg else "system prompt cleared")
        elif name == "/reset":
            self.messages = []
            self.say("conversation forgotten")
        elif name == "/set":
            self.set(arg)
        elif name == "/save":
            self.save(arg)
        elif name == "/load":
            self.load(arg)
        else:
            self.say(f"unknown command {name}; /help lists them")
        return None

    def set(self, arg: str) -> None:
        key, _, value = arg.partition(" ")
        if not key or not value.strip():
            self.say("usage: /set NAME VALUE (e.g. /set temperature 0.2)")
            return
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value.strip()
        self.params[key] = parsed
        self.say(f"{key} = {parsed!r}")

    def save(self, arg: str) -> None:
        if not arg:
            self.say("usage: /save FILE")
            return
        path = Path(arg).expanduser()
        try:
            path.write_text(json.dumps({"system": self.system, "messages": self.messages}, indent=1,
                                       ensure_ascii=False))
        except OSError as exc:
            self.say(f"could not write {path}: {exc.strerror}")
            return
        self.say(f"saved {len(self.messages)} messages to {path}")

    def load(self, arg: str) -> None:
        if not arg:
            self.say("usage: /load FILE")
            return
        path = Path(arg).expanduser()
        try:
            data = json.loads(path.read_text())
            messages = data["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
                raise ValueError("no list of messages")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.say(f"could not load {path}: {getattr(exc, 'strerror', None) or exc} (a file written by /save)")
            return
        self.system, self.messages = data.get("system"), messages
        self.say(f"loaded {len(messages)} messages from {path}")

    # -- output -----------------------------------------------------------------------------------------------

    def dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.color else text

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def say(self, text: str) -> None:
        self.write(text + "\n")


def run(engine: Engine, *, system: str | None = None) -> int:
    """The chat on this terminal (readline's line editing and history where the platform has it)."""
    try:
        import readline  # noqa: F401  (input() then edits lines and recalls them with the arrow keys)
    except ImportError:
        pass
    return Session(engine, system=system).run()
