"""``GGUFRerankPostprocessor``: a LlamaIndex node postprocessor that reranks with a local reranker GGUF on its
``--rerank`` server."""

from __future__ import annotations

from llama_index.core.bridge.pydantic import ConfigDict
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ..client import RerankResult
from ..options import LlamaIndexExtras, RerankOptions


class GGUFRerankPostprocessor(BaseNodePostprocessor, RerankOptions, LlamaIndexExtras):
    """Rerank retrieved nodes by a reranker model's score of each against the query, keep the best ``top_n`` (the
    score in ``NodeWithScore.score``). Use it in ``node_postprocessors`` of a query engine.

    Example:
        .. code-block:: python

            from gguf_provider.llama_index import GGUFRerankPostprocessor

            reranker = GGUFRerankPostprocessor(model="gpustack/bge-reranker-v2-m3-GGUF:Q8_0", top_n=3)
            engine = index.as_query_engine(similarity_top_k=10, node_postprocessors=[reranker])
    """

    model_config = ConfigDict(defer_build=False)  # built at import (the option groups defer theirs)

    @classmethod
    def class_name(cls) -> str:
        return "GGUFRerankPostprocessor"

    # unasync: async source
    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        query = _query(query_bundle)
        return _scored(nodes, await self.arerank(query, _texts(nodes)))

    # unasync: generated from the async source above by scripts/gen_sync.py; do not edit
    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        query = _query(query_bundle)
        return _scored(nodes, self.rerank(query, _texts(nodes)))

    # unasync: end

def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError("GGUFRerankPostprocessor needs the query: postprocess_nodes(nodes, query_str=...) or a "
                         "query bundle")
    return query_bundle.query_str


def _texts(nodes: list[NodeWithScore]) -> list[str]:
    # the text the embedding saw (metadata the node lets the embedder see included), as LlamaIndex's rerankers do
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]


def _scored(nodes: list[NodeWithScore], ranked: list[RerankResult]) -> list[NodeWithScore]:
    """The ranked nodes, best first, each a new NodeWithScore with the reranker's score."""
    return [NodeWithScore(node=nodes[r.index].node, score=r.score) for r in ranked]
