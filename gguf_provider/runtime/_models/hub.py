"""Hugging Face models: resolve a repo (and quant or file name) to files in the Hugging Face cache, downloading
them through ``huggingface_hub`` when missing.

The cache is the standard one (``HF_HOME``/``HF_HUB_CACHE``, which llama-server ``-hf`` uses too). Returned paths are
the cache's *snapshot* paths (symlinks named like the repo files), never the blob paths: llama.cpp finds the other
shards of a split model by the name of the first one.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ...errors import (
    InsufficientDiskError,
    MissingShardError,
    ModelDownloadError,
    ModelNotFoundError,
    UnknownQuantError,
)
from .._common.gguf import GGUFHeader, TensorInfo, read_tables
from .._common.progress import Progress
from .files import (
    QuantChooser,
    TableReader,
    _Candidate,
    _group,
    _is_gguf,
    _select,
    _select_mmproj,
    human_size,
)
from .remote import read_remote_table
from .spec import LocalModel, ModelRef, ResolvedModel, Spec


def _free_disk_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (tests monkeypatch this)."""
    return shutil.disk_usage(path).free


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _is_network_error(exc: BaseException) -> bool:
    """A connection-level failure (no route, timeout, offline mode) rather than an answer from the Hub."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names & {"OfflineModeIsEnabled", "ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError",
                 "ProxyError", "ConnectionError"}
    )


# --- the cache -------------------------------------------------------------------------------------------------


def _hf_cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()


def is_offline(offline: bool | None) -> bool:
    """``offline`` if given, else whether ``HF_HUB_OFFLINE`` is on (read at call time too)."""
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


OFFLINE_MODE = "offline mode is on"


def _offline_hint(repo: str, quant: str | None, why: str) -> str:
    spec = f"{repo}:{quant}" if quant else repo
    if why.startswith(OFFLINE_MODE):
        return (f"run `gguf-provider pull {spec}` (or resolve it once) while online, or unset HF_HUB_OFFLINE / pass "
                "offline=False")
    return f"run `gguf-provider pull {spec}` (or resolve it once) where the Hub (or $HF_ENDPOINT) can be reached"


def _cached_like(repo: str, cache: Path) -> str:
    """`` Did you mean 'org/repo:QUANT'?`` for a cached repo close to ``repo``, else ""."""
    names = {m.repo.casefold(): m.name for m in list_cached(cache) if m.repo}
    close = difflib.get_close_matches(repo.casefold(), list(names), n=1, cutoff=0.8)
    return f" Did you mean {names[close[0]]!r} (cached)?" if close else ""


def _resolve_hf_cached(repo: str, *, quant: str | None, filename: str | None, revision: str | None, vision: bool,
                       cache: Path, why: str, choose: QuantChooser | None = None) -> ResolvedModel:
    """Resolve from the Hugging Face cache only (no network)."""
    from huggingface_hub import try_to_load_from_cache

    rev = revision or "main"
    storage = _repo_storage(cache, repo)
    commit = _cached_commit(storage, rev)
    if commit is None:
        raise ModelNotFoundError(
            f"{repo} (revision {rev}) is not in the Hugging Face cache {cache} and {why}.{_cached_like(repo, cache)} "
            f"To get it: {_offline_hint(repo, quant, why)}"
        )
    snapshot = storage / "snapshots" / commit
    files = _snapshot_files(snapshot)
    where = f"the cached snapshot of {repo} ({why})"
    said: list[str] = []
    try:
        chosen = _select(_group(files), quant=quant, filename=filename, where=where, name=repo, choose=choose,
                         reader=lambda c: functools.partial(read_tables, [snapshot / f for f in c.files]), said=said)
    except ModelNotFoundError as exc:
        if isinstance(exc, UnknownQuantError):
            raise UnknownQuantError(f"{exc}; {_offline_hint(repo, quant, why)}", available=exc.available) from None
        raise ModelNotFoundError(f"{exc}; {_offline_hint(repo, quant, why)}") from None
    except MissingShardError as exc:
        raise MissingShardError(f"{exc} (not fully downloaded); {_offline_hint(repo, quant, why)}") from None
    shards: list[Path] = []
    for rel in chosen.files:
        found = try_to_load_from_cache(repo, rel, cache_dir=str(cache), revision=commit)
        if not isinstance(found, str):
            raise ModelNotFoundError(f"{rel} of {repo} is not in the cache {cache}; {_offline_hint(repo, quant, why)}")
        shards.append(Path(found))
    mmproj: Path | None = None
    if vision:
        proj = _select_mmproj(files, chosen.first)
        if proj is None:
            raise ModelNotFoundError(
                f"vision=True but no mmproj file of {repo} is in the cache {cache} ({why}); "
                f"{_offline_hint(repo, quant, why)} with vision=True"
            )
        mmproj = snapshot / proj
    return ResolvedModel(shards[0], tuple(shards), mmproj, sum(s.stat().st_size for s in shards), "hf", repo,
                         chosen.quant, cached=why, chosen=said[0] if said else None)


def _is_complete_in_cache(storage: Path, commit: str, rel: str, size: int, sha256: str | None) -> bool:
    pointer = storage / "snapshots" / commit / rel
    if pointer.is_file() and (size <= 0 or pointer.stat().st_size == size):
        return True
    if sha256:  # the same blob under another commit: huggingface_hub only links it
        blob = storage / "blobs" / sha256
        return blob.is_file() and (size <= 0 or blob.stat().st_size == size)
    return False


def list_cached(cache_dir: str | os.PathLike[str] | None = None) -> list[LocalModel]:
    """GGUF models complete in the Hugging Face cache, snapshots a ref points at first (mmproj files left out)."""
    out: list[LocalModel] = []
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


# --- the Hub ---------------------------------------------------------------------------------------------------


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


def _make_tqdm_class(progress: Progress, total: int, state: dict[str, Any]) -> type[Any]:
    from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

    class _ProgressBar(hf_tqdm):
        """huggingface_hub's tqdm bar that also reports to ``progress`` (works with bars disabled too)."""

        def update(self, n: float | None = 1) -> bool | None:
            step = int(n or 0)
            state["file_done"] += step
            progress("download", state["done"] + state["file_done"], total, state["filename"])
            result: bool | None = super().update(n)
            return result

    return _ProgressBar


