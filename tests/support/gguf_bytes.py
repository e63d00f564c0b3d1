"""GGUF headers written by the tests themselves (a few lines of struct packing), so the header reader, the memory
fit and local model resolution are unit tested offline, without a model file.

``STANDINS`` carry what the fit reads from the real test models (and their file sizes);
tests/integration_tests/test_gguf_real.py checks them against the real files.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12


def s(text: str | bytes) -> bytes:
    """A GGUF string: u64 length + bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def u32(key: str, v: int) -> bytes:
    return kv(key, U32, struct.pack("<I", v))


def string(key: str, v: str) -> bytes:
    return kv(key, STR, s(v))


def f32(key: str, v: float) -> bytes:
    return kv(key, F32, struct.pack("<f", v))


def boolean(key: str, v: bool) -> bytes:
    return kv(key, BOOL, b"\x01" if v else b"\x00")


def array(key: str, elem: int, items: list[bytes]) -> bytes:
    """An array of ``elem``; ``items`` are the packed elements."""
    return kv(key, ARR, struct.pack("<IQ", elem, len(items)) + b"".join(items))


def gguf(*kvs: bytes, version: int = 3, tensor_count: int = 0, kv_count: int | None = None) -> bytes:
    """Magic, version, counts and the KV section (``kv_count`` defaults to ``len(kvs)``)."""
    n = len(kvs) if kv_count is None else kv_count
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, n) + b"".join(kvs)


def encode(key: str, value: str | bool | int | float | tuple[int, ...]) -> bytes:
    """One KV from a Python value: str, bool, int (u32), float (f32), tuple of ints (u32 array)."""
    if isinstance(value, str):
        return string(key, value)
    if isinstance(value, bool):
        return boolean(key, value)
    if isinstance(value, int):
        return u32(key, value)
    if isinstance(value, float):
        return f32(key, value)
    return array(key, U32, [struct.pack("<I", v) for v in value])


# --- a header like a real model's -----------------------------------------------------------------------------

TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
N_TOKENS, N_MERGES = 300, 200


def rich_header() -> bytes:
    """A complete llama-style KV section with every kind of value a real one has: strings, u32/f32/bool scalars,
    a u64, string/int32/float32 token arrays and a chat template (no tensors: it ends where tensor infos would
    start). ``RICH_KV_COUNT`` KVs."""
    tokens = [s(f"tok{i}") for i in range(N_TOKENS)]
    merges = [s(f"t{i} k{i}") for i in range(N_MERGES)]
    return gguf(
        string("general.architecture", "llama"),
        string("general.name", "Rich Test Model"),
        array("general.languages", STR, [s("en")]),
        kv("general.size", U64, struct.pack("<Q", 135_000_000)),
        u32("general.file_type", 3),
        u32("general.quantization_version", 2),
        u32("llama.context_length", 8192),
        u32("llama.block_count", 30),
        u32("llama.embedding_length", 576),
        u32("llama.feed_forward_length", 1536),
        u32("llama.attention.head_count", 9),
        u32("llama.attention.head_count_kv", 3),
        u32("llama.rope.dimension_count", 64),
        f32("llama.rope.freq_base", 100000.0),
        f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
        u32("llama.vocab_size", N_TOKENS),
        string("tokenizer.ggml.model", "gpt2"),
        array("tokenizer.ggml.tokens", STR, tokens),
        array("tokenizer.ggml.token_type", I32, [struct.pack("<i", 1)] * N_TOKENS),
        array("tokenizer.ggml.scores", F32, [struct.pack("<f", -float(i)) for i in range(N_TOKENS)]),
        array("tokenizer.ggml.merges", STR, merges),
        u32("tokenizer.ggml.bos_token_id", 1),
        u32("tokenizer.ggml.eos_token_id", 2),
        boolean("tokenizer.ggml.add_bos_token", False),
        string("tokenizer.chat_template", TEMPLATE),
    )


RICH_KV_COUNT = 25


def cut_points(n: int) -> Iterator[int]:
    """Where to truncate an ``n``-byte header: densely at both ends, sparsely across the arrays."""
    yield from range(0, min(64, n))  # magic, version, counts, first key
    yield from range(64, n, max(n // 300, 1))  # across the arrays
    yield from range(max(n - 64, 64), n)  # the last KVs


# --- stand-ins for the real test models -------------------------------------------------------------------------


@dataclass(frozen=True)
class StandIn:
    """A header-only file named like a real test model, with the metadata the memory fit reads from it."""

    filename: str
    size: int  # bytes of the real file (the weights the fit counts)
    metadata: dict[str, str | bool | int | float | tuple[int, ...]] = field(repr=False)

    def data(self) -> bytes:
        return gguf(*(encode(k, v) for k, v in self.metadata.items()))

    def write(self, directory: Path) -> Path:
        path = directory / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.data())
        return path


STANDINS = {
    "smollm2": StandIn("SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432, {
        "general.architecture": "llama",
        "general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2",
        "general.file_type": 3,
        "llama.context_length": 8192,
        "llama.block_count": 30,
        "llama.embedding_length": 576,
        "llama.attention.head_count": 9,
        "llama.attention.head_count_kv": 3,
        "llama.rope.dimension_count": 64,
    }),
    "qwen": StandIn("Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", 491_400_064, {
        "general.architecture": "qwen2",
        "general.name": "Qwen2.5 Coder 0.5B Instruct AWQ",
        "general.file_type": 15,
        "qwen2.context_length": 32768,
        "qwen2.block_count": 24,
        "qwen2.embedding_length": 896,
        "qwen2.attention.head_count": 14,
        "qwen2.attention.head_count_kv": 2,
    }),
    "gemma": StandIn("gemma-3-270m.Q4_K_M.gguf", 253_113_024, {
        "general.architecture": "gemma3",
        "general.name": "Gemma 3 270m",
        "general.file_type": 15,
        "gemma3.context_length": 32768,
        "gemma3.block_count": 18,
        "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.attention.sliding_window": 512,
    }),
}
