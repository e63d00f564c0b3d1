"""Record what the real coding tools send to a model server, as fixtures under tests/fixtures/tools/<tool>/.

A small HTTP server stands in for the gateway: it logs every request (method, path, query, headers without
credentials, JSON body) and answers each with a minimal valid reply in its protocol: ``HEAD /`` 200, a model list
for ``GET /v1/models``, Anthropic Messages (SSE when asked) for ``POST /v1/messages``, OpenAI chat completions (SSE
when asked) for ``POST /v1/chat/completions``, OpenAI Responses (SSE when asked) for ``POST /v1/responses``. The
first request that offers the tool named in :data:`RECIPES` is answered with a call of that tool (reading
``notes.txt`` in the tool's working dir), so the tool runs it and its next request carries the result: a second
turn, recorded too.

Each tool (installed by scripts/test_tools.py) runs once, non-interactively, in a temp working dir with a temp
HOME. The requests are written as ``NN-<path>.json`` (``{"method", "path", "query", "headers", "body"}``) with the
tools' own texts (system prompts, tool and property descriptions, reminders they add to the conversation) replaced
by seeded generated words of the same length, line by line: their shape (fields, roles, block types, the tool
schemas' structure, sizes) is kept, their authors' prose is not ours to ship. What is ours stays: the prompt, the
file's content and the tools' results of reading it, the recorder's replies.

Usage: ``python scripts/record_tool_requests.py [claude|opencode|aider|codex|all] ...`` (writes the fixtures; the raw,
unscrubbed requests go only to a temp dir, printed).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.test_tools import TOOLS, ensure  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "tools"
MODEL = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"  # the gateway's name for the test model: the fixtures replay as they are
WORKDIR = "/tmp/tool-work"  # the tool's temp working dir is written as this in the fixtures
NOTES = "The launch code is 4711.\nNothing else is in this file.\n"
PROMPT = "Read notes.txt and tell me the launch code it contains. Answer with the number only."
AIDER_PROMPT = "Add a line 'Checked.' at the end of notes.txt."
REPLY = "4711"
DROP_HEADERS = {"authorization", "x-api-key", "cookie", "host", "content-length", "connection"}
# tool name offered by the tool -> arguments of the recorder's call of it
RECIPES: dict[str, tuple[str, dict[str, str]]] = {
    "claude": ("Read", {"file_path": f"{WORKDIR}/notes.txt"}),
    "opencode": ("read", {"filePath": f"{WORKDIR}/notes.txt"}),
    "codex": ("exec_command", {"cmd": "cat notes.txt"}),
}


# --- the recording server ---------------------------------------------------------------------------------------


class Recorder:
    def __init__(self, tool: str, workdir: Path) -> None:
        self.tool = tool
        self.workdir = workdir
        self.requests: list[dict[str, Any]] = []
        self.called = False  # the tool call of RECIPES was answered once
        self.lock = threading.Lock()

    def tool_call_for(self, offered: list[str], body: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
        recipe = RECIPES.get(self.tool)
        with self.lock:
            if recipe is None or self.called or recipe[0] not in offered:
                return None
            self.called = True
        name, args = recipe
        return name, {k: v.replace(WORKDIR, str(self.workdir)) for k, v in args.items()}


def _sse(handler: BaseHTTPRequestHandler, events: list[tuple[str | None, Any]]) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    for event, data in events:
        chunk = (f"event: {event}\n" if event else "") + "data: " + (data if isinstance(data, str) else json.dumps(data))
        handler.wfile.write((chunk + "\n\n").encode())
        handler.wfile.flush()
    handler.close_connection = True


def _json(handler: BaseHTTPRequestHandler, obj: Any, status: int = 200) -> None:
    raw = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


def anthropic_reply(handler: BaseHTTPRequestHandler, body: dict[str, Any], call: tuple[str, dict[str, str]] | None) -> None:
    mid = "msg_" + uuid.uuid4().hex[:24]
    usage = {"input_tokens": 100, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    if call is not None:
        block: dict[str, Any] = {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": call[0], "input": {}}
        stop = "tool_use"
    else:
        block, stop = {"type": "text", "text": ""}, "end_turn"
    if not body.get("stream"):
        whole = {**block, "input": call[1]} if call is not None else {"type": "text", "text": REPLY}
        _json(handler, {"id": mid, "type": "message", "role": "assistant", "model": body.get("model", MODEL),
                        "content": [whole], "stop_reason": stop, "stop_sequence": None, "usage": usage})
        return
    delta = {"type": "input_json_delta", "partial_json": json.dumps(call[1])} if call is not None \
        else {"type": "text_delta", "text": REPLY}
    _sse(handler, [
        ("message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": body.get("model", MODEL), "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("ping", {"type": "ping"}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def openai_reply(handler: BaseHTTPRequestHandler, body: dict[str, Any], call: tuple[str, dict[str, str]] | None,
                 text: str) -> None:
    cid, now, model = "chatcmpl-" + uuid.uuid4().hex[:24], int(time.time()), body.get("model", MODEL)
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    tool_call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                 "function": {"name": call[0], "arguments": json.dumps(call[1])}} if call is not None else None
    finish = "tool_calls" if call is not None else "stop"
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": None if call else text}
        if tool_call:
            message["tool_calls"] = [tool_call]
        _json(handler, {"id": cid, "object": "chat.completion", "created": now, "model": model,
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
        return

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    if tool_call is not None:
        events.append((None, chunk({"tool_calls": [{"index": 0, **tool_call}]})))
    else:
        events.append((None, chunk({"content": text})))
    events.append((None, chunk({}, finish)))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                              "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    _sse(handler, events)


def responses_reply(handler: BaseHTTPRequestHandler, body: dict[str, Any], call: tuple[str, dict[str, str]] | None,
                    text: str) -> None:
    """A Responses API reply: one message, or one function call; its events as OpenAI streams them."""
    rid, now, model = "resp_" + uuid.uuid4().hex[:24], int(time.time()), body.get("model", MODEL)
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 105}
    head = {"id": rid, "object": "response", "created_at": now, "model": model, "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None}
    if call is not None:
        item: dict[str, Any] = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:24], "status": "completed",
                                "call_id": "call_" + uuid.uuid4().hex[:24], "name": call[0],
                                "arguments": json.dumps(call[1])}
    else:
        item = {"type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
    done = {**head, "status": "completed", "output": [item], "usage": usage}
    if not body.get("stream"):
        _json(handler, done)
        return
    opened = {**item, "status": "in_progress"}
    steps: list[dict[str, Any]] = [{"type": "response.created", "response": {**head, "status": "in_progress"}},
                                   {"type": "response.in_progress", "response": {**head, "status": "in_progress"}}]
    where = {"item_id": item["id"], "output_index": 0}
    if call is not None:
        steps += [{"type": "response.output_item.added", "output_index": 0, "item": {**opened, "arguments": ""}},
                  {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
                  {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"],
                   "name": item["name"]}]
    else:
        part = {"type": "output_text", "text": "", "annotations": []}
        at = {**where, "content_index": 0}
        steps += [{"type": "response.output_item.added", "output_index": 0, "item": {**opened, "content": []}},
                  {"type": "response.content_part.added", **at, "part": part},
                  {"type": "response.output_text.delta", **at, "delta": text, "logprobs": []},
                  {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
                  {"type": "response.content_part.done", **at, "part": {**part, "text": text}}]
    steps += [{"type": "response.output_item.done", "output_index": 0, "item": item},
              {"type": "response.completed", "response": done}]
    _sse(handler, [(step["type"], {**step, "sequence_number": i}) for i, step in enumerate(steps)])


def make_handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _record(self) -> dict[str, Any] | None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            url = urlsplit(self.path)
            rec.requests.append({
                "method": self.command, "path": url.path, "query": dict(parse_qsl(url.query, keep_blank_values=True)),
                "headers": {k.lower(): v for k, v in self.headers.items() if k.lower() not in DROP_HEADERS},
                "body": body})
            return body if isinstance(body, dict) else None

        def do_HEAD(self) -> None:
            self._record()
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self._record()
            path = urlsplit(self.path).path
            if path.endswith("/models"):
                entry = {"id": MODEL, "object": "model", "created": 0, "owned_by": "gguf-provider", "type": "model",
                         "display_name": MODEL, "created_at": "2026-01-01T00:00:00Z"}
                _json(self, {"object": "list", "data": [entry], "has_more": False, "first_id": MODEL,
                             "last_id": MODEL})
            elif path == "/":
                _json(self, {"status": "ok"})
            else:
                _json(self, {"error": {"message": f"no {path}"}}, 404)

        def do_POST(self) -> None:
            body = self._record() or {}
            path = urlsplit(self.path).path
            offered = [t.get("name") or (t.get("function") or {}).get("name") for t in body.get("tools") or []]
            if path.endswith("/messages/count_tokens"):
                _json(self, {"input_tokens": 100})
            elif path.endswith("/messages"):
                anthropic_reply(self, body, rec.tool_call_for(offered, body))
            elif path.endswith("/chat/completions"):
                text = REPLY if rec.tool != "aider" else aider_edit()
                openai_reply(self, body, rec.tool_call_for(offered, body), text)
            elif path.endswith("/responses"):
                responses_reply(self, body, rec.tool_call_for(offered, body), REPLY)
            else:
                _json(self, {"error": {"message": f"no {path}"}}, 404)

    return Handler


def aider_edit() -> str:
    """A reply in aider's `whole` edit format (its format for an unknown model): the file's name, then all of it."""
    return ("notes.txt\n```\n" + NOTES + "Checked.\n```\n")


# --- running each tool ------------------------------------------------------------------------------------------


def run_tool(tool: str, url: str, work: Path, home: Path) -> subprocess.CompletedProcess[str]:
    exe = str(ensure(tool))
    # opencode takes its project dir from $PWD, not from its cwd
    env = {**os.environ, "HOME": str(home), "PWD": str(work), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local/state")}
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        env.pop(var, None)
    if tool == "claude":
        env.update(claude_env(url))
        cmd = [exe, "-p", PROMPT, "--model", MODEL, "--output-format", "json"]
    elif tool == "opencode":
        write_opencode_config(work, url)
        env.update({"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1"})
        cmd = [exe, "run", PROMPT]
    elif tool == "codex":
        env.update(codex_env(home, url))
        cmd = codex_cmd(exe, PROMPT)
    else:
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        cmd = aider_cmd(exe, url, AIDER_PROMPT)
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def claude_env(url: str) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": "x", "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1"}


def write_opencode_config(work: Path, url: str, output_limit: int | None = None) -> None:
    """opencode.json in ``work``: a provider through @ai-sdk/openai-compatible at ``url``; ``output_limit``: the
    model's ``limit`` (its context, 32k as the tests' gateway, and the reply's tokens; none: opencode's 32,000)."""
    model: dict[str, object] = {"name": MODEL}
    if output_limit is not None:
        model["limit"] = {"context": 32768, "output": output_limit}
    config = {"$schema": "https://opencode.ai/config.json", "model": f"gguf/{MODEL}", "small_model": f"gguf/{MODEL}",
              "autoupdate": False, "share": "disabled",
              "provider": {"gguf": {"npm": "@ai-sdk/openai-compatible", "name": "gguf-provider",
                                    "options": {"baseURL": f"{url}/v1", "apiKey": "x"},
                                    "models": {MODEL: model}}}}
    (work / "opencode.json").write_text(json.dumps(config, indent=2))


def codex_env(home: Path, url: str) -> dict[str, str]:
    """A CODEX_HOME under ``home`` whose config.toml names the server at ``url`` as the provider ``local``, over the
    Responses API (Codex's only wire API), its key in LOCAL_KEY."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "local"\ncheck_for_update_on_startup = false\n\n'
        f'[model_providers.local]\nname = "local"\nbase_url = "{url}/v1"\nenv_key = "LOCAL_KEY"\n'
        'wire_api = "responses"\n\n[analytics]\nenabled = false\n')
    return {"CODEX_HOME": str(codex_home), "LOCAL_KEY": "x"}


