"""The ``%gguf`` and ``%%gguf`` commands: argument parsing, the per-model state and history, and chats through the
shared engine layer (:mod:`gguf_provider.chat`), so streaming, reasoning and errors behave as in the LangChain and
LlamaIndex adapters. What they draw lives in :mod:`.display`.

``%gguf`` load, ps, devices, list, unload, use, reset, history, config, or a one-shot prompt; ``%%gguf`` a chat turn whose
reply streams live into the cell output.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import mimetypes
import re
import shlex
import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import chat, logs, status
from ..engine import Engine, EngineConfig
from ..errors import GGUFProviderError, ServerError
from ..events import ReasoningDelta, TextDelta, Timings, Usage
from .display import GGUFReply, ModelSummary, _LiveOutput, _Progress, _Table

# --- state ------------------------------------------------------------------------------------------------------


@dataclass
class _Turn:
    """One exchange; ``key`` names the cell that made it, so running that cell again replaces it."""

    key: str
    user: str
    reply: str
    images: tuple[str, ...] = ()  # the cell's --image files as data URIs (or http(s) URLs), resent with the history


@dataclass
class _Model:
    """A loaded model under its name: its engine, its reasoning default and its history."""

    name: str
    engine: Engine
    reasoning: bool | None = None
    history: list[_Turn] = field(default_factory=list)


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one clean line instead of SystemExit
        raise UsageError(f"{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise UsageError(message or self.format_usage())


def _cell_parser() -> _ArgParser:
    p = _ArgParser(prog="%%gguf", add_help=False)
    p.add_argument("name", nargs="?")
    p.add_argument("-s", "--system")
    p.add_argument("-t", "--temperature", type=float)
    p.add_argument("-n", "--max-tokens", type=int)
    p.add_argument("--max-time", type=float)
    p.add_argument("--no-history", action="store_true")
    p.add_argument("-o", "--output")
    p.add_argument("-f", "--format", choices=["markdown", "text", "code", "json"], default="markdown")
    think = p.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", default=None)
    think.add_argument("--no-think", dest="think", action="store_false")
    p.add_argument("--no-interpolate", action="store_true")
    p.add_argument("-i", "--image", action="append", default=[])
    return p


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
        logs.from_env()  # $GGUF_PROVIDER_LOG, also when it was set after the import (`%env`, os.environ)

    def _pre_run_cell(self, info: Any) -> None:
        self._cell_id = getattr(info, "cell_id", None)

    # --- entry point ----------------------------------------------------------------------------------------

    @line_cell_magic
    def gguf(self, line: str, cell: str | None = None) -> Any:
        """%gguf load SPEC | ps | devices [--rpc HOST:PORT,...] | list | unload [NAME|--all] | use NAME | reset [NAME]
        | history | config | log [LEVEL] | PROMPT
        %%gguf [NAME] [-s SYSTEM] [-t TEMP] [-n MAX_TOKENS] [--no-history] [-o VAR] [-f FORMAT] [--think|--no-think]
        [--no-interpolate] [--image PATH_OR_URL ...]"""
        try:
            if cell is not None:
                return self._cell(line, cell)
            return self._line(line)
        except ServerError as exc:
            first = str(exc).splitlines()[0]
            where = f" — server log: {exc.log_path}" if exc.log_path else ""
            raise UsageError(f"%gguf: {first}{where}") from None
        except GGUFProviderError as exc:
            raise UsageError(f"%gguf: {str(exc).splitlines()[0]}") from None

    # --- line commands --------------------------------------------------------------------------------------

    def _line(self, line: str) -> Any:
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%gguf: {exc}") from None
        if not words:
            raise UsageError("%gguf: give a subcommand (load, ps, devices, list, unload, use, reset, history, config, "
                             "log) or a prompt")
        cmd, rest = words[0], words[1:]
        handler = getattr(self, f"_cmd_{cmd}", None)
        if handler is None:
            return self._one_shot(line)
        return handler(rest)

    def _cmd_load(self, args: list[str]) -> ModelSummary:
        p = _ArgParser(prog="%gguf load", add_help=False)
        p.add_argument("spec")
        p.add_argument("--quant")
        p.add_argument("--ctx", type=int)
        p.add_argument("--as", dest="alias")
        p.add_argument("--reasoning", choices=["on", "off"])
        p.add_argument("--chat-template-file")
        p.add_argument("--vision", action="store_true")
        p.add_argument("--mmproj")
        p.add_argument("--speculative", default="auto", metavar="auto|off|ngram|TYPE|DRAFT")
        p.add_argument("--kv-cache-type", default="f16", metavar="TYPE")
        p.add_argument("--rpc", default="", metavar="HOST:PORT,...")
        ns = p.parse_args(args)
        name = ns.alias or ns.spec.rsplit("/", 1)[-1].removesuffix(".gguf")
        try:
            config = EngineConfig(model=ns.spec, quant=ns.quant, n_ctx=ns.ctx,
                                  chat_template_file=ns.chat_template_file, vision=ns.vision or bool(ns.mmproj),
                                  mmproj=ns.mmproj, speculative=ns.speculative, kv_cache_type=ns.kv_cache_type,
                                  rpc_servers=ns.rpc)
        except ValueError as exc:
            raise UsageError(f"%gguf load: {exc}") from None
        progress = _Progress(self._shell)
        engine = Engine(replace(config, progress=progress))
        try:
            info = engine.load()
        except ValueError as exc:  # a speculative type or cache type this llama-server does not list
            raise UsageError(f"%gguf load: {exc}") from None
        finally:
            progress.close()
        old = self.models.get(name)
        if old is not None and old.engine is not engine:
            old.engine.unload()
        reasoning = None if ns.reasoning is None else ns.reasoning == "on"
        self.models[name] = _Model(name, engine, reasoning)
        self.current = name
        return ModelSummary(name, info.model, engine.n_ctx, info.address.describe(), engine.capabilities(),
                            engine.modalities())

    def _cmd_ps(self, args: list[str]) -> _Table:
        servers = status.running_servers(live=True)
        now = time.time()
        rows = [{"id": r.id, "pid": r.pid, "model": r.model.rsplit("/", 1)[-1], "ctx": r.ctx, "leases": r.leases,
                 "memory": f"{r.memory / 2**20:.0f} MiB", "last used": f"{now - r.last_used:.0f} s ago",
                 "live": r.describe_metrics(),
                 **({"workers": ", ".join(r.workers)} if any(s.workers for s in servers) else {}),
                 **({"devices": r.describe_placement() or "CPU"} if any(s.placement for s in servers) else {})}
                for r in servers]
        return _Table(rows, "no servers running", status.memory_budget(servers).describe())

    def _cmd_devices(self, args: list[str]) -> _Table:
        from ..runtime import devices, discovery, rpc

        p = _ArgParser(prog="%gguf devices", add_help=False)
        p.add_argument("--rpc", default="", metavar="HOST:PORT,...")
        ns = p.parse_args(args)
        try:
            workers = rpc.normalize(ns.rpc)
        except ValueError as exc:
            raise UsageError(f"%gguf devices: {exc}") from None
        found = discovery.locate()
        listed = devices.machine_devices(found[0] if found else None, rpc=workers)
        rows = [{"name": d.name, "kind": d.kind, "description": d.description,
                 "free / total": f"{d.free / 2**30:.1f} / {d.total / 2**30:.1f} GiB"} for d in listed]
        footer = (f"as seen by {found[0]}" if found else
                  "no llama-server found (`gguf-provider server install`): GPUs from nvidia-smi")
        if workers and not any(d.kind == "rpc" for d in listed):
            footer += f"; no RPC device listed for {','.join(workers)}: is `gguf-provider rpc-worker` running there?"
        return _Table(rows, "no devices", footer)

    def _cmd_log(self, args: list[str]) -> None:
        """``%gguf log [debug|info|warning|error|off]``: gguf-provider's log records in the cell output (stderr)."""
        if len(args) > 1:
            raise UsageError("%gguf log [debug|info|warning|error|off]")
        if args:
            try:
                logs.enable(args[0])
            except ValueError as exc:
                raise UsageError(f"%gguf log: {exc}") from None
        h = logs.handler()
        print(f"gguf-provider log: {logging.getLevelName(h.level).lower() if h else 'off'}")

    def _cmd_list(self, args: list[str]) -> _Table:
        rows = [{"name": m.name, "size": f"{m.size_bytes / 2**20:.0f} MiB", "path": m.path}
                for m in status.local_models()]
        return _Table(rows, "no local models")

    def _cmd_unload(self, args: list[str]) -> None:
        names = list(self.models) if args == ["--all"] else (args or ([self.current] if self.current else []))
        if not names:
            raise UsageError("%gguf unload: no model is loaded")
        for name in names:
            model = self._model(name)
            model.engine.unload()
            del self.models[name]
            print(f"unloaded {name}")
        if self.current not in self.models:
            self.current = next(iter(self.models), None)

    def _cmd_use(self, args: list[str]) -> None:
        if len(args) != 1:
            raise UsageError("%gguf use NAME")
        self.current = self._model(args[0]).name
        print(f"using {self.current}")

    def _cmd_reset(self, args: list[str]) -> None:
        model = self._model(args[0] if args else None)
        model.history.clear()
        print(f"history of {model.name} cleared")

    def _cmd_history(self, args: list[str]) -> _Table:
        model = self._model(args[0] if args else None)
        rows = [{"#": i + 1, "you": t.user[:80], "model": t.reply[:80]} for i, t in enumerate(model.history)]
        return _Table(rows, f"no history for {model.name}")

    def _cmd_config(self, args: list[str]) -> _Table:
        p = _ArgParser(prog="%gguf config", add_help=False)
        p.add_argument("--system")
        p.add_argument("--temperature", type=float)
        p.add_argument("--max-tokens", type=int)
        p.add_argument("--max-time", type=float)
        ns = p.parse_args(args)
        for key in ("system", "temperature", "max_tokens", "max_time"):
            value = getattr(ns, key)
            if value is not None:
                self.settings[key] = value
        return _Table([{"setting": k, "value": v} for k, v in self.settings.items()], "")

    def _one_shot(self, prompt: str) -> None:
        """The reply streams into the output as it comes (and stays in ``_gguf_last``): nothing to return."""
        model = self._model(None)
        messages = self._messages(model, prompt, self.settings["system"], history=False)
        self._run(model, messages, self.settings["temperature"], self.settings["max_tokens"], model.reasoning,
                  max_time=self.settings["max_time"])

    # --- the cell -------------------------------------------------------------------------------------------

    def _cell(self, line: str, cell: str) -> Any:
        try:
            ns = _cell_parser().parse_args(shlex.split(line))
        except ValueError as exc:
            raise UsageError(f"%%gguf: {exc}") from None
        model = self._model(ns.name)
        prompt = cell.strip() if ns.no_interpolate else interpolate(cell.strip(), self._shell.user_ns)
        if not prompt:
            raise UsageError("%%gguf: the cell is empty: write your message below the %%gguf line")
        system = ns.system if ns.system is not None else self.settings["system"]
        key = self._cell_id or hashlib.sha256(f"{line}\n{cell}".encode()).hexdigest()[:16]
        images = tuple(image_url(v, Path.cwd()) for v in ns.image)
        messages = self._messages(model, prompt, system, history=not ns.no_history, replace_key=key, images=images)
        temperature = ns.temperature if ns.temperature is not None else self.settings["temperature"]
        max_tokens = ns.max_tokens if ns.max_tokens is not None else self.settings["max_tokens"]
        reasoning = ns.think if ns.think is not None else model.reasoning
        response_format = {"type": "json_object"} if ns.format == "json" else None
        max_time = ns.max_time if ns.max_time is not None else self.settings["max_time"]
        reply = self._run(model, messages, temperature, max_tokens, reasoning, response_format, max_time=max_time,
                          live=ns.format != "json", markdown=ns.format != "text")
        if not ns.no_history:
            self._record(model, key, prompt, reply.text, images)
        if ns.output:
            self._shell.user_ns[ns.output] = reply.text
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

    def _model(self, name: str | None) -> _Model:
        name = name or self.current
        if name is None:
            raise UsageError("%gguf: no model loaded: run %gguf load SPEC first")
        if name not in self.models:
            raise UsageError(f"%gguf: no model named {name!r} is loaded (loaded: {', '.join(self.models) or 'none'})")
        return self.models[name]

    def _messages(self, model: _Model, prompt: str, system: str | None, *, history: bool,
                  replace_key: str | None = None, images: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if history:
            for turn in model.history:
                if turn.key == replace_key:
                    break  # re-running a cell replaces its turn: the conversation up to it is the context
                messages += [{"role": "user", "content": _user_content(turn.user, turn.images)},
                             {"role": "assistant", "content": turn.reply}]
        messages.append({"role": "user", "content": _user_content(prompt, images)})
        return messages

    def _record(self, model: _Model, key: str, prompt: str, reply: str, images: tuple[str, ...] = ()) -> None:
        for i, turn in enumerate(model.history):
            if turn.key == key:
                model.history[i] = _Turn(key, prompt, reply, images)
                return
        model.history.append(_Turn(key, prompt, reply, images))

    def _run(self, model: _Model, messages: list[dict[str, Any]], temperature: float | None,
             max_tokens: int | None, reasoning: bool | None, response_format: dict[str, Any] | None = None,
             live: bool = True, markdown: bool = True, max_time: float | None = None) -> GGUFReply:
        request = chat.ChatRequest(messages=messages, params={"temperature": temperature, "max_tokens": max_tokens},
                                   reasoning=reasoning, response_format=response_format,
                                   max_time="auto" if max_time is None else max_time)  # --max-time 0: no bound
        reply = GGUFReply(model=model.name, markdown=markdown)
        out = _LiveOutput(self._shell, reply) if live else None
        text: list[str] = []
        thinking: list[str] = []
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
        if out:
            out.finish()
        self._shell.user_ns["_gguf_last"] = reply
        return reply
