"""Memory fit: how much KV cache a context needs and the largest context that fits in free memory.

The KV estimate follows llama.cpp's cache layout (llama-kv-cache*.cpp in the pinned source):

* standard / GQA: per attention layer and token, ``n_head_kv * (key_length * type_k + value_length * type_v)``;
* sliding window: SWA layers keep only ``min(n_ctx, sliding_window * n_seq + n_ubatch)`` cells (rounded up to
  256). Which layers are SWA comes from ``{arch}.attention.sliding_window_pattern`` (a per-layer array or an
  int) or else llama.cpp's hard-coded pattern for the arch (gemma3: 5 SWA + 1 full per 6 layers). For an
  unknown arch every layer is counted as full: an overestimate, never an underestimate;
* MLA (``key_length_mla``/``value_length_mla`` present): one latent of ``kv_lora_rank + rope dims`` per token
  and layer in the K cache, no V cache;
* hybrid / recurrent: only attention layers hold KV (per-layer ``head_count_kv`` of 0, or every
  ``full_attention_interval``-th layer); the recurrent state is a constant (:func:`recurrent_state_bytes`).

A cache type costs its ggml block's bytes per element (:data:`CACHE_TYPES`: f16 2, q8_0 34/32, q4_0 18/32, ...).
A draft model (speculative decoding) holds its own KV cache of the same context and type.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from ...errors import InsufficientMemoryError
from .._common.gguf import GGUFHeader

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_CONTEXT = 4096  # when the file has no context_length
MIN_CONTEXT = 512
CONTEXT_STEP = 256
N_UBATCH = 512  # llama.cpp's default micro-batch: SWA caches keep this many cells beyond the window

# KV cache types llama-server takes (`--cache-type-k/-v`): (elements per block, bytes per block), from ggml's
# type traits (ggml.c, ggml-common.h): a q8_0 block is one f16 scale + 32 int8 values = 34 bytes for 32 elements.
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24),
}
DEFAULT_CACHE_TYPE = "f16"

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from ``"6GiB"``, ``"1.5 GB"``, ``"512MiB"`` or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m[2].lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"not a memory size: {text!r} (e.g. 6GiB, 512MiB, 8GB or a number of bytes)")
    return int(float(m[1]) * _UNITS[unit])


def cache_type_bytes(cache_type: str) -> float:
    """Bytes per element of a KV cache type (``q8_0`` → 1.0625)."""
    try:
        block, size = CACHE_TYPES[cache_type]
    except KeyError:
        raise ValueError(f"unknown KV cache type {cache_type!r}; known: {', '.join(CACHE_TYPES)}") from None
    return size / block


def is_quantized(cache_type: str) -> bool:
    """Whether a cache type is block-quantized (a quantized V cache needs flash attention)."""
    return CACHE_TYPES.get(cache_type, (1, 0))[0] > 1


# llama.cpp's per-arch SWA pattern when the file has none: (n_pattern, dense_first). Layer il is SWA when
# il % n < n - 1 (or, dense_first, when il % n != 0).
_SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "gpt-oss": (2, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "smallthinker": (4, True),
    "plamo3": (8, False),
}
# Architectures with no attention layers at all (state only).
_PURE_RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}


def _pad(n: int, to: int = CONTEXT_STEP) -> int:
    return -(-n // to) * to


def _layers(h: GGUFHeader) -> list[tuple[int, bool]]:
    """(n_head_kv, is_swa) for each attention layer; recurrent layers are left out."""
    n = h.block_count or 0
    if h.architecture in _PURE_RECURRENT or n == 0:
        return []
    default_kv = h.head_count_kv if h.head_count_kv is not None else (h.head_count or 0)
    kv = list(h.head_count_kv_per_layer or ())[:n]
    kv += [default_kv] * (n - len(kv))
    attn = [k > 0 for k in kv]
    if h.head_count_kv_per_layer is None and h.full_attention_interval:
        # e.g. qwen3next: every k-th layer is attention, the rest recurrent
        attn = [(i + 1) % h.full_attention_interval == 0 for i in range(n)]
    swa = [False] * n
    if h.sliding_window:
        if h.swa_layers is not None:
            swa = [i < len(h.swa_layers) and h.swa_layers[i] for i in range(n)]
        else:
            pattern, dense_first = _SWA_PATTERNS.get(h.architecture, (1, False))  # 1 = all full
            if h.sliding_window_pattern is not None:
                pattern = h.sliding_window_pattern
            swa = [
                pattern == 0 or (i % pattern != 0 if dense_first else i % pattern < pattern - 1)
                for i in range(n)
            ]
    return [(kv[i], swa[i]) for i in range(n) if attn[i]]


def kv_cache_bytes(
    header: GGUFHeader, n_ctx: int, *, type_k_bytes: float = 2.0, type_v_bytes: float = 2.0, n_seq: int = 1
) -> int:
    """Bytes of KV cache for a total context of ``n_ctx`` tokens shared by ``n_seq`` sequences."""
    h = header
    swa_cells = min(n_ctx, _pad(h.sliding_window * n_seq + N_UBATCH)) if h.sliding_window else n_ctx
    mla = bool(h.kv_lora_rank and h.key_length_mla and h.value_length_mla)
    if mla:
        assert h.kv_lora_rank is not None
        rope = h.rope_dimension_count or max((h.key_length or 0) - h.kv_lora_rank, 0) or 64
        k_per_head, v_per_head = float(h.kv_lora_rank + rope), 0.0
    else:
        k_per_head = float(h.head_dim or 0)
        v_per_head = float(h.value_head_dim or 0)
    total = 0.0
    for n_kv, is_swa in _layers(h):
        heads = 1 if mla else n_kv
        total += (
            (swa_cells if is_swa else n_ctx) * heads * (k_per_head * type_k_bytes + v_per_head * type_v_bytes)
        )
    return math.ceil(total)


def recurrent_state_bytes(header: GGUFHeader, *, n_seq: int = 1) -> int:
    """Constant (context-independent) recurrent state of SSM / RWKV / hybrid layers, f32; a rough estimate."""
    h = header
    n = h.block_count or 0
    if not (h.has_ssm or h.architecture in _PURE_RECURRENT) or n == 0:
        return 0
    if h.architecture in _PURE_RECURRENT or (
        h.head_count_kv_per_layer is None and not h.full_attention_interval
    ):
        n_rec = n  # pure recurrent, or hybrid with attention and SSM in every layer (falcon-h1)
    else:
        n_rec = n - len(_layers(h))
    if h.ssm_inner_size and h.ssm_state_size:
        d_inner, d_state = h.ssm_inner_size, h.ssm_state_size
        conv = max((h.ssm_conv_kernel or 4) - 1, 0) * (d_inner + 2 * (h.ssm_group_count or 0) * d_state)
        per_layer = conv + d_inner * d_state
    else:  # RWKV-like: token shift + a 64-wide wkv state per channel
        per_layer = (h.embedding_length or 0) * 66
    return per_layer * 4 * n_rec * n_seq


# --- free memory ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryInfo:
    """Memory a new llama-server could use now, in bytes."""

    ram_available: int
    vram_free: tuple[int, ...] = ()  # per GPU; empty when there is none

    @property
    def has_gpu(self) -> bool:
        return bool(self.vram_free)

    @property
    def vram_total_free(self) -> int:
        return sum(self.vram_free)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) -> None


def _stat_value(path: Path, *keys: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    stats = dict(line.split(maxsplit=1) for line in lines if " " in line)
    for key in keys:
        if stats.get(key, "").strip().isdigit():
            return int(stats[key])
    return 0


def cgroup_memory_available(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """Bytes left under the tightest cgroup memory limit on our cgroup path (v2, else v1); None if unlimited.

    Usage counts reclaimable page cache (``inactive_file``) as free.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    rel_v2, rel_v1 = "/", "/"
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            rel_v2 = parts[2]
        elif len(parts) == 3 and "memory" in parts[1].split(","):
            rel_v1 = parts[2]
    layouts = (
        (root, rel_v2, "memory.max", "memory.current", ("inactive_file",)),
        (
            root / "memory",
            rel_v1,
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            ("total_inactive_file", "inactive_file"),
        ),
    )
    found: list[int] = []
    for base, rel, limit_file, usage_file, inactive_keys in layouts:
        d = base / rel.strip("/")
        while True:  # walk from our cgroup up to the hierarchy root: any ancestor's limit applies
            limit = _read_int(d / limit_file)
            if limit is not None and limit < 1 << 60:  # v1 writes ~2^63 for "no limit"
                usage = _read_int(d / usage_file) or 0
                used = max(usage - _stat_value(d / "memory.stat", *inactive_keys), 0)
                found.append(max(limit - used, 0))
            if d == base or base not in d.parents:
                break
            d = d.parent
    return min(found) if found else None


