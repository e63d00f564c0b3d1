"""Memory fit on header-only stand-ins of the real test models (tests/support/gguf_bytes.py: their metadata and
sizes, checked against the real files by tests/integration_tests/test_gguf_real.py, which also compares the KV sizes
with llama-server's own log); only the free-memory numbers are made up.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import struct
import time
from pathlib import Path

import pytest

from gguf_provider.errors import InsufficientMemoryError
from gguf_provider.runtime._common.gguf import GGUFHeader, read_header
from gguf_provider.runtime._memory.fit import (
    GiB,
    MemoryInfo,
    MiB,
    available_memory,
    cgroup_memory_available,
    fit_context,
    gpu_free_memory,
    kv_cache_bytes,
    recurrent_state_bytes,
)
from tests.support.gguf_bytes import STANDINS


@pytest.fixture(scope="module")
def headers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GGUFHeader, int]]:
    d = tmp_path_factory.mktemp("standins")
    return {key: (read_header(m.write(d)), m.size) for key, m in STANDINS.items()}


def _budget(avail: int) -> float:
    return avail * 0.9 - 512 * MiB  # the default margin


# --- KV cache ------------------------------------------------------------------------------------------------


def test_kv_sizes(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    """The figures llama-server logs for the real files (``llama_kv_cache: size = ...`` at ``-c 32768 -np 1``):
    Qwen2.5-0.5B 384.00 MiB; gemma-3-270m 96.00 MiB (32768 cells, 3 layers) + 15.00 MiB (SWA, 1024 cells,
    15 layers)."""
    assert kv_cache_bytes(headers["qwen"][0], 32768) == 384 * MiB
    assert kv_cache_bytes(headers["gemma"][0], 32768) == (96 + 15) * MiB
    # SmolLM2: 30 layers x 3 kv heads x 64 dims x (K + V) x f16
    assert kv_cache_bytes(headers["smollm2"][0], 8192) == 30 * 3 * 64 * 2 * 2 * 8192


@pytest.mark.parametrize("key", ["smollm2", "qwen", "gemma"])
def test_kv_monotonic(headers: dict[str, tuple[GGUFHeader, int]], key: str) -> None:
    h = headers[key][0]
    sizes = [kv_cache_bytes(h, n) for n in range(256, 65536 + 1, 256)]
    assert all(a <= b for a, b in itertools.pairwise(sizes))
    assert sizes[0] > 0 and sizes[-1] > sizes[0]


def test_kv_cache_types_and_sequences(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h = headers["qwen"][0]
    assert kv_cache_bytes(h, 4096, type_k_bytes=1.0625, type_v_bytes=1.0625) == 4096 * 24 * 2 * 64 * 2 * 1.0625
    assert kv_cache_bytes(h, 4096, n_seq=4) == kv_cache_bytes(h, 4096)  # full attention: n_ctx is the total


def test_sliding_window(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h = headers["gemma"][0]
    per_layer_token = 1 * 256 * 2 * 2  # kv heads x head dim x (K + V) x f16
    full = dataclasses.replace(h, sliding_window=None)
    assert kv_cache_bytes(full, 32768) == 18 * 32768 * per_layer_token
    assert kv_cache_bytes(h, 32768) < kv_cache_bytes(full, 32768) / 4
    # below the window + ubatch every layer holds the whole context
    assert kv_cache_bytes(h, 1024) == kv_cache_bytes(full, 1024)
    # SWA layers keep window * n_seq + ubatch cells: 512 * 4 + 512
    assert kv_cache_bytes(h, 32768, n_seq=4) == (3 * 32768 + 15 * 2560) * per_layer_token
    # a per-layer pattern from the file wins over the built-in one
    every_other = dataclasses.replace(h, swa_layers=(True, False) * 9)
    assert kv_cache_bytes(every_other, 32768) == (9 * 32768 + 9 * 1024) * per_layer_token
    # an unknown arch with a window is counted as all-full (never underestimate)
    assert kv_cache_bytes(dataclasses.replace(h, architecture="somethingnew"), 32768) == kv_cache_bytes(full, 32768)


# Crafted files for layouts none of the test models has, read through the real reader.


def _gguf(arch: str, fields: dict[str, int | tuple[int, ...]]) -> bytes:
    def s(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    kvs = [s("general.architecture") + struct.pack("<I", 8) + s(arch)]
    for key, v in fields.items():
        if isinstance(v, tuple):
            kvs.append(s(f"{arch}.{key}") + struct.pack("<IIQ", 9, 4, len(v)) + struct.pack(f"<{len(v)}I", *v))
        else:
            kvs.append(s(f"{arch}.{key}") + struct.pack("<II", 4, v))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def _crafted(tmp_path: Path, arch: str, **fields: int | tuple[int, ...]) -> GGUFHeader:
    path = tmp_path / f"{arch}.gguf"
    path.write_bytes(_gguf(arch, {k.replace("__", "."): v for k, v in fields.items()}))
    return read_header(path)


def test_mla(tmp_path: Path) -> None:
    h = _crafted(
        tmp_path, "deepseek2", block_count=4, context_length=4096, embedding_length=2048,
        attention__head_count=16, attention__head_count_kv=1, attention__key_length=576,
        attention__value_length=512, attention__key_length_mla=192, attention__value_length_mla=128,
        attention__kv_lora_rank=512, rope__dimension_count=64,
    )  # fmt: skip
    assert h.kv_lora_rank == 512 and h.key_length_mla == 192
    assert kv_cache_bytes(h, 1024) == 4 * 1024 * (512 + 64) * 2  # one latent per token, no V cache
    # an old conversion (no *_mla keys) is plain multi-head attention in llama.cpp
    old = dataclasses.replace(h, key_length_mla=None, value_length_mla=None, head_count_kv=16, key_length=192,
                              value_length=128)  # fmt: skip
    assert kv_cache_bytes(old, 1024) == 4 * 1024 * 16 * (192 + 128) * 2


def test_hybrid_and_recurrent(tmp_path: Path) -> None:
    jamba = _crafted(
        tmp_path, "jamba", block_count=8, embedding_length=1024, attention__head_count=8,
        attention__head_count_kv=(0, 0, 0, 8, 0, 0, 0, 8), ssm__conv_kernel=4, ssm__inner_size=2048,
        ssm__state_size=16,
    )  # fmt: skip
    assert kv_cache_bytes(jamba, 1000) == 2 * 1000 * 8 * 128 * 2 * 2  # only 2 attention layers
    state = recurrent_state_bytes(jamba)
    assert state == 6 * 4 * (3 * 2048 + 2048 * 16)  # 6 SSM layers, f32
    assert recurrent_state_bytes(jamba, n_seq=2) == 2 * state

    nextgen = _crafted(
        tmp_path, "qwen3next", block_count=8, embedding_length=1024, attention__head_count=8,
        attention__head_count_kv=2, attention__key_length=256, attention__value_length=256,
        full_attention_interval=4, ssm__inner_size=4096, ssm__state_size=128, ssm__group_count=16,
        ssm__conv_kernel=4,
    )  # fmt: skip
    assert kv_cache_bytes(nextgen, 1000) == 2 * 1000 * 2 * 256 * 2 * 2  # layers 3 and 7

    mamba = _crafted(tmp_path, "mamba", block_count=24, embedding_length=768, ssm__inner_size=1536,
                     ssm__state_size=16, ssm__conv_kernel=4)  # fmt: skip
    assert kv_cache_bytes(mamba, 100_000) == 0
    assert recurrent_state_bytes(mamba) == 24 * 4 * (3 * 1536 + 1536 * 16)

    # constant state is part of the fit, but does not grow with the context
    big = MemoryInfo(ram_available=64 * GiB)
    r = fit_context(mamba, 100 * MiB, memory=big)
    assert r.n_ctx == 4096 and r.kv_bytes == recurrent_state_bytes(mamba)  # default context when none given


# --- fitting -------------------------------------------------------------------------------------------------


def test_native_context_when_memory_is_plentiful(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    big = MemoryInfo(ram_available=64 * GiB)
    for h, size in headers.values():
        r = fit_context(h, size, memory=big)
        assert r.fits and r.n_ctx == h.context_length and r.n_gpu_layers == 0
        assert r.weights_bytes == size and r.kv_bytes == kv_cache_bytes(h, r.n_ctx)
        assert r.available_bytes == 64 * GiB and "native" in r.reason
    h, size = headers["qwen"]
    assert fit_context(dataclasses.replace(h, context_length=None), size, memory=big).n_ctx == 4096
    assert fit_context(dataclasses.replace(h, context_length=10_000), size, memory=big).n_ctx == 9984


def test_small_memory_forces_a_smaller_context(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h, size = headers["qwen"]
    mem = MemoryInfo(ram_available=int(1.3 * GiB))
    r = fit_context(h, size, memory=mem)
    assert r.fits and 512 <= r.n_ctx < 32768 and r.n_ctx % 256 == 0
    assert size + kv_cache_bytes(h, r.n_ctx) <= _budget(mem.ram_available)
    assert size + kv_cache_bytes(h, r.n_ctx + 256) > _budget(mem.ram_available)  # the largest that fits
    assert "largest" in r.reason
    # more margin, smaller context
    assert fit_context(h, size, memory=mem, margin=0.2).n_ctx < r.n_ctx


def test_sliding_window_fits_more_context(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h, size = headers["gemma"]
    full = dataclasses.replace(h, sliding_window=None)
    mem = MemoryInfo(ram_available=int(size + 512 * MiB + 150 * MiB) * 10 // 9 + 1)
    assert fit_context(h, size, memory=mem).n_ctx == 32768
    assert fit_context(full, size, memory=mem).n_ctx < 32768


def test_insufficient_memory(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h, size = headers["qwen"]
    with pytest.raises(InsufficientMemoryError) as info:
        fit_context(h, size, memory=MemoryInfo(ram_available=256 * MiB))
    msg = str(info.value)
    assert "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf" in msg and "GiB" in msg and "0.46 GiB" in msg
    assert "smaller quant" in msg and "n_gpu_layers" in msg and "n_ctx" in msg


def test_explicit_context_is_honoured(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h, size = headers["smollm2"]
    r = fit_context(h, size, requested=3000, memory=MemoryInfo(ram_available=64 * GiB))
    assert (r.n_ctx, r.fits) == (3000, True)
    assert r.kv_bytes == kv_cache_bytes(h, 3000)
    tiny = MemoryInfo(ram_available=100 * MiB)  # not even 512 fits, but the request stands
    r = fit_context(h, size, requested=100_000, memory=tiny)
    assert (r.n_ctx, r.fits) == (100_000, False) and "NOT fit" in r.reason


def test_gpu_offload(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    h, size = headers["qwen"]
    mem = MemoryInfo(ram_available=64 * GiB, vram_free=(int(1.2 * GiB),))
    full = fit_context(h, size, memory=mem, n_gpu_layers=-1)  # all layers on the small GPU: VRAM limits
    assert full.n_gpu_layers == 24 and full.n_ctx < 32768 and full.available_bytes == int(1.2 * GiB)
    assert fit_context(h, size, memory=mem, n_gpu_layers=0).n_ctx == 32768  # CPU only: RAM is plenty
    half = fit_context(h, size, memory=mem, n_gpu_layers=12)
    assert half.n_gpu_layers == 12 and full.n_ctx < half.n_ctx
    assert fit_context(h, size, memory=mem, n_gpu_layers=-1).n_gpu_layers == 24
    # without a GPU, n_gpu_layers is moot
    assert fit_context(h, size, memory=MemoryInfo(64 * GiB), n_gpu_layers=99).n_gpu_layers == 0
    with pytest.raises(InsufficientMemoryError, match="lower n_gpu_layers"):
        fit_context(h, size, memory=MemoryInfo(64 * GiB, vram_free=(300 * MiB,)), n_gpu_layers=-1)


def test_a_model_larger_than_the_gpu_is_split_not_refused(headers: dict[str, tuple[GGUFHeader, int]]) -> None:
    """Issue 36: automatic layers (the default) on a GPU too small for the model: the context is sized on VRAM and
    RAM together (the plan splits the layers), where all layers on the GPU are refused."""
    h, size = headers["qwen"]
    small = MemoryInfo(64 * GiB, vram_free=(300 * MiB,))
    r = fit_context(h, size, memory=small)
    assert r.fits and r.n_ctx == 32768 and r.available_bytes == 64 * GiB + 300 * MiB


# --- free memory ---------------------------------------------------------------------------------------------


def test_available_memory_is_sane() -> None:
    m = available_memory()
    assert 0 < m.ram_available
    assert all(v >= 0 for v in m.vram_free)
    assert m.has_gpu == bool(m.vram_free)


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_cgroup_v2(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _tree(root, {
        "cgroup.controllers": "memory\n",
        "a/memory.max": "max\n",
        "a/b/memory.max": str(4 * GiB),
        "a/b/memory.current": str(3 * GiB),
        "a/b/memory.stat": f"anon 123\ninactive_file {1 * GiB}\n",
    })  # fmt: skip
    proc = tmp_path / "proc"
    proc.write_text("0::/a/b\n")
    assert cgroup_memory_available(root, proc) == 2 * GiB
    _tree(root, {"a/memory.max": str(GiB), "a/memory.current": str(GiB // 2)})  # a tighter parent
    assert cgroup_memory_available(root, proc) == GiB // 2
    proc.write_text("0::/\n")
    assert cgroup_memory_available(root, proc) is None  # the root has no limit


def test_cgroup_v1(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _tree(root, {
        "memory/memory.limit_in_bytes": "9223372036854771712",  # v1 "unlimited"
        "memory/x/memory.limit_in_bytes": str(8 * GiB),
        "memory/x/memory.usage_in_bytes": str(5 * GiB),
        "memory/x/memory.stat": f"cache 1\ntotal_inactive_file {2 * GiB}\n",
    })  # fmt: skip
    proc = tmp_path / "proc"
    proc.write_text("5:cpu,cpuacct:/\n4:memory:/x\n0::/\n")
    assert cgroup_memory_available(root, proc) == 5 * GiB
    assert cgroup_memory_available(tmp_path / "none", tmp_path / "none") is None


def _fake_smi(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")


def test_gpu_free_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nvidia-smi --query-gpu=index,uuid,memory.total,memory.free,name --format=csv,noheader,nounits
    _fake_smi(tmp_path, "echo '0, GPU-aaaa, 8192, 1024, NVIDIA A'; echo '1, GPU-bbbb, 8192, 2048, NVIDIA B'",
              monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_free_memory() == (1024 * MiB, 2048 * MiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # another user's card is not counted
    assert gpu_free_memory() == (2048 * MiB,)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed'; exit 9", monkeypatch)
    assert gpu_free_memory() == ()
    _fake_smi(tmp_path, "echo '[N/A]'", monkeypatch)
    assert gpu_free_memory() == ()
    _fake_smi(tmp_path, "exec sleep 600", monkeypatch)
    t0 = time.monotonic()
    assert gpu_free_memory(timeout=0.5) == ()
    assert time.monotonic() - t0 < 10  # not nvidia-smi's 600 s: ~0.5 s under 2 hogs and a build on 2 cores, 20x
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_free_memory() == ()


def test_cpu_build_on_a_gpu_host_is_fitted_to_ram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our CPU-only build cannot use the VRAM nvidia-smi reports: the fit counts RAM only. Any other binary (or a
    CUDA build) keeps the VRAM."""
    import json

    from gguf_provider.runtime._install import install, installed
    from gguf_provider.runtime._memory import fit
    from gguf_provider.runtime._serve import budget

    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path))
    monkeypatch.setattr(fit, "gpu_free_memory", lambda: (8 * 2**30,))
    for backend in ("cpu", "cuda"):
        d = install.install_dir(backend)
        d.mkdir(parents=True)
        (d / "llama-server").write_text("")
        (d / install.MARKER).write_text(json.dumps({"backend": backend, "version": "x"}))
    assert installed.backend_of(install.install_dir("cpu") / "llama-server") == "cpu"
    assert not budget.fit_memory(install.install_dir("cpu") / "llama-server").has_gpu
    assert budget.fit_memory(install.install_dir("cuda") / "llama-server").vram_free == (8 * 2**30,)
    other = tmp_path / "elsewhere" / "llama-server"
    other.parent.mkdir()
    other.write_text("")
    assert installed.backend_of(other) is None and budget.fit_memory(other).has_gpu
