"""The ``%gguf`` and ``%%gguf`` commands: argument parsing, the per-model state and history, and chats through the
shared engine layer (:mod:`gguf_provider.chat`), so streaming, reasoning and errors behave as in the LangChain and
LlamaIndex adapters. What they draw lives in :mod:`.display`.

``%gguf`` load, ps, devices, list, unload, use, reset, history, config, log, or a one-shot prompt (sent as
typed); ``%%gguf`` a chat turn whose reply streams live into the cell output. ``%gguf --help``, ``%gguf COMMAND
--help`` and ``%%gguf --help`` say what each takes; errors are one UsageError line in the magics' words
(:func:`gguf_provider.advice.render`). With ``--tools`` the reply may be tool calls (shown and kept in the history,
never run); ``--tool-result [ID]`` sends a call's result back.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import keyword
import logging
import mimetypes
import re
import shlex
import time
import warnings
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from difflib import get_close_matches
from pathlib import Path
from types import FrameType
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import chat, flags, logs
from .._warn import user_frame
from ..advice import render
from ..engine import Engine, EngineConfig
from ..errors import GGUFProviderError, ServerError
from ..events import Collector, ReasoningDelta, TextDelta, Timings, ToolCallDelta, Usage
from ..runtime import default as runtime
from ..tools import function_tool, tool_name
from .display import GGUFReply, ModelSummary, _LiveOutput, _Progress, _Table, call_text

_PACKAGE = Path(__file__).resolve().parents[1]  # gguf_provider/: a warning from a line in it is ours

# --- state ------------------------------------------------------------------------------------------------------


@dataclass
class _Turn:
    """One exchange; ``key`` names the cell that made it, so running that cell again replaces it. A ``--tool-result``
    cell's turn has ``tool_call_id``: ``user`` is that call's result; its ``reply`` is None while other calls of the
    same reply still wait for their results (the model is asked once all are in)."""

    key: str
    user: str
    reply: str | None
    images: tuple[str, ...] = ()  # the cell's --image files as data URIs (or http(s) URLs), resent with the history
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the reply's: {"id", "name", "arguments"}
    tool_call_id: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # what --tools sent; a --tool-result cell resends them


@dataclass
class _Model:
    """A loaded model under its name: its engine, its reasoning default and its history."""

    name: str
    engine: Engine
    reasoning: bool | str | None = None
    history: list[_Turn] = field(default_factory=list)


class _Shown(Exception):
    """``--help`` printed its text: the command is done."""


class _ArgParser(argparse.ArgumentParser):
    """Errors as one UsageError line that points at ``--help``; ``--help`` prints and ends the command."""

    def __init__(self, prog: str, description: str, hint: str = "") -> None:
        super().__init__(prog=prog, description=description)
        self.hint = hint  # what unrecognized words may have meant

    def error(self, message: str) -> Any:  # one clean line instead of SystemExit
        hint = ""
        if message.startswith("unrecognized arguments: "):
            first = message.split()[2]
            if first.startswith("-"):  # a misspelled option
                close = get_close_matches(first.split("=")[0], self._option_string_actions, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
            elif self.hint:  # words: perhaps a prompt
                hint = f"; {self.hint}"
        raise UsageError(f"{self.prog}: {message}{hint} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if status == 0:
            raise _Shown
        raise UsageError(message or self.format_usage())


# Each subcommand: its arguments as the overview shows them, and what it does.
COMMANDS: dict[str, tuple[str, str]] = {
    "load": ("SPEC [options]", "start a model: a .gguf path, a model name in the models dir, or a Hugging Face "
                               "org/repo[:QUANT]; it becomes the current model"),
    "ps": ("", "the llama-servers running: model, context, memory, leases"),
    "devices": ("[--rpc HOST:PORT,...]", "the GPUs (and RPC workers) llama-server can use, with free memory"),
    "plan": ("SPEC [--quant Q] [--ctx N] [--device KIND:MEMORY ...] [--json]",
             "where a model would sit (layers per device, context) without starting it; a repo or directory of "
             "several quants: each one planned, the one auto picks marked"),
    "list": ("", "the .gguf models in the local models dir"),
    "unload": ("[NAME ...] | --all", "stop using the current model, NAME, or every model"),
    "use": ("NAME", "make NAME the current model, the one prompts and cells go to"),
    "reset": ("[NAME]", "clear the chat history of the current model (or NAME)"),
    "history": ("[NAME]", "the chat history of the current model (or NAME)"),
    "config": ("[--system S] [--temperature T] [--max-tokens N] [--max-time SECONDS]",
               "defaults for every prompt and cell; without options, the settings"),
    "log": ("[LEVEL]", "show gguf-provider's log at LEVEL: debug, info, warning, error or off"),
}
_HELP = ("-h", "--help", "help")  # `help` only alone or with a subcommand: `help me ...` is a prompt


def overview() -> str:
    """What ``%gguf --help`` prints: every subcommand, the one-shot prompt and the cell."""
    lines = ["%gguf: chat with local GGUF models (llama-server runs them).", ""]
    lines += [f"  %gguf {cmd} {args}".rstrip() + f"\n      {what}" for cmd, (args, what) in COMMANDS.items()]
    lines += ["  %gguf PROMPT\n      a one-shot prompt to the current model, sent as typed (no history; defaults "
              "from %gguf config)",
              "  %%gguf [NAME] [options]    (a cell's first line; the message is the rest of the cell)\n      a chat "
              "turn with the current model (or NAME): the reply streams in and joins the model's history",
              "", "Options: %gguf COMMAND --help; the cell's: %gguf help cell. Start with %gguf load SPEC, then %gguf "
              "PROMPT or a %%gguf cell."]
    return "\n".join(lines)


def _at_least(kind: type[int] | type[float], low: int = 0) -> Any:
    """An argparse type: a number of ``kind`` >= ``low``, or an error that says so."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"give {'a whole number' if kind is int else 'a number'} >= {low}, "
                                             f"not {text!r}")
        return value

    return parse


