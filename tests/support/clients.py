"""SDK clients a test makes for one test: closed when that test ends (their pooled connections would otherwise be
collected later, as a ResourceWarning in whichever test runs then). Async clients are closed by their test itself
(``async with``): their connections belong to its event loop."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_open: list[Any] = []


def closed_after_test(client: T) -> T:
    """``client`` (anything with ``close()``), to be closed when the current test ends."""
    _open.append(client)
    return client


def close_all() -> None:
    while _open:
        _open.pop().close()
