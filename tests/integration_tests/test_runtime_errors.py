"""Typed errors that say what to do, each raised within its timeout (real llama-server)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gguf_provider.client import EngineClient
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import (
    ContextOverflowError,
    GGUFFormatError,
    MissingShardError,
    ServerConnectionError,
    ServerStartError,
)
from gguf_provider.runtime._serve import manager as mgr
from gguf_provider.runtime._serve.server_options import ServerSpec
from tests.support.runtime import RuntimeEnv
from tests.support.timing import REACT

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def _nothing_started(rt: RuntimeEnv) -> None:
    assert rt.servers() == []
    assert rt.registry() == {}
    assert not list(rt.run_dir.glob("*.log")), "no server may have been spawned"


@pytest.mark.timeout(60)
def test_non_gguf_file_is_refused_before_spawn(rt: RuntimeEnv, tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are my notes, not a model\n" * 10)
    t0 = time.monotonic()
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        Engine(EngineConfig(model_path=str(bad), n_ctx=2048)).chat(CHAT)
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):  # the manager checks too, not only Engine
        mgr.get_manager().acquire(ServerSpec(model=bad, n_ctx=2048))
    took = time.monotonic() - t0
    assert took < 5  # typical ~0.14 s on a loaded 2-core machine; 35x
    _nothing_started(rt)


@pytest.mark.timeout(60)
def test_file_truncated_in_header_is_refused_before_spawn(rt: RuntimeEnv, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(rt.model, "rb") as f:
        cut.write_bytes(f.read(300_000))  # inside the tokenizer's arrays
    with pytest.raises(GGUFFormatError, match="truncated|more than the file can hold"):
        Engine(EngineConfig(model_path=str(cut), n_ctx=2048)).chat(CHAT)
    _nothing_started(rt)


@pytest.mark.timeout(60)
def test_file_truncated_in_tensor_data_is_a_format_error(rt: RuntimeEnv, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(rt.model, "rb") as f:
        cut.write_bytes(f.read(rt.model.stat().st_size * 6 // 10))
    t0 = time.monotonic()
    with pytest.raises(GGUFFormatError, match="truncated or corrupted.*download it again") as ei:
        Engine(EngineConfig(model_path=str(cut), n_ctx=2048)).chat(CHAT)
    took = time.monotonic() - t0
    assert took < 20  # the server's exit, not its 600 s start timeout: typical ~0.3 s under load; 70x
    assert isinstance(ei.value.__cause__, ServerStartError)
    assert "not within the file bounds" in ei.value.__cause__.log_tail
    assert rt.servers() == [] and rt.registry() == {}


@pytest.fixture(scope="module")
def split_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Path]:
    from gguf_provider.runtime._install import discovery

    tool = discovery.find_llama_server().with_name("llama-gguf-split")
    if not tool.is_file():
        pytest.skip("llama-gguf-split was not built next to llama-server")
    d = tmp_path_factory.mktemp("split")
    subprocess.run([str(tool), "--split", "--split-max-size", "40M", str(smollm2_path), str(d / "smol")],
                   check=True, capture_output=True, timeout=120)
    shards = sorted(d.glob("smol-*-of-*.gguf"))
    assert len(shards) == 3, shards
    yield shards[0]
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(60)
def test_missing_shard(rt: RuntimeEnv, split_model: Path, tmp_path: Path) -> None:
    d = tmp_path / "partial"
    d.mkdir()
    for shard in split_model.parent.glob("smol-*.gguf"):
        if "00002" not in shard.name:
            (d / shard.name).symlink_to(shard)
    with pytest.raises(MissingShardError, match=r"smol-00002-of-00003\.gguf.*Download every shard"):
        Engine(EngineConfig(model_path=str(d / split_model.name), n_ctx=2048)).chat(CHAT)
    _nothing_started(rt)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("server_args", [(), ("--context-shift",)], ids=["ends-at-context", "context-shift"])
def test_prompt_longer_than_context_is_refused_before_generation(rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch,
                                                                  server_args: tuple[str, ...]) -> None:
    """The pinned build refuses it itself (``exceed_context_size_error``, with its counts); a server started with
    ``--context-shift`` is never sent it: the prompt is counted first (test_runtime_context.py)."""
    sent: list[dict[str, Any]] = []
    real_stream = EngineClient.stream_chat

    def stream_chat(self: EngineClient, payload: dict[str, Any], deadline: Any = None) -> Any:
        sent.append(payload)
        return real_stream(self, payload, deadline)

    monkeypatch.setattr(EngineClient, "stream_chat", stream_chat)  # the one request path
    engine = Engine(EngineConfig(model_path=str(rt.model), n_ctx=512, timeout=30, server_args=list(server_args)))
    try:
        n_ctx = engine.n_ctx
        long = {"messages": [{"role": "user", "content": "apple banana cherry " * 400}], "max_tokens": 16}
        with pytest.raises(ContextOverflowError, match="shorten the input") as ei:
            engine.chat(long)
        assert ei.value.n_ctx == n_ctx
        assert ei.value.n_prompt_tokens is not None and ei.value.n_prompt_tokens > n_ctx
        got: list[Any] = []
        with pytest.raises(ContextOverflowError):
            for ev in engine.stream(long):
                got.append(ev)
        assert got == [], "no event of a reply may come before the refusal"
        assert len(sent) == (2 if engine.info.ends_at_context else 0)
        # The server is fine afterwards.
        assert engine.chat(CHAT).content
    finally:
        engine.unload()


@pytest.mark.timeout(60)
def test_dead_base_url_fails_fast(rt: RuntimeEnv) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"http://127.0.0.1:{port}/v1", str(rt.run_dir / "nobody.sock")):
        t0 = time.monotonic()
        with pytest.raises(ServerConnectionError, match="Is it running"):
            Engine(EngineConfig(base_url=url)).chat(CHAT)  # not after its timeout (600 s): at once
        took = time.monotonic() - t0
        assert took < 5, url  # typical ~0.001 s on a loaded 2-core machine


@pytest.mark.timeout(60)
def test_base_url_that_never_answers_times_out(rt: RuntimeEnv) -> None:
    with socket.socket() as s:  # listens (the kernel accepts connections) but never reads or answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        t0 = time.monotonic()
        with pytest.raises(ServerConnectionError, match="could not reach"):
            Engine(EngineConfig(base_url=f"http://127.0.0.1:{s.getsockname()[1]}", timeout=2)).chat(CHAT)
        took = time.monotonic() - t0
    assert 1.5 < took < 2 + REACT, took  # its 2 s timeout elapsed (typical 2.0 s under load), and not much more


@pytest.mark.timeout(60)
def test_server_that_exits_at_start(rt: RuntimeEnv) -> None:
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="exited with code") as ei:
        Engine(EngineConfig(model_path=str(rt.model), n_ctx=2048,
                            server_args=("--this-flag-does-not-exist",))).chat(CHAT)
    took = time.monotonic() - t0
    assert took < 15  # the server's exit, not its 600 s start timeout: typical ~0.25 s under load; 60x
    err = ei.value
    assert err.log_path is not None and err.log_path.is_file()
    assert "--this-flag-does-not-exist" in err.log_tail
    assert str(err.log_path) in str(err)
    assert rt.servers() == [] and rt.registry() == {}
