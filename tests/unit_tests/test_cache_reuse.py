"""``cache_reuse`` (llama-server's ``--cache-reuse``): on by default for chat servers, left off where this build
cannot shift the cache, part of the server's identity. tests/integration_tests/test_cache_reuse.py shows it on a
real server; bench P18 measures it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider import ChatGGUF, GGUFEmbeddings
from gguf_provider.engine import EngineConfig
from gguf_provider.llama_index import GGUF
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._serve import server_options
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec

CAPS = ServerCapabilities(path="llama-server", version="test", flags={"--jinja": True, "--cache-reuse": True})
DEFAULT = server_options.DEFAULT_CACHE_REUSE


def _argv(caps: ServerCapabilities = CAPS, *, recurrent: bool = False, **spec: object) -> list[str]:
    return build_argv(ServerSpec(model=Path("/m.gguf"), **spec), Path("/b"), caps, "a", 4096,  # type: ignore[arg-type]
                      Address(socket="/s"), None, recurrent=recurrent)


def _reuse(argv: list[str]) -> str | None:
    return argv[argv.index("--cache-reuse") + 1] if "--cache-reuse" in argv else None


def test_a_user_who_sets_nothing_gets_cache_reuse() -> None:
    assert DEFAULT == 64
    assert ChatGGUF(model="m").cache_reuse == GGUF(model="m").cache_reuse == EngineConfig().cache_reuse == DEFAULT
    assert ServerSpec(model=Path("/m.gguf")).cache_reuse == DEFAULT
    assert _reuse(_argv()) == str(DEFAULT)


def test_a_chunk_size_or_off() -> None:
    assert _reuse(_argv(cache_reuse=256)) == "256"
    assert _reuse(_argv(cache_reuse=0)) is None
    assert ChatGGUF(model="m", cache_reuse=False).cache_reuse == 0
    for bad in (-1, 1.5, "256", True):
        with pytest.raises(ValueError, match="chunk size in tokens"):
            EngineConfig(cache_reuse=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="chunk size in tokens"):
            ChatGGUF(model="m", cache_reuse=bad)


def test_left_off_where_the_server_cannot_shift_the_cache() -> None:
    """Embedding and reranking servers keep no history; llama-server turns it off itself (with a warning) for a
    projector; a recurrent model's state cannot lose a middle part; an old build has no flag."""
    assert _reuse(_argv(embedding=True)) is None
    assert _reuse(_argv(rerank=True, embedding=True)) is None
    assert _reuse(_argv(mmproj=Path("/p.gguf"))) is None
    assert _reuse(_argv(recurrent=True)) is None
    assert _reuse(_argv(ServerCapabilities(path="b", version="old", flags={"--jinja": True}))) is None
    # speculation (n-gram or a draft: llama-server shifts the draft's cache too) and several slots keep it
    assert _reuse(_argv(n_parallel=4, speculative="draft", draft_model=Path("/d.gguf"))) == str(DEFAULT)


def test_embedding_adapters_have_no_such_parameter() -> None:
    assert "cache_reuse" in ChatGGUF.model_fields and "cache_reuse" not in GGUFEmbeddings.model_fields


def test_it_is_part_of_the_server_identity(tmp_path: Path) -> None:
    """A reused chunk keeps the KV computed after the messages dropped before it: a server without cache reuse is
    another server, so ``cache_reuse=0`` is never served by one that has it."""
    model, binary = tmp_path / "m.gguf", tmp_path / "llama-server"
    model.write_bytes(b"GGUF")
    binary.write_bytes(b"#!")
    on, off = ServerSpec(model=model), ServerSpec(model=model, cache_reuse=0)
    assert on.family(binary) != off.family(binary)
    assert server_options.ARGS[-1].name == "cache_reuse"  # appended: the other options' identity args keep their place
    assert server_options.summary(off) == {"cache_reuse": 0} and server_options.summary(on) == {}


@pytest.mark.parametrize("recurrent", [False, True])
def test_the_manager_passes_what_the_models_header_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        recurrent: bool) -> None:
    """A start of a model whose header has recurrent (SSM) layers, hybrid ones included, gets no --cache-reuse:
    this build aborts when a shift asks such a state to lose a middle part (common_context_seq_rm)."""
    from tests.support.gguf_bytes import STANDINS, StandIn
    from tests.unit_tests.test_manager_races import World

    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(tmp_path / "run"))
    world = World(tmp_path)
    monkeypatch.setattr(world.installer, "capabilities", lambda binary: CAPS)
    smol = STANDINS["smollm2"]
    meta = {**smol.metadata, **({"llama.ssm.state_size": 16, "llama.ssm.inner_size": 1152} if recurrent else {})}
    model = StandIn("hybrid.gguf" if recurrent else smol.filename, smol.size, meta).write(tmp_path / "m")
    world.client().acquire(ServerSpec(model=model, n_ctx=2048), keep_alive=0).release()
    assert _reuse(world.launcher.argvs[-1]) == (None if recurrent else str(DEFAULT))
