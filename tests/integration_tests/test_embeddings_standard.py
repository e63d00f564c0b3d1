"""langchain-tests' standard integration suite for GGUFEmbeddings (sync and async), on a real ``--embedding``
server running a real embedder: all-MiniLM-L6-v2 converted by llama.cpp's converter (scripts/test_models.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests

from gguf_provider.langchain import GGUFEmbeddings
from scripts.test_models import ensure

pytestmark = pytest.mark.slow

PARAMS: dict[str, Any] = {}  # the defaults: pooling and context from the model's header


@pytest.fixture(scope="module", autouse=True)
def _shared_server() -> Iterator[GGUFEmbeddings]:
    emb = GGUFEmbeddings(model=str(ensure("minilm")), **PARAMS)
    emb.embed_query("warm up")
    yield emb
    emb.unload()


class TestGGUFEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[GGUFEmbeddings]:
        return GGUFEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"model": str(ensure("minilm")), **PARAMS}


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


async def test_embeddings_are_consistent(_shared_server: GGUFEmbeddings) -> None:
    emb = _shared_server
    texts = [f"sentence number {i}" for i in range(40)]  # more than one batch of 32
    docs = emb.embed_documents(texts)
    adocs = await emb.aembed_documents(texts)
    assert len(docs) == len(adocs) == 40
    assert len({len(v) for v in docs}) == 1 and len(docs[0]) == 384  # MiniLM-L6's embedding_length
    for a, b in zip(docs, adocs, strict=True):
        assert _cos(a, b) > 0.999
    assert _cos(emb.embed_query(texts[3]), docs[3]) > 0.999
    # (Which texts the model finds near each other is its quality, not this adapter's: not asserted.)
