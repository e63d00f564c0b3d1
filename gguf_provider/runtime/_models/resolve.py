"""Resolve a :class:`~.spec.ModelRef` in one pass: parse it (:mod:`.spec`), find the model on disk (:mod:`.local`) or
in the Hugging Face cache and Hub (:mod:`.hub`), then its projector and draft model. The order is one way:
files.py ← spec.py ← local.py, hub.py ← this module; local and hub never import each other or this module.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import ParamSpec, TypeVar

from ...errors import ModelNotFoundError
from .hub import is_offline, resolve_hf
from .local import resolve_local, resolve_mmproj
from .spec import ModelRef, Resolution, ResolvedModel, parse

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


def resolve(ref: ModelRef) -> Resolution:
    """Resolve ``ref`` to GGUF file(s) on disk, downloading if needed: the model with its projector (``mmproj``, or
    found beside the model or in its repo with ``vision``), and the ``draft`` model when one is named.

    An explicit ``mmproj`` file is checked before the model is looked for, so a wrong one fails before any download.
    """
    spec = parse(ref)
    mmproj = resolve_mmproj(ref.mmproj) if ref.mmproj else None
    model = (resolve_hf(spec, ref) if spec.kind == "hf" else
             resolve_local(spec, vision=ref.finds_mmproj, choose=ref.choose))
    if mmproj is not None:
        model = replace(model, mmproj=mmproj)
    log.info("model %r resolved to %s (from %s%s%s%s)", ref.model_path or ref.model or ref.repo, model.path,
             model.source, f" {model.repo}" if model.repo else "",
             f", {len(model.shards)} shards" if len(model.shards) > 1 else "",
             f", projector {model.mmproj}" if model.mmproj else "")
    return Resolution(model, _resolve_draft(ref))


def _resolve_draft(ref: ModelRef) -> ResolvedModel | None:
    """The draft model of ``speculative=``, resolved like any model (path, models-dir name, org/repo:QUANT) with
    ``ref``'s Hub settings."""
    if not ref.draft:
        return None
    draft = ModelRef(ref.draft, hf_token=ref.hf_token, offline=ref.offline, cache_dir=ref.cache_dir, progress=ref.progress)
    try:
        return resolve(draft).model
    except ModelNotFoundError as exc:
        raise type(exc)(f"speculative={ref.draft!r} names no draft model: {exc}. speculative takes 'auto', 'off' (or "
                        f"False), an n-gram type such as 'ngram-mod', or a draft model (a .gguf path, a models-dir "
                        f"name or org/repo:QUANT)") from exc


def pull(ref: ModelRef | str, *, force: bool = False) -> ResolvedModel:
    """Download a Hugging Face model into the cache (like :func:`resolve`, but asks the Hub for the newest
    revision even when the model is cached).

    Files already complete in the cache are not fetched again unless ``force=True``. What is cached is a no-op
    when the Hub cannot be asked (offline mode, or the Hub unreachable): the cached model, its ``cached`` saying
    why. ``ref.progress`` gets "download" reports (see :mod:`gguf_provider.runtime._common.progress`).
    """
    if isinstance(ref, str):
        ref = ModelRef(ref)
    spec = parse(ref)
    if spec.kind != "hf":
        raise ModelNotFoundError(
            f"pull needs a Hugging Face repo ('org/repo' or 'org/repo:QUANT'); {ref.model_path or ref.model!r} is not "
            "one: a path or a models-dir name is a local model, which needs no pull"
        )
    if force and is_offline(ref.offline):
        raise ModelNotFoundError("cannot pull again (force) while offline mode is on (offline=True or "
                                 "HF_HUB_OFFLINE=1): unset it and retry")
    if is_offline(ref.offline):  # the cache only: the model if it is there, else why not and what to do
        return resolve_hf(spec, replace(ref, offline=True))
    return resolve_hf(spec, replace(ref, offline=False), force_download=force, allow_cache_fallback=not force)


def _called_with_fields_of(cls: Callable[P, ModelRef]) -> Callable[[Callable[[ModelRef], T]], Callable[P, T]]:
    """Make a function of a ModelRef callable with the ModelRef's own arguments (``f("org/repo", quant="Q8_0")``),
    so that those arguments are declared once, in the dataclass, and still type-checked at every call."""

    def decorate(fn: Callable[[ModelRef], T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return fn(cls(*args, **kwargs))

        # help() and IDEs show the fields, not ``ref``
        returns = inspect.signature(fn).return_annotation
        call.__signature__ = inspect.signature(cls).replace(return_annotation=returns)  # type: ignore[attr-defined]
        return call

    return decorate


@_called_with_fields_of(ModelRef)
def resolve_model(ref: ModelRef) -> ResolvedModel:
    """Resolve a model given by :class:`ModelRef`'s arguments (path, models-dir name or Hugging Face repo) to GGUF
    file(s) on disk, downloading if needed: ``resolve_model("org/repo", quant="Q8_0", vision=True)``.

    Hub models: the quant is ``quant=`` / ``":QUANT"`` (a whole token of the file name, case-insensitive), else the
    first of Q4_K_M, Q4_K_S, Q5_K_M, Q8_0, else the smallest file; ``filename=`` picks one file exactly. Every shard
    of a split model is fetched; ``vision=True`` also fetches an mmproj file (F16, BF16, Q8_0 preferred). Before
    downloading, the free space of the cache filesystem is checked against the bytes still missing. With
    ``offline=True`` (default: ``HF_HUB_OFFLINE``) only the cache is used. ``progress("download", done, total,
    filename)`` reports the bytes this call downloads (see :mod:`gguf_provider.runtime._common.progress`); tqdm bars are
    shown too (``HF_HUB_DISABLE_PROGRESS_BARS=1`` hides them).

    Raises ModelNotFoundError (UnknownQuantError for a quant the repo lacks), MissingShardError,
    InsufficientDiskError or ModelDownloadError, each with a message that says what to do.
    """
    return resolve(ref).model


def confine(name: str) -> None:
    """ModelNotFoundError unless ``name`` is a model a shared endpoint (the gateway) may serve: a models-dir name, a
    Hugging Face repo (``org/repo[:QUANT]``), or a path to a file inside the models dirs or the Hugging Face cache.
    No other path is looked at, so a request cannot make the endpoint read a file anywhere else."""
    from .._common import paths
    from .hub import _hf_cache

    spec = parse(ModelRef(name))
    if spec.kind == "hf" and not any(part in ("", ".", "..") or part.startswith(".") for part in spec.value.split("/")):
        return
    if spec.kind == "name" and "/" not in spec.value and "\\" not in spec.value and not spec.value.startswith("."):
        return
    if spec.kind == "path":
        real = Path(spec.value).expanduser().resolve()
        roots = [d.resolve() for d in (*paths.models_dirs(), _hf_cache(None))]
        if real.suffix == ".gguf" and any(real.is_relative_to(root) for root in roots):
            return
    raise ModelNotFoundError(
        f"{name!r} is not a model this endpoint serves: give a name from its model list (/v1/models, /api/tags), "
        "a Hugging Face repo as 'org/repo[:QUANT]', or a path inside the models dirs or the Hugging Face cache")
