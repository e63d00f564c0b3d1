"""The file-name conventions of GGUF models and choosing one model among a listing of files.

File names carry a quant token (``model-Q4_K_M.gguf``), a shard suffix (``-00001-of-00003.gguf``) or ``mmproj``;
a spec's quant or file name picks one model among such files (:func:`_select`). Used by :mod:`.local` and
:mod:`.hub` alike; this module calls neither.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ...errors import MissingShardError, ModelNotFoundError, UnknownQuantError
from .._common.gguf import GGUFHeader, TensorInfo

DEFAULT_QUANT_PREFERENCE = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q8_0")  # without a chooser (QuantChooser) only
MMPROJ_QUANT_PREFERENCE = ("F16", "BF16", "Q8_0")

_SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)
# A quant token: not glued to a letter/digit on the left ("IQ4_K_M" holds no "Q4_K_M"), and not followed by a
# letter, digit or "_" on the right ("Q4_K_M" holds no "Q4_K").
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]+)*|TQ[12]_0|MXFP4(?:_MOE)?|BF16|FP16|F16|FP32|F32))"
    r"(?![A-Za-z0-9_])",
    re.IGNORECASE,
)


# --- file names ------------------------------------------------------------------------------------------------


def human_size(n: int) -> str:
    """``98362432`` → ``"98.4 MB"`` (decimal units, as the Hub shows them)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _strip_gguf(name: str) -> str:
    """``dir/model-Q4_K_M-00001-of-00002.gguf`` → ``dir/model-Q4_K_M``."""
    m = _SHARD_RE.match(name)
    if m:
        return m["base"]
    return name[:-5] if name.lower().endswith(".gguf") else name


def _strip_quant(stem: str) -> str:
    """``SmolLM2-135M-Instruct.Q4_1`` → ``SmolLM2-135M-Instruct``."""
    found = list(_QUANT_RE.finditer(stem))
    if not found:
        return stem
    last = found[-1]
    return (stem[: last.start()].rstrip("._- ") + stem[last.end():]).strip("._- ")


def parse_quant(name: str) -> str | None:
    """The quant label in a file name (the last quant-shaped token), upper-cased: ``"Q4_K_M"``, ``"IQ4_XS"``."""
    found = _QUANT_RE.findall(_strip_gguf(name))
    return found[-1].upper() if found else None


def quant_matches(quant: str, name: str) -> bool:
    """Whether ``quant`` occurs in ``name`` as a whole token, case-insensitively.

    ``Q4_K_M`` matches ``model-Q4_K_M.gguf`` and ``Q4_K_M/model-00001-of-00002.gguf`` but not ``model-IQ4_K_M.gguf``;
    ``F16`` does not match ``model-BF16.gguf``; ``Q4_K`` does not match ``model-Q4_K_M.gguf``.
    """
    q = re.escape(quant.strip())
    return re.search(rf"(?<![A-Za-z0-9]){q}(?![A-Za-z0-9_])", _strip_gguf(name), re.IGNORECASE) is not None


def _is_mmproj(name: str) -> bool:
    return "mmproj" in name.rsplit("/", 1)[-1].lower()


def _is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


# --- choosing among files --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    """A model in a file listing: one file, or every shard of a split set (present or not)."""

    files: tuple[str, ...]  # relative posix paths, shard order (only those present)
    sizes: tuple[int, ...]
    n_shards: int  # declared number of shards (1 for a single file)
    missing: tuple[str, ...]  # shard names declared but absent

    @property
    def first(self) -> str:
        return self.files[0] if self.files else self.missing[0]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    @property
    def quant(self) -> str | None:
        return parse_quant(self.first)

    @property
    def label(self) -> str:
        return self.quant or _strip_gguf(self.first.rsplit("/", 1)[-1])


