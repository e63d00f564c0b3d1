"""A fast GGUF header reader that skips arrays.

``gguf.GGUFReader`` materializes the tokenizer arrays (seconds and ~1 GB on big vocabularies); this reader parses
the key/value section with ``struct`` over a chunked buffer, seeks past arrays without decoding them and never
reads the tensor infos or data. Every length is checked against the bytes left in the file before anything is
allocated, so a corrupt or hostile file fails fast with :class:`GGUFFormatError`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ...errors import GGUFFormatError, ModelNotFoundError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

# GGUF value types: id -> (name, struct format or None for variable-size types)
_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("uint8", "B"),
    1: ("int8", "b"),
    2: ("uint16", "H"),
    3: ("int16", "h"),
    4: ("uint32", "I"),
    5: ("int32", "i"),
    6: ("float32", "f"),
    7: ("bool", "?"),
    8: ("string", None),
    9: ("array", None),
    10: ("uint64", "Q"),
    11: ("int64", "q"),
    12: ("float64", "d"),
}
_STRING, _ARRAY = 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_CHUNK = 1 << 20  # read-ahead size
_SMALL_ARRAY = (
    4096  # numeric arrays up to this length (outside tokenizer.*) are kept, e.g. per-layer head counts
)
_MAX_DEPTH = 8  # nested-array depth limit

Scalar = int | float | bool | str


class SkippedArray(NamedTuple):
    """Placeholder for an array the reader skipped (strings, nested, tokenizer or long arrays)."""

    elem_type: str
    length: int


MetaValue = Scalar | SkippedArray | tuple[int | float | bool, ...]


@dataclass(frozen=True)
class GGUFHeader:
    """What the GGUF metadata says about a model. Absent keys are ``None``."""

    path: Path
    version: int
    tensor_count: int
    kv_count: int
    metadata_end: int  # byte offset where the KV section ends and the tensor infos start
    architecture: str
    name: str | None
    file_type: int | None
    split_count: int | None
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | None  # max over layers when the file stores a per-layer array
    head_count_kv: int | None  # idem
    head_count_kv_per_layer: tuple[int, ...] | None  # only when the file stores an array (0 = no attention)
    key_length: int | None
    value_length: int | None
    rope_dimension_count: int | None
    sliding_window: int | None
    sliding_window_pattern: int | None  # `{arch}.attention.sliding_window_pattern` when an int
    swa_layers: tuple[bool, ...] | None  # the same key when a per-layer bool array
    # MLA (DeepSeek-style latent attention)
    kv_lora_rank: int | None
    key_length_mla: int | None
    value_length_mla: int | None
    # recurrent / hybrid hints
    ssm_conv_kernel: int | None
    ssm_inner_size: int | None
    ssm_state_size: int | None
    ssm_group_count: int | None
    full_attention_interval: int | None
    chat_template: str | None
    pooling_type: int | None  # `{arch}.pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank (embedders)
    metadata: dict[str, MetaValue] = field(repr=False, hash=False)

    @property
    def head_dim(self) -> int | None:
        """Per-head K size: ``key_length``, else ``embedding_length // head_count``."""
        if self.key_length:
            return self.key_length
        if self.embedding_length and self.head_count:
            return self.embedding_length // self.head_count
        return None

    @property
    def value_head_dim(self) -> int | None:
        return self.value_length or self.head_dim

    @property
    def has_ssm(self) -> bool:
        """True when the model has recurrent (SSM) layers."""
        return self.ssm_state_size is not None or self.ssm_inner_size is not None


