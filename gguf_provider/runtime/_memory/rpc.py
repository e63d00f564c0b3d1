"""llama.cpp RPC workers: the ``rpc-server`` processes a llama-server spreads a model over (``--rpc``).

A worker is ``host:port``. Before a server starts, :func:`probe` greets each one with the RPC protocol's HELLO and
asks for its devices' memory: an unreachable or busy worker is an :class:`RPCWorkerUnreachableError` naming it
within seconds (llama-server itself would abort with "Failed to connect"), and the memory feeds the fit. An
``rpc-server`` serves one client at a time, so a worker in use by another llama-server answers nothing: busy.

The protocol has no Python package; the few messages used here are hand-written from ggml-rpc.cpp (v7: a command
byte, a little-endian u64 size, the payload; answers are a u64 size and the payload). The protocol has no
authentication or encryption: docs/distributed.md says where a worker may listen.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from ...errors import RPCWorkerUnreachableError
from .._common.paths import exe
from .._install import installed

DEFAULT_PORT = 50052
PROTO_MAJOR = 7  # the pinned source's RPC_PROTO_MAJOR_VERSION
_HELLO, _GET_DEVICE_MEMORY, _DEVICE_COUNT = 14, 11, 15
_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: transport capabilities; zeros = plain TCP
CONNECT_TIMEOUT = 3.0
ANSWER_TIMEOUT = 5.0


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker said about itself."""

    endpoint: str
    version: str | None  # "7.0.0"; None when it speaks another protocol version
    free: tuple[int, ...] = ()  # bytes free per device
    total: tuple[int, ...] = ()

    @property
    def free_bytes(self) -> int:
        return sum(self.free)

    def offer(self) -> str:
        """The memory it offers, in words."""
        if not self.free:
            return "memory not reported"
        n = len(self.free)
        return (f"{self.free_bytes / 2**20:,.0f} MiB free of {sum(self.total) / 2**20:,.0f} MiB on {n} "
                f"device{'s' * (n > 1)}")

    def describe(self) -> str:
        return f"{self.endpoint} (RPC v{self.version or '?'}, {self.offer()})"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` (an IPv6 host in brackets); ValueError saying what is wrong."""
    text = str(endpoint).strip()
    host, sep, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"RPC worker {endpoint!r} is not host:port (e.g. 192.168.1.20:{DEFAULT_PORT})")
    return host, int(port_text)


def normalize(endpoints: object) -> tuple[str, ...]:
    """The workers as a tuple of ``host:port`` from a list, a tuple or one comma-separated string."""
    if endpoints is None or endpoints == "":
        return ()
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)  # type: ignore[call-overload]
    out = []
    for item in items:
        host, port = parse_endpoint(str(item))
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if len(set(out)) != len(out):
        raise ValueError(f"rpc_servers names a worker twice: {', '.join(out)}")
    return tuple(out)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        buf += chunk
    return bytes(buf)


def _call(sock: socket.socket, cmd: int, payload: bytes) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size > 1 << 16:
        raise ConnectionError(f"an answer of {size} bytes is not an RPC answer")
    return _recv_exact(sock, size)


def probe(endpoint: str, *, connect_timeout: float = CONNECT_TIMEOUT,
          answer_timeout: float = ANSWER_TIMEOUT) -> WorkerInfo:
    """Greet the worker and read its devices' memory; :class:`RPCWorkerUnreachableError` (naming it and why:
    refused, unresolvable, silent = busy with another client) within ``connect_timeout + answer_timeout``."""
    host, port = parse_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except OSError as exc:
        why = ("nothing listens there" if isinstance(exc, ConnectionRefusedError)
               else "the host name does not resolve" if isinstance(exc, socket.gaierror)
               else f"no answer in {connect_timeout:.0f} s" if isinstance(exc, TimeoutError) else str(exc))
        raise RPCWorkerUnreachableError(
            f"RPC worker {endpoint} cannot be reached ({why}). Start it there with `gguf-provider rpc-worker "
            f"--host HOST --port {port}` (docs/distributed.md), or drop it from rpc_servers", endpoint) from exc
    with sock:
        sock.settimeout(answer_timeout)
        try:
            answer = _call(sock, _HELLO, bytes(_CAPS_SIZE))
            if len(answer) != 4 + _CAPS_SIZE or answer[0] != PROTO_MAJOR:
                version = f"{answer[0]}.{answer[1]}.{answer[2]}" if len(answer) >= 3 else None
                return WorkerInfo(endpoint, version)
            version = f"{answer[0]}.{answer[1]}.{answer[2]}"
            (count,) = struct.unpack("<I", _call(sock, _DEVICE_COUNT, b""))
            free, total = [], []
            for device in range(min(count, 64)):
                f, t = struct.unpack("<QQ", _call(sock, _GET_DEVICE_MEMORY, struct.pack("<I", device)))
                free.append(f)
                total.append(t)
        except TimeoutError as exc:
            raise RPCWorkerUnreachableError(
                f"RPC worker {endpoint} accepted the connection but did not answer in {answer_timeout:.0f} s: it is "
                f"busy serving another llama-server (an rpc-server serves one client at a time) or it is not an "
                f"rpc-server. Stop the other server (`gguf-provider ps`), or start another worker", endpoint) from exc
        except ConnectionError:
            return WorkerInfo(endpoint, None)  # it closed on our HELLO: another protocol generation, not dead
        except (OSError, struct.error) as exc:
            raise RPCWorkerUnreachableError(f"RPC worker {endpoint} broke off the greeting ({exc})",
                                            endpoint) from exc
    return WorkerInfo(endpoint, version, tuple(free), tuple(total))


def probe_all(endpoints: tuple[str, ...]) -> list[WorkerInfo]:
    """:func:`probe` every worker; the first one that fails raises."""
    return [probe(e) for e in endpoints]


def reachable(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``endpoint`` (after a crash: which workers are gone)."""
    try:
        host, port = parse_endpoint(endpoint)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


# --- the worker process ----------------------------------------------------------------------------------------


NAMES = ("ggml-rpc-server", "rpc-server")  # llama.cpp renamed rpc-server; releases carry either


def find_rpc_server(llama_server: Path | None = None) -> Path | None:
    """The RPC worker binary beside ``llama-server`` (our install keeps both), else our newest install's, else on
    PATH; under either of its names."""
    dirs = [llama_server.parent] if llama_server else []
    inst = installed.any_installed()
    if inst is not None:
        dirs.append(inst.bin_dir)
    for d in dirs:
        for name in NAMES:
            if (d / exe(name)).is_file():
                return d / exe(name)
    found = next((w for w in map(shutil.which, map(exe, NAMES)) if w), None)
    return Path(found) if found else None


def worker_argv(binary: Path, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, threads: int | None = None,
                cache: bool = False, mem_mib: int | None = None, help_text: str = "") -> list[str]:
    """The ``rpc-server`` command line. ``mem_mib`` needs a build with ``-m/--mem`` (``help_text`` is its
    ``--help``): newer builds offer their device's memory and have no cap, which is a ValueError here."""
    argv = [str(binary), "--host", host, "--port", str(port)]
    if threads:
        argv += ["--threads", str(threads)]
    if cache:
        argv.append("--cache")
    if mem_mib is not None:
        if "--mem" not in help_text:
            raise ValueError(f"--mem: this rpc-server ({binary}) has no memory cap (llama.cpp removed `--mem`); it "
                             f"offers its device's memory as the device reports it. Leave --mem out, or keep the "
                             f"worker's memory for it by running nothing else there")
        argv += ["--mem", str(mem_mib)]
    return argv
