"""LangChain adapters: :class:`ChatGGUF`, :class:`GGUFEmbeddings` and :class:`GGUFRerank` (a document compressor)."""

# Without the extra: an ImportError naming the pip install, not a bare ModuleNotFoundError.
try:
    import langchain_core  # noqa: F401
except ModuleNotFoundError as exc:
    raise ImportError(f"gguf_provider.langchain needs langchain-core ({exc}): "
                      "pip install 'gguf-provider[langchain]'") from exc

from .chat_models import ChatGGUF
from .embeddings import GGUFEmbeddings
from .rerank import GGUFRerank

__all__ = ["ChatGGUF", "GGUFEmbeddings", "GGUFRerank"]