def _load_parser() -> _ArgParser:
    p = _ArgParser("%gguf load", COMMANDS["load"][1], hint="one SPEC per %gguf load")
    p.add_argument("spec", metavar="SPEC", help="a .gguf path, a model name in the models dir, or a Hugging Face "
                   "repo as org/repo or org/repo:QUANT")
    p.add_argument("--quant", help="the quantization to pick from a repo (e.g. Q4_K_M)")
    p.add_argument("--as", dest="alias", metavar="NAME", help="the name to use it by (default: the file name)")
    p.add_argument("--reasoning", choices=["on", "off", "low", "medium", "high"],
                   help="the model's thinking in prompts and cells (a cell's --think/--no-think/--effort win)")
    flags.add_to(p)  # every llama-server option of a chat model, as ChatGGUF and GGUF take it
    return p


def _command_parser(cmd: str) -> _ArgParser:
    """``%gguf CMD``'s parser, each argument with its help."""
    if cmd == "load":
        return _load_parser()
    p = _ArgParser(f"%gguf {cmd}", COMMANDS[cmd][1],
                   hint=f"for a prompt that starts with {cmd!r}, write it in a %%gguf cell")
    if cmd in ("use", "reset", "history"):
        p.add_argument("name", nargs="?", metavar="NAME", help="a loaded model's name (default: the current model)"
                       if cmd != "use" else "a loaded model's name (its --as name, or its file name)")
    if cmd == "unload":
        p.add_argument("names", nargs="*", metavar="NAME", help="loaded models (default: the current model)")
        p.add_argument("--all", action="store_true", help="unload every model")
    elif cmd == "plan":
        p.add_argument("spec", metavar="SPEC", help="a .gguf path, a directory, a model name in the models dir, or a "
                       "Hugging Face org/repo[:QUANT]")
        p.add_argument("--quant", help="plan this quant only (default: every quant, auto's pick marked)")
        p.add_argument("--ctx", type=_at_least(int, 1), metavar="N", help="the context to plan for (default: as a "
                       "load would choose)")
        p.add_argument("--device", action="append", default=[], metavar="KIND:MEMORY",
                       help="plan for this device instead of this machine's (repeatable): cuda:8GiB, cpu:32GiB")
        p.add_argument("--json", action="store_true", help="the plan as JSON")
    elif cmd == "devices":
        p.add_argument("--rpc", default="", metavar="HOST:PORT,...", help="also ask these RPC workers "
                       "(gguf-provider rpc-worker) for their devices")
    elif cmd == "config":
        p.add_argument("--system", help="the system prompt ('' for none)")
        p.add_argument("--temperature", type=_at_least(float), help="sampling temperature (0: greedy)")
        p.add_argument("--max-tokens", type=_at_least(int, 1), help="most tokens of a reply")
        p.add_argument("--max-time", type=_at_least(float), metavar="SECONDS",
                       help="most seconds of a reply (0: no limit; default: 600 without --max-tokens)")
    elif cmd == "log":
        p.add_argument("level", nargs="?", metavar="LEVEL", help="debug, info, warning, error or off "
                       "(default: show the level)")
    return p


