"""What a server is made from, before the model is resolved: :class:`ServerConfig` (the model options and the
llama-server options, as given), and :func:`resolve_spec`, which resolves it into a :class:`ServerSpec` (the model's
files found or downloaded, its projector and draft, the speculation mode)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .._common.model_source import ModelSource
from .._common.progress import Progress
from .._common.spec_fields import ResolvedOptions, SpecOptions
from . import speculative
from .server_options import OPTIONS, ServerSpec, spec_values


@dataclass(frozen=True, kw_only=True)
class ServerConfig(ModelSource, ResolvedOptions, SpecOptions):
    """The model options (``ModelSource``) and the llama-server options (``ResolvedOptions``, ``SpecOptions``,
    written from :data:`.server_options.OPTIONS` by scripts/gen_options.py), each checked at construction."""

    def __post_init__(self) -> None:
        # Wrong values fail here, at construction, not when the server starts: each server option's own check.
        for option in OPTIONS:
            if option.normalize is not None:
                object.__setattr__(self, option.name, option.normalize(getattr(self, option.name)))


def resolve_spec(cfg: ServerConfig, *, progress: Progress | None = None) -> ServerSpec:
    """The server spec of ``cfg``: the model resolved (found, or downloaded), with its projector when ``mmproj`` is
    given (checked to be a projector file) or ``vision`` asks for the one beside the model or in its repo.
    ``progress`` gets the download reports."""
    from .._memory import choose
    from .._models import (  # here: an engine's config is made without the model finder loaded
        ModelRef,
        resolve,
    )

    mode = speculative.OFF if cfg.embedding or cfg.rerank else speculative.normalize(cfg.speculative)
    # Several quants and none named: planned for this server as it would start (context, KV type, workers, the
    # drafted logits of a speculating server).
    slots = cfg.n_parallel or 4
    chooser = choose.chooser(n_ctx=cfg.n_ctx if cfg.n_ctx and cfg.n_ctx > 0 else None, cache_type=cfg.kv_cache_type,
                             n_outputs=slots * (1 + 64) if mode != speculative.OFF else slots, rpc=cfg.rpc_servers,
                             cpu_only=cfg.n_gpu_layers == 0)
    found = resolve(ModelRef.of(cfg, progress=progress, choose=chooser,
                                draft=mode if speculative.is_draft(mode) else None))
    resolved = found.model
    draft: Path | None = None
    draft_shards: tuple[Path, ...] = ()
    if found.draft is not None:
        draft, draft_shards = found.draft.path, found.draft.shards
        speculative.check_draft(resolved.path, draft)  # before anything starts
        mode = speculative.DRAFT
    # The declared options as the config has them, then the resolved ones (server_options.OPTIONS says which).
    return ServerSpec(model=resolved.path, shards=tuple(resolved.shards), mmproj=resolved.mmproj, speculative=mode,
                      draft_model=draft, draft_shards=draft_shards, **spec_values(cfg))
