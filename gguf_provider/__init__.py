"""gguf-provider: local GGUF models as first-class citizens of LangChain, LlamaIndex and Jupyter.

Importing this package imports neither LangChain nor LlamaIndex: the adapters load on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    MediaFetchError,
    MediaURLRefusedError,
    MissingShardError,
    ModelDownloadError,
    ModelError,
    ModelNotFoundError,
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

if TYPE_CHECKING:
    from .langchain import ChatGGUF, GGUFEmbeddings
    from .llama_index import GGUF, GGUFEmbedding

_LAZY = {
    "ChatGGUF": ("gguf_provider.langchain", "langchain", "langchain_core"),
    "GGUFEmbeddings": ("gguf_provider.langchain", "langchain", "langchain_core"),
    "GGUF": ("gguf_provider.llama_index", "llama-index", "llama_index.core"),
    "GGUFEmbedding": ("gguf_provider.llama_index", "llama-index", "llama_index.core"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, extra, dep = _LAZY[name]
        import importlib
        import importlib.util

        if importlib.util.find_spec(dep) is None:
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
    "GGUF", "GGUFEmbedding", "GGUFEmbeddings",
    "GGUFFormatError", "GGUFProviderError", "InsufficientDiskError", "InsufficientMemoryError", "MediaFetchError",
    "MediaURLRefusedError", "MissingShardError",
    "ModelDownloadError", "ModelError", "ModelNotFoundError", "RPCWorkerLostError", "RPCWorkerUnreachableError",
    "ServerConnectionError", "ServerCrashedError", "ServerError",
    "ServerStartError", "ServerTimeoutError", "UnknownQuantError", "UnsupportedInputError",
    "__version__",
]
