"""The fast GGUF header reader: real models, crafted bad inputs, truncations and a fuzz test.

Expected values were checked against ``gguf.GGUFReader`` (gguf 0.19) on the same files.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_provider.errors import GGUFFormatError, ModelNotFoundError
from gguf_provider.runtime.gguf import GGUFHeader, SkippedArray, read_header
from tests.support.test_models import ensure

# --- crafting GGUF bytes -------------------------------------------------------------------------------------

U8, I32, U32, F32, BOOL, STR, ARR, U64 = 0, 5, 4, 6, 7, 8, 9, 10


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def u32(key: str, v: int) -> bytes:
    return kv(key, U32, struct.pack("<I", v))


def gguf(*kvs: bytes, version: int = 3, tensor_count: int = 0, kv_count: int | None = None) -> bytes:
    n = len(kvs) if kv_count is None else kv_count
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, n) + b"".join(kvs)


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_format_error(path: Path, *words: str) -> GGUFFormatError:
    t0 = time.perf_counter()
    with pytest.raises(GGUFFormatError) as info:
        read_header(path)
    assert time.perf_counter() - t0 < 1.0
    msg = str(info.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg
    return info.value


# --- real models ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return {key: ensure(key) for key in ("smollm2", "qwen", "gemma")}


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
        t0 = time.perf_counter()
        h = read_header(path)
        assert time.perf_counter() - t0 < 1.0  # ~15-50 ms here; GGUFReader takes seconds
        assert isinstance(h, GGUFHeader)
        assert 24 < h.metadata_end < path.stat().st_size
        # the tensor info section starts right there: the first tensor name is a short ASCII string
        with open(path, "rb") as f:
            f.seek(h.metadata_end)
            (n,) = struct.unpack("<Q", f.read(8))
            assert 0 < n < 256 and f.read(n).isascii()


def test_header_is_frozen(models: dict[str, Path]) -> None:
    h = read_header(models["smollm2"])
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


# --- truncations and fuzzing of a real header ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_prefix(models: dict[str, Path]) -> bytes:
    """The complete metadata section of SmolLM2 (a real header with strings, arrays, floats and bools)."""
    path = models["smollm2"]
    end = read_header(path).metadata_end
    with open(path, "rb") as f:
        return f.read(end)


def _cut_points(n: int) -> Iterator[int]:
    yield from range(0, 64)  # magic, version, counts, first key
    yield from range(64, n, max(n // 300, 1))  # across the arrays
    yield from range(n - 64, n)  # the last KVs


def test_every_truncation_is_a_format_error(tmp_path: Path, real_prefix: bytes) -> None:
    n = len(real_prefix)
    path = tmp_path / "cut.gguf"
    for cut in _cut_points(n):
        path.write_bytes(real_prefix[:cut])
        with pytest.raises(GGUFFormatError):
            read_header(path)
    path.write_bytes(real_prefix)  # the whole KV section alone is enough
    assert read_header(path).kv_count == 33


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "f.gguf"


def _check_only_format_errors(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    t0 = time.perf_counter()
    try:
        read_header(path)
    except GGUFFormatError:
        pass
    assert time.perf_counter() - t0 < 2.0


@settings(max_examples=100, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=512), st.binary(max_size=256).map(lambda b: b"GGUF\x03\0\0\0" + b)))
def test_fuzz_random_bytes(fuzz_path: Path, data: bytes) -> None:
    _check_only_format_errors(fuzz_path, data)


@settings(max_examples=200, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
    _check_only_format_errors(fuzz_path, bytes(buf))
