"""LangChain adapters: :class:`ChatGGUF`, :class:`GGUFEmbeddings` and :class:`GGUFRerank` (a document compressor)."""

# Without the extra: an ImportError naming the pip install, not a bare ModuleNotFoundError.
try:
    import langchain_core  # noqa: F401
except ModuleNotFoundError as exc:
    raise ImportError(f"gguf_provider.langchain needs langchain-core ({exc}): "
                      "pip install 'gguf-provider[langchain]'") from exc

from typing import TYPE_CHECKING

from ..lazy import module_getattr

if TYPE_CHECKING:
    from .chat_models import ChatGGUF
    from .embeddings import GGUFEmbeddings
    from .rerank import GGUFRerank

# Each adapter loads on first access: ``from gguf_provider import ChatGGUF`` does not build the other two.
_MODULES = {"ChatGGUF": "chat_models", "GGUFEmbeddings": "embeddings", "GGUFRerank": "rerank"}


__getattr__ = module_getattr(__name__, _MODULES)

__all__ = ["ChatGGUF", "GGUFEmbeddings", "GGUFRerank"]
