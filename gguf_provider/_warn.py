"""Warnings attributed to the user's line: the first frame outside gguf-provider and the frameworks that call it
(``warnings.warn(..., skip_file_prefixes=)`` does this from Python 3.12; we support 3.10)."""

from __future__ import annotations

import sys
import warnings
from types import FrameType

# Modules whose frames are never the user's: ours, and what runs our code on the user's behalf.
_NOT_THE_USER = ("gguf_provider", "pydantic", "langchain_core", "langchain", "llama_index", "asyncio", "concurrent",
                 "threading", "contextlib", "functools", "IPython", "ipykernel", "traitlets", "anyio", "runpy",
                 "importlib")


def _is_library(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _NOT_THE_USER)


def user_frame() -> FrameType | None:
    """The caller's first frame that is not library code (a notebook cell, a script), or None (a worker thread)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _is_library(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return frame


def _level() -> int:
    """How many frames above :func:`warn`'s caller the first one that is not library code is (1: the caller's
    caller); 2 when every frame is library code (a worker thread's)."""
    frame = sys._getframe(2)  # warn()'s caller
    level = 1
    while frame is not None:
        if not _is_library(frame.f_globals.get("__name__", "")):
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return 2


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` at the user's line."""
    warnings.warn(message, category, stacklevel=_level() + 1)
