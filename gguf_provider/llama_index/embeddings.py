"""``GGUFEmbedding``: LlamaIndex embeddings from a local GGUF model on its own ``--embedding`` llama-server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import ConfigDict, Field

from ..options import EmbeddingOptions, LlamaIndexExtras


class GGUFEmbedding(BaseEmbedding, EmbeddingOptions, LlamaIndexExtras):
    """Embed texts with a local GGUF model. LlamaIndex batches ``embed_batch_size`` texts per request.

    Example:
        .. code-block:: python

            from llama_index.core import Settings
            from gguf_provider.llama_index import GGUFEmbedding

            Settings.embed_model = GGUFEmbedding(model="SmolLM2-135M-Instruct")
    """

    model_config = ConfigDict(defer_build=False)  # built at import (the option groups defer theirs)

    query_instruction: str | None = Field(default=None, description="Prefix for queries (e.g. `query: `).")
    """Prefix for queries (e.g. `query: `)."""
    text_instruction: str | None = Field(default=None, description="Prefix for documents (e.g. `passage: `).")
    """Prefix for documents (e.g. `passage: `)."""

    if not TYPE_CHECKING:  # type checkers take the fields for the signature, not this **data (which takes anything)
        def __init__(self, **data: Any) -> None:
            if not data.get("model_name"):
                spec = data.get("model") or data.get("repo") or data.get("model_path") or data.get("base_url")
                data["model_name"] = str(spec or "unknown")
            data.setdefault("embed_batch_size", 32)
            super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        return "GGUFEmbedding"

    def _query(self, text: str) -> str:
        return f"{self.query_instruction}{text}" if self.query_instruction else text

    def _texts(self, texts: list[str]) -> list[str]:
        return [f"{self.text_instruction}{t}" for t in texts] if self.text_instruction else texts

    # unasync: async source
    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self.aembed([self._query(query)]))[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self.aembed(self._texts([text])))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await self.aembed(self._texts(texts))

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def _get_query_embedding(self, query: str) -> Embedding:
        return (self.embed([self._query(query)]))[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return (self.embed(self._texts([text])))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.embed(self._texts(texts))

    # unasync: end
