"""The runtime: llama-server found or installed, models resolved, the context fitted to memory, servers started,
shared between processes and stopped. It imports no framework.

This module is its front door: :class:`Runtime` (``default()`` is the process's) and the types its methods take
and return. Everything behind it is private, one folder per job: ``_common`` (paths, processes, progress and
cancellation, the GGUF reader), ``_models`` (finding and downloading models), ``_install`` (finding and installing
llama-server), ``_memory`` (fit, devices, the placement plan) and ``_serve`` (the option table, the registry, the
budget, the manager). The names load on first use: importing this module loads none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._common.cancel import Cancel
    from ._common.model_source import ModelSource
    from ._common.process import Address, dies_with_parent
    from ._common.progress import Progress
    from ._front import Devices, ModelPlan, Runtime, Stopped, default
    from ._install.backend import InUse
    from ._install.discovery import ServerCapabilities
    from ._models import LocalModel, ModelRef, Resolution, ResolvedModel
    from ._serve.config import ServerConfig
    from ._serve.health import DEFAULT_START_TIMEOUT
    from ._serve.manager import Lease, ServerInfo
    from ._serve.server_options import OPTIONS, ServerOption, ServerSpec
    from ._serve.status import BudgetStatus, GatewayStatus, ServerStatus, Status

_HOMES = {
    "Runtime": "_front", "default": "_front", "Devices": "_front", "ModelPlan": "_front", "Stopped": "_front",
    "Lease": "_serve.manager", "ServerInfo": "_serve.manager",
    "ServerSpec": "_serve.server_options", "ServerConfig": "_serve.config", "ServerOption": "_serve.server_options", "OPTIONS": "_serve.server_options",
    "Status": "_serve.status", "ServerStatus": "_serve.status", "BudgetStatus": "_serve.status",
    "GatewayStatus": "_serve.status",
    "DEFAULT_START_TIMEOUT": "_serve.health", "Address": "_common.process", "dies_with_parent": "_common.process", "InUse": "_install.backend",
    "ServerCapabilities": "_install.discovery",
    "ModelRef": "_models", "ModelSource": "_common.model_source", "Resolution": "_models", "ResolvedModel": "_models",
    "LocalModel": "_models", "Cancel": "_common.cancel", "Progress": "_common.progress",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Address", "BudgetStatus", "Cancel", "default", "DEFAULT_START_TIMEOUT", "dies_with_parent", "Devices", "GatewayStatus", "InUse", "Lease", "LocalModel", "ModelPlan",
    "ModelRef", "ModelSource", "OPTIONS", "Progress", "Resolution", "ResolvedModel", "Runtime", "ServerCapabilities", "ServerConfig", "ServerInfo",
    "ServerOption", "ServerSpec", "ServerStatus", "Status", "Stopped",
]
