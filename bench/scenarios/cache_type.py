"""P9: the automatic context with a q8_0 KV cache ÷ with f16, under the same memory limit."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from bench.config import GOALS
from bench.log import log
from bench.stats import summary
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._serve import budget

P9_F16_CONTEXT = 4096


def auto_context(model: Path, cache_type: str, limit: str) -> int:
    """The context the fit gives ``model`` with KV cache ``cache_type`` under a memory limit of ``limit``."""
    # A private home: the limit is shared by every server of a home, and other work may hold servers in ours.
    env = {budget.LIMIT_ENV: limit, "GGUF_PROVIDER_LLAMA_SERVER": str(discovery.find_llama_server()),
           "GGUF_PROVIDER_HOME": tempfile.mkdtemp(prefix="bench-p9-")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    engine = Engine(EngineConfig(model_path=str(model), kv_cache_type=cache_type, speculative=False, keep_alive=0,
                                 shared=False))
    try:
        return int(engine.load().n_ctx)
    finally:
        engine.unload()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench_cache_type(model: Path) -> dict[str, Any]:
    """The fit is deterministic: one start per cache type under the same memory limit, the one that leaves f16
    ``P9_F16_CONTEXT`` tokens (the model's native context fits either type under a looser one)."""
    limit = f"{budget.charge(gguf.read_header(model), model.stat().st_size, P9_F16_CONTEXT) / 2**20:.0f}MiB"
    f16, q8 = auto_context(model, "f16", limit), auto_context(model, "q8_0", limit)
    log(f"P9: automatic context under {limit}: f16 {f16}, q8_0 {q8} tokens")
    return {"model": model.name, "limit": limit, "f16": f16, "q8_0": q8,
            "ratio": summary([q8 / f16], GOALS["p9"])}
