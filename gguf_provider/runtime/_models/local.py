"""Models already on disk: a path to a ``.gguf`` file (with its shard set and an mmproj beside it), or a name
looked up by file stem in the models dirs (``<home>/models`` and ``$GGUF_PROVIDER_MODELS``)."""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import MissingShardError, ModelNotFoundError, UnknownQuantError
from .._common import gguf, paths
from .files import (
    _SHARD_RE,
    QuantChooser,
    QuantFile,
    _group,
    _is_gguf,
    _is_mmproj,
    _select,
    _select_mmproj,
    _strip_gguf,
    _strip_quant,
    is_auto,
    parse_quant,
    quant_matches,
)
from .spec import LocalModel, ResolvedModel, Spec


def _shard_set(path: Path) -> tuple[Path, ...]:
    """All shards of the split set ``path`` belongs to (or just ``path``); MissingShardError if any is absent."""
    m = _SHARD_RE.match(path.name)
    if not m:
        return (path,)
    total = int(m["total"])
    shards = tuple(path.with_name(f"{m['base']}-{i:05d}-of-{m['total']}.gguf") for i in range(1, total + 1))
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise MissingShardError(
            f"{path.name} is part of a split model of {total} shards, but {len(missing)} are missing from "
            f"{path.parent}: {', '.join(missing)}. Download every shard into the same directory."
        )
    return shards


def _local_mmproj(model: Path, shards: tuple[Path, ...]) -> Path:
    folder = model.parent
    files = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file() and p not in shards}
    choice = _select_mmproj(files, model.name)
    if choice is None:
        raise ModelNotFoundError(
            f"vision=True but there is no mmproj file (a name containing 'mmproj', ending in .gguf) next to {model}"
        )
    return folder / choice


def resolve_mmproj(value: str) -> Path:
    """An explicit projector file (``mmproj=``): it must exist and be a GGUF whose architecture is ``clip``
    (llama.cpp's multimodal projectors); ModelNotFoundError otherwise, GGUFFormatError for a broken file."""
    path = Path(value).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"mmproj file not found: {path} " + ("is a directory" if path.is_dir() else
                                                                      "does not exist"))
    arch = gguf.read_header(path).architecture
    if arch != "clip":
        raise ModelNotFoundError(
            f"{path} is no multimodal projector: its GGUF architecture is {arch!r}, a projector's is 'clip'. Give the "
            f"mmproj file (e.g. mmproj-model-f16.gguf from the model's repo), not the model")
    return path


def _dir_candidates(folder: Path) -> dict[str, int]:
    """The GGUF files in ``folder`` and its subfolders (a split set may sit in one), relative posix paths."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*.gguf"))
            if p.is_file()}


def _resolve_dir(folder: Path, quant: str | None, *, vision: bool, choose: QuantChooser | None) -> ResolvedModel:
    """A directory of one model's quants: the quant named, else the automatic choice among them."""
    files = _dir_candidates(folder)
    if not files:
        raise ModelNotFoundError(f"{folder} is a directory with no .gguf file in it; give the path of a .gguf file")
    said: list[str] = []
    stems = {_strip_quant(_strip_gguf(c.first.rsplit("/", 1)[-1])) for c in _group(files)}
    chosen = _select(_group(files), quant=quant, filename=None, where=f"directory {folder}",
                     name=stems.pop() if len(stems) == 1 else folder.name,
                     choose=choose, reader=lambda c: functools.partial(gguf.read_tables, [folder / f for f in c.files]),
                     said=said)
    return replace(_resolve_path(folder / chosen.first, vision=vision), chosen=said[0] if said else None)


def _resolve_path(path: Path, *, vision: bool, source: str = "path") -> ResolvedModel:
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path} does not exist")
    if path.is_dir():
        raise ModelNotFoundError(f"{path} is a directory; give the path of a .gguf file")
    shards = _shard_set(path)
    mmproj = _local_mmproj(shards[0], shards) if vision else None
    return ResolvedModel(
        path=shards[0],
        shards=shards,
        mmproj=mmproj,
        size_bytes=sum(s.stat().st_size for s in shards),
        source=source,
        repo=None,
        quant=parse_quant(shards[0].name),
    )


@dataclass(frozen=True)
class _LocalEntry:
    path: Path  # file or shard 1
    stem: str  # file name without .gguf (and without the shard suffix)
    n_shards: int


def _scan_models_dirs() -> list[_LocalEntry]:
    entries: list[_LocalEntry] = []
    seen: set[Path] = set()
    for folder in paths.models_dirs():
        if not folder.is_dir():
            continue
        for p in sorted(folder.rglob("*")):
            if not p.is_file() or not _is_gguf(p.name) or _is_mmproj(p.name):
                continue
            m = _SHARD_RE.match(p.name)
            if m and int(m["idx"]) != 1:
                continue
            key = p.absolute()  # the same file under two names stays two models
            if key in seen:
                continue
            seen.add(key)
            entries.append(_LocalEntry(p, _strip_gguf(p.name), int(m["total"]) if m else 1))
    return entries


