"""The real test models' GGUF headers: the reader's values (checked against ``gguf.GGUFReader``, gguf 0.19, on the
same files), the KV sizes the fit computes (checked against llama-server's log), truncations and mutations of a real
header, and the stand-ins the offline unit tests use in their place (tests/support/gguf_bytes.py).
"""

from __future__ import annotations

import dataclasses
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_provider.errors import GGUFFormatError
from gguf_provider.runtime._common.gguf import GGUFHeader, SkippedArray, read_header
from gguf_provider.runtime._memory.fit import MiB, kv_cache_bytes
from tests.support.gguf_bytes import STANDINS, cut_points

# One read of a real header, in this thread's CPU time: what other processes of a busy machine take, and waiting
# for the disk, do not count. Slowest measured (qwen, gemma), idle or beside a CPU hog: ~90 ms; 10x+. gguf.GGUFReader,
# which reads the tensor infos too, takes seconds.
READ_CPU_S = 1.0


@pytest.fixture(scope="module")
def models(smollm2_path: Path, qwen_path: Path, gemma_path: Path) -> dict[str, Path]:
    return {"smollm2": smollm2_path, "qwen": qwen_path, "gemma": gemma_path}


def test_smollm2(models: dict[str, Path]) -> None:
    h = read_header(models["smollm2"])
    assert (h.version, h.tensor_count, h.kv_count) == (3, 272, 33)
    assert h.architecture == "llama"
    assert h.name == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert (h.context_length, h.block_count, h.embedding_length) == (8192, 30, 576)
    assert (h.head_count, h.head_count_kv, h.head_count_kv_per_layer) == (9, 3, None)
    assert (h.key_length, h.value_length, h.head_dim, h.value_head_dim) == (None, None, 64, 64)
    assert h.rope_dimension_count == 64
    assert h.sliding_window is None
    assert h.file_type == 3  # Q4_1
    assert h.split_count is None
    assert h.chat_template is not None and h.chat_template.startswith("{% for message in messages %}")
    assert len(h.chat_template) == 368
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("string", 49152)
    assert h.metadata["tokenizer.ggml.merges"] == SkippedArray("string", 48900)
    assert h.metadata["tokenizer.ggml.token_type"] == SkippedArray("int32", 49152)
    assert h.metadata["general.languages"] == SkippedArray("string", 1)
    assert h.metadata["llama.vocab_size"] == 49152
    assert h.metadata["tokenizer.ggml.add_bos_token"] is False
    assert h.metadata["llama.rope.freq_base"] == 100000.0
    assert len(h.metadata) == h.kv_count
    assert not h.has_ssm and h.kv_lora_rank is None


def test_qwen(models: dict[str, Path]) -> None:
    h = read_header(models["qwen"])
    assert (h.version, h.tensor_count, h.kv_count) == (3, 291, 26)
    assert h.architecture == "qwen2"
    assert h.name == "Qwen2.5 Coder 0.5B Instruct AWQ"
    assert (h.context_length, h.block_count, h.embedding_length) == (32768, 24, 896)
    assert (h.head_count, h.head_count_kv, h.head_dim) == (14, 2, 64)
    assert h.sliding_window is None
    assert h.file_type == 15  # Q4_K_M
    assert h.chat_template is not None and "<tool_call>" in h.chat_template and len(h.chat_template) == 2507
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("string", 151936)
    assert h.metadata["tokenizer.ggml.merges"] == SkippedArray("string", 151387)
    assert h.metadata["tokenizer.ggml.eos_token_id"] == 151645
    assert len(h.metadata) == h.kv_count


def test_gemma3(models: dict[str, Path]) -> None:
    h = read_header(models["gemma"])
    assert (h.version, h.tensor_count, h.kv_count) == (3, 236, 33)
    assert h.architecture == "gemma3"
    assert h.name == "Gemma 3 270m"
    assert (h.context_length, h.block_count, h.embedding_length) == (32768, 18, 640)
    assert (h.head_count, h.head_count_kv) == (4, 1)
    assert (h.key_length, h.value_length, h.head_dim) == (256, 256, 256)  # not 640 // 4
    assert h.sliding_window == 512
    assert h.sliding_window_pattern is None and h.swa_layers is None  # llama.cpp's built-in pattern applies
    assert h.chat_template is None  # base model: no template
    assert h.file_type == 15
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("string", 262144)
    assert h.metadata["tokenizer.ggml.scores"] == SkippedArray("float32", 262144)
    assert len(h.metadata) == h.kv_count