def codex_cmd(exe: str, prompt: str) -> list[str]:
    return [exe, "exec", "--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only", "--color", "never", prompt]


def aider_cmd(exe: str, url: str, message: str) -> list[str]:
    return [exe, "--openai-api-base", f"{url}/v1", "--openai-api-key", "x", "--model", f"openai/{MODEL}", "--no-git",
            "--no-check-update", "--analytics-disable", "--yes-always", "--no-show-model-warnings",
            "--no-auto-lint", "--no-pretty", "--message", message,
            "notes.txt"]


# --- scrubbing: the tools' own texts become generated text of the same length ------------------------------------

WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore "
         "magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip ex ea commodo "
         "consequat duis aute irure in reprehenderit voluptate velit esse cillum fugiat nulla pariatur excepteur "
         "sint occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est laborum").split()


def filler(text: str, seed: str) -> str:
    """Words of the same length as ``text``, line by line (its line breaks, each line's indent and the lines without
    words kept), seeded."""
    rnd = random.Random(seed)
    out = []
    for line in text.split("\n"):
        if not re.search(r"[A-Za-z]", line):  # no words (a fence, a rule, numbers): kept
            out.append(line)
            continue
        body = line.lstrip(" \t")
        indent = line[: len(line) - len(body)]
        words: list[str] = []
        size = 0
        while size < len(body):
            w = rnd.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        out.append(indent + " ".join(words)[: len(body)].rstrip().ljust(len(body), "."))
    return "\n".join(out)


