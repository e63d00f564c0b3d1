"""``gguf-provider launch claude|codex|opencode``: a coding agent run against the gateway, set up for this run only.

The gateway is the one named (``--url``), else one running for this user, else one started for the run and stopped
after it (the servers it loaded stay for their keep-alive, so the next launch finds the model loaded). With no
model named, one is chosen among this machine's models by :func:`choose`'s rule. What the tool needs is set in its
environment and, for Codex, as ``-c`` overrides on its command line (no secret there: the key goes in the
environment); the user's own config files are written only with ``--write-config``.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import GGUFProviderError


class LaunchError(GGUFProviderError):
    """``launch`` cannot run the tool: no model fits it, the tool is not installed, the gateway did not start."""


@dataclass(frozen=True)
class Tool:
    name: str
    exe: str
    package: str  # npm package: the install hint
    # Prompt tokens of its first request, measured with Qwen2.5's template (tests/fixtures/tools, recorded with the
    # tools' own texts: Claude Code 18,792 with its 24 tools, Codex ~8,700, opencode's agent request 7,306)
    first_request: int
    small_model: bool  # it sends some requests to a second, "small/fast" model


TOOLS: dict[str, Tool] = {
    "claude": Tool("claude", "claude", "@anthropic-ai/claude-code", 18_800, True),
    "codex": Tool("codex", "codex", "@openai/codex", 8_700, False),
    "opencode": Tool("opencode", "opencode", "opencode-ai", 7_300, True),
}
TOKENIZER_MARGIN = 1.25  # another model's tokenizer may spend more tokens on the same JSON and English than Qwen's
REPLY_TOKENS = 8192  # room for the reply (and the turns that follow) beside the first request
PROVIDER = "gguf"  # the provider's id in Codex's and opencode's configs
KEY_ENV = "GGUF_PROVIDER_API_KEY"  # Codex's env_key and opencode's {env:...}: the gateway's key, for this run


def context_for(tool: Tool) -> int:
    """The context a model needs for ``tool``: its measured first request with the tokenizer margin, and a reply,
    rounded up to a multiple of 1,024."""
    return math.ceil((tool.first_request * TOKENIZER_MARGIN + REPLY_TOKENS) / 1024) * 1024


# --- choosing a model -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str
    path: str
    size_bytes: int
    why_not: str | None  # None: it qualifies


def judge(name: str, facts: Mapping[str, Any] | None, need: int, tool: Tool,
          fits: Callable[[], str | None]) -> str | None:
    """Why the model with header ``facts`` (Runtime.identify's) cannot run ``tool`` in ``need`` tokens of context,
    or None. ``fits()``: why it does not fit this machine at that context, or None (called last: it plans)."""
    if facts is None:
        return "its file cannot be read"
    if facts.get("pooling") not in (None, 0):
        return "an embedding or reranking model"
    template = facts.get("chat_template") or ""
    if not template:
        return "its header has no chat template"
    if "tools" not in template:
        return f"its chat template takes no tools ({tool.name} works through tool calls)"
    trained = facts.get("context_length")
    if trained and trained < need:
        return f"it was trained for {trained:,} tokens of context; {tool.name} needs {need:,}"
    return fits()


def choose(candidates: Sequence[Candidate]) -> Candidate | None:
    """The rule: among the models that qualify (a chat template that takes tools, a trained context that holds the
    tool's first request and a reply, and a fit in this machine's memory at that context), the largest file (the
    most capable model the machine can run for it), ties by name."""
    ok = [c for c in candidates if c.why_not is None]
    return min(ok, key=lambda c: (-c.size_bytes, c.name)) if ok else None


def candidates(tool: Tool, need: int) -> list[Candidate]:
    """This machine's models, each judged for ``tool`` (reads headers, plans each chat model: no server starts)."""
    from .runtime import default

    rt = default()
    models = rt.models()
    facts = rt.identify([m.path for m in models], digest=False)

    def fit(path: Path) -> Callable[[], str | None]:
        def check() -> str | None:
            try:
                placed = rt.plan(str(path), n_ctx=need).plan
            except (GGUFProviderError, ValueError, OSError) as exc:
                return f"it could not be planned ({exc})"
            return None if placed.fits else (f"at {need:,} tokens of context it needs more memory than this "
                                             f"machine has free (`gguf-provider plan {path.name} --ctx {need}`)")
        return check

    return [Candidate(m.name, str(m.path), m.size_bytes, judge(m.name, f, need, tool, fit(m.path)))
            for m, f in zip(models, facts, strict=True)]


def refusal(tool: Tool, need: int, judged: Sequence[Candidate]) -> str:
    if not judged:
        return (f"no local model to run {tool.name} with: `gguf-provider pull ORG/REPO` one whose chat template "
                f"takes tools and whose context holds {need:,} tokens (Qwen2.5-Coder-7B-Instruct-GGUF, for one), or "
                f"name one: `gguf-provider launch {tool.name} MODEL`")
    lines = "\n".join(f"  {c.name}: {c.why_not}" for c in judged)
    return (f"no local model fits {tool.name} ({tool.name}'s first request is ~{tool.first_request:,} tokens; with "
            f"a reply it needs {need:,} tokens of context and tool calls):\n{lines}\nname one to use it anyway: "
            f"`gguf-provider launch {tool.name} MODEL`")


# --- the gateway ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gateway:
    url: str
    key_file: str = ""  # "": the gateway takes no key
    n_ctx: int | None = None  # its --ctx, when known (None: fitted per model)
    started: bool = False  # by this launch, for this run

    def key(self) -> str | None:
        if not self.key_file:
            return None
        from .gateway.app import read_key_file

        return read_key_file(self.key_file)


def running_gateway() -> Gateway | None:
    """A gateway running for this user (of several, the one with the highest pid), as its runtime record says."""
    from .runtime import default

    found = default().status().gateways
    if not found:
        return None
    g = max(found, key=lambda g: g.pid)
    return Gateway(g.url, g.key_file, g.n_ctx)


@contextmanager
def started_gateway(n_ctx: int, *, timeout: float = 120.0) -> Iterator[Gateway]:
    """A gateway for this run: loopback, a free port, a fresh key (a 0600 file in a 0700 temporary dir: never on a
    command line), ``--ctx n_ctx``; stopped when the body ends. ``timeout``: for its start (imports and binding, ~2 s
    on 2 cores; the model loads at the first request)."""
    import secrets

    tmp = Path(tempfile.mkdtemp(prefix="gguf-provider-launch-"))
    key_file = tmp / "key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    log = tmp / "gateway.log"
    cmd = [sys.executable, "-m", "gguf_provider.cli", "serve", "--port", "0", "--ctx", str(n_ctx),
           "--api-key-file", str(key_file)]
    from .runtime import dies_with_parent

    def stop_now(sig: int, _: object) -> None:
        raise SystemExit(128 + sig)  # the finally below stops the gateway: it runs in a session of its own

    # Until the gateway is stopped, a SIGTERM or SIGHUP to launch ends it through that finally (while the tool runs,
    # _run_tool passes them to the tool instead)
    previous = {sig: signal.signal(sig, stop_now) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with open(log, "wb") as err:
            # its own session: a Ctrl-C meant for the tool does not stop it mid-run; a SIGTERM from the kernel if
            # launch dies (kill -9): it stops as told, its record and leases given back
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=dies_with_parent(signal.SIGTERM))
        try:
            url = _await_url(proc, timeout, log)
            yield Gateway(url, str(key_file), n_ctx, started=True)
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _await_url(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> str:
    lines: queue.Queue[bytes] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.put(line)
        except (OSError, ValueError):  # closed by _stop
            pass
        lines.put(b"")

    threading.Thread(target=pump, daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=timeout)
            if not line:
                break
            found = re.match(rb"gateway at (\S+) ", line)
            if found:
                return found.group(1).decode()
    except queue.Empty:
        pass
    _stop(proc)
    tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:]) if log.exists() else ""
    raise LaunchError(f"the gateway did not start (exit code {proc.returncode}):\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)  # it gives its leases back and ends its requests (5 s graceful): measured ~1 s idle
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# --- what each tool is given ------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What a tool gets for one run: environment variables to set and to remove, arguments before the user's."""

    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    args: list[str] = field(default_factory=list)
    secret: str | None = None  # the env variable that holds the key (shown as read from its file, never printed)


def setup(tool: Tool, url: str, model: str, small: str, *, key: str | None, n_ctx: int | None) -> Setup:
    token = key or "gguf-provider"  # a gateway without a key takes any
    if tool.name == "claude":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": token, "ANTHROPIC_MODEL": model,
               "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": small, "ANTHROPIC_SMALL_FAST_MODEL": small,
               "CLAUDE_CODE_SUBAGENT_MODEL": model, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        # with ANTHROPIC_API_KEY set it would send that to the gateway (and ask whether to use it)
        return Setup(env, ("ANTHROPIC_API_KEY",), [], "ANTHROPIC_AUTH_TOKEN")
    if tool.name == "codex":
        provider = (f'{{ name = "gguf-provider", base_url = {json.dumps(url + "/v1")}, env_key = "{KEY_ENV}", '
                    'wire_api = "responses" }')
        args = ["-c", f"model_providers.{PROVIDER}={provider}", "-c", f'model_provider="{PROVIDER}"',
                "-c", f"model={json.dumps(model)}"]
        if n_ctx:
            args += ["-c", f"model_context_window={n_ctx}"]
        return Setup({KEY_ENV: token}, (), args, KEY_ENV)
    config = opencode_config(url, model, small, n_ctx=n_ctx, api_key="{env:" + KEY_ENV + "}")
    # OPENCODE_CONFIG_CONTENT is read last, over the global and the project's opencode.json
    return Setup({KEY_ENV: token, "OPENCODE_CONFIG_CONTENT": json.dumps(config)}, (), [], KEY_ENV)


def opencode_config(url: str, model: str, small: str, *, n_ctx: int | None, api_key: str) -> dict[str, Any]:
    def entry(name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "tool_call": True}
        if n_ctx:
            out["limit"] = {"context": n_ctx, "output": REPLY_TOKENS}
        return out

    return {"$schema": "https://opencode.ai/config.json", "model": f"{PROVIDER}/{model}",
            "small_model": f"{PROVIDER}/{small}",
            "provider": {PROVIDER: {"npm": "@ai-sdk/openai-compatible", "name": "gguf-provider",
                                    "options": {"baseURL": f"{url}/v1", "apiKey": api_key},
                                    "models": {name: entry(name) for name in dict.fromkeys((model, small))}}}}


def render(tool: Tool, made: Setup, gw: Gateway, user_args: Sequence[str], *, note: str) -> str:
    """``--print-env``: shell lines that set up ``tool`` as a run would (the key read from its file, not shown)."""
    out = [f"# {note}"]
    out += [f"unset {name}" for name in made.unset]
    for name, value in made.env.items():
        if name == made.secret and gw.key_file:
            out.append(f'export {name}="$(head -n1 {shlex.quote(gw.key_file)})"')
        else:
            out.append(f"export {name}={shlex.quote(value)}")
    out.append(shlex.join([tool.exe, *made.args, *user_args]))
    return "\n".join(out)


# --- the user's own config (--write-config) -----------------------------------------------------------------------

BEGIN, END = "# >>> gguf-provider launch >>>", "# <<< gguf-provider launch <<<"


def write_config(tool: Tool, url: str, model: str, small: str, *, key_file: str, n_ctx: int | None,
                 home: Path | None = None) -> tuple[Path, str]:
    """Point ``tool``'s own config at the gateway for every later run; returns the file and how to use it. The key
    is not written: Claude Code reads it from its file (``apiKeyHelper``); Codex and opencode from $GGUF_PROVIDER_
    API_KEY."""
    home = Path.home() if home is None else home
    if tool.name == "claude":
        path = home / ".claude" / "settings.json"
        data = _read_json(path)
        env = dict(data.get("env") or {})
        env.update({k: v for k, v in setup(tool, url, model, small, key=None, n_ctx=n_ctx).env.items()
                    if k != "ANTHROPIC_AUTH_TOKEN"})
        data["env"] = env
        if key_file:
            data["apiKeyHelper"] = f"head -n1 {shlex.quote(key_file)}"
        else:
            env["ANTHROPIC_AUTH_TOKEN"] = "gguf-provider"
        _write(path, json.dumps(data, indent=2) + "\n")
        return path, "claude"
    if tool.name == "codex":
        path = Path(os.environ.get("CODEX_HOME") or home / ".codex") / "config.toml"
        text = path.read_text() if path.exists() else ""
        text = re.sub(rf"\n?{re.escape(BEGIN)}.*?{re.escape(END)}\n?", "\n", text, flags=re.S).rstrip()
        key_line = f'env_key = "{KEY_ENV}"\n' if key_file else ""
        block = (f'{BEGIN}\n[model_providers.{PROVIDER}]\nname = "gguf-provider"\nbase_url = '
                 f'{json.dumps(url + "/v1")}\n{key_line}wire_api = "responses"\n\n[profiles.{PROVIDER}]\n'
                 f'model = {json.dumps(model)}\nmodel_provider = "{PROVIDER}"\n'
                 + (f"model_context_window = {n_ctx}\n" if n_ctx else "") + f"{END}\n")
        _write(path, (text + "\n\n" if text else "") + block)
        how = f"codex --profile {PROVIDER}"
        return path, (f'export {KEY_ENV}="$(head -n1 {shlex.quote(key_file)})"; {how}' if key_file else how)
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    path = config_home / "opencode" / "opencode.json"
    data = _read_json(path)
    ours = opencode_config(url, model, small, n_ctx=n_ctx, api_key="{env:" + KEY_ENV + "}" if key_file
                           else "gguf-provider")
    data.setdefault("$schema", ours["$schema"])
    data["model"], data["small_model"] = ours["model"], ours["small_model"]
    data["provider"] = {**(data.get("provider") or {}), **ours["provider"]}
    _write(path, json.dumps(data, indent=2) + "\n")
    return path, (f'export {KEY_ENV}="$(head -n1 {shlex.quote(key_file)})"; opencode' if key_file else "opencode")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{path} is not JSON that launch can merge into ({exc}); edit it by hand or move it "
                          "away") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path} holds no JSON object; edit it by hand or move it away")
    return data


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.gguf-provider.tmp")
    tmp.write_text(text)
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


