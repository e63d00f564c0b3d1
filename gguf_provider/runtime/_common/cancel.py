"""Stopping a model load whose caller went away.

A load (install, download, server start) runs in a worker thread when an async caller awaits it
(``Engine.aload``); a thread cannot be interrupted, so the load asks a :class:`Cancel` at its checkpoints:
between its stages and at every progress report (each download chunk, each build line, each health poll while the
model loads). A cancelled load raises :class:`~gguf_provider.errors.LoadCancelled` there, and what it had started
is undone on the way out (a spawning server is stopped and unregistered by the manager's failure path).
"""

from __future__ import annotations

import threading

from ...errors import LoadCancelled
from .progress import Progress

__all__ = ["Cancel"]


class Cancel:
    """A flag the caller sets and the load checks."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise :class:`LoadCancelled` once the caller has gone."""
        if self._event.is_set():
            raise LoadCancelled("the load was cancelled by its caller")

    def progress(self, inner: Progress | None) -> Progress:
        """A progress callback that checks first, then reports to ``inner`` (when given)."""

        def report(stage: str, done: int, total: int, detail: str = "") -> None:
            self.check()
            if inner is not None:
                inner(stage, done, total, detail)

        return report


def check(cancel: Cancel | None) -> None:
    if cancel is not None:
        cancel.check()