@dataclass(frozen=True)
class NvidiaGPU:
    """One GPU as ``nvidia-smi`` lists it (``index`` is nvidia-smi's, in PCI bus order)."""

    index: int
    uuid: str
    name: str
    total: int  # bytes
    free: int  # bytes


def cuda_visible(gpus: tuple[NvidiaGPU, ...], visible: str | None) -> tuple[NvidiaGPU, ...]:
    """The GPUs a CUDA program sees under ``CUDA_VISIBLE_DEVICES=visible``, in the order it numbers them.

    As the CUDA runtime reads it: unset (None) = all; empty = none; a comma list of indices or ``GPU-<uuid>``
    (a unique prefix is enough); the list stops at the first entry that is invalid, unknown or repeated (a
    ``MIG-`` instance counts as unknown: nvidia-smi's per-GPU memory does not describe it). Indices are taken
    as nvidia-smi's, i.e. PCI bus order: what CUDA uses with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and by default
    too unless the cards differ in speed.
    """
    if visible is None:
        return gpus
    chosen: list[NvidiaGPU] = []
    for item in (part.strip() for part in visible.split(",")):
        if item.isdigit():
            found = [g for g in gpus if g.index == int(item)]
        elif item.upper().startswith("GPU-") and len(item) > 4:
            found = [g for g in gpus if g.uuid.upper().startswith(item.upper())]
        else:
            found = []
        if len(found) != 1 or found[0] in chosen:
            break
        chosen.append(found[0])
    return tuple(chosen)


