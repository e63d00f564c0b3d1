"""P21: Claude Code's first two recorded requests (tests/fixtures/tools/claude/: its first ``/v1/messages`` request
and the next one, which extends the same conversation with a tool call and its result) replayed as they are
(system prompt, 24 tools, thinking, effort, metadata, cache_control: ~18,600 prompt tokens with Qwen's template)
through the gateway (`gguf-provider serve` with no model, ``/v1/messages``) and straight to the llama-server behind
it (its own Anthropic ``/v1/messages``), with ``max_tokens`` :data:`MAX_TOKENS`, ``stream: true`` and
temperature 0: the same body to both but for the gateway's two documented changes, made by :func:`straight` for
llama-server's endpoint (the billing block dropped, mid-conversation system messages joined to ``system``), so
that both read the same prompt and write the same reply. Qwen2.5-Coder-0.5B, ``--ctx`` :data:`N_CTX`.

- (a) the time the gateway adds to the first token, in ms (goal <= 5 ms, as P20's): each request through the
  gateway, its TTFT less the server's whole time to the first token of the request the gateway sent it, timed where
  that request leaves the gateway's process (:mod:`bench.boundary`): the median of a round's replies. Beside it, as
  the issue first put it, TTFT gateway − straight with llama-server's prompt time taken out: the median of
  :data:`TTFT_PAIRS` pairs a round, each request replayed once each way in alternating order. That pair keeps the
  server's work before its prompt timer (template, tokenization, the tools' grammar: ~90 ms here, moving by ~33 ms
  from one request to the next), so it cannot tell 5 ms from 0; the boundary's figure can. It counts the upload of
  the body to the gateway, which a straight request pays to the server too; the client's own time to first token
  (the same request to a server that answers at once, :data:`bench.boundary.NULL_SERVER`) is taken out, as a
  straight request has it as well.
  The first token: the first ``content_block_start``/``content_block_delta`` event. Taken on the replies the
  gateway streams as they come; a reply that begins like a tool call (``{"name": ...``,
  :func:`gguf_provider.tools.could_be_tool_call` of llama-server's text for the same request) is held by the
  gateway until it knows (healing, chat.py ``EventProcessor``): its delay is that hold, reported apart
  (``ttft_held_ms``), not overhead.
- (b) the second request's prompt tokens evaluated ÷ its prompt tokens, through the gateway right after the first
  went through it (goal <= 0.1: the long shared prefix is reused from the prompt cache, not read again). The same
  figure straight to llama-server is reported beside it.

The server's prompt time, and the prompt tokens it evaluated, come from llama-server's own log: the ``prompt eval
time = X ms / N tokens`` line it writes when each task ends (the log the registry names). That line is there for
every task whichever endpoint took it, so both paths are measured alike; llama-server's Anthropic stream carries no
``timings``, and the gateway's Anthropic stream carries the token counts (``usage``) only. The requests are sent
one at a time and each reply's line is read before the next request, so each line is that reply's. The prompt
tokens (b) divides by are the reply's: ``usage.input_tokens`` + ``usage.cache_read_input_tokens`` as Anthropic counts
them (llama-server's stream: the uncached part and the cached one; the gateway's stream: the whole prompt in
``input_tokens``, no cache field), checked against the other path's count of the same request.

The fixtures' prose (system prompt, tool descriptions) is replaced by generated words seeded per file, so the
second request's copy of the first's texts reads differently from the first's though every length matches: the
second request is rebuilt as Claude Code sent it, with the first's texts wherever the second repeats them at the
same place (strings of the same length in ``system``, ``tools`` and the first's messages); its own
``cache_control`` marks stay. Where the fixtures already agree this changes nothing.

The 18,600-token prefix is read cold once through each path before the rounds (minutes on two cores). The server
is pinned to its own core; the gateway process and this one share the other.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import boundary, machine
from bench.config import GOALS, ROOT, Config
from bench.log import log
from bench.rounds import adaptive
from bench.scenarios.gateway import _behind, start_gateway, stop_gateway
from bench.stats import summary

FIXTURES = (ROOT / "tests" / "fixtures" / "tools" / "claude-code", ROOT / "tests" / "fixtures" / "tools" / "claude")
MAX_TOKENS = 8
TTFT_PAIRS = (9, 1)  # pairs of the first request and of the second a round (the second's reply is held: apart)
N_CTX = 65536  # two ~18,700-token conversations (one a path, if their prompts differ) in the unified KV cache
KEEP_ALIVE = 86400  # s
READ_TIMEOUT = 7200  # s: a cold read of the prefix at one thread
NULL_REPLIES = 5  # a round's client-only replies (null_ttft), for the client's own TTFT
DROP_HEADERS = {"host", "content-length", "connection", "accept-encoding"}


# --- the requests ------------------------------------------------------------------------------------------------


def load_requests() -> tuple[dict[str, Any], dict[str, Any]]:
    """The first recorded ``POST /v1/messages`` and the next one whose messages begin with its messages (aligned:
    see the module's docstring), as fixtures (``method``, ``path``, ``query``, ``headers``, ``body``)."""
    folder = next((f for f in FIXTURES if f.is_dir() and any(f.glob("*.json"))), None)
    if folder is None:
        raise RuntimeError(f"P21: no Claude Code fixtures in {' or '.join(str(f) for f in FIXTURES)}")
    posts = [r for r in (json.loads(p.read_text()) for p in sorted(folder.glob("*.json")))
             if r.get("method") == "POST" and r.get("path") == "/v1/messages" and isinstance(r.get("body"), dict)]
    if not posts:
        raise RuntimeError(f"P21: no POST /v1/messages in {folder}")
    first = posts[0]
    n = len(first["body"]["messages"])
    for later in posts[1:]:
        body = later["body"]
        if len(body.get("messages", ())) <= n:
            continue
        aligned = {**body, **{k: _align(body[k], first["body"][k]) for k in ("system", "tools")
                              if k in body and k in first["body"]}}
        aligned["messages"] = [_align(m, f) for m, f in zip(body["messages"], first["body"]["messages"], strict=False)
                               ] + body["messages"][n:]
        if all(_bare(a) == _bare(f) for a, f in zip(aligned["messages"], first["body"]["messages"], strict=False)):
            return first, {**later, "body": aligned}
    raise RuntimeError(f"P21: no request in {folder} extends the first one's conversation")


def _align(value: Any, like: Any) -> Any:
    """``value`` with ``like``'s strings wherever both have a string of the same length at the same place."""
    if isinstance(value, dict) and isinstance(like, dict):
        return {k: _align(v, like[k]) if k in like else v for k, v in value.items()}
    if isinstance(value, list) and isinstance(like, list) and len(value) == len(like):
        return [_align(v, w) for v, w in zip(value, like, strict=True)]
    if isinstance(value, str) and isinstance(like, str) and len(value) == len(like):
        return like
    return value


def _bare(value: Any) -> Any:
    """``value`` without its ``cache_control`` marks (Claude Code moves them along the conversation)."""
    if isinstance(value, dict):
        return {k: _bare(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


# --- one reply ---------------------------------------------------------------------------------------------------


class PromptLog:
    """llama-server's prompt time and prompt tokens evaluated for each task, from its log."""

    LINE = re.compile(rb"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def read(self, timeout: float = 10.0) -> tuple[float, int]:
        """The prompt time (s) and tokens evaluated of the one task that ended since :meth:`mark`."""
        deadline = time.monotonic() + timeout
        seen = None  # when the first line was seen: a moment later, no second one may have come
        while True:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                found = self.LINE.findall(f.read())
            if len(found) > 1:
                raise RuntimeError(f"P21: {len(found)} tasks ended in {self.path} for one request")
            if found and seen is None:
                seen = time.monotonic()
            if found and seen is not None and time.monotonic() - seen > 0.02:
                return float(found[0][0]) / 1000, int(found[0][1])
            if time.monotonic() > deadline:
                raise RuntimeError(f"P21: no 'prompt eval time' line in {self.path} within {timeout} s")
            time.sleep(0.005)


class Boundary:
    """The gateway's upstream requests as :mod:`bench.boundary` timed them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        self.offset = path.stat().st_size

    def read(self, timeout: float = 10.0) -> dict[str, float]:
        """The one request timed since the last read."""
        deadline = time.monotonic() + timeout
        while True:
            found, self.offset = boundary.read(str(self.path), self.offset)
            if found:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"P21: the gateway's upstream request was not timed in {self.path}")
            time.sleep(0.002)
        if len(found) > 1:
            raise RuntimeError(f"P21: {len(found)} upstream requests timed for one request through the gateway")
        return found[0]


def reply(client: httpx.Client, req: dict[str, Any], body: dict[str, Any], plog: PromptLog,
          bound: Boundary | None = None) -> dict[str, Any]:
    """One streamed reply: TTFT (s), the server's prompt time (s), the prompt tokens it evaluated, the prompt's
    tokens (``usage.input_tokens``) and its text; through the gateway (``bound``), the time it added (s): its TTFT
    less the server's time to the first token of the request it sent."""
    plog.mark()
    first = None
    usage: dict[str, Any] = {}
    text: list[str] = []
    content = json.dumps(body).encode()  # encoded before the clock starts: the client's work, either way
    headers = {**_headers(req), "content-type": "application/json"}
    t0 = time.perf_counter()
    with client.stream("POST", req["path"], params=req.get("query") or None, content=content, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"P21: {r.status_code} from {client.base_url}: {r.read()[:1000]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            kind = ev.get("type")
            if first is None and kind in ("content_block_start", "content_block_delta"):
                first = time.perf_counter()
            if kind == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                text.append(ev["delta"]["text"])
            elif kind == "message_start":
                usage.update({k: v for k, v in (ev["message"].get("usage") or {}).items() if v})
            elif kind == "message_delta":
                usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v})
            elif kind == "error":
                raise RuntimeError(f"P21: error event from {client.base_url}: {ev}")
    if first is None:
        raise RuntimeError(f"P21: no content in the reply from {client.base_url}")
    prompt, evaluated = plog.read()
    out = {"ttft": first - t0, "prompt": prompt, "evaluated": evaluated,
           "input_tokens": usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0),
           "text": "".join(text)}
    if bound is not None:
        up = bound.read()
        out["added"] = (first - t0) - (up["first"] - up["sent"])
    return out


def null_ttft(client: httpx.Client, req: dict[str, Any], body: dict[str, Any]) -> float:
    """The client's own time to first token (ms) for this request: sent as :func:`reply` sends it, to a server
    that answers at once (:data:`bench.boundary.NULL_SERVER`)."""
    content = json.dumps(body).encode()
    headers = {**_headers(req), "content-type": "application/json"}
    first = None
    t0 = time.perf_counter()
    with client.stream("POST", req["path"], content=content, headers=headers) as r:
        for line in r.iter_lines():  # to the end, so that the connection is kept for the next, as reply()'s are
            if first is None and line.startswith("data: ") and \
                    json.loads(line[6:]).get("type") == "content_block_start":
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("P21: the null server's reply had no content_block_start")
    return (first - t0) * 1000


def held(straight_reply: dict[str, Any]) -> bool:
    """Whether the gateway holds this reply as a possible tool call: llama-server's text for the same request (its
    endpoint streams a model's untagged JSON as text) begins like one."""
    from gguf_provider.tools import could_be_tool_call

    return could_be_tool_call(straight_reply["text"])


def straight(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as llama-server's own ``/v1/messages`` must get it to read the prompt the gateway gives it: the
    gateway's two documented changes made here (docs/gateway.md, "What /v1/messages takes"): Claude Code's billing
    block dropped, and ``system``-role messages inside ``messages`` joined, in order, to ``system`` as one text
    (llama-server's endpoint would keep them in place: another prompt, another reply, no TTFT to compare)."""
    from gguf_provider.gateway.anthropic import _billed, _text

    system = body.get("system")
    texts = [_text(_billed(system), "system")] if system else []
    kept = []
    for m in body["messages"]:
        if m.get("role") == "system":
            text = _text(m.get("content"), "a system message")
            if text:
                texts.append(text)
        else:
            kept.append(m)
    return {**body, "system": "\n\n".join(texts), "messages": kept} if texts else {**body, "messages": kept}


def _headers(req: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (req.get("headers") or {}).items() if k.lower() not in DROP_HEADERS}


# --- the scenario ------------------------------------------------------------------------------------------------


def bench_claude_replay(cfg: Config, model: Path) -> dict[str, Any]:
    first, second = load_requests()
    bodies = [{**r["body"], "model": model.stem, "max_tokens": MAX_TOKENS, "stream": True, "temperature": 0}
              for r in (first, second)]
    # keep_alive: the cold read (tens of minutes on a loaded 2-core machine) included; stopped at the end
    timed = Path(tempfile.mkdtemp(prefix="p21-")) / "boundary.jsonl"
    proc, url, said = start_gateway(cfg, model, N_CTX, KEEP_ALIVE, "P21", boundary=timed)
    gw = httpx.Client(base_url=url, timeout=READ_TIMEOUT)
    try:
        # loads the model (a short request: the cold read of the long prefix comes once the server is pinned)
        gw.post("/v1/messages", json={"model": model.stem, "max_tokens": 1,
                                      "messages": [{"role": "user", "content": "Hi"}]}).raise_for_status()
        server = _behind(url)
        plog = PromptLog(Path(_log_of(server["pid"])))
        pinning = machine.pin(server["pid"])
        for tid in machine._tasks(proc.pid) if pinning.get("pinned") else ():  # the gateway beside the clients
            os.sched_setaffinity(tid, pinning["client_cores"])
        headers = {"Authorization": f"Bearer {server['key']}", "x-api-key": server["key"]} if server["key"] else {}
        if server["socket"]:
            direct = httpx.Client(base_url="http://llama-server", timeout=READ_TIMEOUT, headers=headers,
                                  transport=httpx.HTTPTransport(uds=server["socket"]))
        else:
            direct = httpx.Client(base_url=server["url"], timeout=READ_TIMEOUT, headers=headers)
        clients = {"gateway": gw, "direct": direct}
        bounds = Boundary(timed)
        null = subprocess.Popen([sys.executable, "-c", boundary.NULL_SERVER], stdout=subprocess.PIPE, text=True)
        assert null.stdout is not None
        nowhere = httpx.Client(base_url=f"http://127.0.0.1:{null.stdout.readline().strip()}", timeout=60)
        reqs = (first, second)

        sent = {"gateway": bodies, "direct": [straight(b) for b in bodies]}

        def send(who: str, i: int) -> dict[str, Any]:
            return reply(clients[who], reqs[i], sent[who][i], plog, bounds if who == "gateway" else None)

        cold: dict[str, list[dict[str, Any]]] = {}
        t0 = time.perf_counter()
        for who in ("gateway", "direct"):  # the long prefix read once through each path (its prompt may differ)
            cold[who] = [send(who, 0), send(who, 1)]
            log(f"P21 cold {who}: prompts of {cold[who][0]['input_tokens']} and {cold[who][1]['input_tokens']} "
                f"tokens, {cold[who][0]['evaluated']} and {cold[who][1]['evaluated']} evaluated, "
                f"{cold[who][0]['prompt']:.0f} s and {cold[who][1]['prompt']:.1f} s")
        warm_s = time.perf_counter() - t0
        for k in (0, 1):  # each path's count of the prompt's tokens (the usage fields' meaning) against the other's
            g, d = cold["gateway"][k]["input_tokens"], cold["direct"][k]["input_tokens"]
            if abs(g - d) > 0.01 * d:
                raise RuntimeError(f"P21: request {k + 1} counted {g} prompt tokens through the gateway, {d} straight")
        awake = machine.keep_awake(pinning.get("client_cores", []))
        added: list[float] = []  # ms: the gateway's TTFT less the server's time for its request and the client's
        client_ms: list[float] = []  # ms: the client's own TTFT (a server that costs nothing, NULL_SERVER)
        ttft: list[float] = []  # ms: (TTFT − the server's prompt time), gateway − straight, streamed replies
        ttft_wall: list[float] = []  # ms: TTFT, gateway − straight, streamed replies
        ttft_held: list[float] = []  # ms: as ttft, the replies held as a possible tool call
        held_requests: set[int] = set()
        ratio: list[float] = []  # the second request through the gateway: tokens evaluated ÷ its prompt tokens
        ratio_direct: list[float] = []  # the same straight to llama-server
        evaluated: dict[str, list[int]] = {"gateway": [], "direct": []}  # the second request's tokens evaluated
        prompt_tokens: dict[str, set[int]] = {"gateway": set(), "direct": set()}

        def step(r: int) -> None:
            diffs, walls, holds, adds = [], [], [], []
            for k, pairs in enumerate(TTFT_PAIRS):  # the first request, then the second
                for i in range(pairs):
                    order = ("gateway", "direct") if (r + i) % 2 == 0 else ("direct", "gateway")
                    got = {who: send(who, k) for who in order}
                    g, d = got["gateway"], got["direct"]
                    diff = ((g["ttft"] - g["prompt"]) - (d["ttft"] - d["prompt"])) * 1000
                    if held(d):
                        held_requests.add(k + 1)
                        holds.append(diff)
                        continue
                    diffs.append(diff)
                    walls.append((g["ttft"] - d["ttft"]) * 1000)
                    adds.append(g["added"] * 1000)
            if not diffs:
                raise RuntimeError("P21: the gateway held every reply as a possible tool call; no TTFT to compare")
            own = statistics.median(null_ttft(nowhere, reqs[0], sent["gateway"][0]) for _ in range(NULL_REPLIES))
            client_ms.append(own)
            added.append(statistics.median(adds) - own)
            ttft.append(statistics.median(diffs))
            ttft_wall.append(statistics.median(walls))
            if holds:
                ttft_held.append(statistics.median(holds))
            # (b): each path's second request right after its first, the order alternating round by round
            for who in ("gateway", "direct") if r % 2 == 0 else ("direct", "gateway"):
                send(who, 0)
                s = send(who, 1)
                (ratio if who == "gateway" else ratio_direct).append(s["evaluated"] / s["input_tokens"])
                evaluated[who].append(int(s["evaluated"]))
                prompt_tokens[who].add(int(s["input_tokens"]))
            log(f"P21 round {r + 1}: the gateway added {added[-1]:.1f} ms to the first token (the client's own "
                f"{client_ms[-1]:.1f} ms taken out); TTFT "
                f"{ttft_wall[-1]:+.1f} ms ({ttft[-1]:+.1f} ms server prompt time taken out); "
                f"second request evaluated {evaluated['gateway'][-1]} of {s['input_tokens'] if who == 'gateway' else '-'}"
                f" tokens through the gateway ({ratio[-1]:.4f}), {evaluated['direct'][-1]} straight "
                f"({ratio_direct[-1]:.4f})")

        try:
            n = adaptive(cfg, "P21", step, lambda: added, GOALS["p21_ttft"])
        finally:
            nowhere.close()
            null.kill()
            null.wait()
            awake.stop()
            machine.unpin(server["pid"])
        return {"model": model.name, "max_tokens": MAX_TOKENS, "n_ctx": N_CTX, "rounds": n, "pinning": pinning,
                "fixtures": str(Path(FIXTURES[1]).relative_to(ROOT)) if not FIXTURES[0].is_dir()
                else str(FIXTURES[0].relative_to(ROOT)),
                "prompt_tokens": {who: sorted(v) for who, v in prompt_tokens.items()},
                "cold": cold, "warm_s": warm_s,
                "ttft_added_ms": summary(added, GOALS["p21_ttft"]), "client_ttft_ms": summary(client_ms),
                "ttft_extra_ms": summary(ttft), "ttft_wall_extra_ms": summary(ttft_wall),
                "ttft_held_ms": summary(ttft_held) if ttft_held else None, "held_requests": sorted(held_requests),
                "replies": {who: [c["text"] for c in cold[who]] for who in cold},
                "prompt_ratio": summary(ratio, GOALS["p21_prompt"]), "prompt_ratio_direct": summary(ratio_direct),
                "evaluated": evaluated}
    except Exception:
        log("P21 failed; the gateway's last lines:\n" + "".join(said))
        raise
    finally:
        gw.close()
        stop_gateway(proc)


def _log_of(pid: int) -> str:
    """The log file of the llama-server with this pid (the registry's entry)."""
    from gguf_provider.runtime._serve import registry

    entry = next(e for e in registry.read().values() if e.pid == pid)
    if not entry.log:
        raise RuntimeError("P21: the server's registry entry names no log")
    return entry.log