class _Reader:
    """Sequential little-endian reader over a file with a chunk buffer and bounds checks."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path
        self.buf = b""
        self.pos = 0  # position in buf
        self.base = 0  # file offset of buf[0]

    def fail(self, what: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: not a valid GGUF file: {what} (at byte {self.offset})")

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def left(self) -> int:
        return self.size - self.offset

    def _fill(self, n: int) -> None:
        """Make at least ``n`` bytes available at ``pos`` (n is always small or checked against the file)."""
        if n > self.left():
            raise self.fail(f"truncated: needs {n} more bytes, {self.left()} left")
        tail = self.buf[self.pos :]
        self.base += self.pos
        self.f.seek(self.base + len(tail))
        more = self.f.read(max(n - len(tail), _CHUNK))
        self.buf, self.pos = tail + more, 0
        if len(self.buf) < n:  # the file shrank under us
            raise self.fail("truncated while reading")

    def read(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            self._fill(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct) -> int:
        if self.pos + st.size > len(self.buf):
            self._fill(st.size)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return int(v)

    def skip(self, n: int) -> None:
        if n > self.left():
            raise self.fail(f"truncated or absurd length: {n} bytes to skip, {self.left()} left")
        if self.pos + n <= len(self.buf):
            self.pos += n
        else:  # jump: drop the buffer
            self.base, self.buf, self.pos = self.offset + n, b"", 0

    def string(self, what: str) -> bytes:
        n = self.unpack(_U64)
        if n > self.left():
            raise self.fail(f"{what} length {n} exceeds the {self.left()} bytes left")
        return self.read(n)

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` length-prefixed strings: the hot loop for tokenizer arrays, kept on locals."""
        unpack = _U64.unpack_from
        buf, p, end = self.buf, self.pos, len(self.buf)
        for _ in range(count):
            if p + 8 <= end:
                q = p + 8 + unpack(buf, p)[0]
                if q <= end:  # fast path: the whole string is buffered
                    p = q
                    continue
            self.pos = p  # slow path: refill or jump
            self.skip(self.unpack(_U64))
            buf, p, end = self.buf, self.pos, len(self.buf)
        self.pos = p


    def read_strings(self, count: int) -> list[bytes]:
        """``count`` length-prefixed strings (a tokenizer's token list), on the same buffered fast path."""
        out: list[bytes] = []
        append, unpack = out.append, _U64.unpack_from
        buf, p, end = self.buf, self.pos, len(self.buf)
        for _ in range(count):
            if p + 8 <= end:
                q = p + 8 + unpack(buf, p)[0]
                if q <= end:  # fast path: the whole string is buffered
                    append(buf[p + 8:q])
                    p = q
                    continue
            self.pos = p  # slow path: refill
            append(self.string("token"))
            buf, p, end = self.buf, self.pos, len(self.buf)
        self.pos = p
        return out


def _value_type(r: _Reader, key: str) -> int:
    t = r.unpack(_U32)
    if t not in _TYPES:
        raise r.fail(f"unknown value type {t} for key {key!r}")
    return t


def _read_value(r: _Reader, t: int, key: str) -> MetaValue:
    if t == _STRING:
        return r.string(f"string value of {key!r}").decode("utf-8", errors="replace")
    if t == _ARRAY:
        return _read_array(r, key, 0)
    fmt = _TYPES[t][1]
    assert fmt is not None
    (v,) = struct.unpack("<" + fmt, r.read(struct.calcsize(fmt)))
    return v  # type: ignore[no-any-return]


def _read_array(r: _Reader, key: str, depth: int) -> MetaValue:
    if depth > _MAX_DEPTH:
        raise r.fail(f"arrays nested deeper than {_MAX_DEPTH} in {key!r}")
    et = _value_type(r, key)
    n = r.unpack(_U64)
    name, fmt = _TYPES[et]
    if et == _STRING:
        if n * 8 > r.left():
            raise r.fail(f"array {key!r} claims {n} strings, more than the file can hold")
        r.skip_strings(n)
    elif et == _ARRAY:
        if n * 12 > r.left():
            raise r.fail(f"array {key!r} claims {n} nested arrays, more than the file can hold")
        for _ in range(n):
            _read_array(r, key, depth + 1)
    else:
        assert fmt is not None
        nbytes = n * struct.calcsize(fmt)
        if nbytes > r.left():
            raise r.fail(f"array {key!r} of {n} {name} exceeds the {r.left()} bytes left")
        if n <= _SMALL_ARRAY and depth == 0 and not key.startswith("tokenizer."):
            return tuple(struct.unpack(f"<{n}{fmt}", r.read(nbytes)))
        r.skip(nbytes)
    return SkippedArray(name, n)


def _int(v: MetaValue | None) -> int | None:
    """An int from a scalar, the max of a numeric array, else None."""
    if isinstance(v, tuple) and not isinstance(v, SkippedArray):
        ints = [int(x) for x in v if isinstance(x, (int, bool))]
        return max(ints) if ints else None
    if isinstance(v, (int, bool)):
        return int(v)
    return None