def _find_by_name(name: str, quant: str | None, choose: QuantChooser | None = None,
                  said: list[str] | None = None) -> Path:
    entries = _scan_models_dirs()
    key = _strip_gguf(name).casefold()
    if quant is not None and is_auto(quant):
        quant = None
    pool = [e for e in entries if quant_matches(quant, e.stem)] if quant else entries
    exact = [e for e in pool if e.stem.casefold() == key]
    if exact:
        return exact[0].path  # the first models dir wins
    loose = [e for e in pool if _strip_quant(e.stem).casefold() == key]
    if len(loose) == 1:
        return loose[0].path
    if len(loose) > 1 and choose is not None:  # one model in several quants: the automatic choice
        complete = []
        for e in loose:
            try:
                complete.append((e, _shard_set(e.path)))
            except MissingShardError:
                continue
        if len(complete) > 1:
            files = [QuantFile(parse_quant(e.path.name) or e.stem, sum(s.stat().st_size for s in shards),
                               tuple(s.name for s in shards), functools.partial(gguf.read_tables, shards))
                     for e, shards in complete]
            index, line = choose(_strip_quant(loose[0].stem), files)
            if said is not None:
                said.append(line)
            return complete[index][0].path
    if len(loose) > 1:
        listing = ", ".join(e.stem for e in loose)
        raise ModelNotFoundError(
            f"model name {name!r} is ambiguous: it matches {listing}. Give the full name or a quant "
            f"(e.g. {loose[0].stem!r} or '{name}:{parse_quant(loose[0].stem) or 'QUANT'}')"
        )
    dirs = ", ".join(str(d) for d in paths.models_dirs())
    if quant:
        other = [e for e in entries if _strip_quant(e.stem).casefold() == key or e.stem.casefold() == key]
        if other:  # the model is there, in other quants
            quants = ", ".join(f"{parse_quant(e.stem) or '?'} ({e.stem})" for e in other)
            raise UnknownQuantError(f"no {quant} quant of {name!r} in the models dirs ({dirs}); there: {quants}",
                                    available={parse_quant(e.stem) or e.stem: e.path.stat().st_size for e in other})
    known = ", ".join(e.stem for e in entries[:20]) or "none"
    raise ModelNotFoundError(
        f"no model named {name!r} in the models dirs ({dirs}).{did_you_mean(name, entries)} Models there: "
        f"{known}. Give a path to a .gguf file, or a Hugging Face repo as 'org/repo' or 'org/repo:QUANT'"
    )


def did_you_mean(name: str, entries: list[_LocalEntry]) -> str:
    """`` Did you mean 'X'?`` over every name a model on this machine answers to: models-dir file stems (with and
    without the quant) and the Hugging Face cache's repos (``org/repo:QUANT``, and the repo's name alone)."""
    from .hub import list_cached

    names: dict[str, str] = {}  # what may be meant (casefolded) -> the spec that loads it
    for e in entries:
        names.setdefault(_strip_quant(e.stem).casefold(), e.stem)
        names[e.stem.casefold()] = e.stem
    try:
        cached = list_cached()
    except OSError:
        cached = []
    for m in cached:
        if m.repo:
            short = m.repo.rsplit("/", 1)[-1]
            for said in (m.repo, short, short.removesuffix("-GGUF").removesuffix("-gguf"), m.name):
                names.setdefault(said.casefold(), m.name)
    close = difflib.get_close_matches(_strip_gguf(name).casefold(), list(names), n=1, cutoff=0.75)
    return f" Did you mean {names[close[0]]!r}?" if close else ""


def resolve_local(spec: Spec, *, vision: bool, choose: QuantChooser | None = None) -> ResolvedModel:
    """Resolve a parsed spec of kind "path" or "name" (a bare ``*.gguf`` file name is also looked up by name; a
    directory holds one model's quants, and ``choose`` picks among them as among a name's)."""
    if spec.kind == "path":
        path = Path(spec.value).expanduser()
        if not path.exists() and _is_gguf(path.name) and len(path.parts) == 1:
            try:  # a bare file name: look in the models dirs too
                return _resolve_path(_find_by_name(path.name, spec.quant), vision=vision, source="models-dir")
            except ModelNotFoundError:
                pass
        if path.is_dir():
            return _resolve_dir(path, spec.quant, vision=vision, choose=choose)
        return _resolve_path(path, vision=vision, source="path")
    said: list[str] = []
    found = _resolve_path(_find_by_name(spec.value, spec.quant, choose, said), vision=vision, source="models-dir")
    return replace(found, chosen=said[0]) if said else found


def list_models_dirs() -> list[LocalModel]:
    """Models in the models dirs, mmproj files left out (a split set missing shards is sized by shard 1 alone)."""
    out: list[LocalModel] = []
    for e in _scan_models_dirs():
        try:
            shards = _shard_set(e.path)
        except MissingShardError:
            shards = (e.path,)
        out.append(LocalModel(e.stem, e.path, sum(s.stat().st_size for s in shards if s.exists()), "models-dir",
                              None, parse_quant(e.path.name), e.n_shards))
    return out
