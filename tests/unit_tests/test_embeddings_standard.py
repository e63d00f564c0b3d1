"""langchain-tests' standard unit suite for GGUFEmbeddings (no server is started)."""

from __future__ import annotations

from typing import Any

from langchain_tests.unit_tests import EmbeddingsUnitTests

from gguf_provider.langchain import GGUFEmbeddings


class TestGGUFEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[GGUFEmbeddings]:
        return GGUFEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"model": "SmolLM2-135M-Instruct", "n_ctx": 2048}
