"""Attach mode (``base_url=``) against live llama-servers: nothing spawned, context read from ``/props``."""

from __future__ import annotations

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import ServerConnectionError
from gguf_provider.runtime._serve.health import props_n_ctx
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


@pytest.mark.timeout(180)  # typical ~17 s on a loaded 2-core machine; 10x
def test_attach_over_http_with_key_and_over_a_socket(rt: RuntimeEnv, free_tcp_port: int) -> None:
    tcp = Engine(EngineConfig(model_path=str(rt.model), n_ctx=2048, port=free_tcp_port))
    sock = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024))
    try:
        tcp_info, sock_info = tcp.load(), sock.load()
        assert tcp_info.address.url and sock_info.address.socket
        key = tcp_info.address.api_key
        assert key
        before = ({p.pid for p in rt.servers()}, set(rt.registry()))
        for base_url, api_key, n_ctx in ((tcp_info.address.url + "/v1", key, 2048),
                                         (sock_info.address.socket, None, 1024)):
            attached = Engine(EngineConfig(base_url=base_url, api_key=api_key, timeout=30))
            info = attached.load()
            assert info.pid == 0, "attach spawns nothing and owns nothing"
            assert attached.n_ctx == props_n_ctx(info.props) == n_ctx
            assert attached.chat(CHAT).content
            attached.unload()
        assert ({p.pid for p in rt.servers()}, set(rt.registry())) == before
        with pytest.raises(ServerConnectionError, match="check api_key"):
            Engine(EngineConfig(base_url=tcp_info.address.url, timeout=10)).load()
        with pytest.raises(ServerConnectionError, match="check api_key"):
            Engine(EngineConfig(base_url=tcp_info.address.url, api_key="wrong", timeout=10)).load()
    finally:
        tcp.unload()
        sock.unload()