class Scrubber:
    """Replaces every prose string of a request body that is not ours; keeps structure, names, enums, ids."""

    PROSE_KEYS = {"text", "content", "description", "system", "title", "instructions", "reasoning"}

    def __init__(self, seed: str, ours: list[str], workdir: Path) -> None:
        self.seed = seed
        self.workdir = str(workdir)
        self.ours = [s for s in ours if s]

    def __call__(self, value: Any, path: str = "$", key: str = "") -> Any:
        if isinstance(value, dict) and (value.get("type") in ("tool_result", "function_call_output")
                                        or value.get("role") == "tool"):
            return self.keep(value)  # the output of running a tool on our file: ours
        if isinstance(value, dict):
            return {k: self(v, f"{path}.{k}", k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v, f"{path}[{i}]", key) for i, v in enumerate(value)]
        if isinstance(value, str):
            value = value.replace(self.workdir, WORKDIR)
            if key in self.PROSE_KEYS:
                return self.prose(value, path)
        return value

    def keep(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.keep(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.keep(v) for v in value]
        return value.replace(self.workdir, WORKDIR) if isinstance(value, str) else value

    def prose(self, text: str, path: str) -> str:
        """Our strings stay; in a string that holds one of ours, only the rest is replaced."""
        if not re.search(r"[A-Za-z]", text) or text in self.ours:  # no words: punctuation, numbers, nothing
            return text
        if text.startswith("x-anthropic-billing-header:"):  # Claude Code's billing tag: a tag, not prose
            return text
        for mine in sorted(self.ours, key=len, reverse=True):
            if mine in text:
                head, _, tail = text.partition(mine)
                return self.prose(head, path + "<") + mine + self.prose(tail, path + ">")
        # seeded by the text itself: the same text gets the same words in every request (a later turn repeats the
        # earlier one's prefix, and a server's prompt cache must see the same prefix in the fixtures too)
        return filler(text, f"{self.seed}:{hashlib.sha256(text.encode()).hexdigest()}")


def scrub_metadata(body: Any) -> Any:
    """Ids that name this machine or session (Claude Code's metadata.user_id) become fixed ones of the same shape."""
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict) and "user_id" in body["metadata"]:
        meta = body["metadata"]
        try:
            ids = json.loads(meta["user_id"])  # Claude Code 2.1: a JSON object of device, account and session ids
        except ValueError:
            ids = None
        if isinstance(ids, dict):
            meta["user_id"] = json.dumps({k: re.sub(r"[0-9a-f]", "0", v) if isinstance(v, str) else v
                                          for k, v in ids.items()}, separators=(",", ":"))
        else:
            meta["user_id"] = re.sub(r"[0-9a-f]", "0", str(meta["user_id"]))
    return body


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def zero_uuids(value: Any) -> Any:
    """Every UUID in ``value`` zeroed: Codex sends its installation, session, thread and turn ids in headers, in
    ``client_metadata``, ``prompt_cache_key`` and its items' ids (the dashes and the length are kept)."""
    if isinstance(value, dict):
        return {k: zero_uuids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [zero_uuids(v) for v in value]
    if isinstance(value, str):
        return UUID.sub(lambda m: re.sub(r"[0-9a-f]", "0", m.group()), value)
    return value


def fixture_name(i: int, req: dict[str, Any]) -> str:
    path = req["path"].strip("/").replace("/", "-") or "root"
    return f"{i:02d}-{req['method'].lower()}-{path}.json"


def write_fixtures(tool: str, rec: Recorder, ours: list[str]) -> list[Path]:
    out = FIXTURES / tool
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    written = []
    for i, req in enumerate(rec.requests, 1):
        name = fixture_name(i, req)
        scrub = Scrubber(tool, ours, rec.workdir)
        headers = {k: v for k, v in req["headers"].items() if k not in ("x-claude-code-session-id",)}
        if "x-claude-code-session-id" in req["headers"]:
            headers["x-claude-code-session-id"] = "00000000-0000-0000-0000-000000000000"
        fixture = zero_uuids({"method": req["method"], "path": req["path"], "query": req["query"],
                              "headers": headers, "body": scrub_metadata(scrub(req["body"]))})
        (out / name).write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        written.append(out / name)
    return written


def record(tool: str) -> list[Path]:
    work = Path(tempfile.mkdtemp(prefix="tool-work-"))
    home = Path(tempfile.mkdtemp(prefix="tool-home-"))
    (work / "notes.txt").write_text(NOTES)
    rec = Recorder(tool, work)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(rec))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        t0 = time.monotonic()
        proc = run_tool(tool, url, work, home)
        took = time.monotonic() - t0
    finally:
        server.shutdown()
    raw = Path(tempfile.mkdtemp(prefix=f"raw-{tool}-")) / "requests.json"
    raw.write_text(json.dumps(rec.requests, indent=1))
    print(f"{tool}: exit {proc.returncode} in {took:.1f}s, {len(rec.requests)} requests (raw: {raw})")
    print("  stdout:", proc.stdout.strip()[-1500:])
    if proc.returncode != 0:
        print("  stderr:", proc.stderr.strip()[-3000:])
    # ours: the prompts, the file and the replies the recorder gave (a tool echoes them back in later turns)
    ours = [PROMPT, AIDER_PROMPT, NOTES, NOTES.strip(), REPLY, aider_edit(), *NOTES.splitlines()]
    files = write_fixtures(tool, rec, ours)
    for f in files:
        print(f"  {f.relative_to(ROOT)} ({f.stat().st_size} bytes)")
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed")
    return files


def main(argv: list[str]) -> int:
    keys = argv or ["all"]
    if "all" in keys:
        keys = list(TOOLS)
    for key in keys:
        record(key)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
