"""The llama-server command line of one start, pure: the head (binary, model, alias, context, address) written here,
then each declared option's flags (:data:`.server_options.OPTIONS`, in command-line order)."""

from __future__ import annotations

import re
from pathlib import Path

from .._common.process import Address
from .._install.discovery import ServerCapabilities, command
from .server_options import (
    EMBED_UBATCH_MAX,
    IN_ARGV_ORDER,
    POOLING_NAMES,
    Build,
    ServerSpec,
    cache_type_args,
    check_cache_type,
    embedding_pooling,
    user_cache_ram,
    user_ubatch,
)

SAFETY_FLAGS = ("--jinja", "--no-webui", "--offline")  # passed when the build has them
# `/metrics` for `ps` (runtime/_serve/metrics.py), passed when the build has it. Like the flags above it is no part of a
# server's identity: a server started without it is still attached and shared; `ps` shows "–" for its live numbers.
METRICS_FLAG = "--metrics"
# `/slots`, which `ps` and the prompt cache read: on by default in newer builds, off (501) unless asked in older ones
SLOTS_FLAG = "--slots"


def api_name(model: Path) -> str:
    """The name a server gives its model in ``/v1/models`` and ``/props``: the file's stem, without a shard suffix."""
    return re.sub(r"-\d{5}-of-\d{5}$", "", model.name.removesuffix(".gguf"))


def build_argv(spec: ServerSpec, binary: Path, caps: ServerCapabilities, alias: str, n_ctx: int,
               address: Address, api_key_file: Path | None, *, header_pooling: int | None = None,
               placement: tuple[str, ...] = (), slot_save_path: Path | None = None,
               recurrent: bool = False, threads: int | None = None, cache_ram: int | None = None) -> list[str]:
    """The command line; ``cache_ram``: the host-RAM prompt cache in bytes (``--cache-ram`` in MiB; None: not
    passed, the build has no such cache or the user set it)."""
    # Two aliases: a build whose --alias takes several names (comma-separated help) answers /v1/models with the
    # first in sort order, the model's name (the marker sorts last); an older one keeps the last, the marker. The
    # marker on the command line is part of the proof that the process is ours (registry.py).
    argv = [*command(binary), "-m", str(spec.model), "--alias", api_name(spec.model), "--alias", alias, "-c",
            str(n_ctx)]
    argv += [flag for flag in (*SAFETY_FLAGS, METRICS_FLAG, SLOTS_FLAG) if caps.supports(flag)]
    if cache_ram is not None:
        argv += ["--cache-ram", str(cache_ram >> 20)]
    if address.socket:
        argv += ["--host", address.socket]
    else:
        assert address.url is not None
        port = address.url.rsplit(":", 1)[1]
        argv += ["--host", "127.0.0.1", "--port", port]
    if api_key_file is not None:
        argv += ["--api-key-file", str(api_key_file)]
    build = Build(caps=caps, n_ctx=n_ctx, header_pooling=header_pooling, placement=placement,
                  slot_save_path=slot_save_path, recurrent=recurrent, threads=threads)
    for option in IN_ARGV_ORDER:
        argv += option.flags_for(spec, build)
    return argv


__all__ = ["EMBED_UBATCH_MAX", "METRICS_FLAG", "POOLING_NAMES", "SAFETY_FLAGS", "build_argv", "cache_type_args",
           "check_cache_type", "embedding_pooling", "user_cache_ram", "user_ubatch"]
