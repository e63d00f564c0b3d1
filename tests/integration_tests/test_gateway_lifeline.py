"""A client that leaves stops its work, and a gateway told to stop stops, over a real gateway and llama-server
(issue 61, items 3 and 4; gateway/lifeline.py).

The clients here are raw sockets: one writes a request, waits until llama-server is busy with it (its process uses
CPU), and closes. Whether the server stopped is read from the server process's CPU time, with no clock in the
assertion: it must go idle within a bound derived from the prompt speed measured on this server (llama-server
checks for a closed connection between batches; the servers here get 128-token batches), while the whole prompt
would have taken several times longer.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from tests.support.gateway import GatewayProc, gateway
from tests.support.timing import REACT

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct.Q4_1"
BATCH = 128  # llama-server's batch here: the most prompt tokens it reads between two checks of the connection
N_CTX = 8192
WORDS = 7000  # ~7,000 prompt tokens: several times the bound to read at this model's speed
# The speed is read on a shorter prompt: every cancel below comes within a prompt's first batches, where reading is
# at its fastest (attention grows with the context), so this speed gives the tighter bound; and it is read in ~20 s
# where the whole of a 7,000-word prompt took 90 s here.
SPEED_WORDS = 2000
ARGS = ("--ctx", str(N_CTX), "--server-arg=--batch-size", f"--server-arg={BATCH}", "--server-arg=--ubatch-size",
        f"--server-arg={BATCH}")
IDLE_WINDOW = 0.25  # seconds of (almost) no CPU that say a server is idle
IDLE_CPU = 0.05  # CPU seconds within that window still counted as idle (its HTTP thread, the metrics)

_VOCAB = ("river stone light window garden paper music engine forest market silver morning letter bridge "
          "winter number yellow animal button camera dinner friend island kitchen lesson mirror orange pocket "
          "rabbit summer ticket velvet wonder anchor basket candle desert feather harbor jacket lantern meadow").split()


def prompt(seed: int, words: int = WORDS) -> str:
    """Text no earlier request began with (so no cached prefix shortens it)."""
    rng = random.Random(seed)
    return f"{seed}: " + " ".join(rng.choice(_VOCAB) for _ in range(words))


@dataclass
class Speed:
    prompt_tps: float  # prompt tokens per second, as the server timed a cold prompt of SPEED_WORDS words
    prompt_tokens: int  # a prompt of WORDS words, in tokens (scaled from that prompt's)

    @property
    def bound(self) -> float:
        """Seconds from a disconnect to an idle slot: two batches at the measured speed (a busier machine), the
        idle window, and half a second for the gateway's cancel and the poll."""
        return 2 * BATCH / self.prompt_tps + IDLE_WINDOW + 0.5

    @property
    def whole(self) -> float:
        """Seconds a whole prompt of WORDS words takes at least (the speed of a shorter one)."""
        return self.prompt_tokens / self.prompt_tps


@pytest.fixture(scope="module")
def gw(smollm2_path: Path) -> Iterator[GatewayProc]:
    with gateway(smollm2_path.parent, *ARGS) as g:
        yield g


