"""A model reference: the model part of a config (:class:`ModelRef`), declared once, how it is parsed
(:func:`parse`), and what it resolves to (:class:`ResolvedModel`, :class:`Resolution`).

Parsing is pure: it says where to look (a path, a models-dir name, a Hugging Face repo) and for which quant; it
touches no file but to tell a path from a name. :mod:`.resolve` then looks there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ...errors import ModelNotFoundError
from .._common.model_source import ModelSource
from .._common.progress import Progress
from .files import QuantChooser, _is_gguf

_REPO_RE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant>[\w.+-]+))?$")
_HUB_PREFIXES = ("hf://", "https://huggingface.co/", "huggingface.co/", "hf.co/")


@dataclass(frozen=True)
class ModelRef(ModelSource):
    """Which model to load and how to get it: everything model resolution reads, and nothing else.

    ``model`` is a ``.gguf`` path, a models-dir name (``name`` or ``name:QUANT``) or a Hugging Face repo
    (``org/repo`` or ``org/repo:QUANT``); or ``repo=`` names the repo; ``model_path=``, when given, is used instead
    of both (and of ``quant``/``filename``/``revision``).
    """

    cache_dir: str | os.PathLike[str] | None = None  # None: the standard Hugging Face cache
    draft: str | None = None  # a draft model (speculative=), resolved like ``model`` with the same Hub settings
    progress: Progress | None = field(default=None, compare=False, hash=False)  # "download" reports
    # Picks among several quants when none is named (None: this machine's devices at the model's own context)
    choose: QuantChooser | None = field(default=None, compare=False, hash=False)

    @classmethod
    def of(cls, config: ModelSource, **more: Any) -> ModelRef:
        """The model options of ``config`` (an EngineConfig), and ``more`` (``draft``, ``progress``, ...)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(ModelSource)}, **more)

    @property
    def finds_mmproj(self) -> bool:
        """Whether the projector is looked for beside the model (``vision`` without an explicit ``mmproj``)."""
        return self.vision and not self.mmproj


@dataclass(frozen=True)
class ResolvedModel:
    """GGUF file(s) ready to hand to llama-server."""

    path: Path  # the file, or shard 1 of a split set
    shards: tuple[Path, ...]  # every file of the model, shard order (a single file: just ``path``)
    mmproj: Path | None  # the multimodal projector, when asked for with ``vision=True`` or ``mmproj=``
    size_bytes: int  # total size of ``shards`` (mmproj excluded)
    source: str  # "path" | "models-dir" | "hf"
    repo: str | None = None  # Hugging Face repo id (source "hf")
    quant: str | None = None  # quant label read from the file name, e.g. "Q4_K_M"
    # Why it came from the Hugging Face cache without asking the Hub (offline mode, the Hub unreachable); else None
    cached: str | None = field(default=None, compare=False)
    # The automatic quant choice's line when it picked this file among several (see _memory.choose); else None
    chosen: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Resolution:
    """A :class:`ModelRef` resolved: the model (with its projector) and the draft model, if one was named."""

    model: ResolvedModel
    draft: ResolvedModel | None = None


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


# --- parsing a spec --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A parsed reference: where to look, and the quant asked for."""

    kind: str  # "path" | "name" | "hf"
    value: str  # the path, the name, or the repo id
    quant: str | None


def parse(ref: ModelRef) -> Spec:
    """Parse ``ref``: ``model_path`` if given, else ``model`` / ``repo`` with ``quant`` (ModelNotFoundError for a
    missing, empty, conflicting or malformed spec)."""
    if ref.model_path:
        return _parse_spec(ref.model_path, None, None)
    return _parse_spec(ref.model, ref.repo, ref.quant)


def _parse_spec(spec: str | os.PathLike[str] | None, repo: str | None, quant: str | None) -> Spec:
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
        return Spec("hf", repo.strip("/"), _merge_quant(spec_quant, quant))
    if not isinstance(spec, str):
        return Spec("path", os.fspath(spec), quant)
    text = spec.strip()
    if not text:
        raise ModelNotFoundError("empty model spec")
    for prefix in _HUB_PREFIXES:
        if text.startswith(prefix):
            return _hub_spec(text[len(prefix):], quant, spec)
    if (text.startswith(("~", ".", "/", "\\")) or os.path.isabs(text) or Path(text).expanduser().exists()
            or (_is_gguf(text) and ("/" in text or os.sep in text))):
        return Spec("path", text, quant)
    if _REPO_RE.match(text):
        return _hub_spec(text, quant, spec)
    name, name_quant = text, None
    if ":" in text:
        name, name_quant = text.rsplit(":", 1)
    return Spec("name", name, _merge_quant(name_quant, quant))


def _hub_spec(text: str, quant: str | None, original: str) -> Spec:
    m = _REPO_RE.match(text.strip("/"))
    if not m:
        raise ModelNotFoundError(f"{original!r} is not a Hugging Face repo spec ('org/repo' or 'org/repo:QUANT')")
    return Spec("hf", m["repo"], _merge_quant(m["quant"], quant))


def _merge_quant(from_spec: str | None, keyword: str | None) -> str | None:
    if from_spec and keyword and from_spec.upper() != keyword.upper():
        raise ModelNotFoundError(f"conflicting quants: {from_spec!r} in the spec and quant={keyword!r}")
    return from_spec or keyword
