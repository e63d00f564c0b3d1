"""gguf-provider: local GGUF models as first-class citizens of LangChain, LlamaIndex and Jupyter.

Importing this package imports neither LangChain nor LlamaIndex: the adapters load on first access. It logs through
Python's ``logging`` (logger ``gguf_provider``), silent unless ``$GGUF_PROVIDER_LOG`` or the application says
otherwise (:mod:`gguf_provider.logs`, docs/logging.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import logs
from .errors import (
    APIError,
    BinaryNotFoundError,
    BuildError,
    ContextOverflowError,
    DeviceOutOfMemoryError,
    DraftModelMismatchError,
    GGUFFormatError,
    GGUFProviderError,
    InsufficientDiskError,
    InsufficientMemoryError,
    LoadCancelled,
    MediaFetchError,
    MediaURLRefusedError,
    MissingShardError,
    ModelDownloadError,
    ModelError,
    ModelNotFoundError,
    NotARerankerError,
    RPCWorkerLostError,
    RPCWorkerUnreachableError,
    ServerConnectionError,
    ServerCrashedError,
    ServerError,
    ServerStartError,
    ServerTimeoutError,
    UnknownQuantError,
    UnsupportedInputError,
)

__version__ = "0.1.0"

logging.getLogger(logs.LOGGER).addHandler(logging.NullHandler())  # silent by default, as libraries are
logs.from_env()  # $GGUF_PROVIDER_LOG=debug|info|warning|error: a stderr handler for scripts

if TYPE_CHECKING:
    from .langchain import ChatGGUF, GGUFEmbeddings, GGUFRerank
    from .llama_index import GGUF, GGUFEmbedding, GGUFRerankPostprocessor

_LAZY = {
    "ChatGGUF": ("gguf_provider.langchain", "langchain", "langchain_core"),
    "GGUFEmbeddings": ("gguf_provider.langchain", "langchain", "langchain_core"),
    "GGUFRerank": ("gguf_provider.langchain", "langchain", "langchain_core"),
    "GGUF": ("gguf_provider.llama_index", "llama-index", "llama_index.core"),
    "GGUFEmbedding": ("gguf_provider.llama_index", "llama-index", "llama_index.core"),
    "GGUFRerankPostprocessor": ("gguf_provider.llama_index", "llama-index", "llama_index.core"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, extra, dep = _LAZY[name]
        import importlib
        import importlib.util

        try:
            found = importlib.util.find_spec(dep) is not None
        except ModuleNotFoundError:  # a dotted name whose parent package is missing (llama_index.core)
            found = False
        if not found:
            raise ImportError(f"{name} needs {dep}: pip install 'gguf-provider[{extra}]'")
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'gguf_provider' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gguf_provider``: register the %gguf / %%gguf magics."""
    from .jupyter import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gguf_provider``: give back every model's lease (each server stops after its keep_alive)."""
    from .jupyter import unload_ipython_extension as _unload

    _unload(ipython)


__all__ = [
    "APIError", "BinaryNotFoundError", "BuildError", "ChatGGUF", "ContextOverflowError", "DeviceOutOfMemoryError",
    "DraftModelMismatchError",
    "GGUF", "GGUFEmbedding", "GGUFEmbeddings", "GGUFRerank", "GGUFRerankPostprocessor",
    "GGUFFormatError", "GGUFProviderError", "InsufficientDiskError", "InsufficientMemoryError", "LoadCancelled",
    "MediaFetchError",
    "MediaURLRefusedError", "MissingShardError",
    "ModelDownloadError", "ModelError", "ModelNotFoundError", "NotARerankerError", "RPCWorkerLostError", "RPCWorkerUnreachableError",
    "ServerConnectionError", "ServerCrashedError", "ServerError",
    "ServerStartError", "ServerTimeoutError", "UnknownQuantError", "UnsupportedInputError",
    "__version__",
]
