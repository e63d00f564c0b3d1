"""A memory plan: which layers go to which device, where the KV cache sits, the context, and what each device holds.

We compute the plan ourselves rather than take llama.cpp's ``--fit``: a plan is needed before anything loads (for
``gguf-provider plan`` on devices the user only names, and for the memory budget, which counts what each server
holds per device), and llama.cpp's fit only runs inside a starting server on the devices present. The plan follows
llama.cpp's documented behaviour so that passing its arguments (``-ngl``, ``--tensor-split``, ``--n-cpu-moe``,
``--fit off``) reproduces it exactly:

* ``-ngl N`` puts the last N layers on the GPUs, the output head counting as the last layer (llama-model.cpp:
  ``i_gpu_start = n_layer + 1 - N``); the input embeddings always stay in host memory; a tied output head is
  copied to the device that holds the output layer;
* with several GPUs the offloaded layers are cut in proportion to the split (llama.cpp's default split is each
  device's free memory; we pass it explicitly so the plan is what runs);
* each layer's KV cache sits with its layer (``offload_kqv`` on);
* when the model does not fit the GPUs, llama.cpp's fit order (tools/fit-params/README.md): the automatic context
  shrinks to at most :data:`FIT_MIN_CONTEXT`, then a MoE model's expert tensors move to RAM from the first layer
  on (``--n-cpu-moe``), then whole layers stay in RAM (fewer ``-ngl``); only when RAM is short too does the
  context shrink further, down to 512 tokens.

Sizes come from the file's tensor table (:func:`.gguf.read_tensors`); compute buffers are estimated from the
header (calibrated on llama.cpp's own ``sched_reserve`` lines, see docs/gpu.md). The estimate errs high; a start
that still runs out of device memory is retried with a smaller plan (the manager's out-of-memory path).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import GGUFFormatError
from .._common.gguf import GGUFHeader, TensorInfo
from . import fit
from .devices import Device

MiB = 1 << 20
GiB = 1 << 30
FIT_MIN_CONTEXT = 4096  # llama.cpp's --fit-ctx default: the automatic context is not cut below it to fit a GPU
N_UBATCH = 512
HOST_MARGIN = 0.10  # of free RAM, plus HOST_HEADROOM, as fit.fit_context keeps
HOST_HEADROOM = 512 * MiB

_LAYER = re.compile(r"^blk\.(\d+)\.")
_EXPERTS = re.compile(r"^blk\.\d+\.ffn_(up|down|gate|gate_up)_(ch)?exps")


FIT_TARGET = 1024 * MiB
"""Memory kept free on each GPU-like device: llama.cpp's ``--fit-target`` default (common.h ``fit_params_target``,
a flat 1024 MiB per device at the pinned build), so our plan leaves what llama.cpp's own fit would."""


def device_reserve(device: Device) -> int:
    """Memory kept free on a GPU-like device: :data:`FIT_TARGET`."""
    return FIT_TARGET


def usable(device: Device) -> int:
    """What a plan may fill on ``device``."""
    if device.kind == "cpu":
        return max(int(device.free * (1 - HOST_MARGIN)) - HOST_HEADROOM, 0)
    return max(device.free - device_reserve(device), 0)


@dataclass(frozen=True)
class ModelSizes:
    """A model's weights by where llama.cpp places them."""

    layers: tuple[int, ...]  # bytes of each repeating layer blk.i (experts included)
    experts: tuple[int, ...]  # of those, the MoE expert tensors (0 for a dense layer)
    output: int  # the output head on its device: output.weight (or the tied token_embd copy) + output_norm
    input: int  # token_embd and the rest that stays in host memory
    output_on_host: int = 0  # what the head adds to host memory when not offloaded (a tied head adds only its norm)

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def is_moe(self) -> bool:
        return any(self.experts)

    @classmethod
    def from_tensors(cls, tensors: Sequence[TensorInfo], n_layer: int) -> ModelSizes:
        layers, experts = [0] * n_layer, [0] * n_layer
        names = {t.name: t.nbytes for t in tensors}
        output, host = 0, 0
        for t in tensors:
            m = _LAYER.match(t.name)
            if m and int(m[1]) < n_layer:
                i = int(m[1])
                layers[i] += t.nbytes
                if _EXPERTS.match(t.name):
                    experts[i] += t.nbytes
            elif t.name.startswith(("output.", "output_norm.")):
                output += t.nbytes
            else:
                host += t.nbytes
        on_host = output
        if "output.weight" not in names:  # tied embeddings: the output layer's device gets a copy
            output += names.get("token_embd.weight", 0)
        return cls(tuple(layers), tuple(experts), output, host, on_host)

    @classmethod
    def estimate(cls, header: GGUFHeader, file_bytes: int) -> ModelSizes:
        """Without a tensor table: the file spread evenly over the layers, one more share for the output."""
        n = max(header.block_count or 1, 1)
        share = file_bytes // (n + 2)
        return cls((share,) * n, (0,) * n, share, file_bytes - share * (n + 1), share)

    @classmethod
    def of_files(cls, header: GGUFHeader, files: Sequence[Path]) -> ModelSizes:
        from .._common.gguf import read_tensors

        tensors = [t for f in files for t in read_tensors(f)]
        return cls.from_tensors(tensors, max(header.block_count or 1, 1))


