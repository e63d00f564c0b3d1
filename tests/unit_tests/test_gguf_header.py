"""The fast GGUF header reader on headers the tests write: a llama-style one, crafted bad inputs, truncations and
a fuzz test (offline). The real models' headers are checked in tests/integration_tests/test_gguf_real.py.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_provider.errors import GGUFFormatError, ModelNotFoundError
from gguf_provider.runtime._common.gguf import GGUFHeader, SkippedArray, read_header
from tests.support.gguf_bytes import (
    ARR,
    BOOL,
    F32,
    I32,
    N_MERGES,
    N_TOKENS,
    RICH_KV_COUNT,
    STR,
    TEMPLATE,
    U8,
    U32,
    U64,
    cut_points,
    gguf,
    kv,
    rich_header,
    s,
    u32,
)

# One read of a header of at most a few KB, in this thread's CPU time (what other processes of a busy machine take
# does not count): the slowest measured, beside a CPU hog, took ~3 ms; over 100x that.
READ_CPU_S = 1.0


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_format_error(path: Path, *words: str) -> GGUFFormatError:
    t0 = time.thread_time()
    with pytest.raises(GGUFFormatError) as info:
        read_header(path)
    assert time.thread_time() - t0 < READ_CPU_S
    msg = str(info.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg
    return info.value



# --- a header like a real model's ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rich() -> bytes:
    return rich_header()


def test_rich_header(tmp_path: Path, rich: bytes) -> None:
    h = read_header(write(tmp_path, rich))
    assert (h.version, h.tensor_count, h.kv_count) == (3, 0, RICH_KV_COUNT)
    assert h.architecture == "llama" and h.name == "Rich Test Model"
    assert (h.context_length, h.block_count, h.embedding_length) == (8192, 30, 576)
    assert (h.head_count, h.head_count_kv, h.head_count_kv_per_layer) == (9, 3, None)
    assert (h.key_length, h.value_length, h.head_dim, h.value_head_dim) == (None, None, 64, 64)
    assert h.rope_dimension_count == 64 and h.sliding_window is None
    assert h.file_type == 3 and h.split_count is None
    assert h.chat_template == TEMPLATE
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("string", N_TOKENS)
    assert h.metadata["tokenizer.ggml.merges"] == SkippedArray("string", N_MERGES)
    assert h.metadata["tokenizer.ggml.token_type"] == SkippedArray("int32", N_TOKENS)
    assert h.metadata["tokenizer.ggml.scores"] == SkippedArray("float32", N_TOKENS)
    assert h.metadata["general.languages"] == SkippedArray("string", 1)
    assert h.metadata["general.size"] == 135_000_000
    assert h.metadata["llama.vocab_size"] == N_TOKENS
    assert h.metadata["tokenizer.ggml.add_bos_token"] is False
    assert h.metadata["llama.rope.freq_base"] == 100000.0
    assert len(h.metadata) == h.kv_count
    assert not h.has_ssm and h.kv_lora_rank is None
    assert h.metadata_end == len(rich)  # stops where the tensor infos would start


def test_header_stops_before_tensor_infos(tmp_path: Path, rich: bytes) -> None:
    """With tensors declared, reading ends at the KV section: the tensor infos and data after it are not read."""
    data = rich[:4] + struct.pack("<I", 3) + struct.pack("<Q", 2) + rich[16:]
    h = read_header(write(tmp_path, data + s("token_embd.weight") + b"\xff" * 4096))
    assert h.tensor_count == 2 and h.metadata_end == len(data)


def test_header_is_frozen(tmp_path: Path, rich: bytes) -> None:
    h = read_header(write(tmp_path, rich))
    assert isinstance(h, GGUFHeader)
    with pytest.raises(AttributeError):
        h.block_count = 1  # type: ignore[misc]


# --- crafted headers -----------------------------------------------------------------------------------------


def test_crafted_minimal_and_small_arrays(tmp_path: Path) -> None:
    per_layer = struct.pack("<IQ", I32, 4) + struct.pack("<4i", 0, 8, 0, 4)
    data = gguf(
        kv("general.architecture", STR, s("jamba")),
        u32("jamba.block_count", 4),
        kv("jamba.attention.head_count_kv", ARR, per_layer),
        kv("jamba.attention.head_count", ARR, struct.pack("<IQ", U32, 4) + struct.pack("<4I", 32, 32, 32, 32)),
        kv("split.count", 2, struct.pack("<H", 3)),
        kv("general.tags", ARR, struct.pack("<IQ", STR, 2) + s("a") + s("bc")),
        kv("nested", ARR, struct.pack("<IQ", ARR, 2) + struct.pack("<IQ", U8, 3) + b"xyz" + struct.pack("<IQ", STR, 0)),
        kv("tokenizer.ggml.scores", ARR, struct.pack("<IQ", F32, 2) + struct.pack("<2f", 1.0, 2.0)),
        kv("flag", BOOL, b"\x01"),
        kv("bad.utf8.value", STR, s(b"\xff\xfe")),
        u32("jamba.ssm.state_size", 16),
    )
    h = read_header(write(tmp_path, data))
    assert h.architecture == "jamba" and h.block_count == 4
    assert h.head_count_kv == 8 and h.head_count_kv_per_layer == (0, 8, 0, 4)
    assert h.head_count == 32 and h.split_count == 3
    assert h.metadata["general.tags"] == SkippedArray("string", 2)
    assert h.metadata["nested"] == SkippedArray("array", 2)
    assert h.metadata["tokenizer.ggml.scores"] == SkippedArray("float32", 2)  # tokenizer arrays never kept
    assert h.metadata["flag"] is True
    assert h.metadata["bad.utf8.value"] == "\ufffd\ufffd"
    assert h.has_ssm and h.ssm_state_size == 16
    assert h.context_length is None and h.chat_template is None
    assert h.metadata_end == len(data)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        read_header(tmp_path / "nope.gguf")
    with pytest.raises(GGUFFormatError, match="directory"):
        read_header(tmp_path)


@pytest.mark.parametrize(
    "data",
    [b"", b"GG", b"PK\x03\x04" + b"\0" * 100, b"hello world, not a model\n" * 10, b"ggufGGUF" + b"\0" * 32],
)
def test_not_gguf(tmp_path: Path, data: bytes) -> None:
    assert_format_error(write(tmp_path, data), "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 99, 0x03000000])
def test_unsupported_version(tmp_path: Path, version: int) -> None:
    assert_format_error(write(tmp_path, gguf(version=version)), "version")


def test_absurd_string_lengths(tmp_path: Path) -> None:
    huge = struct.pack("<Q", 1 << 60)
    assert_format_error(write(tmp_path, gguf(kv_count=1) + huge + b"x" * 64), "key length")
    value = s("general.name") + struct.pack("<I", STR) + huge + b"x" * 64
    assert_format_error(write(tmp_path, gguf(value)), "string value")
    assert_format_error(write(tmp_path, gguf(kv_count=1) + struct.pack("<Q", (1 << 64) - 1)), "length")


def test_absurd_counts(tmp_path: Path) -> None:
    assert_format_error(write(tmp_path, gguf(kv_count=1 << 62) + b"x" * 100), "kv_count")
    assert_format_error(write(tmp_path, gguf(kv_count=1000, tensor_count=0) + b"x" * 100), "kv_count")
    assert_format_error(write(tmp_path, gguf(tensor_count=1 << 40) + b"x" * 100), "tensor_count")


@pytest.mark.parametrize(
    ("elem", "length", "word"),
    [(U32, 1 << 61, "uint32"), (U64, (1 << 64) - 1, "uint64"), (STR, 1 << 59, "strings"), (ARR, 1 << 58, "nested")],
)
def test_absurd_array_lengths(tmp_path: Path, elem: int, length: int, word: str) -> None:
    data = gguf(kv("a", ARR, struct.pack("<IQ", elem, length) + b"\0" * 64))
    assert_format_error(write(tmp_path, data), word)


def test_string_array_with_absurd_element(tmp_path: Path) -> None:
    data = gguf(kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 3) + s("a") + struct.pack("<Q", 1 << 60)))
    assert_format_error(write(tmp_path, data + b"\0" * 64), "truncated or absurd")


@pytest.mark.parametrize("vtype", [13, 255, 1 << 31])
def test_unknown_value_type(tmp_path: Path, vtype: int) -> None:
    assert_format_error(write(tmp_path, gguf(kv("k", vtype, b"\0" * 16))), "unknown value type", "'k'")
    arr = gguf(kv("k", ARR, struct.pack("<IQ", vtype, 1) + b"\0" * 16))
    assert_format_error(write(tmp_path, arr), "unknown value type")


def test_nesting_bomb_and_bad_key(tmp_path: Path) -> None:
    bomb = struct.pack("<IQ", ARR, 1) * 100 + struct.pack("<IQ", U8, 0)
    assert_format_error(write(tmp_path, gguf(kv("k", ARR, bomb))), "nested deeper")
    bad_key = s(b"\xff\xfe") + struct.pack("<I", U8) + b"\0"
    assert_format_error(write(tmp_path, gguf(bad_key)), "not UTF-8")


# --- truncations and fuzzing of a full header ------------------------------------------------------------------


def test_every_truncation_is_a_format_error(tmp_path: Path, rich: bytes) -> None:
    path = tmp_path / "cut.gguf"
    for cut in cut_points(len(rich)):
        path.write_bytes(rich[:cut])
        with pytest.raises(GGUFFormatError):
            read_header(path)
    path.write_bytes(rich)  # the whole KV section alone is enough
    assert read_header(path).kv_count == RICH_KV_COUNT


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "f.gguf"


def _check_only_format_errors(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    t0 = time.thread_time()
    try:
        read_header(path)
    except GGUFFormatError:
        pass
    assert time.thread_time() - t0 < READ_CPU_S


# deadline=None: the CPU-time bound of _check_only_format_errors instead of hypothesis' wall-clock one.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=512), st.binary(max_size=256).map(lambda b: b"GGUF\x03\0\0\0" + b)))
def test_fuzz_random_bytes(fuzz_path: Path, data: bytes) -> None:
    _check_only_format_errors(fuzz_path, data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_header(fuzz_path: Path, rich: bytes, data: st.DataObject) -> None:
    full = rich
    buf = bytearray(full[: data.draw(st.integers(0, len(full)), label="cut")])
    # bias mutations towards the start, where the lengths and types of the scalar KVs are
    for _ in range(data.draw(st.integers(1, 8), label="mutations")):
        if not buf:
            break
        hi = data.draw(st.sampled_from([min(len(buf), 1024), len(buf)]), label="region")
        pos = data.draw(st.integers(0, hi - 1), label="pos")
        chunk = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        buf[pos : pos + len(chunk)] = chunk
    _check_only_format_errors(fuzz_path, bytes(buf))
