"""langchain-tests' standard unit suite for ChatGGUF.

None of these tests starts a server: construction, ``bind_tools``, ``with_structured_output`` and
``_get_ls_params`` are all lazy (the server starts on the first request or at ``load()``).
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_tests.unit_tests import ChatModelUnitTests

from gguf_provider.langchain import ChatGGUF

# A name, not a path: nothing in the unit suite resolves it.
MODEL = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"


class TestChatGGUFUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatGGUF

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": MODEL, "n_ctx": 4096}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        # One llama-server serves one model: a per-call ``model`` only labels traces (see _get_ls_params).
        return False


def test_unit_suite_starts_no_server() -> None:
    """The objects the unit suite builds never touch the runtime."""
    llm = ChatGGUF(model=MODEL, temperature=0, max_tokens=100, timeout=60, stop=[], max_retries=2, api_key="test")
    llm.bind_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                   tool_choice="any")
    llm.with_structured_output({"title": "x", "type": "object", "properties": {"a": {"type": "integer"}}})
    llm._get_ls_params(model="other")
    assert llm._engine is None or llm._engine._info is None
