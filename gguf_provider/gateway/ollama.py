"""The Ollama wire protocol, the part its clients use: ``/api/chat``, ``/api/generate``, ``/api/embed`` (and the
older ``/api/embeddings``), ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull``. Replies
stream as JSON lines (Ollama's default); ``options`` map to ours (``num_ctx`` is the server's context,
``num_predict`` max_tokens, ``temperature``, ``top_k``, ``stop``, ...), ``keep_alive`` to how long the gateway
holds the model after the request."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .. import chat
from ..events import Completion, Event, Finish, ReasoningDelta, TextDelta, Timings, ToolCallDelta, Usage
from ..tools import ToolCall
from .common import (
    WAITING,
    BadRequest,
    Waiting,
    dumps,
    field,
    has_media,
    json_body,
    kind_of,
    message_of,
    open_events,
    reading,
    report,
    streaming,
)

if TYPE_CHECKING:
    from .state import Gateway

# The Ollama API version whose subset this serves (clients such as Open WebUI read it to know what to send).
API_VERSION = "0.14.0"
MEDIA = "application/x-ndjson"
# Ollama's options -> llama-server's request fields (sampling); num_ctx and keep_alive are read apart.
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
           "min_p": "min_p", "typical_p": "typical_p", "repeat_penalty": "repeat_penalty",
           "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty", "seed": "seed", "stop": "stop", "mirostat": "mirostat",
           "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta", "tfs_z": None, "penalize_newline": None,
           "num_keep": "n_keep", "num_thread": None, "num_gpu": None, "num_batch": None, "main_gpu": None,
           "use_mmap": None, "numa": None, "low_vram": None, "num_ctx": None}
DONE = {"tool_calls": "stop", "repetition": "length"}
_DURATION = re.compile(r"^(?P<n>-?\d+(?:\.\d+)?)(?P<unit>ns|us|µs|ms|s|m|h)?$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def error(exc: BaseException) -> JSONResponse:
    return JSONResponse({"error": message_of(exc)}, status_code=kind_of(exc)[0])


def stream_error(exc: BaseException) -> bytes:
    """The error line that ends a stream already started."""
    return (dumps({"error": message_of(exc)}) + "\n").encode()


def name_of(body: dict[str, Any]) -> str:
    """The model: Ollama clients say ``model`` (older ones ``name``); a ``:latest`` tag is the name itself."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("`model` is required")
    return name.strip().removesuffix(":latest")


def keep_alive(value: Any) -> float | None:
    """Seconds from Ollama's ``keep_alive``: a number of seconds or a duration ("5m", "1h30m" is not taken, "300ms");
    negative: for ever. None: not given."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value).strip())
        if not m:
            raise BadRequest(f"`keep_alive` must be seconds or a duration such as \"5m\", not {value!r}")
        seconds = float(m["n"]) * _UNITS[m["unit"] or "s"]
    return float("inf") if seconds < 0 else seconds


def _options(body: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """llama-server's sampling fields from ``options``, and ``num_ctx``."""
    options = field(body, "options", dict, default={})
    params: dict[str, Any] = {}
    for k, v in options.items():
        if k not in OPTIONS:
            raise BadRequest(f"unknown option {k!r}; these are taken: {', '.join(sorted(OPTIONS))}")
        target = OPTIONS[k]
        if target is not None and v is not None:
            params[target] = v
    n_ctx = options.get("num_ctx")
    if n_ctx is not None and (not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 1):
        raise BadRequest(f"`num_ctx` must be a positive number of tokens, not {n_ctx!r}")
    return params, n_ctx


def _format(value: Any) -> dict[str, Any] | None:
    if value in (None, ""):
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": value}}
    raise BadRequest(f"`format` must be \"json\" or a JSON schema, not {value!r}")