def load_config(ns: argparse.Namespace) -> EngineConfig:
    """``%gguf load``'s engine config; a wrong value is a UsageError here, before anything starts."""
    try:
        return EngineConfig(model=ns.spec, quant=ns.quant, **flags.values(ns))
    except ValueError as exc:
        raise UsageError(f"%gguf load: {render(str(exc), 'magic')}") from None


def _cell_parser() -> _ArgParser:
    p = _ArgParser("%%gguf", "A chat turn: the message is the cell below the %%gguf line; the reply streams in "
                   "and joins the model's history. {name} in the message is the notebook variable's value.",
                   hint="the %%gguf line takes a model name and options: write the message in the cell below")
    p.add_argument("name", nargs="?", metavar="NAME", help="a loaded model (default: the current model)")
    p.add_argument("-s", "--system", help="the system prompt of this turn")
    p.add_argument("-t", "--temperature", type=_at_least(float), help="sampling temperature (0: greedy)")
    p.add_argument("-n", "--max-tokens", type=_at_least(int, 1), help="most tokens of the reply")
    p.add_argument("--max-time", type=_at_least(float), metavar="SECONDS",
                   help="most seconds of the reply (0: no limit)")
    p.add_argument("--no-history", action="store_true", help="send this turn alone and keep it out of the history")
    p.add_argument("-o", "--output", metavar="VAR", help="also store the reply's text in notebook variable VAR")
    p.add_argument("-f", "--format", choices=["markdown", "text", "code", "json"], default="markdown",
                   help="markdown (default); text; code: the reply's code goes into the next cell; json: JSON mode, "
                   "the parsed value is returned")
    think = p.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", default=None, help="let the model think first")
    think.add_argument("--effort", dest="think", choices=["low", "medium", "high"], help="how much to think")
    think.add_argument("--no-think", dest="think", action="store_false", help="answer without thinking")
    p.add_argument("--no-interpolate", action="store_true", help="send {braces} as written")
    p.add_argument("-i", "--image", action="append", default=[], metavar="PATH_OR_URL",
                   help="an image to send with the message (repeat for more; needs a vision model)")
    p.add_argument("--tools", metavar="NAME[,NAME...]", help="notebook functions or OpenAI tool dicts the model may "
                   "call (calls are shown and kept, never run)")
    p.add_argument("--tool-choice", metavar="auto|none|required|TOOL", help="whether or which tool the model must call")
    p.add_argument("--tool-result", nargs="?", const="", metavar="ID",
                   help="the cell is the result of tool call ID (or of the one call waiting)")
    return p


def notebook_tools(names: str, namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """``--tools``' value as OpenAI-format tools: each name a notebook variable holding a function (its schema from
    its signature, :func:`~gguf_provider.tools.function_tool`), an OpenAI tool dict, a bare ``{"name", "parameters"}``
    function dict, or a list of these."""
    tools: list[dict[str, Any]] = []

    def add(value: Any, name: str) -> None:
        if isinstance(value, (list, tuple)):
            for item in value:
                add(item, name)
        elif isinstance(value, dict) and isinstance(value.get("function"), dict):
            tools.append(value)
        elif isinstance(value, dict) and "name" in value:
            tools.append({"type": "function", "function": value})
        elif callable(value):
            try:
                tools.append(function_tool(value))
            except (TypeError, ValueError) as exc:  # a builtin without a signature
                raise UsageError(f"%%gguf --tools: no schema for {name}: {exc}") from None
        else:
            raise UsageError(f"%%gguf --tools: {name} is a {type(value).__name__}, not a function or an OpenAI "
                             f"tool dict")

    for name in filter(None, (n.strip() for n in names.split(","))):
        if name not in namespace:
            raise UsageError(f"%%gguf --tools: {name} is not defined in the notebook")
        add(namespace[name], name)
    return tools


def _tool_choice(value: str | None, tools: list[dict[str, Any]]) -> str | None:
    """``--tool-choice`` normalized as every adapter does it; a tool it names must be one of ``--tools``."""
    if value is None:
        return None
    if not tools:
        raise UsageError("%%gguf --tool-choice: give the tools with --tools")
    choice = chat.normalize_tool_choice(value)
    names = [tool_name(t) for t in tools]
    if choice and choice.startswith("name:") and choice[5:] not in names:
        raise UsageError(f"%%gguf --tool-choice: {value!r} is not auto, none, required or a tool of --tools "
                         f"({', '.join(names)})")
    return choice


def _result_id(given: str, waiting: list[dict[str, Any]]) -> str:
    """The call ``--tool-result [ID]`` answers: ``ID``, or without it the one call that waits for a result."""
    ids = [str(c["id"]) for c in waiting]
    if not given and len(ids) == 1:
        return ids[0]
    if given in ids:
        return given
    raise UsageError(f"%%gguf --tool-result ID: {'which call? ' if not given else f'no call {given!r} '}"
                     f"(waiting for results: {', '.join(ids)})")


def _asked(text: str, images: tuple[str, ...], tool_call_id: str | None, names: dict[str, str]) -> dict[str, Any]:
    """A turn's message to the model: the user's, or a tool result (with the call's tool name, which some templates
    render)."""
    if tool_call_id is None:
        return {"role": "user", "content": _user_content(text, images)}
    named = {"name": names[tool_call_id]} if tool_call_id in names else {}
    return {"role": "tool", "tool_call_id": tool_call_id, **named, "content": text}


def _wire_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in calls]


