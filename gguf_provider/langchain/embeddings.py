"""``GGUFEmbeddings``: LangChain embeddings from a llama-server started with ``--embedding``."""

from __future__ import annotations

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr

from .._adapter import env_api_key_secret
from ..engine import DEFAULT_TIMEOUT, Engine, EngineConfig


class GGUFEmbeddings(BaseModel, Embeddings):
    """Embed texts with a local GGUF model on its own ``--embedding`` server.

    Example:
        .. code-block:: python

            from gguf_provider import GGUFEmbeddings

            emb = GGUFEmbeddings(model="SmolLM2-135M-Instruct")
            vectors = emb.embed_documents(["hello", "world"])
    """

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    model: str | None = None
    repo: str | None = None
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None
    token: SecretStr | None = None
    """Hugging Face token."""
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
    batch_size: int = 32
    timeout: float = DEFAULT_TIMEOUT

    _engine: Engine | None = PrivateAttr(default=None)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(EngineConfig.from_fields(self, embedding=True))
        return self._engine

    def _batches(self, texts: list[str]) -> list[list[str]]:
        n = max(1, self.batch_size)
        return [texts[i:i + n] for i in range(0, len(texts), n)]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for batch in self._batches(texts):
            out += self.engine.embed(batch)
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for batch in self._batches(texts):
            out += await self.engine.aembed(batch)
        return out

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]

    def unload(self) -> None:
        if self._engine is not None:
            self._engine.unload()
