"""The few calls that differ between an async I/O path and its sync copy (scripts/gen_sync.py writes the sync
code from the async source, renaming each name on the left to the one on the right).

- ``off_loop(fn, *args)`` -> ``in_caller``: blocking work (file I/O, DNS, a failure's diagnosis) in a worker thread
  for a coroutine, in the caller's thread for sync code;
- ``gather(awaitables)`` -> ``collect``: several requests at once for a coroutine, one after another for sync code;
- ``running_loop()`` -> ``no_loop``: the event loop a coroutine runs on, None for sync code;
- ``AsyncCall[T]`` -> ``SyncCall[T]``: a call to retry, returning an awaitable or the value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
AsyncCall = Callable[[], Awaitable[T]]
SyncCall = Callable[[], T]


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.to_thread(fn, *args, **kwargs)


def in_caller(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return fn(*args, **kwargs)


async def gather(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    return list(await asyncio.gather(*awaitables))


def collect(values: Iterable[T]) -> list[T]:
    return list(values)


def running_loop() -> asyncio.AbstractEventLoop | None:
    return asyncio.get_running_loop()


def no_loop() -> asyncio.AbstractEventLoop | None:
    return None
