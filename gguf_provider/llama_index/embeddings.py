"""``GGUFEmbedding``: LlamaIndex embeddings from a local GGUF model on its own ``--embedding`` llama-server."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr, SecretStr

from .._adapter import env_api_key_secret
from ..engine import DEFAULT_TIMEOUT, Engine, EngineConfig


class GGUFEmbedding(BaseEmbedding):
    """Embed texts with a local GGUF model. LlamaIndex batches ``embed_batch_size`` texts per request.

    Example:
        .. code-block:: python

            from llama_index.core import Settings
            from gguf_provider.llama_index import GGUFEmbedding

            Settings.embed_model = GGUFEmbedding(model="SmolLM2-135M-Instruct")
    """

    model: str | None = Field(default=None, description="A .gguf path, a name in the models dir, or "
                                                        "'org/repo[:QUANT]' on Hugging Face.")
    repo: str | None = None
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None
    token: SecretStr | None = None
    model_path: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = Field(default_factory=env_api_key_secret, description="Key of an attached "
                                      "server (default $GGUF_PROVIDER_API_KEY).")
    pooling: str = "mean"
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    server_args: list[str] = Field(default_factory=list)
    keep_alive: float | None = None
    shared: bool = True
    llama_server: str | None = None
    timeout: float | None = DEFAULT_TIMEOUT
    query_instruction: str | None = Field(default=None, description="Prefix for queries (e.g. 'query: ').")
    text_instruction: str | None = Field(default=None, description="Prefix for documents (e.g. 'passage: ').")

    _engine: Engine | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        if not data.get("model_name"):
            spec = data.get("model") or data.get("repo") or data.get("model_path") or data.get("base_url")
            data["model_name"] = str(spec or "unknown")
        data.setdefault("embed_batch_size", 32)
        super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        return "GGUFEmbedding"

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_fields(self, embedding=True)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(self.engine_config())
        return self._engine

    def load(self) -> GGUFEmbedding:
        self.engine.load()
        return self

    def unload(self) -> None:
        if self._engine is not None:
            self._engine.unload()

    def _query(self, text: str) -> str:
        return f"{self.query_instruction}{text}" if self.query_instruction else text

    def _texts(self, texts: list[str]) -> list[str]:
        return [f"{self.text_instruction}{t}" for t in texts] if self.text_instruction else texts

    def _get_query_embedding(self, query: str) -> Embedding:
        return self.engine.embed([self._query(query)])[0]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self.engine.aembed([self._query(query)]))[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self.engine.embed(self._texts([text]))[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self.engine.aembed(self._texts([text])))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.engine.embed(self._texts(texts)) if texts else []

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await self.engine.aembed(self._texts(texts)) if texts else []
