"""Resolve a model spec to GGUF file(s) on disk: a local path, a name in the models dirs, or a Hugging Face repo.

A :class:`ModelRef` (the model part of a config) is resolved in one pass by :func:`resolve` (:mod:`.resolve`): parsed
(:mod:`.spec`), found on disk (:mod:`.local`) or in the Hugging Face cache or Hub (:mod:`.hub`), then its projector
and draft model. :func:`resolve_model` takes the ModelRef's arguments. Spec forms accepted:

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

from .._common.model_source import ModelSource
from .files import DEFAULT_QUANT_PREFERENCE, parse_quant, quant_matches
from .hub import list_cached
from .local import list_models_dirs, resolve_mmproj
from .resolve import confine, pull, resolve, resolve_model
from .spec import LocalModel, ModelRef, Resolution, ResolvedModel

__all__ = [
    "DEFAULT_QUANT_PREFERENCE",
    "LocalModel",
    "ModelRef",
    "ModelSource",
    "Resolution",
    "ResolvedModel",
    "list_local_models",
    "confine",
    "parse_quant",
    "pull",
    "quant_matches",
    "resolve",
    "resolve_mmproj",
    "resolve_model",
]


def list_local_models(cache_dir: str | os.PathLike[str] | None = None) -> list[LocalModel]:
    """Models in the models dirs and GGUF models in the Hugging Face cache (mmproj files left out)."""
    return list_models_dirs() + list_cached(cache_dir)
