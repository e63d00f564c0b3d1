"""``GGUFEmbeddings``: LangChain embeddings from a llama-server started with ``--embedding``."""

from __future__ import annotations

from langchain_core.embeddings import Embeddings
from pydantic import ConfigDict, Field

from ..options import EmbeddingOptions, LangChainExtras


class GGUFEmbeddings(EmbeddingOptions, LangChainExtras, Embeddings):
    """Embed texts with a local GGUF model on its own ``--embedding`` server.

    Example:
        .. code-block:: python

            from gguf_provider import GGUFEmbeddings

            emb = GGUFEmbeddings(model="SmolLM2-135M-Instruct")
            vectors = emb.embed_documents(["hello", "world"])
    """

    model_config = ConfigDict(defer_build=False)  # built at import (the option groups defer theirs)

    batch_size: int = Field(default=32, description="Texts sent per request.")
    """Texts sent per request."""

    def _batches(self, texts: list[str]) -> list[list[str]]:
        n = max(1, self.batch_size)
        return [texts[i:i + n] for i in range(0, len(texts), n)]

    # unasync: async source
    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return [v for batch in self._batches(texts) for v in await self.aembed(batch)]

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed([text]))[0]

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [v for batch in self._batches(texts) for v in self.embed(batch)]

    def embed_query(self, text: str) -> list[float]:
        return (self.embed([text]))[0]

    # unasync: end