# --- the command ------------------------------------------------------------------------------------------------


@dataclass
class Request:
    tool: str
    model: str | None = None
    small_model: str | None = None
    url: str | None = None
    api_key_file: str | None = None
    print_env: bool = False
    write_config: bool = False
    args: Sequence[str] = ()


def say(text: str) -> None:
    print(f"gguf-provider: {text}", file=sys.stderr, flush=True)


def pick_model(tool: Tool, need: int, named: str | None) -> tuple[str, str]:
    """The model to run (its name for the gateway) and how it was chosen."""
    if named:
        return named, "named"
    judged = candidates(tool, need)
    best = choose(judged)
    if best is None:
        raise LaunchError(refusal(tool, need, judged))
    others = sum(c.why_not is None for c in judged) - 1
    return best.name, (f"chosen: the largest of {others + 1} local models that take tools and hold {need:,} tokens"
                       if others else f"chosen: the one local model that takes tools and holds {need:,} tokens")


def run(req: Request) -> int:
    tool = TOOLS[req.tool]
    need = context_for(tool)
    model, how = pick_model(tool, need, req.model)
    small = req.small_model or model
    gw = Gateway(req.url.rstrip("/"), req.api_key_file or "") if req.url else running_gateway()
    if req.print_env or req.write_config:
        from .gateway import DEFAULT_PORT

        shown = gw or Gateway(f"http://127.0.0.1:{DEFAULT_PORT}")
        where = (f"the gateway at {shown.url}" if gw else f"no gateway runs: these lines assume one at its default "
                 f"port, `gguf-provider serve --ctx {need}`")
        if req.write_config:
            path, usage = write_config(tool, shown.url, model, small, key_file=shown.key_file,
                                       n_ctx=shown.n_ctx or (None if gw else need))
            say(f"wrote {tool.name}'s settings for {where} into {path}; run: {usage}")
        if req.print_env:
            made = setup(tool, shown.url, model, small, key=None, n_ctx=shown.n_ctx or (None if gw else need))
            print(render(tool, made, shown, req.args, note=f"{tool.name} on {model} ({how}); {where}"))
        return 0
    exe = shutil.which(tool.exe)
    if exe is None:
        raise LaunchError(f"{tool.exe} is not on PATH: install it (`npm install -g {tool.package}`) and launch again")
    if gw is not None:
        if gw.n_ctx is not None and gw.n_ctx < need:
            say(f"warning: the gateway at {gw.url} gives models {gw.n_ctx:,} tokens of context; {tool.name} needs "
                f"~{need:,} (its first request with a reply): stop it, or start one with `--ctx {need}`")
        return _run_tool(tool, exe, gw, model, small, how, req.args)
    with started_gateway(need) as started:
        return _run_tool(tool, exe, started, model, small, how, req.args)


def _run_tool(tool: Tool, exe: str, gw: Gateway, model: str, small: str, how: str, args: Sequence[str]) -> int:
    made = setup(tool, gw.url, model, small, key=gw.key(), n_ctx=gw.n_ctx)
    env = {k: v for k, v in os.environ.items() if k not in made.unset}
    env.update(made.env)
    say(f"{tool.name} on {model} ({how}) through the gateway at {gw.url}"
        + (", started for this run" if gw.started else ""))
    child = subprocess.Popen([exe, *made.args, *args], env=env)
    # The terminal's Ctrl-C reaches the tool itself (one process group): it decides what it means; launch waits.
    # A SIGTERM or SIGHUP sent to launch alone is passed to the tool; once it ends, so does a gateway started here.
    handlers = {signal.SIGINT: lambda *_: None, signal.SIGTERM: lambda sig, _: child.send_signal(sig),
                signal.SIGHUP: lambda sig, _: child.send_signal(sig)}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        rc = child.wait()
        return 128 - rc if rc < 0 else rc  # a tool ended by a signal: the shell's 128 + N
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
