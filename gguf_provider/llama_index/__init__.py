"""LlamaIndex adapters: :class:`GGUF` (a function-calling LLM) and :class:`GGUFEmbedding`."""

from .embeddings import GGUFEmbedding
from .llms import GGUF

__all__ = ["GGUF", "GGUFEmbedding"]
