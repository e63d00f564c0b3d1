"""``GGUFRerank``: a LangChain document compressor that reranks with a local reranker GGUF on its ``--rerank`` server."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict

from ..client import RerankResult
from ..options import LangChainExtras, RerankOptions


class GGUFRerank(RerankOptions, LangChainExtras, BaseDocumentCompressor):
    """Rerank retrieved documents by a reranker model's score of each against the query, keep the best ``top_n``
    (each with its score in ``metadata["relevance_score"]``). Use it in a ``ContextualCompressionRetriever``.

    Example:
        .. code-block:: python

            from langchain_classic.retrievers import ContextualCompressionRetriever
            from gguf_provider.langchain import GGUFRerank

            reranker = GGUFRerank(model="gpustack/bge-reranker-v2-m3-GGUF:Q8_0", top_n=3)
            retriever = ContextualCompressionRetriever(base_compressor=reranker, base_retriever=retriever)
    """

    model_config = ConfigDict(defer_build=False)  # built at import (the option groups defer theirs)

    # unasync: async source
    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        docs = list(documents)
        return _scored(docs, await self.arerank(query, [d.page_content for d in docs]))

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        docs = list(documents)
        return _scored(docs, self.rerank(query, [d.page_content for d in docs]))

    # unasync: end

def _scored(docs: list[Document], ranked: list[RerankResult]) -> list[Document]:
    """The ranked documents, best first, each a copy with its score in its metadata (the input is left as it was)."""
    return [docs[r.index].model_copy(update={"metadata": {**docs[r.index].metadata, "relevance_score": r.score}})
            for r in ranked]
