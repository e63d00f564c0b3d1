"""LangChain adapters: :class:`ChatGGUF` and :class:`GGUFEmbeddings`."""

from .chat_models import ChatGGUF
from .embeddings import GGUFEmbeddings

__all__ = ["ChatGGUF", "GGUFEmbeddings"]