def nvidia_gpus(timeout: float = 5.0) -> tuple[NvidiaGPU, ...]:
    """The NVIDIA GPUs visible to this process (``CUDA_VISIBLE_DEVICES`` applied, see :func:`cuda_visible`), from
    nvidia-smi; () when there is none, nvidia-smi is missing, fails, hangs past ``timeout`` or prints something
    unreadable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,memory.total,memory.free,name", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
        gpus = []
        for line in filter(None, map(str.strip, out.splitlines())):
            index, uuid, total, free, name = (field.strip() for field in line.split(",", 4))
            gpus.append(NvidiaGPU(int(index), uuid, name, int(total) * MiB, int(free) * MiB))
    except (OSError, subprocess.SubprocessError, ValueError):  # ValueError: "[N/A]", too few fields
        return ()
    return cuda_visible(tuple(gpus), os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_free_memory(timeout: float = 5.0) -> tuple[int, ...]:
    """Free VRAM per NVIDIA GPU visible to this process (``CUDA_VISIBLE_DEVICES`` honoured), in bytes; () when
    there is none or nvidia-smi fails."""
    return tuple(g.free for g in nvidia_gpus(timeout))


def ram_available() -> int:
    """Free RAM now: psutil's ``available``, capped by the cgroup limit."""
    ram = psutil.virtual_memory().available
    cg = cgroup_memory_available()
    return min(ram, cg) if cg is not None else ram


def available_memory() -> MemoryInfo:
    """Free RAM (psutil ``available``, capped by the cgroup limit) and free VRAM per GPU."""
    return MemoryInfo(ram_available=ram_available(), vram_free=gpu_free_memory())


