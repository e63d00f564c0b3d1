"""What a server holds is what it is charged (issue 51, point 3): the host-RAM prompt cache is sized by rule,
passed as ``--cache-ram`` and charged; the user's own ``--cache-ram`` is charged as given; embedding and reranking
servers hold none. The real growth is checked by tests/integration_tests/test_memory_real.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from gguf_provider.runtime._common.gguf import read_header
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._memory import fit
from gguf_provider.runtime._serve import budget
from gguf_provider.runtime._serve import manager as mgr
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec
from tests.support import gguf_bytes as gb

MiB, GiB = 1 << 20, 1 << 30
WITH = ServerCapabilities(path="llama-server", version="t", flags={"--cache-ram": True})
WITHOUT = ServerCapabilities(path="llama-server", version="old", flags={})


@pytest.fixture
def smol(tmp_path: Path) -> tuple[Path, int]:
    return gb.STANDINS["smollm2"].write(tmp_path), gb.STANDINS["smollm2"].size


def test_the_prompt_cache_is_two_contexts_of_kv_within_the_pool(smol: tuple[Path, int]) -> None:
    header = read_header(smol[0])
    kv = fit.kv_cache_bytes(header, 8192)
    assert budget.prompt_ram(header, 8192, pool=64 * GiB) == 2 * kv // MiB * MiB
    assert budget.prompt_ram(header, 8192, pool=8 * GiB) == min(2 * kv, GiB) // MiB * MiB  # an eighth of 8 GiB
    assert budget.prompt_ram(header, 8192, pool=80 * MiB) == 10 * MiB
    q8 = budget.prompt_ram(header, 8192, cache_type="q8_0", pool=64 * GiB)
    assert q8 < budget.prompt_ram(header, 8192, pool=64 * GiB)  # the saved prompts are KV state of that type
    huge = budget.prompt_ram(header, 10_000_000, pool=1 << 50)
    assert huge == budget.LLAMA_CACHE_RAM  # never above llama.cpp's own bound


def test_the_budget_charges_it_and_shrinks_the_context_for_it(
        smol: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    header, size = read_header(smol[0]), smol[1]
    plenty = fit.MemoryInfo(ram_available=64 * GiB)
    monkeypatch.setattr(budget, "holders", lambda data, reg=None: [])
    monkeypatch.setattr(budget.registry, "read", dict)
    monkeypatch.delenv(budget.MAX_MODELS_ENV, raising=False)

    def cache(n_ctx: int) -> int:
        return budget.prompt_ram(header, n_ctx, pool=64 * GiB)

    got = budget.admit(header, size, requested=4096, n_gpu_layers=None, memory=lambda: plenty, cache_ram=cache)
    assert got.cache_ram == cache(4096) > 0
    assert got.charge == budget.charge(header, size, 4096) + cache(4096)
    # Under a limit that holds the model at its native 8192 without its cache, the cache's share shrinks the context.
    monkeypatch.setenv(budget.LIMIT_ENV, str(budget.charge(header, size, 8192)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = budget.admit(header, size, requested=None, n_gpu_layers=None, memory=lambda: plenty)
        cached = budget.admit(header, size, requested=None, n_gpu_layers=None, memory=lambda: plenty,
                              cache_ram=cache)
    assert bare.n_ctx == 8192 and cached.n_ctx < 8192
    assert cached.charge <= budget.charge(header, size, 8192)


def test_what_each_server_is_charged_and_passed(smol: tuple[Path, int]) -> None:
    header = read_header(smol[0])
    chat = ServerSpec(model=smol[0])
    rule = mgr._cache_ram(chat, WITH, header)
    assert rule is not None and rule(4096) == budget.prompt_ram(header, 4096, pool=budget.ram_pool())
    assert mgr._passes_cache_ram(chat, WITH) and not mgr._passes_cache_ram(chat, WITHOUT)
    assert mgr._cache_ram(chat, WITHOUT, header) is None  # an older build has no such cache
    # Embedding and reranking servers: stateless, no cache (`--cache-ram 0`).
    for spec in (ServerSpec(model=smol[0], embedding=True), ServerSpec(model=smol[0], embedding=True, rerank=True)):
        off = mgr._cache_ram(spec, WITH, header)
        assert off is not None and off(4096) == 0
    # The user's own size is charged as given (-1, no limit: llama.cpp's default bound), and ours is not passed.
    mine = ServerSpec(model=smol[0], server_args=("--cache-ram", "512"))
    assert mgr._cache_ram(mine, WITH, header)(4096) == 512 * MiB  # type: ignore[misc]
    assert not mgr._passes_cache_ram(mine, WITH)
    unbounded = ServerSpec(model=smol[0], server_args=("-cram=-1",))
    assert mgr._cache_ram(unbounded, WITH, header)(4096) == budget.LLAMA_CACHE_RAM  # type: ignore[misc]


def test_the_command_line_carries_the_charged_size(smol: tuple[Path, int]) -> None:
    argv = build_argv(ServerSpec(model=smol[0]), Path("/bin/llama-server"), WITH, "a", 4096,
                      Address(socket="/run/x.sock"), None, cache_ram=384 * MiB)
    assert argv[argv.index("--cache-ram") + 1] == "384"
    zero = build_argv(ServerSpec(model=smol[0], embedding=True), Path("/bin/llama-server"), WITH, "a", 4096,
                      Address(socket="/run/x.sock"), None, cache_ram=0)
    assert zero[zero.index("--cache-ram") + 1] == "0"
    none = build_argv(ServerSpec(model=smol[0]), Path("/bin/llama-server"), WITHOUT, "a", 4096,
                      Address(socket="/run/x.sock"), None)
    assert "--cache-ram" not in none