def _str(v: MetaValue | None) -> str | None:
    return v if isinstance(v, str) else None


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the metadata of a GGUF file (shard 1 of a split model) without materializing arrays.

    Raises :class:`ModelNotFoundError` when the file is missing and :class:`GGUFFormatError` when it is not a
    valid GGUF file (wrong magic, unsupported version, truncated, absurd lengths or unknown value types).
    """
    return _parse(Path(path), None)[0]


TOKENS_KEY = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class Vocabulary:
    """A model's tokenizer as its GGUF header states it (what llama.cpp compares before a draft model drafts)."""

    path: Path
    model: str | None  # `tokenizer.ggml.model`: gpt2 (BPE), llama (SentencePiece), bert (WordPiece), ...
    tokens: tuple[bytes, ...] = field(repr=False)
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None
    add_eos: bool | None


def require_model(header: GGUFHeader, path: str | os.PathLike[str]) -> None:
    """ModelNotFoundError when ``path`` is a multimodal projector (architecture ``clip``), not a model."""
    if header.architecture == "clip":
        raise ModelNotFoundError(
            f"{path} is a multimodal projector (mmproj), not a model: give its model, with vision=True (the mmproj "
            f"beside it) or mmproj='{path}'")


def read_vocabulary(path: str | os.PathLike[str]) -> Vocabulary:
    """The tokenizer of a GGUF file, its token texts included (read only for this: ~0.1 s for 150k tokens)."""
    header, tokens = _parse(Path(path), TOKENS_KEY)
    meta = header.metadata

    def flag(key: str) -> bool | None:
        v = meta.get(key)
        return v if isinstance(v, bool) else None

    return Vocabulary(path=header.path, model=_str(meta.get("tokenizer.ggml.model")), tokens=tuple(tokens),
                      bos_id=_int(meta.get("tokenizer.ggml.bos_token_id")),
                      eos_id=_int(meta.get("tokenizer.ggml.eos_token_id")),
                      add_bos=flag("tokenizer.ggml.add_bos_token"), add_eos=flag("tokenizer.ggml.add_eos_token"))


def _parse(p: Path, strings_of: str | None) -> tuple[GGUFHeader, list[bytes]]:
    """The header, and the values of the string array ``strings_of`` when it is given (else none)."""
    try:
        f = open(p, "rb", buffering=0)
    except FileNotFoundError:
        raise ModelNotFoundError(f"GGUF file not found: {p}") from None
    except IsADirectoryError:
        raise GGUFFormatError(f"{p}: is a directory, not a GGUF file") from None
    with f:
        return _parse_from(_Reader(f, os.fstat(f.fileno()).st_size, p), strings_of)


def _parse_from(r: _Reader, strings_of: str | None) -> tuple[GGUFHeader, list[bytes]]:
    p, size = r.path, r.size
    strings: list[bytes] = []
    if size < 4 or r.read(4) != MAGIC:
        raise GGUFFormatError(f"{p}: not a GGUF file (the first 4 bytes are not b'GGUF')")
    version = r.unpack(_U32)
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian file?)" if version >= 1 << 16 else ""
        raise GGUFFormatError(
            f"{p}: unsupported GGUF version {version}{hint}; versions {SUPPORTED_VERSIONS} are supported"
        )
    tensor_count, kv_count = r.unpack(_U64), r.unpack(_U64)
    # A KV takes >= 13 bytes (key length, type, 1-byte value); a tensor info >= 24 before its name.
    if kv_count * 13 > r.left():
        raise r.fail(f"kv_count {kv_count} is more than the file could hold")
    if tensor_count * 24 > r.left():
        raise r.fail(f"tensor_count {tensor_count} is more than the file could hold")
    meta: dict[str, MetaValue] = {}
    for _ in range(kv_count):
        raw = r.string("key")
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise r.fail(f"key {raw[:40]!r} is not UTF-8") from None
        t = _value_type(r, key)
        if key == strings_of and t == _ARRAY:
            strings = _read_string_array(r, key)
            meta[key] = SkippedArray("string", len(strings))
        else:
            meta[key] = _read_value(r, t, key)
    return _build(p, version, tensor_count, kv_count, r.offset, meta), strings


def _read_string_array(r: _Reader, key: str) -> list[bytes]:
    et = _value_type(r, key)
    n = r.unpack(_U64)
    if et != _STRING:
        raise r.fail(f"{key!r} is an array of {_TYPES[et][0]}, not of strings")
    if n * 8 > r.left():
        raise r.fail(f"array {key!r} claims {n} strings, more than the file can hold")
    return r.read_strings(n)