def test_real_headers_are_fast_and_stop_before_tensor_infos(models: dict[str, Path]) -> None:
    for path in models.values():
        t0 = time.thread_time()
        h = read_header(path)
        assert time.thread_time() - t0 < READ_CPU_S
        assert isinstance(h, GGUFHeader)
        assert 24 < h.metadata_end < path.stat().st_size
        # the tensor info section starts right there: the first tensor name is a short ASCII string
        with open(path, "rb") as f:
            f.seek(h.metadata_end)
            (n,) = struct.unpack("<Q", f.read(8))
            assert 0 < n < 256 and f.read(n).isascii()


# --- the memory fit on the real headers -----------------------------------------------------------------------


def test_kv_matches_llama_server(models: dict[str, Path]) -> None:
    """KV sizes of llama-server's own log lines (``llama_kv_cache: size = ...``) for these files at ``-c 32768 -np 1``:
    Qwen2.5-0.5B 384.00 MiB; gemma-3-270m 96.00 MiB (32768 cells, 3 layers) + 15.00 MiB (SWA, 1024 cells,
    15 layers)."""
    assert kv_cache_bytes(read_header(models["qwen"]), 32768) == 384 * MiB
    assert kv_cache_bytes(read_header(models["gemma"]), 32768) == (96 + 15) * MiB
    # SmolLM2: 30 layers x 3 kv heads x 64 dims x (K + V) x f16
    assert kv_cache_bytes(read_header(models["smollm2"]), 8192) == 30 * 3 * 64 * 2 * 2 * 8192


_NOT_COMPARED = {"path", "tensor_count", "kv_count", "metadata_end", "chat_template", "metadata"}


@pytest.mark.parametrize("key", sorted(STANDINS))
def test_standins_match_the_real_models(models: dict[str, Path], tmp_path: Path, key: str) -> None:
    """The unit tests' header-only stand-ins say what the real files say, wherever the fit looks."""
    real, standin = models[key], STANDINS[key]
    assert real.name == standin.filename and real.stat().st_size == standin.size
    h_real, h_fake = read_header(real), read_header(standin.write(tmp_path))
    for f in dataclasses.fields(GGUFHeader):
        if f.name not in _NOT_COMPARED:
            assert getattr(h_fake, f.name) == getattr(h_real, f.name), f.name
    for n_ctx in (512, 4096, 8192, 32768, 65536):
        for n_seq in (1, 4):
            assert kv_cache_bytes(h_fake, n_ctx, n_seq=n_seq) == kv_cache_bytes(h_real, n_ctx, n_seq=n_seq)


# --- truncations and fuzzing of a real header ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_prefix(models: dict[str, Path]) -> bytes:
    """The complete metadata section of SmolLM2 (a real header with strings, arrays, floats and bools)."""
    path = models["smollm2"]
    end = read_header(path).metadata_end
    with open(path, "rb") as f:
        return f.read(end)


def test_every_truncation_is_a_format_error(tmp_path: Path, real_prefix: bytes) -> None:
    path = tmp_path / "cut.gguf"
    for cut in cut_points(len(real_prefix)):
        path.write_bytes(real_prefix[:cut])
        with pytest.raises(GGUFFormatError):
            read_header(path)
    path.write_bytes(real_prefix)  # the whole KV section alone is enough
    assert read_header(path).kv_count == 33


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "f.gguf"


# deadline=None: the CPU-time bound below instead of hypothesis' wall-clock one.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_real_header(fuzz_path: Path, real_prefix: bytes, data: st.DataObject) -> None:
    n = len(real_prefix)
    buf = bytearray(real_prefix[: data.draw(st.integers(0, n), label="cut")])
    # bias mutations towards the start, where the lengths and types of the scalar KVs are
    for _ in range(data.draw(st.integers(1, 8), label="mutations")):
        if not buf:
            break
        hi = data.draw(st.sampled_from([min(len(buf), 2048), len(buf)]), label="region")
        pos = data.draw(st.integers(0, hi - 1), label="pos")
        chunk = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        buf[pos : pos + len(chunk)] = chunk
    fuzz_path.write_bytes(bytes(buf))
    t0 = time.thread_time()
    try:
        read_header(fuzz_path)
    except GGUFFormatError:
        pass
    assert time.thread_time() - t0 < READ_CPU_S
