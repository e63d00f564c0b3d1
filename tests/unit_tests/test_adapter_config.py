"""Every adapter hands its server/model options to the engine under the same names (declared once in
gguf_provider/options.py, no hand-copied mapping)."""

from __future__ import annotations

from typing import Any

import pytest

from gguf_provider.engine import EngineConfig

OPTIONS: dict[str, Any] = {
    "model": "org/repo:Q8_0", "api_key": "k-secret", "n_ctx": 1024, "n_gpu_layers": 3, "server_args": ["-t", "1"],
    "keep_alive": 0, "shared": False, "llama_server": "/opt/llama-server", "timeout": 7.0, "port": 8080,
    "offline": True, "start_timeout": 5, "n_parallel": 2, "rpc_servers": ["h:1"], "token": "hf-secret",
    "max_retries": 0,
}


def _adapters() -> list[tuple[str, Any]]:
    from gguf_provider import ChatGGUF, GGUFEmbeddings
    from gguf_provider.llama_index import GGUF, GGUFEmbedding

    return [
        ("ChatGGUF", ChatGGUF(**OPTIONS, reasoning_format="x")),
        ("GGUF", GGUF(**OPTIONS, reasoning_format="x")),
        ("GGUFEmbeddings", GGUFEmbeddings(**OPTIONS, pooling="cls")),
        ("GGUFEmbedding", GGUFEmbedding(**OPTIONS, pooling="cls")),
    ]


@pytest.mark.parametrize("name", ["ChatGGUF", "GGUF", "GGUFEmbeddings", "GGUFEmbedding"])
def test_adapter_options_reach_the_engine(name: str) -> None:
    adapter = dict(_adapters())[name]
    cfg: EngineConfig = adapter.engine.config
    assert cfg.model == "org/repo:Q8_0" and cfg.api_key == "k-secret"  # secrets unwrapped for the engine
    assert (cfg.n_ctx, cfg.n_gpu_layers, cfg.keep_alive, cfg.shared) == (1024, 3, 0, False)
    assert cfg.server_args == ("-t", "1") and cfg.llama_server == "/opt/llama-server" and cfg.timeout == 7.0
    assert (cfg.port, cfg.offline, cfg.start_timeout, cfg.max_retries) == (8080, True, 5, 0)
    assert (cfg.n_parallel, cfg.rpc_servers, cfg.hf_token) == (2, ("h:1",), "hf-secret")
    if "Embedding" in name:
        assert cfg.embedding and cfg.pooling == "cls"
    else:
        assert not cfg.embedding and cfg.reasoning_format == "x"


def test_unset_options_keep_the_engine_defaults() -> None:
    from gguf_provider import ChatGGUF

    cfg = ChatGGUF(model="m", timeout=None).engine.config
    assert cfg == EngineConfig(model="m")


def test_every_adapter_takes_the_attach_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf_provider import ChatGGUF, GGUFEmbeddings
    from gguf_provider.llama_index import GGUF, GGUFEmbedding

    monkeypatch.setenv("GGUF_PROVIDER_API_KEY", "from-env")
    for cls in (ChatGGUF, GGUFEmbeddings, GGUF, GGUFEmbedding):
        adapter = cls(base_url="http://127.0.0.1:8080")  # type: ignore[call-arg]
        assert adapter.engine.config.api_key == "from-env", cls
        assert cls(base_url="http://127.0.0.1:8080", api_key="given").engine.config.api_key == "given"  # type: ignore[call-arg]
    monkeypatch.delenv("GGUF_PROVIDER_API_KEY")
    assert GGUF(base_url="http://127.0.0.1:8080").engine.config.api_key is None