@dataclass(frozen=True)
class Placement:
    """What one device holds under a plan."""

    device: Device
    layers: tuple[int, ...] = ()  # repeating layers placed here
    output: bool = False
    weights: int = 0
    kv: int = 0
    compute: int = 0
    other: int = 0  # the projector and the draft model, on the first GPU (or in RAM without one)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.other

    @property
    def fits(self) -> bool:
        return self.total <= usable(self.device)

    def layer_text(self) -> str:
        if not self.layers:
            return "output layer" if self.output else "no layers"
        elif len(self.layers) == 1:
            text = f"layer {self.layers[0]}"
        else:
            text = f"layers {self.layers[0]}-{self.layers[-1]}"
        return text + (" + output" if self.output else "")

    def to_json(self) -> dict[str, object]:
        return {"device": self.device.to_json(), "layers": list(self.layers), "n_layers": len(self.layers),
                "output": self.output, "weights": self.weights, "kv": self.kv, "compute": self.compute,
                "other": self.other, "bytes": self.total, "usable": usable(self.device), "fits": self.fits}


@dataclass(frozen=True)
class Plan:
    """A model's placement over devices at a context, and the llama-server arguments that reproduce it."""

    model: str
    n_ctx: int
    n_layer: int
    n_gpu_layers: int  # llama.cpp's -ngl (the output head counts as one)
    tensor_split: tuple[float, ...]  # per GPU, in device order; () for one GPU or none
    n_cpu_moe: int  # MoE layers whose experts stay in RAM
    placements: tuple[Placement, ...]
    fits: bool
    reason: str
    gpus: tuple[str, ...] = field(default=())  # the GPU devices used, in order (llama-server --device)
    devices_off: bool = False  # no GPU is used at all (`--device none`): not even its op-offload buffer fits

    @property
    def split(self) -> bool:
        """Whether the layers are shared between GPU(s) and host RAM."""
        return 0 < self.n_gpu_layers < self.n_layer + 1 or self.n_cpu_moe > 0

    def by_device(self) -> dict[str, int]:
        """Bytes each device holds (what the memory budget charges), by device name."""
        return {p.device.name: p.total for p in self.placements if p.total}

    def args(self) -> list[str]:
        """llama-server arguments that place the model as planned (the context goes separately)."""
        if self.devices_off:
            return ["--device", "none"]
        if not self.gpus:
            has_gpu = any(p.device.kind != "cpu" for p in self.placements)
            return ["-ngl", "0"] if has_gpu else []
        out = ["-ngl", str(self.n_gpu_layers)]
        if self.tensor_split:
            out += ["--tensor-split", ",".join(f"{s:g}" for s in self.tensor_split)]
        if self.n_cpu_moe:
            out += ["--n-cpu-moe", str(self.n_cpu_moe)]
        return out

    def summary(self) -> list[dict[str, object]]:
        """Per device: name, layers and bytes; what the registry keeps and `ps` shows."""
        return [{"device": p.device.name, "layers": p.layer_text(), "n_layers": len(p.layers) + int(p.output),
                 "bytes": p.total} for p in self.placements if p.total or p.layers]

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "n_ctx": self.n_ctx, "n_layer": self.n_layer, "fits": self.fits,
                "reason": self.reason, "n_gpu_layers": self.n_gpu_layers, "tensor_split": list(self.tensor_split),
                "n_cpu_moe": self.n_cpu_moe, "split": self.split, "args": self.args(),
                "devices": [p.to_json() for p in self.placements]}

    def describe(self) -> str:
        lines = [f"{self.model}: n_ctx {self.n_ctx}, {self.n_layer} layers + output — "
                 f"{'fits' if self.fits else 'does NOT fit'}: {self.reason}"]
        for p in self.placements:
            lines.append(f"  {p.device.name:<8} {p.device.description[:28]:<28} {p.layer_text():<22} "
                         f"weights {_mib(p.weights)}, KV {_mib(p.kv)}, compute {_mib(p.compute)}"
                         + (f", projector/draft {_mib(p.other)}" if p.other else "") + f" = {_mib(p.total)}"
                         f" of {_mib(usable(p.device))} usable")
        if self.args():
            lines.append(f"  llama-server {' '.join(self.args())} -c {self.n_ctx}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def _meta_int(header: GGUFHeader, key: str) -> int:
    v = header.metadata.get(f"{header.architecture}.{key}")
    if isinstance(v, tuple):
        v = max((int(x) for x in v), default=0)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def compute_bytes(header: GGUFHeader, n_ctx: int, *, n_ubatch: int = N_UBATCH) -> int:
    """A device's compute buffer: activations of one micro-batch plus the attention mask (f16, n_ctx × n_ubatch).
    On SmolLM2 (n_embd 576, n_ff 1536) llama.cpp reserved 14.4-15.7 MiB at n_ctx 2048 and 20.4 MiB at 8192 on an
    H200; this gives 17.3 and 23.3 (4 MiB for what the formula misses: it errs high)."""
    n_embd = header.embedding_length or 0
    n_ff = _meta_int(header, "feed_forward_length") or 4 * n_embd
    return n_ubatch * 4 * (2 * n_embd + 3 * n_ff) + n_ctx * n_ubatch * 2 + 4 * MiB


def host_compute_bytes(header: GGUFHeader, n_ctx: int, n_outputs: int = 4) -> int:
    """The compute and output buffers of a server that computes everything on the CPU. Measured with this project's
    CPU build: SmolLM2 at n_ctx 8192, 50.45 MiB of compute and 0.75 of output; Qwen2.5-Coder-0.5B at 32768, 153.33
    and 2.32. Counted as 2.5 :func:`compute_bytes` and the logits (58 and 172 MiB: it errs high)."""
    return 5 * compute_bytes(header, n_ctx) // 2 + logits_bytes(header, n_outputs)


SPECULATIVE_OUTPUTS = 4 * (1 + 64)
"""Outputs a speculating server reserves logits for: 4 slots × (1 + 64 drafted tokens), llama.cpp's
common_speculative_get_output_limits with the n-gram drafts' default size. On the H200 the output device's compute
buffer grew by 29-33 MiB with SmolLM2 (49,152 tokens) under `--spec-default`; this counts 50 MiB."""


def logits_bytes(header: GGUFHeader, n_outputs: int = 4) -> int:
    """The logits of ``n_outputs`` tokens (f32 over the vocabulary), on the device that holds the output layer:
    4 for a plain server (its 4 slots), :data:`SPECULATIVE_OUTPUTS` for one that speculates."""
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    n_vocab = getattr(tokens, "length", 0) or _meta_int(header, "vocab_size")
    return n_vocab * 4 * n_outputs


def _kv_per_layer(header: GGUFHeader, n_ctx: int, cache_type: str, n_seq: int, n_layer: int) -> list[int]:
    per = fit.cache_type_bytes(cache_type)
    total = fit.kv_cache_bytes(header, n_ctx, type_k_bytes=per, type_v_bytes=per, n_seq=n_seq)
    total += fit.recurrent_state_bytes(header, n_seq=n_seq)
    return [math.ceil(total / n_layer)] * n_layer


def _split_fractions(gpus: Sequence[Device]) -> list[float]:
    room = [float(usable(d)) for d in gpus]
    s = sum(room) or float(len(gpus))
    return [r / s if sum(room) else 1 / len(gpus) for r in room]


@dataclass
class _Tally:
    layers: list[int] = field(default_factory=list)
    output: bool = False
    weights: int = 0
    kv: int = 0


def place(header: GGUFHeader, sizes: ModelSizes, devices: Sequence[Device], *, n_ctx: int, n_gpu_layers: int,
          n_cpu_moe: int = 0, cache_type: str = fit.DEFAULT_CACHE_TYPE, n_seq: int = 1,
          split: Sequence[float] | None = None, n_outputs: int = 4,
          use_gpus: bool = True, other: int = 0) -> tuple[Placement, ...]:
    """Where everything goes for a given context, -ngl and --n-cpu-moe, as llama.cpp's loader places it
    (``use_gpus=False``: `--device none`, the GPUs hold nothing). ``other``: the projector's and the draft model's
    bytes, which llama.cpp puts on the first GPU (the projector with `--mmproj-offload`, its default; the draft on
    the main model's devices), else in RAM."""
    if not use_gpus:
        host_only = place(header, sizes, [d for d in devices if d.kind == "cpu"], n_ctx=n_ctx, n_gpu_layers=0,
                          cache_type=cache_type, n_seq=n_seq, n_outputs=n_outputs, other=other)
        return (*(Placement(d) for d in devices if d.kind != "cpu"), *host_only)
    gpus = [d for d in devices if d.kind != "cpu"]
    host = next((d for d in devices if d.kind == "cpu"), None) or Device("CPU", "cpu", "host RAM", 0, 0)
    n = sizes.n_layer
    kv = _kv_per_layer(header, n_ctx, cache_type, n_seq, n)
    ngl = min(max(n_gpu_layers, 0), n + 1) if gpus else 0
    start = n + 1 - ngl
    fractions = list(split) if split else _split_fractions(gpus)
    cum = [sum(fractions[: j + 1]) / (sum(fractions) or 1) for j in range(len(fractions))]

    def device_of(il: int) -> int:  # index into gpus; len(gpus) is the host
        if il < start or not gpus:
            return len(gpus)
        frac = (il - start) / ngl  # llama-model.cpp: std::upper_bound over the cumulative split
        return next((j for j, c in enumerate(cum) if c > frac), len(gpus) - 1)

    tally = [_Tally() for _ in range(len(gpus) + 1)]
    tally[-1].weights = sizes.input
    for il in range(n):
        t = tally[device_of(il)]
        t.layers.append(il)
        weights = sizes.layers[il]
        if t is not tally[-1] and il < n_cpu_moe:  # --n-cpu-moe: this layer's experts stay in RAM
            weights -= sizes.experts[il]
            tally[-1].weights += sizes.experts[il]
        t.weights += weights
        t.kv += kv[il]
    out = tally[device_of(n)]
    out.output = True
    out.weights += sizes.output if out is not tally[-1] else sizes.output_on_host
    compute = compute_bytes(header, n_ctx)
    placements = []
    for j, d in enumerate(gpus):
        t = tally[j]
        # a GPU that holds layers needs a compute buffer; llama.cpp keeps one on the first GPU even with none
        holds = bool(t.layers) or t.output or j == 0
        logits = logits_bytes(header, n_outputs) if t.output else 0
        if j == 0 and not (t.layers or t.output):
            # No layer here, yet llama.cpp offloads the large host operations to this GPU (op offload) and computes
            # the logits there: on the H200, with every SmolLM2 layer in RAM, its compute buffer was 15.7 MiB
            # (n_ctx 2048) and, speculating, 79.1 MiB (n_ctx 8192; 48.8 MiB of it drafted logits). Counted as the
            # usual buffer and the logits with an eighth more.
            logits = logits_bytes(header, n_outputs) * 9 // 8
        placements.append(Placement(d, tuple(t.layers), t.output, t.weights, t.kv, compute + logits if holds else 0,
                                    other if j == 0 else 0))
    t = tally[-1]
    # The host's compute buffer: small beside a GPU that computes (CUDA_Host: 4-10 MiB on the H200 for SmolLM2),
    # larger when the CPU computes everything (host_compute_bytes).
    on_gpu = any(p.layers or p.output for p in placements)
    placements.append(Placement(host, tuple(t.layers), t.output, t.weights, t.kv,
                                compute // 4 if on_gpu else host_compute_bytes(header, n_ctx, n_outputs),
                                0 if gpus else other))
    return tuple(placements)


def _fits(placements: Sequence[Placement]) -> bool:
    return all(p.fits for p in placements)


def _gpus_fit(placements: Sequence[Placement]) -> bool:
    return all(p.fits for p in placements if p.device.kind != "cpu")


def plan(header: GGUFHeader, sizes: ModelSizes, devices: Sequence[Device], *, n_ctx: int | None = None,
         n_gpu_layers: int | None = None, cache_type: str = fit.DEFAULT_CACHE_TYPE, n_seq: int = 1,
         model: str | None = None, max_ctx: int | None = None, n_outputs: int = 4,
         other: Callable[[int], int] | None = None) -> Plan:
    """Place a model on ``devices`` (GPU-like devices in llama.cpp's order, then ``CPU`` for host RAM).

    ``n_ctx`` and ``n_gpu_layers`` are honoured when given (``fits`` then says whether they fit); otherwise they
    are chosen in llama.cpp's fit order (module docstring), the automatic context at most ``max_ctx`` (what the
    memory budget admitted). ``n_outputs``: the tokens whose logits the output device holds (4 slots; a speculating
    server :data:`SPECULATIVE_OUTPUTS`). ``other(n_ctx)``: the projector's and draft model's bytes at a context
    (:func:`place`). Never raises for a model that does not fit: the plan says so (``fits`` False, ``reason``) and
    the caller decides.
    """
    name = model or header.path.name
    gpus = tuple(d for d in devices if d.kind != "cpu")
    n = sizes.n_layer
    native = header.context_length or fit.DEFAULT_CONTEXT
    top = native // fit.CONTEXT_STEP * fit.CONTEXT_STEP if native >= fit.MIN_CONTEXT else native
    if max_ctx:
        top = max(min(top, max_ctx), min(fit.MIN_CONTEXT, top))
    lo = min(fit.MIN_CONTEXT, native)
    split = tuple(round(f, 3) for f in _split_fractions(gpus)) if len(gpus) > 1 else ()

    def at(ctx: int, ngl: int, moe: int = 0, use_gpus: bool = True) -> tuple[Placement, ...]:
        return place(header, sizes, devices, n_ctx=ctx, n_gpu_layers=ngl, n_cpu_moe=moe, cache_type=cache_type,
                     n_seq=n_seq, split=split or None, n_outputs=n_outputs, use_gpus=use_gpus,
                     other=other(ctx) if other else 0)

    def make(ctx: int, ngl: int, moe: int, why: str) -> Plan:
        placed = at(ctx, ngl, moe)
        ok = _fits(placed)
        used = tuple(p.device.name for p in placed if p.device.kind != "cpu" and (p.layers or p.output))
        return Plan(name, ctx, n, ngl if gpus else 0, split if used else (), moe, placed, ok,
                    why if ok else f"{why}; {_shortfall(placed)}", used)

    def largest_ctx(ok: object, floor: int, ceiling: int) -> int | None:
        """The largest multiple of 256 in [floor, ceiling] where ok(ctx) holds (need grows with ctx)."""
        assert callable(ok)
        if ceiling < floor or not ok(floor):
            return None
        if ok(ceiling):
            return ceiling
        good, bad = floor // fit.CONTEXT_STEP, ceiling // fit.CONTEXT_STEP
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if ok(mid * fit.CONTEXT_STEP) else (good, mid)
        return max(good * fit.CONTEXT_STEP, floor)

    full = n + 1
    if not gpus:
        ctx = n_ctx or largest_ctx(lambda c: _fits(at(c, 0)), lo, top)
        if ctx is None:
            return make(lo, 0, 0, f"not even n_ctx={lo} fits in host RAM")
        return make(ctx, 0, 0, _ctx_why(ctx, n_ctx, top, "host RAM"))

    if n_gpu_layers is not None and n_gpu_layers >= 0:  # the user's -ngl: only the context is ours to choose
        ngl = min(n_gpu_layers, full)
        ctx = n_ctx or largest_ctx(lambda c: _fits(at(c, ngl)), lo, top)
        if ctx is None:
            return make(lo, ngl, 0, f"n_gpu_layers={n_gpu_layers} requested and not even n_ctx={lo} fits")
        return make(ctx, ngl, 0, f"n_gpu_layers={n_gpu_layers} requested; " + _ctx_why(ctx, n_ctx, top, "memory"))

    # 1. everything on the GPUs, the context shrunk no further than FIT_MIN_CONTEXT
    floor = min(FIT_MIN_CONTEXT, top)
    ctx_full: int | None = n_ctx if n_ctx and _fits(at(n_ctx, full)) else None
    if n_ctx is None:
        ctx_full = largest_ctx(lambda c: _fits(at(c, full)), floor, top)
    if ctx_full is not None:
        return make(ctx_full, full, 0, "every layer on the GPU" + ("s" if len(gpus) > 1 else "") + "; "
                    + _ctx_why(ctx_full, n_ctx, top, "GPU memory"))
    ctx = n_ctx or floor
    # 2. a MoE model: expert tensors of the first layers to RAM
    if sizes.is_moe:
        for moe in range(1, n + 1):
            if _gpus_fit(at(ctx, full, moe)):
                if _fits(at(ctx, full, moe)):
                    return make(ctx, full, moe, f"every layer on the GPU, the experts of the first {moe} in RAM "
                                f"(--n-cpu-moe {moe}); " + _ctx_why(ctx, n_ctx, top, "GPU memory"))
                break
    # 3. fewer layers on the GPUs: as many as fit, the rest in RAM (a MoE model's offloaded layers keep their
    # experts in RAM: llama.cpp's fit fills "dense-only layers back-to-front")
    moe = n if sizes.is_moe else 0

    def most_layers(c: int) -> int:
        """The most layers the GPUs hold at context ``c`` (their need grows with the count: a binary search)."""
        good, bad = 0, full + 1
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if _gpus_fit(at(c, mid, moe)) else (good, mid)
        return good

    ngl = most_layers(ctx)
    if not _fits(at(ctx, ngl, moe)) and n_ctx is None:  # RAM is short too: the context shrinks below the floor
        shrunk = largest_ctx(lambda c: _fits(at(c, most_layers(c), moe)), lo, ctx)
        if shrunk is not None:
            ctx = shrunk
            ngl = most_layers(ctx)
    if ngl == 0:  # nothing goes to the GPUs: the context is not cut for them
        off = not _gpus_fit(at(ctx, 0))  # not even the op-offload buffer fits: the GPUs are not used at all
        ctx = n_ctx or largest_ctx(lambda c: _fits(at(c, 0, use_gpus=not off)), lo, top) or lo
        placed = at(ctx, 0, use_gpus=not off)
        why = ("no layer fits the GPU memory: every layer in RAM"
               + (", the GPU not used (--device none)" if off else "") + "; " + _ctx_why(ctx, n_ctx, top, "host RAM"))
        ok = _fits(placed)
        return Plan(name, ctx, n, 0, (), 0, placed, ok, why if ok else f"{why}; {_shortfall(placed)}", (),
                    devices_off=off)
    what = (f"split: {ngl} of {full} layers on the GPU" + ("s" if len(gpus) > 1 else "")
            + (" (their experts in RAM)" if moe and ngl else "") + ", the rest in RAM"
            if ngl else "no layer fits the GPU memory: every layer in RAM")
    why = (f"n_ctx={ctx}: cut to llama.cpp's fit minimum before moving layers to RAM" if ctx == floor < top and
           not n_ctx else _ctx_why(ctx, n_ctx, top, "memory"))
    return make(ctx, ngl, moe if ngl else 0, f"{what}; {why}")


def _ctx_why(ctx: int, requested: int | None, top: int, pool: str) -> str:
    if requested:
        return f"n_ctx={ctx} requested"
    return f"n_ctx={ctx}: " + ("the native context" if ctx == top else f"the largest that fits in {pool}")


def _shortfall(placements: Sequence[Placement]) -> str:
    short = [p for p in placements if not p.fits]
    return "; ".join(f"{p.device.name} needs {_mib(p.total)} but has {_mib(usable(p.device))} usable "
                     f"({_mib(p.device.free)} free)" for p in short)


def for_model(header: GGUFHeader, files: Sequence[Path], devices: Sequence[Device], **kw: object) -> Plan:
    """:func:`plan` with sizes read from ``files`` (the model's shards), or estimated when a table is unreadable."""
    try:
        sizes: ModelSizes | None = ModelSizes.of_files(header, files)
    except (OSError, ValueError, GGUFFormatError):  # read_tensors raises GGUFFormatError on a corrupt table
        sizes = None
    if sizes is None or not (sum(sizes.layers) + sizes.input):  # unreadable, or a file with no tensor table
        sizes = ModelSizes.estimate(header, sum(f.stat().st_size for f in files))
    return plan(header, sizes, devices, **kw)  # type: ignore[arg-type]
