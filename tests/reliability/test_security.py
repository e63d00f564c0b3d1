"""Private dirs and files, API keys off command lines, no inherited LLAMA_ARG_*, port collisions (real server)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import httpx
import psutil
import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime._serve import registry
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}
# A start and a few short requests: ~1 s idle, up to 19 s seen beside two CPU hogs (too close to speed_timeout's
# 30 s floor); 10x+.
TIMEOUT = 300


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _props_n_ctx(h: httpx.Client) -> int:
    return int(h.get("/props").json()["default_generation_settings"]["n_ctx"])


@pytest.mark.timeout(TIMEOUT)
def test_socket_mode_private_files_and_scrubbed_env(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    os.chmod(rt.run_dir, 0o755)  # a lax pre-existing dir is tightened
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "128")
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "3")
    monkeypatch.setenv("LLAMA_API_KEY", "inherited-key")
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=2048))
    try:
        info = engine.info
        assert info.address.socket is not None and info.address.url is None
        sock = Path(info.address.socket)
        assert sock.parent == rt.run_dir and stat.S_ISSOCK(os.stat(sock).st_mode)
        assert _mode(rt.run_dir) == 0o700
        assert _mode(registry.registry_path()) == 0o600
        assert info.log_path.parent == rt.run_dir  # logs (prompts may show up there) sit in the 0700 dir too

        # Nothing of LLAMA_ARG_* / LLAMA_API_KEY reached the server: it has the context we asked for and no key.
        env = psutil.Process(info.pid).environ()
        assert not [k for k in env if k.startswith("LLAMA_ARG_") or k == "LLAMA_API_KEY"]
        # /props and /v1/models of an idle server: ~ms, 10 s is 100x+.
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x", timeout=10) as h:
            assert _props_n_ctx(h) == 2048
            assert h.get("/props").json()["total_slots"] != 3
            assert h.get("/v1/models").status_code == 200
        assert engine.n_ctx == 2048
        assert engine.chat(CHAT).content
    finally:
        engine.unload()


@pytest.mark.timeout(TIMEOUT)
def test_tcp_mode_requires_the_key_which_is_in_no_argv(rt: RuntimeEnv) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=2048, port=port))
    try:
        info = engine.info
        assert info.address.url == f"http://127.0.0.1:{port}"
        key = info.address.api_key
        assert key and len(key) >= 32
        entry = rt.registry()[info.key]
        key_file = Path(entry["api_key_file"])
        assert key_file.parent == rt.run_dir
        assert _mode(key_file) == 0o600 and key_file.read_text().strip() == key
        assert key not in Path(registry.registry_path()).read_text(), "the registry holds the key file, not the key"

        body = {"messages": CHAT["messages"], "max_tokens": 2}
        # 401s and one 2-token reply from an idle server: ~0.1 s, 30 s is 100x+.
        with httpx.Client(base_url=info.address.url, timeout=30) as h:
            assert h.post("/v1/chat/completions", json=body).status_code == 401
            assert h.get("/props").status_code == 401
            assert h.post("/v1/chat/completions", json=body,
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
            ok = h.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        assert engine.chat(CHAT).content

        # The key appears on no command line (nor in the server's environment).
        for p in psutil.process_iter():
            try:
                assert key not in " ".join(p.cmdline()), p
            except psutil.Error:
                pass
        assert "--api-key-file" in psutil.Process(info.pid).cmdline()
        assert key not in "".join(psutil.Process(info.pid).environ().values())
    finally:
        engine.unload()
    assert not key_file.exists(), "the key file goes with its server"


@pytest.mark.timeout(TIMEOUT)
def test_port_in_use_picks_another_port(rt: RuntimeEnv) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=2048, port=port))
        try:
            url = engine.info.address.url
            assert url is not None and url.startswith("http://127.0.0.1:")
            assert int(url.rsplit(":", 1)[1]) != port
            assert engine.chat(CHAT).content
        finally:
            engine.unload()
