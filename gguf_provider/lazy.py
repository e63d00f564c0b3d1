"""Imports deferred to first use: attributes of a package that load their module on first access (so importing one
adapter builds only it), and a stand-in for a module used only once a server is talked to."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def module_getattr(package: str, modules: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from ``package.<modules[name]>``."""

    def __getattr__(name: str) -> Any:
        if name in modules:
            return getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class LazyModule:
    """A stand-in for module ``name``: the module is imported at the first attribute read. For httpx, which costs
    about a third of ``from gguf_provider import ChatGGUF`` (its CLI's click/rich/pygments, when installed) and is
    needed only once a server is asked something (bench P3). Type checkers see the real module (``TYPE_CHECKING``).
    Not ``importlib.util.LazyLoader``: that puts a lazy module in ``sys.modules`` for every other importer too."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)