def image_url(value: str, cwd: Path | None = None) -> str:
    """``--image``'s value as a URL llama-server takes: an http(s) URL as it is (the engine fetches it), a file as a
    base64 data URI. UsageError for a missing file or one that is not an image."""
    if value.startswith(("http://", "https://", "data:")):
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and cwd is not None:
        path = cwd / path
    if not path.is_file():
        raise UsageError(f"%%gguf --image: no such file: {value}")
    mime = mimetypes.guess_type(path.name)[0] or ""
    if not mime.startswith("image/"):
        raise UsageError(f"%%gguf --image: {value} is not an image file (.png, .jpg, .gif, .bmp, .webp)")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _user_content(prompt: str, images: tuple[str, ...]) -> str | list[dict[str, Any]]:
    if not images:
        return prompt
    return [{"type": "text", "text": prompt}, *({"type": "image_url", "image_url": {"url": u}} for u in images)]


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")
_CODE_BLOCK = re.compile(r"```[\w+-]*\n(.*?)```", re.S)


def interpolate(text: str, namespace: dict[str, Any]) -> str:
    """Fill ``{name}`` / ``{obj.attr}`` from ``namespace``; ``{{`` and ``}}`` stand for braces. Other braces (code,
    JSON) are left alone. An unknown name raises UsageError naming it."""

    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        path = m.group(1).split(".")
        if path[0] not in namespace:
            raise UsageError(f"%%gguf: {{{m.group(1)}}} is not defined in the notebook (write {{{{ }}}} for a "
                             f"literal brace, or use --no-interpolate)")
        value = namespace[path[0]]
        for attr in path[1:]:
            if not hasattr(value, attr):
                raise UsageError(f"%%gguf: {{{m.group(1)}}}: {path[0]} has no attribute {attr!r} (write {{{{ }}}} "
                                 f"for a literal brace, or use --no-interpolate)")
            value = getattr(value, attr)
        return str(value)

    return _PLACEHOLDER.sub(sub, text)


def _where(line: str) -> str:
    """How an error of ``%gguf line`` begins: ``%gguf load``, or ``%gguf`` for a prompt."""
    first = line.split(None, 1)[0] if line.strip() else ""
    return f"%gguf {first}" if first in COMMANDS else "%gguf"


def _rewarn(caught: list[warnings.WarningMessage], frame: FrameType | None) -> None:
    """Warn again what the magic warned: gguf-provider's in magic words (``--max-time``), at the user's line; others
    as they were."""
    for w in caught:
        ours = w.category.__module__.partition(".")[0] == "gguf_provider" or Path(w.filename).is_relative_to(_PACKAGE)
        text = render(str(w.message), "magic") if ours else str(w.message)
        message = w.message
        if text != str(message):
            try:
                message = w.category(text)
            except TypeError:  # a category that wants more than a message: kept as it was
                pass
        if ours and frame is not None:
            warnings.warn_explicit(message, w.category, frame.f_code.co_filename, frame.f_lineno,
                                   module_globals=frame.f_globals)
        else:
            warnings.warn_explicit(message, w.category, w.filename, w.lineno, source=w.source)


