"""Progress reports: the one callback shape that the build, model downloads and server start all call.

``progress(stage, done, total, detail)``:

============  ==========================================  ======================================  ==================
stage         done                                        total                                   detail
============  ==========================================  ======================================  ==================
"build"       build steps finished (percent with make)    steps in all (100 with make)            the build line
"download"    bytes downloaded so far by this call        bytes this call downloads in all        the file fetched
"loading"     milliseconds since the server was started   0 (unknown)                             ""
============  ==========================================  ======================================  ==================

A call may leave ``detail`` out, so a callback must give it a default. Stages come in this order: "build" (only
``install``), then "download" (only when files are missing from the cache), then "loading". ``install`` reports
"download" too, for llama.cpp's release archive (before any "build", which then only follows a fallback).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["STAGES", "Progress"]

STAGES = ("build", "download", "loading")


class Progress(Protocol):
    """A progress callback: ``progress(stage, done, total, detail="")`` (see the module docstring)."""

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None: ...
