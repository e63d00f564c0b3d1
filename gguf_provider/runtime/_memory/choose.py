"""The automatic quant: which of a model's files this machine should run, decided by planning each one.

When a repo, a directory or the cache holds several quants of one model and none is named (or ``quant="auto"``),
every quant is planned (:func:`.plan.plan`) on this machine's devices at the asked context (or the context the plan
would choose), and:

* with a GPU-like device: the best quality that fits entirely on the GPU(s) (every layer and the output head);
* on a CPU-only machine, or when no quant fits the GPUs whole: the best quality up to :data:`CPU_BEST` (the
  4-bit K-quant), else the smallest file. Decoding on a CPU slows as the weights grow; measured here (Qwen2.5-Coder
  0.5B, one thread, `llama bench -n 48`): Q2_K 14.2 tok/s, Q4_K_M 12.0, Q5_K_M 9.9, Q6_K 10.0, Q8_0 9.9, F16 6.8.
  Above Q4_K_M every step costs ~17% of the speed (F16 43%) for a quality gain llama.cpp's own perplexity tables
  put under 1%; below it the quality drops faster than the speed rises (docs/runtime.md);
* never a file that does not fit: :class:`~gguf_provider.errors.InsufficientMemoryError` says what each needs.

Quality is the file's own type (``general.file_type``, what llama-quantize wrote), not its name: a mislabelled
file is judged by what it holds. A file of an unknown type ranks by its size among the others.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import InsufficientMemoryError
from .._common.gguf import GGUFHeader, TensorInfo
from .._models.files import QuantChooser, QuantFile, human_size
from . import fit
from .devices import Device
from .plan import ModelSizes, Plan, place, plan, usable

log = logging.getLogger(__name__)

# llama_ftype (llama.h) -> the quant's name, worst to best quality (llama-quantize's perplexity tables); F32
# gains nothing over F16/BF16, so they share the top rank and the smaller wins.
_FTYPES: dict[int, str] = {
    24: "IQ1_S", 31: "IQ1_M", 36: "TQ1_0", 19: "IQ2_XXS", 37: "TQ2_0", 20: "IQ2_XS", 28: "IQ2_S", 21: "Q2_K_S",
    29: "IQ2_M", 10: "Q2_K", 23: "IQ3_XXS", 22: "IQ3_XS", 11: "Q3_K_S", 26: "IQ3_S", 27: "IQ3_M", 12: "Q3_K_M",
    13: "Q3_K_L", 30: "IQ4_XS", 2: "Q4_0", 25: "IQ4_NL", 3: "Q4_1", 38: "MXFP4_MOE", 14: "Q4_K_S", 15: "Q4_K_M",
    8: "Q5_0", 9: "Q5_1", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 7: "Q8_0", 32: "BF16", 1: "F16", 0: "F32",
}
QUALITY: tuple[str, ...] = tuple(_FTYPES.values())
_LOSSLESS = ("BF16", "F16", "F32")
CPU_BEST = "Q4_K_M"
"""The best quality the CPU rule takes when there is a choice (see the module docstring)."""


def quant_type(header: GGUFHeader) -> str | None:
    """The quant a file holds, from its header (``general.file_type``); None when unknown."""
    return _FTYPES.get(header.file_type) if header.file_type is not None else None


def _rank(name: str | None) -> int | None:
    if name is None:
        return None
    name = name.upper().removeprefix("UD-")
    if name in _LOSSLESS:
        return QUALITY.index(_LOSSLESS[0])
    return QUALITY.index(name) if name in QUALITY else None


@dataclass(frozen=True)
class Option:
    """One quant of the model: its label (from the file name), its files' total size, header and tensor table."""

    label: str
    size: int
    header: GGUFHeader
    tensors: tuple[TensorInfo, ...]

    @property
    def quant(self) -> str | None:
        return quant_type(self.header) or (self.label.upper() if _rank(self.label) is not None else None)

    @property
    def sizes(self) -> ModelSizes:
        if not self.tensors:
            return ModelSizes.estimate(self.header, self.size)
        return ModelSizes.from_tensors(self.tensors, max(self.header.block_count or 1, 1))


@dataclass(frozen=True)
class Verdict:
    """One quant planned on the devices."""

    option: Option
    plan: Plan
    rank: float  # quality: the index in QUALITY, or by size for an unknown type

    @property
    def on_gpu(self) -> bool:
        """Every layer and the output head on GPU-like devices, the plan fitting."""
        p = self.plan
        return p.fits and bool(p.gpus) and p.n_gpu_layers >= p.n_layer + 1 and not p.n_cpu_moe

    def where(self) -> str:
        p = self.plan
        if self.on_gpu:
            return f"all {p.n_layer} layers on {', '.join(p.gpus)}"
        if p.gpus:
            return f"{p.n_gpu_layers} of {p.n_layer + 1} layers on {', '.join(p.gpus)}, the rest in RAM"
        return "in RAM"

    def to_json(self, picked: bool) -> dict[str, object]:
        p = self.plan
        return {"quant": self.option.label, "type": self.option.quant, "bytes": self.option.size,
                "fits": p.fits, "on_gpu": self.on_gpu, "n_ctx": p.n_ctx, "n_gpu_layers": p.n_gpu_layers,
                "layers": {q.device.name: len(q.layers) + int(q.output) for q in p.placements
                           if q.layers or q.output},
                "need": p.by_device(), "picked": picked, "plan": p.to_json()}


