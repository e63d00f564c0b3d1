"""The model options, declared once: :class:`ModelSource` (which model, and where it comes from).

Its own module, light to import (the engine's config is one): resolving a model is runtime/models' job, whose
:class:`~.models.ModelRef` adds how to resolve it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def _option(default: Any, doc: str | None, **more: str) -> Any:
    """A field of :class:`ModelSource`: ``doc`` is its description (docs/reference.md, the adapters' field and
    docstring); ``adapter`` the adapters' annotation where it differs, ``alias`` the adapters' other keyword;
    ``doc=None``: the field is a llama-server option, declared (described, given to the adapters) in
    :data:`.server_options.OPTIONS`."""
    return field(default=default, metadata={"doc": doc, **more})


@dataclass(frozen=True)
class ModelSource:
    """Which model, and where it comes from: the model options, declared once. :class:`~.models.ModelRef` adds how to
    resolve them, ``EngineConfig`` the server and engine options; the adapters' fields are written from these by
    scripts/gen_options.py (gguf_provider/_server_fields.py)."""

    model: str | os.PathLike[str] | None = _option(None, (
        "The model: a `.gguf` path, a name in the models dir (file stem, case-insensitive) or `org/repo[:QUANT]` "
        "on Hugging Face."), adapter="str | None")
    repo: str | None = _option(None, "A Hugging Face repo id (`org/name`), instead of `model`.")
    # A whole token of the file name, case-insensitive (Hub and models-dir names).
    quant: str | None = _option(None, (
        "The quant to pick (e.g. `Q4_K_M`); default or `auto`: the best that fits this machine (docs/runtime.md)."))
    filename: str | None = _option(None, "The exact `.gguf` file to pick from the repo.")
    revision: str | None = _option(None, "A Hub branch, tag or commit to pin (default `main`).")
    hf_token: str | bool | None = _option(None, (  # also used for the draft
        "Hugging Face token for private or gated repos (also accepted as `token`; default: huggingface_hub's own, "
        "e.g. `$HF_TOKEN`)."), adapter="SecretStr | None", alias="token")
    model_path: str | None = _option(None, "A local `.gguf` file, used as it is (no lookup).")
    vision: bool = _option(False, None)  # also find the mmproj projector beside the model or in its repo
    mmproj: str | None = _option(None, None)  # this projector file instead (implies vision)
    offline: bool | None = _option(None, (
        "Resolve Hub models from the local cache only, never the network (default: `$HF_HUB_OFFLINE`)."))