def resolve_hf(spec: Spec, ref: ModelRef, *, force_download: bool = False,
               allow_cache_fallback: bool = True) -> ResolvedModel:
    """Resolve a parsed spec of kind "hf" with ``ref``'s Hub settings: from the cache when offline (or, with
    ``allow_cache_fallback``, when the Hub cannot be reached), else asking the Hub and downloading what is missing."""
    repo, quant, filename, revision, token = spec.value, spec.quant, ref.filename, ref.revision, ref.hf_token
    vision, progress = ref.finds_mmproj, ref.progress
    cache = _hf_cache(ref.cache_dir)
    if is_offline(ref.offline):
        return _resolve_hf_cached(repo, quant=quant, filename=filename, revision=revision, vision=vision,
                                  cache=cache, why=OFFLINE_MODE + " (offline=True or HF_HUB_OFFLINE=1)",
                                  choose=ref.choose)

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
                                          cache=cache, why=f"the Hugging Face Hub could not be reached ({exc})",
                                          choose=ref.choose)
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
    commit = info.sha or ""
    storage = _repo_storage(cache, repo)

    def reader(c: _Candidate) -> TableReader:
        """Each shard's tables: from the cache when it holds the file, else by HTTP ranges (no download)."""
        def read() -> list[tuple[GGUFHeader, list[TensorInfo]]]:
            out = []
            for f in c.files:
                local = storage / "snapshots" / commit / f
                if commit and _is_complete_in_cache(storage, commit, f, sizes[f], shas.get(f)) and local.is_file():
                    out += read_tables([local])
                else:
                    out.append(read_remote_table(repo, f, revision=commit or revision, size=sizes[f], token=token,
                                                 sha256=shas.get(f)))
            return out
        return read

    said: list[str] = []
    chosen = _select(_group(sizes), quant=quant, filename=filename, where=where, name=repo, choose=ref.choose,
                     reader=reader, said=said)
    to_fetch = list(chosen.files)
    if vision:
        proj = _select_mmproj(sizes, chosen.first)
        if proj is None:
            raise ModelNotFoundError(
                f"vision=True but {repo} has no mmproj file (a .gguf whose name contains 'mmproj'); "
                "pick a repo that ships one, or pass vision=False"
            )
        to_fetch.append(proj)

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
        progress("download", need, need, to_fetch[-1])
    shards = tuple(local[f] for f in chosen.files)
    return ResolvedModel(
        path=shards[0],
        shards=shards,
        mmproj=local[to_fetch[-1]] if vision else None,
        size_bytes=chosen.size,
        source="hf",
        repo=repo,
        quant=chosen.quant,
        chosen=said[0] if said else None,
    )