@pytest.fixture(scope="module")
def speed(gw: GatewayProc) -> Speed:
    """The server's prompt speed, read from its own timings of a cold prompt of the size the tests send."""
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", timeout=300, json={
            "model": SMOL, "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt(1, SPEED_WORDS)}]}) as r:
        last = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")][-1]
    timings = last["timings"]
    s = Speed(float(timings["prompt_per_second"]), int(last["usage"]["prompt_tokens"]) * WORDS // SPEED_WORDS)
    print(f"prompt speed {s.prompt_tps:.0f} tokens/s; {s.prompt_tokens} tokens take {s.whole:.1f} s; "
          f"the bound from a disconnect to an idle slot: {s.bound:.1f} s")
    assert s.whole > 3 * s.bound, f"the prompt ({s.whole:.1f} s) is too short to tell a cancel apart: {s}"
    return s


def server(gw: GatewayProc) -> psutil.Process:
    (proc,) = gw.servers()
    return proc


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def wait_busy(proc: psutil.Process, timeout: float) -> None:
    """Until the server computes (over half a core in a 0.3 s window)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu(proc)
        time.sleep(0.3)
        if cpu(proc) - before > 0.15:
            return
    raise AssertionError(f"llama-server did not start on the request within {timeout:.0f} s")


def idle_after(proc: psutil.Process, limit: float) -> float:
    """Seconds until the server went idle (the start of the first window of IDLE_WINDOW s with under IDLE_CPU s of
    CPU), watched for at most ``limit`` s (then ``inf``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        start, before = time.monotonic(), cpu(proc)
        time.sleep(IDLE_WINDOW)
        if cpu(proc) - before < IDLE_CPU:
            return start - t0
    return float("inf")


def raw_request(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A POST written on a socket of its own (closing it is the client leaving)."""
    u = urlsplit(url)
    sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=120)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


REQUESTS = {
    "openai-chat": ("/v1/chat/completions", lambda p, n, s: {"model": SMOL, "max_tokens": n, "stream": s,
                                                             "messages": [{"role": "user", "content": p}]}),
    "openai-completions": ("/v1/completions", lambda p, n, s: {"model": SMOL, "max_tokens": n, "stream": s,
                                                               "prompt": p}),
    "anthropic": ("/v1/messages", lambda p, n, s: {"model": SMOL, "max_tokens": n, "stream": s,
                                                   "messages": [{"role": "user", "content": p}]}),
    "ollama": ("/api/chat", lambda p, n, s: {"model": SMOL, "stream": s, "options": {"num_predict": n},
                                             "messages": [{"role": "user", "content": p}]}),
    "openai-responses": ("/v1/responses", lambda p, n, s: {"model": SMOL, "max_output_tokens": n, "stream": s,
                                                           "input": p}),
}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("protocol", list(REQUESTS))
def test_a_client_leaving_mid_prompt_cancels_the_servers_work(gw: GatewayProc, speed: Speed, protocol: str,
                                                             stream: bool) -> None:
    """Before the first byte of the reply, while llama-server reads the prompt: the slot is idle within the bound,
    where the rest of the prompt would have taken far longer."""
    path, make = REQUESTS[protocol]
    proc = server(gw)
    assert idle_after(proc, REACT) < REACT
    sock = raw_request(gw.url, path, make(prompt(random.randrange(10**9)), 4, stream))
    wait_busy(proc, REACT)
    sock.close()
    took = idle_after(proc, speed.whole)
    print(f"{protocol} {'streamed' if stream else 'whole'}: idle {took:.2f} s after the client left "
          f"(bound {speed.bound:.1f} s, the whole prompt {speed.whole:.1f} s)")
    assert took <= speed.bound, f"the server read on for {took:.1f} s after its client left: {gw.log()}"


def long_stream(gw: GatewayProc, protocol: str, marker: bytes, count: int) -> tuple[socket.socket, bytes]:
    """A streamed reply asked to run long (``ignore_eos``), read until ``marker`` came ``count`` times."""
    path, make = REQUESTS[protocol]
    sock = raw_request(gw.url, path, {**make("Count from one to a thousand.", 4000, True), "ignore_eos": True})
    got = b""
    while got.count(marker) < count:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    return sock, got


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic", "openai-completions", "openai-responses"])
def test_a_client_leaving_mid_stream_stops_the_generation(gw: GatewayProc, speed: Speed, protocol: str) -> None:
    """After a few streamed tokens of a reply asked to run long (ignore_eos): the slot is idle within the bound."""
    proc = server(gw)
    sock, got = long_stream(gw, protocol, b"data:", 5)
    assert got.startswith(b"HTTP/1.1 200")
    sock.close()
    took = idle_after(proc, 60)
    print(f"{protocol}: idle {took:.2f} s after the client left mid-stream")
    assert took <= speed.bound, f"the server generated on for {took:.1f} s after its client left: {gw.log()}"


# --- a gateway told to stop ------------------------------------------------------------------------------------

# Seconds from SIGTERM/SIGINT to the gateway's exit, with requests in prompt processing: uvicorn's graceful 5 s is
# not used up (each request is ended at once, its task given CANCEL_WAIT = 2 s to unwind), then each server's stop:
# the prompt cache's save of idle slots (<= 3 s, SAVE_BUDGET) and SIGTERM, SIGKILL after 5 s: 15 s, doubled for a
# busy machine.
STOP_BOUND = 30.0


@dataclass
class Outcome:
    status: int = 0
    body: bytes = b""


def _rest(sock: socket.socket) -> bytes:
    """What the socket gets until the other side closes; then it is closed."""
    data = b""
    with sock:
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError:
            pass
    return data


def _read_all(sock: socket.socket, out: Outcome) -> None:
    head, _, body = _rest(sock).partition(b"\r\n\r\n")
    out.status = int(head.split()[1]) if head.startswith(b"HTTP/") else 0
    out.body = body


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_gateway_told_to_stop_ends_requests_in_prompt_processing(smollm2_path: Path, sig: signal.Signals) -> None:
    """Three requests (one per protocol) in prompt processing, the gateway signalled: each is answered 503 in its
    protocol's error shape, the gateway exits within STOP_BOUND and leaves no llama-server behind (the kill
    matrix's row for a request in flight: tests/integration_tests/test_kill_matrix.py)."""
    with gateway(smollm2_path.parent, *ARGS) as gw:
        warm = httpx.post(f"{gw.url}/v1/chat/completions", timeout=300, json={
            "model": SMOL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        assert warm.status_code == 200, warm.text
        proc = server(gw)
        outcomes = {}
        readers = []
        for n, protocol in enumerate(("openai-chat", "anthropic", "ollama")):
            path, make = REQUESTS[protocol]
            sock = raw_request(gw.url, path, make(prompt(random.randrange(10**9) + n), 4, True))
            outcomes[protocol] = Outcome()
            readers.append(threading.Thread(target=_read_all, args=(sock, outcomes[protocol]), daemon=True))
            readers[-1].start()
        wait_busy(proc, REACT)
        t0 = time.monotonic()
        gw.proc.send_signal(sig)
        try:
            gw.proc.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the gateway still ran {STOP_BOUND:.0f} s after {sig.name}: {gw.log()}") from None
        took = time.monotonic() - t0
        for t in readers:
            t.join(REACT)
        print(f"{sig.name}: the gateway exited {took:.1f} s after the signal")
        assert outcomes["openai-chat"].status == 503
        assert json.loads(outcomes["openai-chat"].body)["error"]["type"] == "server_error"
        assert outcomes["anthropic"].status == 503
        assert json.loads(outcomes["anthropic"].body)["error"]["type"] == "api_error"
        assert outcomes["ollama"].status == 503 and "stopping" in json.loads(outcomes["ollama"].body)["error"]
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        # it ended as told, having removed its record (`ps`, `launch` read it): SIGTERM 0, SIGINT 130
        assert gw.proc.returncode == (0 if sig == signal.SIGTERM else 130), gw.proc.returncode
        assert not list((gw.run_dir / "gateways").glob("*.json"))


# protocol -> (a delta's marker, what its error event holds, the end event it must not reach)
STOP_EVENTS = {"anthropic": (b"event: content_block_delta", '"type":"api_error"', b"message_stop"),
               "openai-responses": (b"event: response.output_text.delta", '"code":"server_error"',
                                    b"response.completed")}


@pytest.mark.parametrize("protocol", list(STOP_EVENTS))
def test_a_gateway_told_to_stop_mid_stream_ends_the_stream_with_an_error_event(smollm2_path: Path,
                                                                               protocol: str) -> None:
    """A stream that has started gets the protocol's error event (``event: error``: Anthropic's; the Responses
    API's, numbered after the stream's last event) and ends."""
    marker, shape, end = STOP_EVENTS[protocol]
    with gateway(smollm2_path.parent, *ARGS) as gw:
        sock, got = long_stream(gw, protocol, marker, 2)
        gw.proc.send_signal(signal.SIGTERM)
        got += _rest(sock)
        gw.proc.wait(STOP_BOUND)
        events = [e for e in got.split(b"\n\n") if e.strip(b"\r\n0")]
        last = events[-1].decode(errors="replace")
        assert "event: error" in last and shape in last and "stopping" in last, last
        assert not any(end in e for e in events)
        if protocol == "openai-responses":
            numbers = [json.loads(e.split(b"data: ", 1)[1])["sequence_number"] for e in events if b"data: " in e]
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
