"""Resolve a model spec to GGUF file(s) on disk: a local path, a name in the models dirs, or a Hugging Face repo.

Spec forms accepted by :func:`resolve_model`:

* a path to a ``.gguf`` file (``~`` expanded); any shard of a split set (``name-00001-of-00003.gguf``) stands for
  the whole set, which must be complete;
* a bare name (``"SmolLM2-135M-Instruct"`` or ``"SmolLM2-135M-Instruct.Q4_1"``, optionally ``name:QUANT``) looked up
  by file stem, case-insensitively, in ``<home>/models`` and ``$GGUF_PROVIDER_MODELS``;
* ``"org/repo"`` or ``"org/repo:QUANT"`` (llama-server's ``-hf`` syntax), or ``repo=``/``quant=``/``filename=``
  keywords: fetched through ``huggingface_hub`` into the standard Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``,
  the cache llama-server ``-hf`` uses too).

Returned paths of Hub models are the cache's *snapshot* paths (symlinks named like the repo files), never the blob
paths: llama.cpp finds the other shards of a split model by the name of the first one.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    InsufficientDiskError,
    MissingShardError,
    ModelDownloadError,
    ModelNotFoundError,
    UnknownQuantError,
)
from . import paths

__all__ = [
    "DEFAULT_QUANT_PREFERENCE",
    "LocalModel",
    "ProgressCallback",
    "ResolvedModel",
    "list_local_models",
    "parse_quant",
    "pull",
    "quant_matches",
    "resolve_model",
]

ProgressCallback = Callable[[int, int, str], None]
"""``progress(done_bytes, total_bytes, filename)``: bytes downloaded so far out of all bytes this call downloads."""

DEFAULT_QUANT_PREFERENCE = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q8_0")
MMPROJ_QUANT_PREFERENCE = ("F16", "BF16", "Q8_0")

_SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)
# A quant token: not glued to a letter/digit on the left ("IQ4_K_M" holds no "Q4_K_M"), and not followed by a
# letter, digit or "_" on the right ("Q4_K_M" holds no "Q4_K").
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]+)*|TQ[12]_0|MXFP4(?:_MOE)?|BF16|FP16|F16|FP32|F32))"
    r"(?![A-Za-z0-9_])",
    re.IGNORECASE,
)
_REPO_RE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant>[\w.+-]+))?$")
_HUB_PREFIXES = ("hf://", "https://huggingface.co/", "huggingface.co/", "hf.co/")


@dataclass(frozen=True)
class ResolvedModel:
    """GGUF file(s) ready to hand to llama-server."""

    path: Path  # the file, or shard 1 of a split set
    shards: tuple[Path, ...]  # every file of the model, shard order (a single file: just ``path``)
    mmproj: Path | None  # the multimodal projector, when asked for with ``vision=True``
    size_bytes: int  # total size of ``shards`` (mmproj excluded)
    source: str  # "path" | "models-dir" | "hf"
    repo: str | None = None  # Hugging Face repo id (source "hf")
    quant: str | None = None  # quant label read from the file name, e.g. "Q4_K_M"


@dataclass(frozen=True)
class LocalModel:
    """A model already on this machine, as listed by :func:`list_local_models`."""

    name: str  # what to pass to resolve_model(): a file stem, or "org/repo:QUANT"
    path: Path  # the file, or shard 1
    size_bytes: int
    source: str  # "models-dir" | "hf"
    repo: str | None = None
    quant: str | None = None
    n_shards: int = 1


# --- helpers ---------------------------------------------------------------------------------------------------


def _free_disk_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (tests monkeypatch this)."""
    return shutil.disk_usage(path).free


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


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _is_network_error(exc: BaseException) -> bool:
    """A connection-level failure (no route, timeout, offline mode) rather than an answer from the Hub."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names & {"OfflineModeIsEnabled", "ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError",
                 "ProxyError", "ConnectionError"}
    )


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


def _select(cands: list[_Candidate], *, quant: str | None, filename: str | None, where: str) -> _Candidate:
    """Pick the model among ``cands`` by filename, by quant, or by the default preference."""
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


# --- local files -----------------------------------------------------------------------------------------------


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


def _strip_quant(stem: str) -> str:
    """``SmolLM2-135M-Instruct.Q4_1`` → ``SmolLM2-135M-Instruct``."""
    found = list(_QUANT_RE.finditer(stem))
    if not found:
        return stem
    last = found[-1]
    return (stem[: last.start()].rstrip("._- ") + stem[last.end():]).strip("._- ")


def _find_by_name(name: str, quant: str | None) -> Path:
    entries = _scan_models_dirs()
    key = _strip_gguf(name).casefold()
    pool = [e for e in entries if quant_matches(quant, e.stem)] if quant else entries
    exact = [e for e in pool if e.stem.casefold() == key]
    if exact:
        return exact[0].path  # the first models dir wins
    loose = [e for e in pool if _strip_quant(e.stem).casefold() == key]
    if len(loose) == 1:
        return loose[0].path
    if len(loose) > 1:
        listing = ", ".join(e.stem for e in loose)
        raise ModelNotFoundError(
            f"model name {name!r} is ambiguous: it matches {listing}. Give the full name or a quant "
            f"(e.g. {loose[0].stem!r} or '{name}:{parse_quant(loose[0].stem) or 'QUANT'}')"
        )
    dirs = ", ".join(str(d) for d in paths.models_dirs())
    known = ", ".join(e.stem for e in entries[:20]) or "none"
    wanted = f"{name}:{quant}" if quant else name
    raise ModelNotFoundError(
        f"no model named {wanted!r} in the models dirs ({dirs}); models there: {known}. Give a path to a .gguf "
        "file, or a Hugging Face repo as 'org/repo' or 'org/repo:QUANT'"
    )


# --- Hugging Face ----------------------------------------------------------------------------------------------


def _hf_cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()


def _is_offline(offline: bool | None) -> bool:
    if offline is not None:
        return offline
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or _truthy(os.environ.get("HF_HUB_OFFLINE"))


def _repo_storage(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _cached_commit(storage: Path, revision: str) -> str | None:
    if re.fullmatch(r"[0-9a-f]{40}", revision) and (storage / "snapshots" / revision).is_dir():
        return revision
    ref = storage / "refs" / revision
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if (storage / "snapshots" / commit).is_dir() else None


def _snapshot_files(snapshot: Path) -> dict[str, int]:
    files: dict[str, int] = {}
    for p in snapshot.rglob("*"):
        if p.is_file() and _is_gguf(p.name):  # is_file() follows the symlink: a dangling one is skipped
            files[p.relative_to(snapshot).as_posix()] = p.stat().st_size
    return files


def _offline_hint(repo: str, quant: str | None) -> str:
    spec = f"{repo}:{quant}" if quant else repo
    return (f"run `gguf-provider pull {spec}` (or resolve it once) while online, or unset HF_HUB_OFFLINE / pass "
            "offline=False")


def _resolve_hf_cached(repo: str, *, quant: str | None, filename: str | None, revision: str | None, vision: bool,
                       cache: Path, why: str) -> ResolvedModel:
    """Resolve from the Hugging Face cache only (no network)."""
    from huggingface_hub import try_to_load_from_cache

    rev = revision or "main"
    storage = _repo_storage(cache, repo)
    commit = _cached_commit(storage, rev)
    if commit is None:
        raise ModelNotFoundError(
            f"{repo} (revision {rev}) is not in the Hugging Face cache {cache} and {why}; {_offline_hint(repo, quant)}"
        )
    snapshot = storage / "snapshots" / commit
    files = _snapshot_files(snapshot)
    where = f"the cached snapshot of {repo} ({why})"
    try:
        chosen = _select(_group(files), quant=quant, filename=filename, where=where)
    except ModelNotFoundError as exc:
        if isinstance(exc, UnknownQuantError):
            raise UnknownQuantError(f"{exc}; {_offline_hint(repo, quant)}", available=exc.available) from None
        raise ModelNotFoundError(f"{exc}; {_offline_hint(repo, quant)}") from None
    except MissingShardError as exc:
        raise MissingShardError(f"{exc} (not fully downloaded); {_offline_hint(repo, quant)}") from None
    shards: list[Path] = []
    for rel in chosen.files:
        found = try_to_load_from_cache(repo, rel, cache_dir=str(cache), revision=commit)
        if not isinstance(found, str):
            raise ModelNotFoundError(f"{rel} of {repo} is not in the cache {cache}; {_offline_hint(repo, quant)}")
        shards.append(Path(found))
    mmproj: Path | None = None
    if vision:
        proj = _select_mmproj(files, chosen.first)
        if proj is None:
            raise ModelNotFoundError(
                f"vision=True but no mmproj file of {repo} is in the cache {cache} ({why}); "
                f"{_offline_hint(repo, quant)} with vision=True"
            )
        mmproj = snapshot / proj
    return ResolvedModel(shards[0], tuple(shards), mmproj, sum(s.stat().st_size for s in shards), "hf", repo,
                         chosen.quant)


def _hub_error(exc: BaseException, repo: str, revision: str | None, token: str | bool | None) -> ModelNotFoundError:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token_hint = (
        "If it is private or gated, accept its terms on huggingface.co and pass token=... (or set HF_TOKEN, "
        "or run `hf auth login`)." if not token else
        "Check that the token you passed has read access to it."
    )
    if isinstance(exc, GatedRepoError):
        return ModelNotFoundError(f"{repo} is a gated repo you have no access to. {token_hint}")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelNotFoundError(
            f"Hugging Face repo {repo!r} not found (or not accessible). Check the spelling ('org/repo'). {token_hint}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelNotFoundError(f"{repo} has no revision {revision!r}")
    if isinstance(exc, RemoteEntryNotFoundError):
        return ModelNotFoundError(f"{repo}: file not found on the Hub: {exc}")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return ModelNotFoundError(f"access to {repo} denied (HTTP {status}). {token_hint}")
        return ModelNotFoundError(f"the Hugging Face Hub answered HTTP {status} for {repo}: {exc}")
    return ModelNotFoundError(f"could not look up {repo}: {exc}")


def _is_complete_in_cache(storage: Path, commit: str, rel: str, size: int, sha256: str | None) -> bool:
    pointer = storage / "snapshots" / commit / rel
    if pointer.is_file() and (size <= 0 or pointer.stat().st_size == size):
        return True
    if sha256:  # the same blob under another commit: huggingface_hub only links it
        blob = storage / "blobs" / sha256
        return blob.is_file() and (size <= 0 or blob.stat().st_size == size)
    return False


def _make_tqdm_class(progress: ProgressCallback, total: int, state: dict[str, Any]) -> type[Any]:
    from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

    class _ProgressBar(hf_tqdm):
        """huggingface_hub's tqdm bar that also reports to ``progress`` (works with bars disabled too)."""

        def update(self, n: float | None = 1) -> bool | None:
            step = int(n or 0)
            state["file_done"] += step
            progress(state["done"] + state["file_done"], total, state["filename"])
            result: bool | None = super().update(n)
            return result

    return _ProgressBar