def _build(
    p: Path, version: int, tensor_count: int, kv_count: int, end: int, meta: dict[str, MetaValue]
) -> GGUFHeader:
    arch = _str(meta.get("general.architecture")) or ""

    def a(suffix: str) -> MetaValue | None:
        return meta.get(f"{arch}.{suffix}")

    kv = a("attention.head_count_kv")
    per_layer = (
        tuple(int(x) for x in kv) if isinstance(kv, tuple) and not isinstance(kv, SkippedArray) else None
    )
    pattern = a("attention.sliding_window_pattern")
    swa_layers = None
    if isinstance(pattern, tuple) and not isinstance(pattern, SkippedArray):
        swa_layers = tuple(bool(x) for x in pattern)
    return GGUFHeader(
        path=p,
        version=version,
        tensor_count=tensor_count,
        kv_count=kv_count,
        metadata_end=end,
        architecture=arch,
        name=_str(meta.get("general.name")),
        file_type=_int(meta.get("general.file_type")),
        split_count=_int(meta.get("split.count")),
        context_length=_int(a("context_length")),
        block_count=_int(a("block_count")),
        embedding_length=_int(a("embedding_length")),
        head_count=_int(a("attention.head_count")),
        head_count_kv=_int(kv),
        head_count_kv_per_layer=per_layer,
        key_length=_int(a("attention.key_length")),
        value_length=_int(a("attention.value_length")),
        rope_dimension_count=_int(a("rope.dimension_count")),
        sliding_window=_int(a("attention.sliding_window")),
        sliding_window_pattern=None if swa_layers is not None else _int(pattern),
        swa_layers=swa_layers,
        kv_lora_rank=_int(a("attention.kv_lora_rank")),
        key_length_mla=_int(a("attention.key_length_mla")),
        value_length_mla=_int(a("attention.value_length_mla")),
        ssm_conv_kernel=_int(a("ssm.conv_kernel")),
        ssm_inner_size=_int(a("ssm.inner_size")),
        ssm_state_size=_int(a("ssm.state_size")),
        ssm_group_count=_int(a("ssm.group_count")),
        full_attention_interval=_int(a("full_attention_interval")),
        chat_template=_str(meta.get("tokenizer.chat_template")),
        pooling_type=_int(a("pooling_type")),
        metadata=meta,
    )


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF file's tensor table: its name and the bytes its data takes in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    nbytes: int


def read_tensors(path: str | os.PathLike[str]) -> list[TensorInfo]:
    """The tensor table of one GGUF file (a split model's shard holds its own part): names, shapes and sizes.

    A tensor's size is the distance from its data offset to the next one's (the last runs to the file's end), so
    padding is counted: what mapping the file costs. Reads only the table, never the data.
    """
    p = Path(path)
    with open(p, "rb", buffering=0) as f:
        return read_table(f, os.fstat(f.fileno()).st_size, p)[1]


def read_table(f: BinaryIO, size: int, name: str | os.PathLike[str]) -> tuple[GGUFHeader, list[TensorInfo]]:
    """The header and the tensor table of a GGUF file opened as ``f`` (``size`` bytes in all), read in one pass
    from its start: a local file, or a remote one read by HTTP ranges (:mod:`..._models.remote`). ``name`` is
    what messages call it."""
    r = _Reader(f, size, Path(name))
    header = _parse_from(r, None)[0]
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(header.tensor_count):
        tname = r.string("tensor name").decode("utf-8", errors="replace")
        n_dims = r.unpack(_U32)
        if n_dims > 8:
            raise r.fail(f"tensor {tname!r} claims {n_dims} dimensions")
        shape = tuple(r.unpack(_U64) for _ in range(n_dims))
        ggml_type, offset = r.unpack(_U32), r.unpack(_U64)
        raw.append((tname, shape, ggml_type, offset))
    align = _int(header.metadata.get("general.alignment")) or 32
    data_start = -(-r.offset // align) * align
    data_size = max(size - data_start, 0)
    ends = sorted({o for *_, o in raw} | {data_size})
    following = {o: ends[i + 1] for i, o in enumerate(ends[:-1])}
    return header, [TensorInfo(n, shape, t, max(following.get(o, data_size) - o, 0)) for n, shape, t, o in raw]


def read_tables(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[GGUFHeader, list[TensorInfo]]]:
    """:func:`read_table` of each file in ``paths`` (a model's shards)."""
    out = []
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            out.append(read_table(f, os.fstat(f.fileno()).st_size, path))
    return out
