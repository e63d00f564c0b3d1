"""Tensor tables of real models, written into GGUF files by the tests themselves, so the memory plan is unit tested
offline on the real per-tensor sizes (tests/integration_tests/test_plan_real.py checks them against the real files).

A file written here has the real model's header keys that the plan reads and its real tensor table (names, shapes,
types, offsets); its data section is a hole (the file is truncated to its full size, sparse where the filesystem
allows), so :func:`gguf_provider.runtime._common.gguf.read_tensors` reads the same sizes as from the real file.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from tests.support.gguf_bytes import STANDINS, encode, gguf, s

# ggml type -> (elements per block, bytes per block)
F32, F16, Q4_1, Q5_0, Q8_0, Q2_K, Q4_K, Q6_K = 0, 1, 3, 6, 8, 10, 12, 14
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_1: (32, 20), Q5_0: (32, 22), Q8_0: (32, 34), Q2_K: (256, 84),
         Q4_K: (256, 144), Q6_K: (256, 210)}

Tensor = tuple[str, tuple[int, ...], int]  # name, shape (ggml order), ggml type
Meta = dict[str, str | bool | int | float | tuple[int, ...]]


def tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    per, size = BLOCK[ggml_type]
    n = 1
    for d in shape:
        n *= d
    return n // per * size


def write_gguf(path: Path, metadata: Meta, tensors: Sequence[Tensor], *, alignment: int = 32,
               data: bool = True) -> Path:
    """A GGUF file with ``metadata``, the tensor table of ``tensors`` (data offsets aligned to ``alignment``) and,
    when ``data``, a data section of the tensors' sizes (the last one unpadded: the file ends where it does)."""
    kvs = [encode(k, v) for k, v in metadata.items()]
    infos, offset, ends = [], 0, 0
    for name, shape, t in tensors:
        offset = -(-offset // alignment) * alignment
        infos.append(s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
                     + struct.pack("<IQ", t, offset))
        offset += tensor_bytes(shape, t)
        ends = offset
    head = gguf(*kvs, tensor_count=len(tensors)) + b"".join(infos)
    data_start = -(-len(head) // alignment) * alignment
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        if data:
            f.truncate(data_start + ends)
    return path


# --- Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf (491,400,064 bytes; 24 layers, untied output head) ---------------------

QWEN_FILE = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
QWEN_META: Meta = {**STANDINS["qwen"].metadata, "qwen2.feed_forward_length": 4864}  # the stand-in's header + n_ff
# the layers whose ffn_down is Q6_K and attn_v Q8_0 (the others: Q4_K and Q5_0), as in the real file
QWEN_MORE_BITS = frozenset({0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21})


def qwen_tensors() -> list[Tensor]:
    """The real file's tensor table, in its order (the layers sorted as strings: 0, 1, 10, 11, ..., 19, 2, 20, ...)."""
    out: list[Tensor] = [("output.weight", (896, 151936), Q8_0), ("token_embd.weight", (896, 151936), Q5_0)]
    for i in sorted(range(24), key=str):
        more = i in QWEN_MORE_BITS
        out += [(f"blk.{i}.{name}", shape, t) for name, shape, t in (
            ("attn_norm.weight", (896,), F32),
            ("ffn_down.weight", (4864, 896), Q6_K if more else Q4_K),
            ("ffn_gate.weight", (896, 4864), Q5_0),
            ("ffn_up.weight", (896, 4864), Q5_0),
            ("ffn_norm.weight", (896,), F32),
            ("attn_k.bias", (128,), F32),
            ("attn_k.weight", (896, 128), Q5_0),
            ("attn_output.weight", (896, 896), Q5_0),
            ("attn_q.bias", (896,), F32),
            ("attn_q.weight", (896, 896), Q5_0),
            ("attn_v.bias", (128,), F32),
            ("attn_v.weight", (896, 128), Q8_0 if more else Q5_0),
        )]
    out.append(("output_norm.weight", (896,), F32))
    return out


# --- SmolLM2-135M cut to 8 layers (.devcarry/smol8.gguf, 49,588,768 bytes; tied output head) ------------------------
# llama.cpp's own numbers for it on an NVIDIA H200 (llama-server -lv 4, n_ctx 2048, f16 KV; /work/notes/device/*.log)

SMOL8_META: Meta = {
    "general.architecture": "llama",
    "llama.context_length": 8192,
    "llama.block_count": 8,
    "llama.embedding_length": 576,
    "llama.feed_forward_length": 1536,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.rope.dimension_count": 64,
}


def smol8_tensors() -> list[Tensor]:
    out: list[Tensor] = [("token_embd.weight", (576, 49152), Q8_0)]
    for i in range(8):
        out += [(f"blk.{i}.{name}", shape, t) for name, shape, t in (
            ("attn_norm.weight", (576,), F32),
            ("ffn_down.weight", (1536, 576), Q4_1),
            ("ffn_gate.weight", (576, 1536), Q4_1),
            ("ffn_up.weight", (576, 1536), Q4_1),
            ("ffn_norm.weight", (576,), F32),
            ("attn_k.weight", (576, 192), Q4_1),
            ("attn_output.weight", (576, 576), Q4_1),
            ("attn_q.weight", (576, 576), Q4_1),
            ("attn_v.weight", (576, 192), Q4_1),
        )]
    out.append(("output_norm.weight", (576,), F32))
    return out