def _resolve_hf(repo: str, *, quant: str | None, filename: str | None, revision: str | None,
                token: str | bool | None, vision: bool, offline: bool | None, progress: ProgressCallback | None,
                cache_dir: str | os.PathLike[str] | None, force_download: bool = False,
                allow_cache_fallback: bool = True) -> ResolvedModel:
    cache = _hf_cache(cache_dir)
    if _is_offline(offline):
        return _resolve_hf_cached(repo, quant=quant, filename=filename, revision=revision, vision=vision,
                                  cache=cache, why="offline mode is on (offline=True or HF_HUB_OFFLINE=1)")

    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True, token=token)
    except HfHubHTTPError as exc:
        raise _hub_error(exc, repo, revision, token) from None
    except Exception as exc:
        if not _is_network_error(exc):
            raise
        if allow_cache_fallback:
            try:
                return _resolve_hf_cached(repo, quant=quant, filename=filename, revision=revision, vision=vision,
                                          cache=cache, why=f"the Hugging Face Hub could not be reached ({exc})")
            except ModelNotFoundError as cached_exc:
                raise ModelNotFoundError(str(cached_exc)) from exc
        raise ModelNotFoundError(f"could not reach the Hugging Face Hub for {repo}: {exc}") from exc

    sizes: dict[str, int] = {}
    shas: dict[str, str] = {}
    for s in info.siblings or []:
        size = s.size if s.size is not None else (s.lfs.size if s.lfs is not None else 0)
        sizes[s.rfilename] = int(size or 0)
        if s.lfs is not None:
            shas[s.rfilename] = s.lfs.sha256
    where = f"Hugging Face repo {repo}" + (f" (revision {revision})" if revision else "")
    chosen = _select(_group(sizes), quant=quant, filename=filename, where=where)
    to_fetch = list(chosen.files)
    if vision:
        proj = _select_mmproj(sizes, chosen.first)
        if proj is None:
            raise ModelNotFoundError(
                f"vision=True but {repo} has no mmproj file (a .gguf whose name contains 'mmproj'); "
                "pick a repo that ships one, or pass vision=False"
            )
        to_fetch.append(proj)

    commit = info.sha or ""
    storage = _repo_storage(cache, repo)
    pending = [f for f in to_fetch
               if force_download or not (commit and _is_complete_in_cache(storage, commit, f, sizes[f], shas.get(f)))]
    need = sum(sizes[f] for f in pending)
    if need:
        probe = cache
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = _free_disk_bytes(probe)
        if need > free:
            raise InsufficientDiskError(
                f"downloading {repo} ({', '.join(pending)}) needs {human_size(need)} but only {human_size(free)} "
                f"is free on the filesystem of {cache}. Free some space, or point HF_HUB_CACHE (or cache_dir=) "
                "at a bigger disk."
            )

    state: dict[str, Any] = {"done": 0, "file_done": 0, "filename": ""}
    tqdm_class = _make_tqdm_class(progress, need, state) if progress is not None else None
    local: dict[str, Path] = {}
    for rel in to_fetch:
        state["filename"], state["file_done"] = rel, 0
        try:
            got = hf_hub_download(
                repo, rel, revision=revision, cache_dir=str(cache), token=token, tqdm_class=tqdm_class,
                force_download=force_download and rel in pending,
            )
        except HfHubHTTPError as exc:
            raise _hub_error(exc, repo, revision, token) from None
        except Exception as exc:
            if isinstance(exc, (ModelNotFoundError, InsufficientDiskError)):
                raise
            raise ModelDownloadError(
                f"downloading {rel} from {repo} failed: {exc}. Nothing partial was kept; run it again to retry."
            ) from exc
        path = Path(str(got))
        actual = path.stat().st_size
        if sizes[rel] and actual != sizes[rel]:
            raise ModelDownloadError(
                f"{path} has {actual} bytes but the Hub lists {sizes[rel]} for {rel}; delete it and download again"
            )
        if rel in pending:
            state["done"] += sizes[rel]
        local[rel] = path
    if progress is not None and need:
        progress(need, need, to_fetch[-1])
    shards = tuple(local[f] for f in chosen.files)
    return ResolvedModel(
        path=shards[0],
        shards=shards,
        mmproj=local[to_fetch[-1]] if vision else None,
        size_bytes=chosen.size,
        source="hf",
        repo=repo,
        quant=chosen.quant,
    )


