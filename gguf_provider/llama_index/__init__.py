"""LlamaIndex adapters: :class:`GGUF` (a function-calling LLM), :class:`GGUFEmbedding` and
:class:`GGUFRerankPostprocessor` (a node postprocessor)."""

# Without the extra: an ImportError naming the pip install, not a bare ModuleNotFoundError.
try:
    import llama_index.core  # noqa: F401
except ModuleNotFoundError as exc:
    raise ImportError(f"gguf_provider.llama_index needs llama-index-core ({exc}): "
                      "pip install 'gguf-provider[llama-index]'") from exc

from typing import TYPE_CHECKING

from ..lazy import module_getattr

if TYPE_CHECKING:
    from .embeddings import GGUFEmbedding
    from .llms import GGUF
    from .postprocessor import GGUFRerankPostprocessor

# Each adapter loads on first access: ``from gguf_provider import GGUF`` does not build the other two.
_MODULES = {"GGUF": "llms", "GGUFEmbedding": "embeddings", "GGUFRerankPostprocessor": "postprocessor"}


__getattr__ = module_getattr(__name__, _MODULES)

__all__ = ["GGUF", "GGUFEmbedding", "GGUFRerankPostprocessor"]
