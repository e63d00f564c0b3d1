"""An EngineClient dropped without ``close()`` (a model object gone out of scope: langchain-tests' standard suite
builds one per test) closes its connections when it is collected, not the garbage collector later: the leak showed
as a ResourceWarning for each socket in the embeddings standard suite."""

from __future__ import annotations

import gc
import http.server
import socketserver
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_provider.client import EngineClient
from gguf_provider.runtime._common.process import Address


class _Health(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's connection stays open in its pool

    def do_GET(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:  # a Unix peer has no host to print
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "s.sock")
    server = _UnixServer(path, _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()
    thread.join()


def _collected_warnings(make: object) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        make()  # type: ignore[operator]
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_a_dropped_client_closes_its_connections(socket_path: str) -> None:
    def use_and_drop() -> None:
        client = EngineClient(Address(socket=socket_path))
        assert client.get_json("/health") == {"status": "ok"}

    assert _collected_warnings(use_and_drop) == []


def test_close_then_drop_closes_once_and_reconnects(socket_path: str) -> None:
    def use_close_reuse() -> None:
        client = EngineClient(Address(socket=socket_path))
        client.get_json("/health")
        client.close()
        client.close()
        assert client.get_json("/health") == {"status": "ok"}  # a new client after close

    assert _collected_warnings(use_close_reuse) == []