# --- public API ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    kind: str  # "path" | "name" | "hf"
    value: str
    quant: str | None


def _parse_spec(spec: str | os.PathLike[str] | None, repo: str | None, quant: str | None) -> _Spec:
    if spec is not None and repo is not None:
        raise ModelNotFoundError(f"give either a model spec ({spec!r}) or repo= ({repo!r}), not both")
    if spec is None:
        if repo is None:
            raise ModelNotFoundError(
                "no model given: pass a .gguf path, a model name, or a Hugging Face repo ('org/repo[:QUANT]')"
            )
        spec_quant = None
        if ":" in repo:
            repo, spec_quant = repo.split(":", 1)
        return _Spec("hf", repo.strip("/"), _merge_quant(spec_quant, quant))
    if not isinstance(spec, str):
        return _Spec("path", os.fspath(spec), quant)
    text = spec.strip()
    if not text:
        raise ModelNotFoundError("empty model spec")
    for prefix in _HUB_PREFIXES:
        if text.startswith(prefix):
            return _hub_spec(text[len(prefix):], quant, spec)
    if (text.startswith(("~", ".", "/", "\\")) or os.path.isabs(text) or Path(text).expanduser().exists()
            or (_is_gguf(text) and ("/" in text or os.sep in text))):
        return _Spec("path", text, quant)
    if _REPO_RE.match(text):
        return _hub_spec(text, quant, spec)
    name, name_quant = text, None
    if ":" in text:
        name, name_quant = text.rsplit(":", 1)
    return _Spec("name", name, _merge_quant(name_quant, quant))


