"""Everything the magics draw: the reply (:class:`GGUFReply`), the load summary, tables, the live output of a
streaming reply and the load progress, each as Markdown in a kernel and as plain text in terminal IPython."""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass, field
from typing import Any

_UPDATE_EVERY = 0.1  # seconds between live display updates


def _is_kernel(shell: Any) -> bool:
    """A Jupyter kernel (rich display updates), not terminal IPython (prints)."""
    return bool(getattr(shell, "kernel", None))


def call_text(call: dict[str, Any]) -> str:
    """A tool call as it is shown: ``get_weather({"city": "Paris"})``."""
    return f"{call['name']}({json.dumps(call['arguments'], ensure_ascii=False)})"


@dataclass
class GGUFReply:
    """One reply: shown as Markdown (reasoning collapsed) in rich front ends, as text elsewhere. ``tool_calls``:
    the calls it made, ``{"id", "name", "arguments"}`` (arguments a dict), shown under the text and never run."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""
    tokens_per_second: float | None = None
    drafted: tuple[int, int] | None = None  # speculative decoding: (drafted, accepted) tokens
    usage: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    done: bool = False
    markdown: bool = True  # False (``-f text``): plain text only

    def _footer(self) -> str:
        parts = [self.model] if self.model else []
        if self.usage.get("output_tokens"):
            parts.append(f"{self.usage['output_tokens']} tokens")
        if self.tokens_per_second:
            parts.append(f"{self.tokens_per_second:.1f} tok/s")
        if self.drafted:
            parts.append(f"{self.drafted[1]}/{self.drafted[0]} drafted accepted")
        if self.interrupted:
            parts.append("interrupted")
        return " · ".join(parts)

    def _repr_markdown_(self) -> str | None:
        if not self.markdown:
            return None
        out = []
        if self.reasoning:
            out.append(f"<details><summary>Thinking</summary>\n\n{html.escape(self.reasoning.strip())}\n\n</details>\n")
        out.append(self.text + ("" if self.done else " ▌"))
        out += [f"\n**tool call** `{call_text(c)}` · id `{c['id']}`" for c in self.tool_calls]
        footer = self._footer()
        if footer and self.done:
            out.append(f"\n\n<sub>{footer}</sub>")
        return "\n".join(out)

    def __repr__(self) -> str:
        head = f"[thinking]\n{self.reasoning.strip()}\n[/thinking]\n" if self.reasoning else ""
        footer = self._footer()
        return head + self.text + self._calls(bool(self.text)) + (f"\n[{footer}]" if footer and self.done else "")

    def _calls(self, after: bool) -> str:
        """The tool calls as text lines (on a new line ``after`` other text)."""
        lines = "\n".join(f"[tool call] {call_text(c)}  # id: {c['id']}" for c in self.tool_calls)
        return ("\n" if after and lines else "") + lines

    def __str__(self) -> str:
        return self.text


@dataclass
class ModelSummary:
    """What ``%gguf load`` returns: the model, its context, what its chat template supports, its server."""

    name: str
    path: str
    n_ctx: int
    address: str
    caps: dict[str, Any]
    modalities: dict[str, bool] = field(default_factory=dict)  # /props: {"vision": True, "audio": False, ...}

    def _flags(self) -> str:
        keys = ("supports_tools", "supports_parallel_tool_calls", "supports_preserve_reasoning", "supports_system_role")
        return ", ".join(k.removeprefix("supports_") for k in keys if self.caps.get(k)) or "plain chat"

    def _inputs(self) -> str:
        names = {"vision": "images", "audio": "audio"}
        return ", ".join(["text", *(names[k] for k in names if self.modalities.get(k))])

    def _repr_markdown_(self) -> str:
        return (f"**{self.name}** loaded\n\n| | |\n|---|---|\n| path | `{self.path}` |\n| context | {self.n_ctx} "
                f"tokens |\n| inputs | {self._inputs()} |\n| template | {self._flags()} |\n| server | `{self.address}` |")

    def __repr__(self) -> str:
        return (f"{self.name} loaded: {self.path}\n  context {self.n_ctx} tokens · inputs: {self._inputs()} · "
                f"template: {self._flags()} · {self.address}")


@dataclass
class _Table:
    """Rows of equal keys: a Markdown table in a kernel, aligned columns in a terminal, ``empty`` when none."""

    rows: list[dict[str, Any]]
    empty: str
    footer: str = ""  # a line under the table (e.g. the memory budget)

    def _repr_markdown_(self) -> str:
        if not self.rows:
            return f"_{self.empty}_" + (f"\n\n{self.footer}" if self.footer else "")
        cols = list(self.rows[0])
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in self.rows]
        return "\n".join(lines + ([f"\n{self.footer}"] if self.footer else []))

    def __repr__(self) -> str:
        if not self.rows:
            return self.empty + (f"\n{self.footer}" if self.footer else "")
        cols = list(self.rows[0])
        widths = {c: max(len(c), *(len(str(r[c])) for r in self.rows)) for c in cols}
        lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
        lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in self.rows]
        return "\n".join(lines + ([self.footer] if self.footer else []))


class _LiveOutput:
    """Streams a reply: display updates in a kernel, flushed prints in a terminal."""

    def __init__(self, shell: Any, reply: GGUFReply) -> None:
        from IPython.display import display

        self.reply = reply
        self.rich = _is_kernel(shell)
        self.last = 0.0
        self.handle = display(reply, display_id=True) if self.rich else None  # type: ignore[no-untyped-call]
        self.printed_thinking = False
        self.answer_started = False

    def delta(self, piece: str, text: str, thinking: str, reasoning: bool = False) -> None:
        if self.rich:
            self.reply.text, self.reply.reasoning = text, thinking
            now = time.monotonic()
            if now - self.last >= _UPDATE_EVERY and self.handle is not None:
                self.handle.update(self.reply)
                self.last = now
            return
        if reasoning and not self.printed_thinking:
            print("[thinking]", flush=True)  # reasoning apart from the answer, as in repr(reply)
            self.printed_thinking = True
        elif piece and not reasoning and not self.answer_started:
            self.answer_started = True
            if self.printed_thinking:
                print("\n[/thinking]", flush=True)
        if piece:
            print(piece, end="", flush=True)

    def finish(self) -> None:
        if self.rich and self.handle is not None:
            self.handle.update(self.reply)
        elif not self.rich:
            if self.printed_thinking and not self.answer_started:
                print("\n[/thinking]", end="", flush=True)  # the reply was all thinking (cut or interrupted)
            calls = self.reply._calls(self.printed_thinking or self.answer_started)
            if calls:
                print(calls, end="", flush=True)
            footer = self.reply._footer()
            print(f"\n[{footer}]" if footer else "", flush=True)


class _Progress:
    """Load progress (a :class:`~gguf_provider.runtime._common.progress.Progress`): download bytes as a bar, then "loading"
    with elapsed time."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.bar: Any = None
        self.handle: Any = None
        self.rich = _is_kernel(shell)
        self.last = 0.0
        self.started = time.monotonic()

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None:
        if stage == "download":
            if self.bar is None:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total or None, unit="B", unit_scale=True, desc="download")
            self.bar.update(done - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last < 0.25:
            return
        self.last = now
        msg = f"loading model … {now - self.started:.1f} s"
        if self.rich:
            from IPython.display import display

            if self.handle is None:
                self.handle = display({"text/plain": msg}, raw=True, display_id=True)  # type: ignore[no-untyped-call]
            else:
                self.handle.update({"text/plain": msg}, raw=True)
        else:
            print(f"\r{msg}", end="", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.rich and self.handle is not None:  # the counter becomes a final line, not a stale "loading"
            self.handle.update({"text/plain": f"loaded in {time.monotonic() - self.started:.1f} s"}, raw=True)
        elif not self.rich and self.last:
            print(flush=True)