@magics_class
class GGUFMagics(Magics):
    """One IPython session's magics and state: the loaded models, the current one, the ``config`` settings."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.models: dict[str, _Model] = {}
        self.current: str | None = None
        self.settings: dict[str, Any] = {"system": None, "temperature": None, "max_tokens": None, "max_time": None}
        self._cell_id: str | None = None
        self._shell: Any = shell
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)
        logs.from_env()  # $GGUF_PROVIDER_LOG, also when it was set after the import (`%env`, os.environ)

    def _pre_run_cell(self, info: Any) -> None:
        self._cell_id = getattr(info, "cell_id", None)

    def _post_run_cell(self, result: Any) -> None:
        self._cell_id = None  # a magic called from code later is not that cell

    # --- entry point ----------------------------------------------------------------------------------------

    @line_cell_magic
    def gguf(self, line: str, cell: str | None = None) -> Any:
        """%gguf load SPEC | ps | devices | list | unload [NAME|--all] | use NAME | reset [NAME] | history [NAME]
        | config | log [LEVEL] | PROMPT
        %%gguf [NAME] [options] with the message in the cell.
        %gguf --help: what each does; %gguf COMMAND --help, %gguf help cell: their options."""
        where = "%%gguf" if cell is not None else _where(line)
        caller = user_frame()
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                return self._cell(line, cell) if cell is not None else self._line(line)
        except _Shown:
            return None
        except ServerError as exc:
            first = render(str(exc).splitlines()[0], "magic")
            log = f" — server log: {exc.log_path}" if exc.log_path and str(exc.log_path) not in first else ""
            raise UsageError(f"{where}: {first}{log}") from None
        except GGUFProviderError as exc:
            raise UsageError(f"{where}: {render(str(exc).splitlines()[0], 'magic')}") from None
        finally:
            _rewarn(caught, caller)

    # --- line commands --------------------------------------------------------------------------------------

    def _line(self, line: str) -> Any:
        words = line.split()
        if not words:
            raise UsageError("%gguf: give a subcommand (load, ps, devices, plan, list, unload, use, reset, history, config, "
                             "log) or a prompt; %gguf --help says more")
        topic = words[1] if len(words) == 2 and words[1] in (*COMMANDS, "cell") else None
        if words[0] in _HELP and (words[0] != "help" or len(words) == 1 or topic):
            if topic:  # help load: load's options; help cell: the cell's (`%%gguf --help` needs a cell body)
                (_cell_parser() if topic == "cell" else _command_parser(topic)).print_help()
            else:
                print(overview())
            return None
        if words[0] not in COMMANDS:
            if re.fullmatch(r"--?[A-Za-z][\w-]*", words[0]):  # an option where a prompt takes none
                raise UsageError(f"%gguf: {words[0]} is not a subcommand; the options of a prompt go on a %%gguf "
                                 "cell's line (%gguf help cell), their defaults in %gguf config; %gguf --help lists "
                                 "the subcommands")
            return self._one_shot(line.strip())  # a prompt, as typed: apostrophes and all
        cmd = words[0]
        try:
            args = shlex.split(line)[1:]
        except ValueError as exc:
            raise UsageError(f"%gguf {cmd}: {exc}: quote a value with spaces or quotes in it as a whole (\"...\"), or "
                             "write free text in a %%gguf cell") from None
        return getattr(self, f"_cmd_{cmd}")(_command_parser(cmd).parse_args(args))

    def _cmd_load(self, ns: argparse.Namespace) -> ModelSummary:
        name = ns.alias or ns.spec.rsplit("/", 1)[-1].removesuffix(".gguf")
        config = load_config(ns)
        progress = _Progress(self._shell)
        engine = Engine(replace(config, progress=progress))
        try:
            info = engine.load()
        except ValueError as exc:  # a speculative type or cache type this llama-server does not list
            raise UsageError(f"%gguf load: {render(str(exc), 'magic')}") from None
        finally:
            progress.close()
        old = self.models.get(name)
        if old is not None and old.engine is not engine:
            old.engine.unload()
        reasoning = {None: None, "on": True, "off": False}.get(ns.reasoning, ns.reasoning)
        self.models[name] = _Model(name, engine, reasoning)
        self.current = name
        return ModelSummary(name, info.model, engine.n_ctx, info.address.describe(), engine.capabilities(),
                            engine.modalities())

    def _cmd_ps(self, ns: argparse.Namespace) -> _Table:
        now_running = runtime().status(live=True)
        servers = now_running.servers
        now = time.time()
        rows = [{"id": r.id, "pid": r.pid, "model": r.model.rsplit("/", 1)[-1], "ctx": r.ctx, "leases": r.leases,
                 "memory": f"{r.memory / 2**20:.0f} MiB", "last used": f"{now - r.last_used:.0f} s ago",
                 "live": r.describe_metrics(),
                 **({"workers": ", ".join(r.workers)} if any(s.workers for s in servers) else {}),
                 **({"devices": r.describe_placement() or "CPU"} if any(s.placement for s in servers) else {})}
                for r in servers]
        return _Table(rows, "no servers running", now_running.budget.describe())

    def _cmd_plan(self, ns: argparse.Namespace) -> Any:
        from ..runtime import ModelRef

        try:
            made = runtime().plan(ModelRef(ns.spec, quant=ns.quant), devices=ns.device, n_ctx=ns.ctx)
        except ValueError as exc:
            raise UsageError(f"%gguf plan: {render(str(exc), 'magic')}") from None
        if ns.json:
            print(json.dumps(made.choice.to_json() if made.choice else made.plan.to_json(), indent=2))
            return None
        if made.choice is None:
            print(made.plan.describe())
            return None
        rows = [{"auto": "*" if i == made.choice.picked else "", "quant": v.option.label,
                 "size": f"{v.option.size / 1e6:,.0f} MB", "n_ctx": v.plan.n_ctx, "where": v.where(),
                 "fits": "yes" if v.plan.fits else "no"} for i, v in enumerate(made.choice.verdicts)]
        return _Table(rows, "no quants", f"auto: {made.choice.line()} (planned for {made.where})")

    def _cmd_devices(self, ns: argparse.Namespace) -> _Table:
        try:
            seen = runtime().devices(ns.rpc)
        except ValueError as exc:
            raise UsageError(f"%gguf devices: {render(str(exc), 'magic')}") from None
        listed, found, workers = seen.devices, seen.seen_by, seen.workers
        rows = [{"name": d.name, "kind": d.kind, "description": d.description,
                 "free / total": f"{d.free / 2**30:.1f} / {d.total / 2**30:.1f} GiB"} for d in listed]
        footer = (f"as seen by {found}" if found else
                  "no llama-server found (`gguf-provider server install`): GPUs from nvidia-smi")
        if workers and not any(d.kind == "rpc" for d in listed):
            footer += f"; no RPC device listed for {','.join(workers)}: is `gguf-provider rpc-worker` running there?"
        return _Table(rows, "no devices", footer)

    def _cmd_log(self, ns: argparse.Namespace) -> None:
        """``%gguf log [debug|info|warning|error|off]``: gguf-provider's log records in the cell output (stderr)."""
        if ns.level is not None:
            try:
                logs.enable(ns.level)
            except ValueError as exc:
                raise UsageError(f"%gguf log: {render(str(exc), 'magic')}") from None
        h = logs.handler()
        print(f"gguf-provider log: {logging.getLevelName(h.level).lower() if h else 'off'}")

    def _cmd_list(self, ns: argparse.Namespace) -> _Table:
        rows = [{"name": m.name, "size": f"{m.size_bytes / 2**20:.0f} MiB", "path": m.path}
                for m in runtime().models()]
        return _Table(rows, "no local models")

    def _cmd_unload(self, ns: argparse.Namespace) -> None:
        if ns.all and ns.names:
            raise UsageError(f"%gguf unload: give NAME or --all, not both (unload {' '.join(ns.names)} or every "
                             "model?)")
        if not self.models:
            raise UsageError("%gguf unload: no model is loaded: nothing to unload")
        names = list(self.models) if ns.all else list(dict.fromkeys(self._model(n, "%gguf unload").name
                                                               for n in ns.names or [None]))
        for name in names:
            self.models.pop(name).engine.unload()
            print(f"unloaded {name}")
        if self.current not in self.models:
            self.current = next(iter(self.models), None)

    def _cmd_use(self, ns: argparse.Namespace) -> None:
        if ns.name is None:
            raise UsageError(f"%gguf use: give the name of a loaded model (loaded: {', '.join(self.models) or 'none'})")
        self.current = self._model(ns.name, "%gguf use").name
        print(f"using {self.current}")

    def _cmd_reset(self, ns: argparse.Namespace) -> None:
        model = self._model(ns.name, "%gguf reset")
        model.history.clear()
        print(f"history of {model.name} cleared")

    def _cmd_history(self, ns: argparse.Namespace) -> _Table:
        model = self._model(ns.name, "%gguf history")
        rows = [{"#": i + 1, "you": (f"[tool result {t.tool_call_id}] " if t.tool_call_id else "") + t.user[:80],
                 "model": "; ".join([*([t.reply[:80]] if t.reply else []),
                                     *(f"[tool call] {call_text(c)}"[:80] for c in t.tool_calls)])}
                for i, t in enumerate(model.history)]
        return _Table(rows, f"no history for {model.name}")

    def _cmd_config(self, ns: argparse.Namespace) -> _Table:
        for key in ("system", "temperature", "max_tokens", "max_time"):
            value = getattr(ns, key)
            if value is not None:
                self.settings[key] = value
        return _Table([{"setting": k, "value": v} for k, v in self.settings.items()], "")

    def _one_shot(self, prompt: str) -> None:
        """The reply streams into the output as it comes (and stays in ``_gguf_last``): nothing to return."""
        model = self._model(None, "%gguf")
        messages = self._messages(model, prompt, self.settings["system"], history=False)
        self._run(model, messages, self.settings["temperature"], self.settings["max_tokens"], model.reasoning,
                  max_time=self.settings["max_time"])

    # --- the cell -------------------------------------------------------------------------------------------

    def _cell(self, line: str, cell: str) -> Any:
        try:
            ns = _cell_parser().parse_args(shlex.split(line))
        except ValueError as exc:
            raise UsageError(f"%%gguf: {exc}: quote an option's value with spaces or quotes in it as a whole "
                             "(\"...\")") from None
        if not cell.strip():
            raise UsageError("%%gguf: the cell is empty: write your message below the %%gguf line")
        if ns.output is not None and (not ns.output.isidentifier() or keyword.iskeyword(ns.output)):
            raise UsageError(f"%%gguf -o: {ns.output!r} is not a variable name: give one such as reply")
        model = self._model(ns.name, "%%gguf")
        prompt = cell.strip() if ns.no_interpolate else interpolate(cell.strip(), self._shell.user_ns)
        if not prompt:
            raise UsageError("%%gguf: the cell is empty: write your message below the %%gguf line")
        system = ns.system if ns.system is not None else self.settings["system"]
        key = self._cell_id or hashlib.sha256(f"{line}\n{cell}".encode()).hexdigest()[:16]
        images = tuple(image_url(v, Path.cwd()) for v in ns.image)
        tools = notebook_tools(ns.tools, self._shell.user_ns) if ns.tools else []
        if ns.format == "json" and (ns.tools or ns.tool_result is not None):  # llama-server: 400 with tools
            raise UsageError("%%gguf: -f json does not go with --tools or --tool-result")
        result_of: str | None = None
        if ns.tool_result is not None:
            calling, waiting = self._waiting_calls(model, key, ns.no_history)
            result_of = _result_id(ns.tool_result, waiting)
            tools = tools or calling.tools
            still = [c["id"] for c in waiting if c["id"] != result_of]
            if still:  # the model is asked once every call of its reply has a result
                self._record(model, _Turn(key, prompt, None, tool_call_id=result_of, tools=tools))
                print(f"result of {result_of} recorded; the model is asked once {', '.join(still)} "
                      f"{'has' if len(still) == 1 else 'have'} a result too")
                return None
        tool_choice = _tool_choice(ns.tool_choice, tools)
        messages = self._messages(model, prompt, system, history=not ns.no_history, replace_key=key, images=images,
                                  tool_call_id=result_of)
        temperature = ns.temperature if ns.temperature is not None else self.settings["temperature"]
        max_tokens = ns.max_tokens if ns.max_tokens is not None else self.settings["max_tokens"]
        reasoning = ns.think if ns.think is not None else model.reasoning
        response_format = {"type": "json_object"} if ns.format == "json" else None
        max_time = ns.max_time if ns.max_time is not None else self.settings["max_time"]
        reply = self._run(model, messages, temperature, max_tokens, reasoning, response_format, max_time=max_time,
                          live=ns.format != "json", markdown=ns.format != "text", tools=tools, tool_choice=tool_choice)
        if not ns.no_history:
            self._record(model, _Turn(key, prompt, reply.text, images, reply.tool_calls, result_of, tools))
        if ns.output:
            self._shell.user_ns[ns.output] = reply.text
        if reply.tool_calls:
            return None  # shown already
        if ns.format == "json":
            try:
                return json.loads(reply.text)
            except ValueError:
                raise UsageError("%%gguf -f json: the reply is not complete JSON (raise -n?)") from None
        if ns.format == "code":
            m = _CODE_BLOCK.search(reply.text)
            self._shell.set_next_input((m.group(1) if m else reply.text).rstrip("\n"), replace=False)
        return None

    # --- helpers --------------------------------------------------------------------------------------------

    def _model(self, name: str | None, where: str) -> _Model:
        """The model ``name`` (default: the current one); ``where`` begins the error: ``%gguf use``."""
        name = name or self.current
        if name is None:
            raise UsageError(f"{where}: no model loaded: run %gguf load SPEC first")
        if name not in self.models:
            close = get_close_matches(name, list(self.models), n=1)
            hint = (f"; did you mean {close[0]!r}?" if close else "; run %gguf load SPEC first" if not self.models
                    else "; the message goes in the cell, below the %%gguf line" if where == "%%gguf" else "")
            raise UsageError(f"{where}: no model named {name!r} is loaded (loaded: {', '.join(self.models) or 'none'})"
                             f"{hint}")
        return self.models[name]

    def _messages(self, model: _Model, prompt: str, system: str | None, *, history: bool,
                  replace_key: str | None = None, images: tuple[str, ...] = (),
                  tool_call_id: str | None = None) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        names: dict[str, str] = {}  # call id → tool name, for the tool messages
        for turn in self._context(model, replace_key) if history else []:
            messages.append(_asked(turn.user, turn.images, turn.tool_call_id, names))
            if turn.reply is not None:
                reply: dict[str, Any] = {"role": "assistant", "content": turn.reply}
                if turn.tool_calls:
                    reply["tool_calls"] = _wire_calls(turn.tool_calls)
                    names.update((c["id"], c["name"]) for c in turn.tool_calls)
                messages.append(reply)
        messages.append(_asked(prompt, images, tool_call_id, names))
        return messages

    def _context(self, model: _Model, key: str | None) -> list[_Turn]:
        """The history before the turn of cell ``key`` (re-running a cell replaces its turn: the conversation up to
        it is the context), or all of it."""
        turns = []
        for turn in model.history:
            if turn.key == key:
                break
            turns.append(turn)
        return turns

    def _waiting_calls(self, model: _Model, key: str, no_history: bool) -> tuple[_Turn, list[dict[str, Any]]]:
        """For ``--tool-result``: the turn whose reply made the last tool calls, and those without a result yet."""
        if no_history:
            raise UsageError("%%gguf --tool-result: a result answers a call in the history: drop --no-history")
        turns = self._context(model, key)
        i = len(turns) - 1
        while i >= 0 and turns[i].reply is None:  # results recorded while others were missing
            i -= 1
        if i < 0 or not turns[i].tool_calls:
            raise UsageError(f"%%gguf --tool-result: the last reply of {model.name} made no tool call")
        answered = {t.tool_call_id for t in turns[i + 1:]}
        waiting = [c for c in turns[i].tool_calls if c["id"] not in answered]
        if not waiting:
            raise UsageError("%%gguf --tool-result: every tool call of the last reply has its result")
        return turns[i], waiting

    def _record(self, model: _Model, turn: _Turn) -> None:
        for i, old in enumerate(model.history):
            if old.key == turn.key:
                model.history[i] = turn
                # Results of calls the re-run reply no longer makes answer nothing: they go too.
                gone = {c["id"] for c in old.tool_calls} - {c["id"] for c in turn.tool_calls}
                model.history[i + 1:] = [t for t in model.history[i + 1:] if t.tool_call_id not in gone]
                return
        model.history.append(turn)

    def _run(self, model: _Model, messages: list[dict[str, Any]], temperature: float | None,
             max_tokens: int | None, reasoning: bool | str | None, response_format: dict[str, Any] | None = None,
             live: bool = True, markdown: bool = True, max_time: float | None = None,
             tools: list[dict[str, Any]] | None = None, tool_choice: str | None = None) -> GGUFReply:
        request = chat.ChatRequest(messages=messages, params={"temperature": temperature, "max_tokens": max_tokens},
                                   reasoning=reasoning, response_format=response_format,
                                   max_time="auto" if max_time is None else max_time,  # --max-time 0: no bound
                                   tools=tools or [], tool_choice=tool_choice)
        reply = GGUFReply(model=model.name, markdown=markdown)
        out = _LiveOutput(self._shell, reply) if live else None
        text: list[str] = []
        thinking: list[str] = []
        calls = Collector()  # tool-call fragments, joined by index as every adapter does
        events = chat.stream(model.engine, request)
        assert isinstance(events, Generator)
        try:
            for ev in events:
                if isinstance(ev, TextDelta):
                    text.append(ev.text)
                    if out:
                        out.delta(ev.text, "".join(text), "".join(thinking))
                elif isinstance(ev, ReasoningDelta):
                    thinking.append(ev.text)
                    if out:
                        out.delta(ev.text, "".join(text), "".join(thinking), reasoning=True)
                elif isinstance(ev, ToolCallDelta):
                    calls.add(ev)
                elif isinstance(ev, Usage):
                    reply.usage = {"input_tokens": ev.prompt_tokens, "output_tokens": ev.completion_tokens}
                elif isinstance(ev, Timings):
                    if ev.data.get("predicted_per_second"):
                        reply.tokens_per_second = float(ev.data["predicted_per_second"])
                    if ev.data.get("draft_n"):
                        reply.drafted = (int(ev.data["draft_n"]), int(ev.data.get("draft_n_accepted") or 0))
        except KeyboardInterrupt:
            reply.interrupted = True  # the partial reply is kept; closing the stream stops generation
        finally:
            events.close()
        reply.text, reply.reasoning, reply.done = "".join(text), "".join(thinking), True
        reply.tool_calls = [{"id": c.id or f"call_{i}", "name": c.name, "arguments": c.args()}
                            for i, c in enumerate(calls.done().tool_calls)]
        if out:
            out.finish()
        self._shell.user_ns["_gguf_last"] = reply
        return reply