def _hub_spec(text: str, quant: str | None, original: str) -> _Spec:
    m = _REPO_RE.match(text.strip("/"))
    if not m:
        raise ModelNotFoundError(f"{original!r} is not a Hugging Face repo spec ('org/repo' or 'org/repo:QUANT')")
    return _Spec("hf", m["repo"], _merge_quant(m["quant"], quant))


def _merge_quant(from_spec: str | None, keyword: str | None) -> str | None:
    if from_spec and keyword and from_spec.upper() != keyword.upper():
        raise ModelNotFoundError(f"conflicting quants: {from_spec!r} in the spec and quant={keyword!r}")
    return from_spec or keyword


def resolve_model(
    spec: str | os.PathLike[str] | None = None,
    *,
    repo: str | None = None,
    quant: str | None = None,
    filename: str | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    vision: bool = False,
    offline: bool | None = None,
    progress: ProgressCallback | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ResolvedModel:
    """Resolve ``spec`` (path, models-dir name or Hugging Face repo) to GGUF file(s) on disk, downloading if needed.

    Hub models: the quant is ``quant=`` / ``":QUANT"`` (a whole token of the file name, case-insensitive), else the
    first of Q4_K_M, Q4_K_S, Q5_K_M, Q8_0, else the smallest file; ``filename=`` picks one file exactly. Every shard
    of a split model is fetched; ``vision=True`` also fetches an mmproj file (F16, BF16, Q8_0 preferred). Before
    downloading, the free space of the cache filesystem is checked against the bytes still missing. With
    ``offline=True`` (default: ``HF_HUB_OFFLINE``) only the cache is used. ``progress(done, total, filename)``
    reports the bytes this call downloads; tqdm bars are shown too (``HF_HUB_DISABLE_PROGRESS_BARS=1`` hides them).

    Raises ModelNotFoundError (UnknownQuantError for a quant the repo lacks), MissingShardError,
    InsufficientDiskError or ModelDownloadError, each with a message that says what to do.
    """
    parsed = _parse_spec(spec, repo, quant)
    if parsed.kind == "hf":
        return _resolve_hf(parsed.value, quant=parsed.quant, filename=filename, revision=revision, token=token,
                           vision=vision, offline=offline, progress=progress, cache_dir=cache_dir)
    if parsed.kind == "path":
        path = Path(parsed.value).expanduser()
        if not path.exists() and _is_gguf(path.name) and len(path.parts) == 1:
            try:  # a bare file name: look in the models dirs too
                return _resolve_path(_find_by_name(path.name, parsed.quant), vision=vision, source="models-dir")
            except ModelNotFoundError:
                pass
        return _resolve_path(path, vision=vision, source="path")
    return _resolve_path(_find_by_name(parsed.value, parsed.quant), vision=vision, source="models-dir")


def pull(
    spec: str | None = None,
    *,
    repo: str | None = None,
    quant: str | None = None,
    filename: str | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    vision: bool = False,
    progress: ProgressCallback | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> ResolvedModel:
    """Download a Hugging Face model into the cache (like ``resolve_model``, but always asks the Hub).

    Never falls back to the cache when the Hub cannot be reached, and refuses offline mode. Files already complete
    in the cache are not fetched again unless ``force=True``.
    """
    parsed = _parse_spec(spec, repo, quant)
    if parsed.kind != "hf":
        raise ModelNotFoundError(
            f"pull needs a Hugging Face repo ('org/repo' or 'org/repo:QUANT'); {spec!r} names a local model"
        )
    if _is_offline(None):
        raise ModelNotFoundError("cannot pull while offline mode is on (HF_HUB_OFFLINE=1); unset it and retry")
    return _resolve_hf(parsed.value, quant=parsed.quant, filename=filename, revision=revision, token=token,
                       vision=vision, offline=False, progress=progress, cache_dir=cache_dir, force_download=force,
                       allow_cache_fallback=False)


def list_local_models(cache_dir: str | os.PathLike[str] | None = None) -> list[LocalModel]:
    """Models in the models dirs and GGUF models in the Hugging Face cache (mmproj files left out)."""
    out: list[LocalModel] = []
    for e in _scan_models_dirs():
        try:
            shards = _shard_set(e.path)
        except MissingShardError:
            shards = (e.path,)
        out.append(LocalModel(e.stem, e.path, sum(s.stat().st_size for s in shards if s.exists()), "models-dir",
                              None, parse_quant(e.path.name), e.n_shards))
    cache = _hf_cache(cache_dir)
    if not cache.is_dir():
        return out
    for storage in sorted(cache.glob("models--*")):
        repo = storage.name.removeprefix("models--").replace("--", "/")
        snapshots = storage / "snapshots"
        if not snapshots.is_dir():
            continue
        refd = []
        refs = storage / "refs"
        if refs.is_dir():
            for ref in refs.rglob("*"):
                try:
                    refd.append(ref.read_text().strip())
                except OSError:
                    pass
        commits = sorted((p.name for p in snapshots.iterdir() if p.is_dir()), key=lambda c: (c not in refd, c))
        seen: set[str] = set()
        for commit in commits:
            files = _snapshot_files(snapshots / commit)
            cands = [c for c in _group(files) if not c.missing and c.first not in seen]
            labels = [c.quant for c in cands]
            for c in cands:
                seen.add(c.first)
                unique = c.quant is not None and labels.count(c.quant) == 1
                name = f"{repo}:{c.quant}" if unique else repo
                out.append(LocalModel(name, snapshots / commit / c.first, c.size, "hf", repo, c.quant, c.n_shards))
    return out
