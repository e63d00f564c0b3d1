"""Stopping a model load whose caller went away.

A load (install, download, server start) runs in a worker thread when an async caller awaits it
(``Engine.aload``); a thread cannot be interrupted, so the load asks a :class:`Cancel` at its checkpoints:
between its stages and at every progress report (each download chunk, each build line, each health poll while the
model loads). A cancelled load raises :class:`~gguf_provider.errors.LoadCancelled` there, and what it had started
is undone on the way out (a spawning server is stopped and unregistered by the manager's failure path).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from ...errors import LoadCancelled
from .progress import Progress

__all__ = ["Cancel", "in_thread"]
T = TypeVar("T")


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


async def in_thread(fn: Callable[[Cancel], T], *, abandon: Callable[[T], None] | None = None) -> T:
    """``fn(cancel)`` in a worker thread, the event loop never waiting on it. Cancelling the awaiting task sets
    ``cancel`` and waits for the thread to stop at its next checkpoint; a result it produced all the same goes to
    ``abandon`` (in a thread too) before the cancellation propagates."""
    cancel = Cancel()
    work = asyncio.ensure_future(asyncio.to_thread(fn, cancel))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        cancel.set()
        while not work.done():  # the thread notices within one checkpoint; wait for it, cancelled or not
            try:
                await asyncio.wait({work})
            except asyncio.CancelledError:
                continue
        if abandon is not None and not work.cancelled() and work.exception() is None:
            await asyncio.to_thread(abandon, work.result())
        raise
