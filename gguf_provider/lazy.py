"""Attributes of a package that load their module on first access (so importing one adapter builds only it)."""

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