@dataclass(frozen=True)
class Choice:
    """Every quant planned, and the one the automatic choice takes (None: none fits)."""

    model: str
    verdicts: tuple[Verdict, ...]  # smallest file first
    picked: int | None
    rule: str  # "gpu": the best that fits the GPUs whole; "cpu": the CPU rule; "none": nothing fits
    reason: str

    @property
    def choice(self) -> Verdict | None:
        return self.verdicts[self.picked] if self.picked is not None else None

    def line(self) -> str:
        """``repo: Q6_K (6.7 GB, all 37 layers on CUDA0 at n_ctx 16384); Q8_0 would need 9.1 GB on CUDA0``."""
        v = self.choice
        if v is None:
            return f"{self.model}: no quant fits this machine: {self.reason}"
        return (f"{self.model}: {v.option.label} ({_size(v.option.size)}, {v.where()} at n_ctx {v.plan.n_ctx}); "
                f"{self.reason}")

    def to_json(self) -> dict[str, object]:
        v = self.choice
        return {"model": self.model, "auto": v.option.label if v else None, "rule": self.rule, "line": self.line(),
                "quants": [x.to_json(i == self.picked) for i, x in enumerate(self.verdicts)]}

    def describe(self) -> str:
        """A table of every quant: size, where it would sit, the context, fits or not, which auto picks."""
        rows = [("", "quant", "size", "n_ctx", "where", "fits")]
        for i, v in enumerate(self.verdicts):
            rows.append(("*" if i == self.picked else "", v.option.label, _size(v.option.size), str(v.plan.n_ctx),
                         v.where(), "yes" if v.plan.fits else "no"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        return "\n".join([*lines, f"* auto: {self.line()}"])


def _size(n: int) -> str:
    return human_size(n)


def choose(model: str, options: Sequence[Option], devices: Sequence[Device], *, n_ctx: int | None = None,
           cache_type: str = fit.DEFAULT_CACHE_TYPE, n_outputs: int = 4, extra: int = 0) -> Choice:
    """Plan every option on ``devices`` and pick one by the rules of the module docstring. ``extra``: bytes the
    server holds in RAM beside the model (a projector, a draft model), counted against the host."""
    if extra:
        devices = [Device(d.name, d.kind, d.description, d.total, max(d.free - extra, 0), d.unified)
                   if d.kind == "cpu" else d for d in devices]
    ordered = sorted(options, key=lambda o: (o.size, o.label))
    verdicts = []
    for o in ordered:
        known = _rank(o.quant)
        rank = float(known) if known is not None else _rank_by_size(o, ordered)
        p = plan(o.header, o.sizes, devices, n_ctx=n_ctx, cache_type=cache_type, model=o.label, n_outputs=n_outputs)
        verdicts.append(Verdict(o, p, rank))
    has_gpu = any(d.kind != "cpu" for d in devices)
    whole = [i for i, v in enumerate(verdicts) if v.on_gpu]
    fitting = [i for i, v in enumerate(verdicts) if v.plan.fits]
    if has_gpu and whole:
        best = max(whole, key=lambda i: (verdicts[i].rank, -verdicts[i].option.size))
        better = [i for i in range(len(verdicts)) if verdicts[i].rank > verdicts[best].rank]
        reason = "the best quality that fits the GPU whole"
        if better:
            nxt = min(better, key=lambda i: (verdicts[i].rank, verdicts[i].option.size))
            reason = _would_need(verdicts[nxt], verdicts[best], devices, cache_type, n_outputs)
        return Choice(model, tuple(verdicts), best, "gpu", reason)
    if not fitting:
        smallest = verdicts[0] if verdicts else None
        why = smallest.plan.reason if smallest else "no GGUF file"
        return Choice(model, tuple(verdicts), None, "none",
                      f"even the smallest, {smallest.option.label if smallest else '-'}, does not fit ({why})")
    cap = QUALITY.index(CPU_BEST)
    modest = [i for i in fitting if verdicts[i].rank <= cap]
    pool = "no quant fits the GPU whole; " if has_gpu else ""
    if modest:
        best = max(modest, key=lambda i: (verdicts[i].rank, -verdicts[i].option.size))
        above = [i for i in fitting if verdicts[i].rank > verdicts[best].rank]
        reason = (pool + f"on a CPU the best up to {CPU_BEST}" +
                  (f": larger files decode slower ({verdicts[above[0]].option.label} is "
                   f"{verdicts[above[0]].option.size / verdicts[best].option.size:.1f}x the size)" if above else ""))
    else:
        best = min(fitting, key=lambda i: verdicts[i].option.size)
        reason = pool + f"the smallest file: none is {CPU_BEST} or below"
    return Choice(model, tuple(verdicts), best, "cpu", reason)


def _rank_by_size(o: Option, ordered: Sequence[Option]) -> float:
    """An unknown type's rank: between the known ranks of the files around it by size (a file's size grows with
    its bits per weight)."""
    known = [(x.size, _rank(x.quant)) for x in ordered if _rank(x.quant) is not None]
    below = [r for s, r in known if s <= o.size and r is not None]
    above = [r for s, r in known if s > o.size and r is not None]
    if below and above:
        return (max(below) + min(above)) / 2
    if below:
        return max(below) + 0.5
    if above:
        return min(above) - 0.5
    return float(ordered.index(o))


def _would_need(better: Verdict, picked: Verdict, devices: Sequence[Device], cache_type: str,
                n_outputs: int) -> str:
    """``Q8_0 would need 9.1 GB on CUDA0 (7.8 GB usable)``: the next better quant, whole on the GPUs, at the
    picked context."""
    o = better.option
    placed = place(o.header, o.sizes, devices, n_ctx=picked.plan.n_ctx, n_gpu_layers=o.sizes.n_layer + 1,
                   cache_type=cache_type, n_outputs=n_outputs)
    short = [p for p in placed if p.device.kind != "cpu" and not p.fits] or [p for p in placed if not p.fits]
    if not short:
        return f"{o.label} would not fit whole at n_ctx {picked.plan.n_ctx}"
    p = short[0]
    return (f"{o.label} would need {_size(p.total)} on {p.device.name} ({_size(usable(p.device))} usable at "
            f"n_ctx {picked.plan.n_ctx})")


# --- saying it ---------------------------------------------------------------------------------------------------

_SAID: set[str] = set()
_LOCK = threading.Lock()


def say(choice: Choice, *, to: Callable[[str], None] | None = None) -> None:
    """Log the choice's line, and print it on stderr once per process (a person at a terminal or a notebook sees
    which file was picked and why; a second resolve of the same model stays quiet)."""
    line = choice.line()
    log.info("%s", line)
    with _LOCK:
        if line in _SAID:
            return
        _SAID.add(line)
    (to or (lambda s: print(f"gguf-provider: {s}", file=sys.stderr, flush=True)))(line)


def need_error(choice: Choice) -> InsufficientMemoryError:
    """What to raise when no quant fits: each quant's need, and the levers."""
    needs = "; ".join(f"{v.option.label} ({_size(v.option.size)}): {v.plan.reason}" for v in choice.verdicts[:4])
    return InsufficientMemoryError(
        f"{choice.model}: no quant fits this machine. {needs}. Levers: free memory (stop other servers: "
        f"`gguf-provider ps`), a smaller n_ctx, kv_cache_type='q8_0', or a smaller model")


def chooser(*, n_ctx: int | None = None, cache_type: str = fit.DEFAULT_CACHE_TYPE, n_outputs: int = 4,
            rpc: Sequence[str] = (), devices: Sequence[Device] | None = None,
            seen: list[Choice] | None = None, quiet: bool = False, cpu_only: bool = False) -> QuantChooser:
    """A :class:`~.._models.files.QuantChooser` for this machine's devices (those of the llama-server in use, with
    ``rpc`` workers; or ``devices``): plans each quant, says the choice (:func:`say`), and raises
    InsufficientMemoryError when none fits. ``seen`` gets each :class:`Choice` made; ``quiet``: only logged;
    ``cpu_only``: the GPUs left out (the server will run with ``n_gpu_layers=0``)."""

    def choose_one(name: str, files: Sequence[QuantFile]) -> tuple[int, str]:
        options = []
        for f in files:
            tables = f.read()
            options.append(Option(f.label, f.size, tables[0][0], tuple(t for _, ts in tables for t in ts)))
        devs = list(devices) if devices is not None else _machine(rpc)
        if cpu_only:
            devs = [d for d in devs if d.kind == "cpu"]
        made = choose(name, options, devs, n_ctx=n_ctx, cache_type=cache_type, n_outputs=n_outputs)
        if seen is not None:
            seen.append(made)
        if made.choice is None:
            raise need_error(made)
        if quiet:
            log.info("%s", made.line())
        else:
            say(made)
        return options.index(made.choice.option), made.line()

    return choose_one


def _machine(rpc: Sequence[str]) -> list[Device]:
    from .._install import discovery
    from .devices import machine_devices

    found = discovery.locate()
    return machine_devices(found[0] if found else None, rpc=rpc)
