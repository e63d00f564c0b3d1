"""Jupyter and IPython: the ``%gguf`` / ``%%gguf`` magics, registered by ``%load_ext gguf_provider``.

:mod:`.commands` parses and runs the commands; :mod:`.display` draws their results.
"""

from __future__ import annotations

from typing import Any

# Without the extra: an ImportError naming the pip install, not a bare ModuleNotFoundError.
try:
    import IPython  # noqa: F401
except ModuleNotFoundError as exc:
    raise ImportError(f"gguf_provider.jupyter needs IPython ({exc}): pip install 'gguf-provider[jupyter]'") from exc

from .commands import GGUFMagics, interpolate
from .display import GGUFReply, ModelSummary


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics on ``ipython``."""
    ipython.register_magics(GGUFMagics(ipython))


def unload_ipython_extension(ipython: Any) -> None:
    """Give back every model's lease (each server stops after its keep_alive)."""
    magics = ipython.magics_manager.registry.get("GGUFMagics")
    if magics is not None:
        for model in magics.models.values():
            model.engine.unload()


__all__ = ["GGUFMagics", "GGUFReply", "ModelSummary", "interpolate", "load_ipython_extension",
           "unload_ipython_extension"]