# --- fitting -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitResult:
    n_ctx: int
    weights_bytes: int  # the model file size (weights dominate it)
    kv_bytes: int  # KV cache at n_ctx + constant recurrent state
    available_bytes: int  # free VRAM when layers are offloaded, else free RAM
    n_gpu_layers: int
    fits: bool
    reason: str


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def fit_context(
    header: GGUFHeader,
    model_bytes: int,
    *,
    requested: int | None = None,
    n_gpu_layers: int | None = None,
    memory: MemoryInfo | None = None,
    margin: float = 0.10,
    headroom: int = 512 * MiB,
    type_k_bytes: float = 2.0,
    type_v_bytes: float = 2.0,
    n_seq: int = 1,
    draft: GGUFHeader | None = None,
) -> FitResult:
    """Choose a context size that fits in memory.

    ``requested`` is honoured as-is (``fits``/``reason`` say whether it would fit). Otherwise the result is the
    largest multiple of 256 in [512, native context] whose weights + KV fit in ``(1 - margin) * available -
    headroom``; native is ``context_length`` or 4096. Weights and KV are split between VRAM and RAM in
    proportion to ``n_gpu_layers`` (-1: all); None (automatic) sizes the context on VRAM and RAM together, as the
    memory plan splits the model between them (runtime/_memory/plan.py).
    ``type_k_bytes``/``type_v_bytes`` are the cache type's bytes per element (:func:`cache_type_bytes`). A
    ``draft`` model's KV cache (same context and types) is charged too; its weights belong in ``model_bytes``.
    Raises :class:`InsufficientMemoryError` when not even 512 tokens fit.
    """
    mem = memory if memory is not None else available_memory()
    n_layer = max(header.block_count or 1, 1)
    auto_gpu = mem.has_gpu and n_gpu_layers is None
    if auto_gpu:
        # Automatic layers: the memory plan (runtime/_memory/plan.py) splits the model between the GPUs and RAM, so the
        # context is sized on both together; the plan then keeps layers on the GPUs before context.
        mem = MemoryInfo(ram_available=mem.ram_available + mem.vram_total_free)
    if not mem.has_gpu:
        gpu_layers = 0
    elif n_gpu_layers is None or n_gpu_layers < 0:
        gpu_layers = n_layer
    else:
        gpu_layers = min(n_gpu_layers, n_layer)
    frac = gpu_layers / n_layer
    state = recurrent_state_bytes(header, n_seq=n_seq) + (recurrent_state_bytes(draft, n_seq=n_seq) if draft else 0)

    def budget(avail: int) -> float:
        return avail * (1 - margin) - headroom

    def check(n_ctx: int) -> tuple[int, bool]:
        kv = sum(kv_cache_bytes(h, n_ctx, type_k_bytes=type_k_bytes, type_v_bytes=type_v_bytes, n_seq=n_seq)
                 for h in (header, draft) if h is not None)
        need = model_bytes + kv + state
        ok = need * (1 - frac) <= budget(mem.ram_available) and (
            frac == 0 or need * frac <= budget(mem.vram_total_free)
        )
        return kv + state, ok

    available = mem.vram_total_free if frac > 0 else mem.ram_available
    pool = "VRAM" if frac > 0 else "RAM"
    margin_text = f"{margin:.0%} + {_gib(headroom)} margin"

    def result(n_ctx: int, kv: int, ok: bool, reason: str) -> FitResult:
        # automatic layers: all are asked for; the plan keeps what does not fit the GPUs in RAM
        return FitResult(n_ctx, model_bytes, kv, available, n_layer if auto_gpu else gpu_layers, ok, reason)

    if requested is not None:
        kv, ok = check(requested)
        verdict = "fits" if ok else f"may NOT fit in {_gib(available)} free {pool} (with a {margin_text})"
        return result(
            requested,
            kv,
            ok,
            f"n_ctx={requested} requested; weights {_gib(model_bytes)} + KV {_gib(kv)} {verdict}",
        )

    native = header.context_length or DEFAULT_CONTEXT
    top = native // CONTEXT_STEP * CONTEXT_STEP if native >= MIN_CONTEXT else native
    lo = min(MIN_CONTEXT, native)
    kv_lo, ok_lo = check(lo)
    if not ok_lo:
        advice = (
            "lower n_gpu_layers to keep part of the model in RAM, use a smaller quant, or pass an explicit n_ctx"
            if frac > 0
            else "use a smaller quant, offload layers to a GPU with n_gpu_layers, or pass an explicit n_ctx"
        )
        if frac < 1 and (model_bytes + kv_lo) * (1 - frac) > budget(mem.ram_available):
            available, pool = mem.ram_available, "RAM"  # the CPU share is what does not fit
        raise InsufficientMemoryError(
            f"{header.path.name} does not fit: weights {_gib(model_bytes)} + KV {_gib(kv_lo)} at n_ctx={lo} "
            f"exceed the {_gib(max(budget(available), 0))} usable of {_gib(available)} free {pool} "
            f"({margin_text} kept free); {advice}"
        )
    # Binary search over multiples of 256 (memory need grows with n_ctx).
    if check(top)[1]:
        good = top
    else:
        good_k, bad_k = lo // CONTEXT_STEP, top // CONTEXT_STEP
        while bad_k - good_k > 1:
            mid = (good_k + bad_k) // 2
            good_k, bad_k = (mid, bad_k) if check(mid * CONTEXT_STEP)[1] else (good_k, mid)
        good = max(good_k * CONTEXT_STEP, lo)
    kv, _ = check(good)
    why = "the native context" if good == top else f"the largest that fits in {_gib(available)} free {pool}"
    return result(
        good, kv, True, f"n_ctx={good}: {why} (weights {_gib(model_bytes)} + KV {_gib(kv)}, {margin_text})"
    )
