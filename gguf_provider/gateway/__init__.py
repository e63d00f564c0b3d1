"""``gguf-provider serve`` with no model: one endpoint for every tool on the machine, speaking OpenAI
(``/v1/chat/completions``, ``/v1/responses``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/rerank``,
``/v1/models``), Anthropic (``/v1/messages``, ``/v1/messages/count_tokens``) and Ollama (``/api/*``), routing each
request by its ``model`` through the same runtime the Python adapters use (:mod:`.pool`): a model is started on
first use, shared with every other process, given back when idle and evicted under the memory budget like any idle
server.

Each protocol is a module of translation (:mod:`.openai`, :mod:`.responses`, :mod:`.anthropic`, :mod:`.ollama`)
over the chat layer, so what the adapters guarantee holds here too: ``max_tokens`` capped at the context, an
over-long prompt refused in the protocol's error shape, the loop guard and ``max_time``, tool-call healing,
reasoning apart from the answer. :mod:`.app` is the Starlette app and its guard (Host, Origin, API key, body size);
:mod:`.lifeline` ties each request to its client (one that leaves cancels its work) and to the gateway's stop;
:mod:`.aliases` maps names clients ask for to local models; :mod:`.responses_store` keeps stored Responses API
responses; uvicorn serves it.
"""

from __future__ import annotations

from .aliases import Aliases
from .app import App, create_app, read_key_file, serve
from .state import DEFAULT_PORT, Settings

__all__ = ["DEFAULT_PORT", "Aliases", "App", "Settings", "create_app", "read_key_file", "serve"]
