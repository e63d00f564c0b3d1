"""gguf-provider's log: Python's :mod:`logging`, under the logger ``gguf_provider`` and its children (each module
logs to ``logging.getLogger(__name__)``).

Silent by default, as a library should be: the package adds only a ``NullHandler``. ``$GGUF_PROVIDER_LOG``
(``debug``, ``info``, ``warning``, ``error``; ``off`` or unset: nothing) is read when ``gguf_provider`` is imported
and turns on one stderr handler; the CLI's ``-v``/``-vv`` and ``%gguf log LEVEL`` call :func:`enable`. An
application that configures logging itself needs none of this: the records propagate to its handlers.

What is logged: the install's choice (backend, archive or source build), which model file a spec resolved to, every
server start, attach, eviction and stop with the server's log file, retries, loop-guard and budget decisions. Never
an API key or a key file's contents.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import TextIO

LOGGER = "gguf_provider"
ENV = "GGUF_PROVIDER_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
OFF = ("", "off", "0", "none")
FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at each record (a notebook kernel replaces it)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def parse_level(value: str | int | None) -> int | None:
    """A level name (``debug``, ``info``, ``warning``, ``error``, any case) or number; None for off; ValueError."""
    if value is None or isinstance(value, int):
        return value
    name = value.strip().lower()
    if name in OFF:
        return None
    if name not in LEVELS:
        raise ValueError(f"log level {value!r}: use one of {', '.join(LEVELS)} or off")
    return LEVELS[name]


def handler() -> logging.Handler | None:
    """The stderr handler :func:`enable` installed, if any."""
    return next((h for h in logging.getLogger(LOGGER).handlers if isinstance(h, _Stderr)), None)


def enable(level: str | int | None = "info") -> logging.Handler | None:
    """Log ``gguf_provider`` records of ``level`` and above to stderr (one handler, replaced by a second call);
    ``None``/``"off"`` removes it. Returns the handler."""
    logger = logging.getLogger(LOGGER)
    number = parse_level(level)
    old = handler()
    if old is not None:
        logger.removeHandler(old)
    if number is None:
        logger.setLevel(logging.NOTSET)
        return None
    new = _Stderr()
    new.setFormatter(logging.Formatter(FORMAT))
    new.setLevel(number)
    logger.addHandler(new)
    logger.setLevel(number)
    return new


def from_env() -> logging.Handler | None:
    """Apply ``$GGUF_PROVIDER_LOG`` (at import, and again when the magics load): a bad value is a warning, not an
    error, so that an import never fails for it."""
    value = os.environ.get(ENV)
    if value is None:
        return handler()
    try:
        return enable(value)
    except ValueError as exc:
        warnings.warn(f"${ENV}: {exc}", stacklevel=2)
        return None


def verbosity(count: int) -> str | None:
    """The CLI's ``-v`` count as a level: 1 info, 2 or more debug, 0 none (``$GGUF_PROVIDER_LOG`` stands)."""
    return None if count <= 0 else "info" if count == 1 else "debug"