def _think(value: Any) -> chat.Reasoning:
    if value is None or isinstance(value, bool):
        return value
    if value in chat.REASONING_EFFORTS:
        return str(value)
    raise BadRequest(f"`think` must be true, false, \"low\", \"medium\" or \"high\", not {value!r}")


def _images(images: Any, where: str) -> list[dict[str, Any]]:
    if images is None:
        return []
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise BadRequest(f"{where}.images must be a list of base64 strings")
    return [{"type": "image_url", "image_url": {"url": f"data:{_mime(i)};base64,{i}"}} for i in images]


def _mime(b64: str) -> str:
    head = base64.b64decode(b64[:16] + "=" * (-len(b64[:16]) % 4), validate=False)
    if head.startswith(b"\x89PNG"):
        return "image/png"
    if head.startswith(b"GIF8"):
        return "image/gif"
    if head[:4] == b"RIFF":
        return "image/webp"
    return "image/jpeg"


def messages(given: list[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI-shaped ones (images become image parts, tool calls get ids)."""
    out: list[dict[str, Any]] = []
    ids: list[str] = []  # the ids given to the last assistant message's calls, for the tool messages after it
    for i, m in enumerate(given):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}] must be an object whose role is system, user, assistant or tool")
        role, content = m["role"], m.get("content") or ""
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        msg: dict[str, Any] = {"role": role}
        images = _images(m.get("images"), f"messages[{i}]")
        msg["content"] = [{"type": "text", "text": content}, *images] if images else content
        if role == "assistant" and m.get("tool_calls"):
            ids = []
            calls = []
            for n, call in enumerate(m["tool_calls"]):
                fn = (call or {}).get("function") or {}
                ids.append(f"call_{i}_{n}")
                args = fn.get("arguments")
                calls.append({"id": ids[-1], "type": "function", "function": {
                    "name": str(fn.get("name", "")), "arguments": args if isinstance(args, str) else
                    json.dumps(args or {})}})
            msg["tool_calls"] = calls
        if role == "assistant" and m.get("thinking"):
            msg["reasoning_content"] = str(m["thinking"])
        if role == "tool":
            msg["tool_call_id"] = ids.pop(0) if ids else f"call_{i}"
        out.append(msg)
    return out


def chat_request(body: dict[str, Any], given: list[dict[str, Any]]) -> tuple[chat.ChatRequest, int | None]:
    params, n_ctx = _options(body)
    request = chat.ChatRequest(
        messages=given, tools=field(body, "tools", list, default=[]), response_format=_format(body.get("format")),
        params=params, reasoning=_think(body.get("think")))
    return request, n_ctx


def _stamp() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _done(name: str, done: Completion | None, reason: str | None, started: float, generate: bool) -> dict[str, Any]:
    u = done.usage if done else None
    t = done.timings if done else {}
    out: dict[str, Any] = {"model": name, "created_at": _stamp(), "done": True,
                           "done_reason": DONE.get(reason or "stop", reason or "stop"),
                           "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
                           "prompt_eval_count": u.prompt_tokens if u else 0,
                           "prompt_eval_duration": int(float(t.get("prompt_ms") or 0) * 1e6),
                           "eval_count": u.completion_tokens if u else 0,
                           "eval_duration": int(float(t.get("predicted_ms") or 0) * 1e6)}
    if generate:
        out["response"] = ""
    return out


def _calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        try:
            args = json.loads(c.arguments or "{}")
        except ValueError:
            args = {}
        out.append({"function": {"name": c.name, "arguments": args if isinstance(args, dict) else {}}})
    return out


def _whole(name: str, done: Completion, started: float, generate: bool) -> dict[str, Any]:
    out = _done(name, done, done.finish_reason, started, generate)
    if generate:
        out["response"] = done.content
        if done.reasoning:
            out["thinking"] = done.reasoning
    else:
        message: dict[str, Any] = {"role": "assistant", "content": done.content}
        if done.reasoning:
            message["thinking"] = done.reasoning
        if done.tool_calls:
            message["tool_calls"] = _calls(done.tool_calls)
        out["message"] = message
    return out


async def _lines(events: AsyncIterator[Event | Waiting], name: str, started: float,
                 generate: bool) -> AsyncIterator[bytes]:
    """JSON lines: one per text or thinking piece, tool calls whole (Ollama sends them so), then the final one."""
    head = f'{{"model":{json.dumps(name)},"created_at":"'
    calls: dict[int, ToolCall] = {}
    done = Completion()
    waiting = '"response":"",' if generate else '"message":{"role":"assistant","content":""},'
    try:
        async for ev in events:
            if ev is WAITING:  # the prompt is still being read: a line with no text, as a piece of it would be
                yield (f'{head}{_stamp()}",{waiting}"done":false}}\n').encode()
            elif type(ev) is TextDelta or type(ev) is ReasoningDelta:
                key = ("response" if type(ev) is TextDelta else "thinking") if generate else \
                    ("content" if type(ev) is TextDelta else "thinking")
                if generate:
                    body = '"response":"",' if key == "thinking" else ""
                    yield f'{head}{_stamp()}",{body}"{key}":{json.dumps(ev.text)},"done":false}}\n'.encode()
                else:
                    extra = ',"content":""' if key == "thinking" else ""
                    yield (f'{head}{_stamp()}","message":{{"role":"assistant"{extra},"{key}":{json.dumps(ev.text)}}},'
                           f'"done":false}}\n').encode()
            elif isinstance(ev, ToolCallDelta):
                call = calls.get(ev.index)
                if call is None:
                    calls[ev.index] = ToolCall(ev.id or "", ev.name or "", ev.arguments)
                else:
                    call.arguments += ev.arguments
            elif isinstance(ev, Finish):
                done.finish_reason = ev.reason
            elif isinstance(ev, Usage):
                done.usage = ev
            elif isinstance(ev, Timings):
                done.timings = ev.data
    except Exception as exc:  # after the first line: an error line (the status was sent)
        report(exc, "/api/chat" if not generate else "/api/generate")
        yield stream_error(exc)
        return
    if calls and not generate:
        message = {"role": "assistant", "content": "", "tool_calls": _calls([calls[i] for i in sorted(calls)])}
        yield (dumps({"model": name, "created_at": _stamp(), "message": message, "done": False}) + "\n").encode()
    final = _done(name, done, done.finish_reason, started, generate)
    if not generate:
        final["message"] = {"role": "assistant", "content": ""}
    yield (dumps(final) + "\n").encode()


async def _reply(gw: Gateway, body: dict[str, Any], request: chat.ChatRequest, n_ctx: int | None,
                 generate: bool) -> Response:
    name = name_of(body)
    started = time.monotonic()
    hold = keep_alive(body.get("keep_alive"))
    if not request.messages or (not generate and not body.get("messages")):
        # Ollama's way to load (or, with keep_alive 0, unload) a model: a request without messages or prompt.
        if hold == 0:
            await gw.pool.unload(name)
        else:
            async with gw.pool.use(name, n_ctx=n_ctx, keep_alive=hold):
                pass
        out = _done(name, None, "unload" if hold == 0 else "load", started, generate)
        if not generate:
            out["message"] = {"role": "assistant", "content": ""}
        return JSONResponse(out)
    vision = has_media(request.messages)
    if field(body, "stream", bool, default=True) is False:
        async with gw.pool.use(name, n_ctx=n_ctx, keep_alive=hold, vision=vision) as engine:
            done = await chat.acomplete(engine, request)
        return JSONResponse(_whole(name, done, started, generate))
    opened = await open_events(gw.pool.use(name, n_ctx=n_ctx, keep_alive=hold, vision=vision),
                               lambda engine: chat.astream(engine, request), wait=gw.settings.keepalive)
    return streaming(_lines(opened.events(), name, started, generate), opened, MEDIA)


async def chat_(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    with reading():
        req, n_ctx = chat_request(body, messages(field(body, "messages", list, default=[])))
    return await _reply(gw, body, req, n_ctx, generate=False)


async def generate(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    prompt = field(body, "prompt", str, default="")
    given: list[dict[str, Any]] = []
    system = field(body, "system", str)
    if system:
        given.append({"role": "system", "content": system})
    if prompt:
        images = _images(body.get("images"), "request")
        given.append({"role": "user", "content": [{"type": "text", "text": prompt}, *images] if images else prompt})
    with reading():
        req, n_ctx = chat_request(body, given)
    return await _reply(gw, body, req, n_ctx, generate=True)


async def embed(gw: Gateway, request: Request) -> Response:
    body = await json_body(request)
    name = name_of(body)
    given = body.get("input", body.get("prompt"))
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadRequest("`input` must be a text or a list of texts")
    _, n_ctx = _options(body)
    started = time.monotonic()
    async with gw.pool.use(name, "embed", keep_alive=keep_alive(body.get("keep_alive"))) as engine:
        vectors = await engine.aembed(texts, truncate=field(body, "truncate", bool, default=True))
    took = int((time.monotonic() - started) * 1e9)
    if "input" not in body:  # the older /api/embeddings: one text, "embedding"
        return JSONResponse({"embedding": vectors[0] if vectors else []})
    return JSONResponse({"model": name, "embeddings": vectors, "total_duration": took, "load_duration": 0,
                         "prompt_eval_count": 0})


def _details(facts: dict[str, Any]) -> dict[str, Any]:
    """Ollama's ``details`` from the runtime's identify of a file ({}: not known)."""
    arch = facts.get("architecture") or ""
    families = [arch, "clip"] if arch and facts.get("projector") else [arch] if arch else None
    return {"parent_model": "", "format": "gguf", "family": arch, "families": families,
            "parameter_size": facts.get("parameter_size") or "", "quantization_level": facts.get("quant") or ""}


async def tags(gw: Gateway, request: Request) -> Response:
    """Every model the gateway can serve, with its file's digest (the same for each name of one file: clients
    group by it) and header details."""
    listed = await gw.model_list(identify=True)
    return JSONResponse({"models": [{"name": m.name, "model": m.name, "modified_at": m.modified, "size": m.size,
                                     "digest": m.digest, "details": _details(m.facts or {"quant": m.quant})}
                                    for m in listed]})


async def show(gw: Gateway, request: Request) -> Response:
    """What a model is: its header's details and metadata (``model_info``), its template, and ``capabilities``:
    ``embedding`` (an embedder: its header sets a pooling; a reranker's rank pooling is neither), else
    ``completion``, ``tools`` (its chat template takes tools), ``thinking`` (a family of families.py that thinks,
    or a ``<think>`` / ``enable_thinking`` in its template), ``vision`` (a projector fit for it beside it)."""
    from .. import families

    body = await json_body(request)
    name = name_of(body)
    info = await gw.model_info(name)
    facts = info.get("identity") or {}
    template = facts.get("chat_template") or ""
    capabilities = []
    if facts.get("pooling") not in (None, 0):
        capabilities = ["embedding"] if facts.get("pooling") != 4 else []
    else:
        capabilities.append("completion")
        if "tools" in template:
            capabilities.append("tools")
        family = families.detect(template)
        if (family.thinking != "none" if family is not None else
                any(m in template for m in ("<think>", "enable_thinking", "reasoning_content"))):
            capabilities.append("thinking")
        if facts.get("projector"):
            capabilities.append("vision")
    return JSONResponse({"modelfile": "", "parameters": "", "template": info.get("chat_template") or "",
                         "details": _details(facts), "model_info": facts.get("metadata") or info.get("metadata", {}),
                         "capabilities": capabilities, "modified_at": info.get("modified")})


async def ps(gw: Gateway, request: Request) -> Response:
    """The model files the gateway holds a server for now (one entry per file, however many names or servers it
    is held under), until when (in use: a year from now, as Ollama says "for ever"), and how much of it sits on a
    GPU-like device (``size_vram``: its servers' placement; 0 when all is in RAM)."""
    from ..runtime import default as runtime
    from .state import DIGEST_WAIT

    held = gw.pool.loaded()
    infos = [h.engine.info for h in held]
    files = list(dict.fromkeys(i.model for i in infos))

    def servers() -> dict[str, dict[str, int]]:
        """Our servers by id: ``size`` (the memory counted for it: weights, projector, KV cache) and ``vram``
        (what its placement put on devices other than the CPU)."""
        return {s.id: {"size": s.charge, "vram": sum(int(p.get("bytes") or 0) for p in s.placement
                                                     if not str(p.get("device") or "CPU").upper().startswith("CPU"))}
                for s in runtime().status().servers}

    found, rows = await asyncio.gather(asyncio.to_thread(lambda: runtime().identify(files, wait=DIGEST_WAIT)),
                                       asyncio.to_thread(servers))
    by_file: dict[str, dict[str, Any]] = {}
    for h, info in zip(held, infos, strict=True):
        facts = found[files.index(info.model)] or {}
        key = facts.get("digest") or info.model
        row = rows.get(info.key[:12], {})
        until = min(h.until, time.time() + 365 * 86400)
        entry = by_file.get(key)
        if entry is None:
            by_file[key] = entry = {
                "name": h.name, "model": h.name, "size": 0, "digest": facts.get("digest") or "",
                "details": _details(facts), "size_vram": 0, "context_length": 0, "expires_at": until, "_servers": set()}
        if info.key not in entry["_servers"]:  # two names sharing one server count it once
            entry["_servers"].add(info.key)
            entry["size"] += row.get("size") or _size(info.model)
            entry["size_vram"] += row.get("vram", 0)
        entry["context_length"] = max(entry["context_length"], h.engine.n_ctx)
        entry["expires_at"] = max(entry["expires_at"], until)
    out = []
    for entry in by_file.values():
        entry.pop("_servers")
        entry["expires_at"] = datetime.fromtimestamp(entry["expires_at"], timezone.utc).isoformat().replace(
            "+00:00", "Z")
        out.append(entry)
    return JSONResponse({"models": out})


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


async def version(gw: Gateway, request: Request) -> Response:
    return JSONResponse({"version": API_VERSION, "gguf_provider": _our_version()})


def _our_version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("gguf-provider")
    except PackageNotFoundError:
        return "unknown"


async def pull(gw: Gateway, request: Request) -> Response:
    """Download a Hugging Face model into the cache, its progress streamed as Ollama's pull does."""
    body = await json_body(request)
    name = name_of(body)
    stream = field(body, "stream", bool, default=True)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def progress(stage: str, done: int, total: int, detail: str = "") -> None:
        if stage == "download":
            loop.call_soon_threadsafe(queue.put_nowait, {"status": f"pulling {detail or name}", "digest": detail,
                                                         "total": total, "completed": done})

    work = asyncio.ensure_future(gw.pull(name, progress))
    if not stream:
        await work
        return JSONResponse({"status": "success"})
    work.add_done_callback(lambda _: queue.put_nowait(None))

    async def lines() -> AsyncIterator[bytes]:
        yield (dumps({"status": "pulling manifest"}) + "\n").encode()
        while (item := await queue.get()) is not None:
            yield (dumps(item) + "\n").encode()
        try:
            work.result()
        except Exception as exc:
            yield (dumps({"error": message_of(exc)}) + "\n").encode()
            return
        yield (dumps({"status": "success"}) + "\n").encode()

    await asyncio.wait({work}, timeout=0.05)  # an error at once (a name that is no repo) is an HTTP error
    if work.done() and (exc := work.exception()) is not None:
        raise exc
    return StreamingResponse(lines(), media_type=MEDIA)