def _group(files: dict[str, int]) -> list[_Candidate]:
    """Group a ``{relative path: size}`` listing into model candidates (mmproj files left out)."""
    singles: list[_Candidate] = []
    sets: dict[tuple[str, int], dict[int, str]] = {}
    for name in sorted(files):
        if not _is_gguf(name) or _is_mmproj(name):
            continue
        m = _SHARD_RE.match(name)
        if m and int(m["total"]) >= 1:
            sets.setdefault((m["base"], int(m["total"])), {})[int(m["idx"])] = name
        else:
            singles.append(_Candidate((name,), (files[name],), 1, ()))
    out = list(singles)
    for (base, total), by_idx in sets.items():
        present = tuple(by_idx[i] for i in sorted(by_idx) if 1 <= i <= total)
        missing = tuple(f"{base}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1) if i not in by_idx)
        out.append(_Candidate(present, tuple(files[f] for f in present), total, missing))
    return sorted(out, key=lambda c: c.first)


def _available(cands: Iterable[_Candidate]) -> dict[str, int]:
    avail: dict[str, int] = {}
    for c in cands:
        avail.setdefault(c.label, c.size)
    return avail


def _describe(avail: dict[str, int]) -> str:
    return ", ".join(f"{q} ({human_size(n)})" for q, n in sorted(avail.items(), key=lambda kv: kv[1])) or "none"


TableReader = Callable[[], list[tuple[GGUFHeader, list[TensorInfo]]]]
"""Reads each file of a model (shard order): its header and tensor table, from disk or by HTTP ranges."""


@dataclass(frozen=True)
class QuantFile:
    """One quant of a model that the automatic choice weighs: its label, size, files, and how to read its tables."""

    label: str
    size: int
    files: tuple[str, ...]
    read: TableReader = field(compare=False, repr=False)


class QuantChooser(Protocol):
    """Picks one of ``files`` (several quants of the model ``name``) for this machine: the index of the one taken
    and a line saying why (:mod:`gguf_provider.runtime._memory.choose`). Raises when none fits."""

    def __call__(self, name: str, files: Sequence[QuantFile]) -> tuple[int, str]: ...


def is_auto(quant: str | None) -> bool:
    """No quant named, or ``"auto"``: the automatic choice decides."""
    return quant is None or quant.strip().lower() == "auto"


def _select(cands: list[_Candidate], *, quant: str | None, filename: str | None, where: str, name: str = "",
            choose: QuantChooser | None = None, reader: Callable[[_Candidate], TableReader] | None = None,
            said: list[str] | None = None) -> _Candidate:
    """Pick the model among ``cands`` by filename, by quant, or (none named, or ``"auto"``) with ``choose`` over the
    complete candidates (each read by ``reader``; its line appended to ``said``); without a chooser, by
    :data:`DEFAULT_QUANT_PREFERENCE`."""
    if quant is not None and is_auto(quant):
        quant = None
    if not cands:
        raise ModelNotFoundError(f"{where} holds no GGUF model file")
    if filename:
        want = filename.strip("/")
        for exact in (True, False):
            for c in cands:
                names = (*c.files, *c.missing)
                if any((n == want or n.rsplit("/", 1)[-1] == want) if exact else
                       (n.lower() == want.lower() or n.rsplit("/", 1)[-1].lower() == want.lower()) for n in names):
                    return _complete(c, where)
        listing = ", ".join(c.first for c in cands)
        raise ModelNotFoundError(f"{where} has no file {filename!r}; GGUF files there: {listing}")
    if quant:
        matching = [c for c in cands if quant_matches(quant, c.first)]
        if not matching:
            avail = _available(cands)
            raise UnknownQuantError(
                f"{where} has no {quant!r} quant; available: {_describe(avail)}", available=avail
            )
        q = quant.strip().upper()
        matching.sort(key=lambda c: (c.quant != q and (c.quant or "").removeprefix("UD-") != q, bool(c.missing),
                                     c.size))
        return _complete(matching[0], where)
    complete = [c for c in cands if not c.missing]
    if len(complete) > 1 and choose is not None and reader is not None:
        files = [QuantFile(c.label, c.size, c.files, reader(c)) for c in complete]
        index, line = choose(name or where, files)
        if said is not None:
            said.append(line)
        return complete[index]
    for pref in DEFAULT_QUANT_PREFERENCE:
        for c in sorted(complete, key=lambda c: c.size):
            if (c.quant or "").removeprefix("UD-") == pref:
                return c
    if complete:
        return min(complete, key=lambda c: c.size)
    return _complete(cands[0], where)


def _complete(c: _Candidate, where: str) -> _Candidate:
    if c.missing:
        raise MissingShardError(
            f"{where}: split model {c.first} has {c.n_shards} shards but these are missing: {', '.join(c.missing)}"
        )
    return c


def _select_mmproj(files: dict[str, int], model_file: str) -> str | None:
    projs = [n for n in files if _is_gguf(n) and _is_mmproj(n)]
    if not projs:
        return None
    model_dir = model_file.rsplit("/", 1)[0] if "/" in model_file else ""

    def rank(n: str) -> tuple[int, int, int, str]:
        n_dir = n.rsplit("/", 1)[0] if "/" in n else ""
        pref = next((i for i, q in enumerate(MMPROJ_QUANT_PREFERENCE) if quant_matches(q, n)),
                    len(MMPROJ_QUANT_PREFERENCE))
        return (n_dir != model_dir and n_dir != "", pref, files[n], n)

    return min(projs, key=rank)
