"""The llama.cpp backend that fits this machine, and the binary in use, each said in one line (issue 36, point 1).

:mod:`.host` probes the machine and holds the rules (re-exported here: ``GPU``, ``Host``, ``probe_host``,
``Choice``, ``choose``, ``describe``); this module judges a binary against them. ``gguf-provider server install``
says :func:`describe`'s line, the first model start in a process says :func:`announce_once`'s, and ``server path``
/ ``server info`` say :func:`judge`'s ``why``. A CPU build on a machine with a GPU gets a
:class:`~gguf_provider.errors.BackendWarning` naming the reason and the fix, never silence.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..._warn import warn
from ...errors import BackendWarning
from .._common import host as _host
from .._common.host import (
    BACKEND_NAMES,
    GPU,
    Choice,
    Host,
    choose,
    describe,
    gpu_list,
    gpus_for,
    probe_host,
    usable,
)
from . import installed

__all__ = ["GPU", "Choice", "Host", "InUse", "announce_once", "choose", "current_host", "describe", "judge",
           "probe_host"]


def current_host() -> Host:
    """This machine, probed once per process (:func:`.host.current_host`)."""
    return _host.current_host()


@dataclass(frozen=True)
class InUse:
    build: str | None  # the binary's backend when it is one of our installs, else None
    choice: Choice  # what fits this machine
    why: str  # "vulkan build chosen: AMD GPU found"; "cpu build: no GPU found"
    line: str  # the one line for stderr
    warning: str | None  # set when the binary computes on the CPU of a machine with a GPU it could use


def judge(binary: Path, build: str | None, host: Host) -> InUse:
    """What ``binary`` (of backend ``build``, None when we did not install it) is on ``host``, and why."""
    choice = choose(host)
    name = BACKEND_NAMES.get(build or "", build or "")
    if build is None:
        why = "not installed by gguf-provider: its backends are the ones it was built with"
        return InUse(None, choice, why, f"llama-server: {binary} ({why})", None)
    if build == choice.backend:
        line = describe(choice, host)
        why = f"{build} build{' chosen' if build != 'cpu' else ''}: {choice.reason}"
        cpu_with_gpu = build == "cpu" and bool(host.gpus)
        return InUse(build, choice, why, line, line if cpu_with_gpu else None)
    fix = f"`gguf-provider server install` installs the {BACKEND_NAMES[choice.backend]} build"
    if not usable(host, build) or build == "cpu":
        # It computes on the CPU: a CPU build, or a GPU build for a GPU this machine does not have.
        unused = gpu_list(gpus_for(host, choice.backend))
        what = "a CPU build" if build == "cpu" else f"a {name} build and no GPU here runs it"
        why = f"{build} build: {what}" + (f", {unused} unused" if unused else "")
        line = f"llama-server: {name} — {what}" + (f"; {unused} unused" if unused else "")
        line += f" ({choice.reason}); {fix}"
        return InUse(build, choice, why, line, line if host.gpus else None)
    gpus = gpu_list(gpus_for(host, build))
    why = f"{build} build: the {choice.backend} build fits this machine better ({choice.reason}) but is not in use"
    line = f"llama-server: {name}" + (f" ({gpus})" if gpus else "") + f" — {choice.backend} fits better " \
        f"({choice.reason}); {fix}"
    return InUse(build, choice, why, line, None)


def in_use(binary: Path) -> InUse:
    """:func:`judge` for ``binary`` on this machine (its backend from our install markers)."""
    return judge(binary, installed.backend_of(binary), current_host())


def _say(line: str) -> None:
    print(f"gguf-provider: {line}", file=sys.stderr, flush=True)


log = logging.getLogger(__name__)
_ANNOUNCED: set[str] = set()
_LOCK = threading.Lock()


def announce_once(binary: Path, *, say: Callable[[str], None] | None = None) -> None:
    """Say which backend ``binary`` runs and why, in one line on stderr, once per process and binary (the
    manager calls it at a model's first start), with a :class:`~gguf_provider.errors.BackendWarning` when it is a
    CPU build on a machine with a GPU."""
    try:
        key = str(binary.resolve())
    except OSError:
        key = str(binary)
    with _LOCK:
        if key in _ANNOUNCED:
            return
        _ANNOUNCED.add(key)
    verdict = in_use(binary)
    log.info("%s (%s)", verdict.line, binary)
    (say or _say)(verdict.line)
    if verdict.warning:
        warn(verdict.warning, BackendWarning)
