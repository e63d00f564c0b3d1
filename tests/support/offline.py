"""Holds tests/unit_tests to running offline, in seconds (registered by tests/conftest.py; other tests are untouched).

A unit test gets a private empty gguf-provider home, no configured llama-server, Hugging Face and pip offline (so
neither a model fetch nor the llama.cpp source download can run), and no connection beyond this machine. A unit test
that asks for a real model, the llama.cpp source or a llama-server (``smollm2_path``, ``llama_src``, ``rt``, ...)
fails before it runs: whatever a unit test needs it writes itself (fake binaries, GGUF headers from
tests/support/gguf_bytes.py), or it belongs in tests/integration_tests.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any

import pytest

UNIT_DIR = Path(__file__).resolve().parents[1] / "unit_tests"
NEEDS_MACHINE = {
    "smollm2_path": "a model file",
    "qwen_path": "a model file",
    "gemma_path": "a model file",
    "minilm_path": "a model file",
    "projector_path": "a model file",
    "reranker_path": "a model file",
    "llama_src": "the llama.cpp source",
    "rt": "a llama-server",
}
_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1", "GGUF_PROVIDER_AUTO_INSTALL": "0"}
_UNSET = ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH", "GGUF_PROVIDER_MODELS", "GGUF_PROVIDER_RUNTIME_DIR")


def is_unit(item: pytest.Item) -> bool:
    return UNIT_DIR in Path(item.path).resolve().parents


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not is_unit(item):
        return
    needed = [f"{name} ({NEEDS_MACHINE[name]})" for name in getattr(item, "fixturenames", ()) if name in NEEDS_MACHINE]
    if needed:
        pytest.fail(f"unit tests run offline, without {', '.join(needed)}: write a fake or move the test to "
                    f"tests/integration_tests", pytrace=False)


@pytest.fixture(scope="session")
def _unit_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("unit-home")


def _local(host: Any) -> bool:
    if host is None or isinstance(host, int) or host in ("localhost", "", b"localhost"):
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _offline_unit_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if not is_unit(request.node):
        return
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(request.getfixturevalue("_unit_home")))
    for k, v in _OFFLINE_ENV.items():
        monkeypatch.setenv(k, v)
    for k in _UNSET:
        monkeypatch.delenv(k, raising=False)

    real_connect, real_connect_ex, real_getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            pytest.fail(f"unit test connects to {address}: unit tests run offline (move it to integration_tests)")

    def connect(self: socket.socket, address: Any) -> None:
        check(self, address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(self, address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _local(host):
            pytest.fail(f"unit test resolves {host!r}: unit tests run offline (move it to integration_tests)")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
