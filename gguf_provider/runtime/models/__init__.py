"""Resolve a model spec to GGUF file(s) on disk: a local path, a name in the models dirs, or a Hugging Face repo.

Spec forms accepted by :func:`resolve_model` (parsed in :mod:`.spec`):

* a path to a ``.gguf`` file (``~`` expanded); any shard of a split set (``name-00001-of-00003.gguf``) stands for
  the whole set, which must be complete (:mod:`.local`);
* a bare name (``"SmolLM2-135M-Instruct"`` or ``"SmolLM2-135M-Instruct.Q4_1"``, optionally ``name:QUANT``) looked up
  by file stem, case-insensitively, in ``<home>/models`` and ``$GGUF_PROVIDER_MODELS`` (:mod:`.local`);
* ``"org/repo"`` or ``"org/repo:QUANT"`` (llama-server's ``-hf`` syntax), or ``repo=``/``quant=``/``filename=``
  keywords: fetched through ``huggingface_hub`` into the standard Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``,
  the cache llama-server ``-hf`` uses too) (:mod:`.hub`).
"""

from __future__ import annotations

import os

from ..progress import Progress
from .hub import _resolve_hf, list_cached, pull
from .local import list_models_dirs, resolve_local, resolve_mmproj
from .spec import DEFAULT_QUANT_PREFERENCE, LocalModel, ResolvedModel, _parse_spec, parse_quant, quant_matches
from .spec import MMPROJ_QUANT_PREFERENCE as MMPROJ_QUANT_PREFERENCE
from .spec import _group as _group  # tests call these two directly
from .spec import _select as _select
from .spec import human_size as human_size

__all__ = [
    "DEFAULT_QUANT_PREFERENCE",
    "LocalModel",
    "ResolvedModel",
    "list_local_models",
    "parse_quant",
    "pull",
    "quant_matches",
    "resolve_mmproj",
    "resolve_model",
]


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
    progress: Progress | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ResolvedModel:
    """Resolve ``spec`` (path, models-dir name or Hugging Face repo) to GGUF file(s) on disk, downloading if needed.

    Hub models: the quant is ``quant=`` / ``":QUANT"`` (a whole token of the file name, case-insensitive), else the
    first of Q4_K_M, Q4_K_S, Q5_K_M, Q8_0, else the smallest file; ``filename=`` picks one file exactly. Every shard
    of a split model is fetched; ``vision=True`` also fetches an mmproj file (F16, BF16, Q8_0 preferred). Before
    downloading, the free space of the cache filesystem is checked against the bytes still missing. With
    ``offline=True`` (default: ``HF_HUB_OFFLINE``) only the cache is used. ``progress("download", done, total,
    filename)`` reports the bytes this call downloads (see :mod:`gguf_provider.runtime.progress`); tqdm bars are
    shown too (``HF_HUB_DISABLE_PROGRESS_BARS=1`` hides them).

    Raises ModelNotFoundError (UnknownQuantError for a quant the repo lacks), MissingShardError,
    InsufficientDiskError or ModelDownloadError, each with a message that says what to do.
    """
    parsed = _parse_spec(spec, repo, quant)
    if parsed.kind == "hf":
        return _resolve_hf(parsed.value, quant=parsed.quant, filename=filename, revision=revision, token=token,
                           vision=vision, offline=offline, progress=progress, cache_dir=cache_dir)
    return resolve_local(parsed.value, parsed.quant, kind=parsed.kind, vision=vision)


def list_local_models(cache_dir: str | os.PathLike[str] | None = None) -> list[LocalModel]:
    """Models in the models dirs and GGUF models in the Hugging Face cache (mmproj files left out)."""
    return list_models_dirs() + list_cached(cache_dir)
