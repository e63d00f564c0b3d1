"""langchain-tests' standard integration suite for ChatGGUF, against a real llama-server.

The model is Qwen2.5-Coder-0.5B-Instruct (its template has tools). The suite builds a new ChatGGUF for nearly every
test; all of them have the same server spec, so they share one llama-server through the runtime's registry. A
module-scoped lease keeps that server up between tests (the session runs with GGUF_PROVIDER_KEEP_ALIVE=0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests

from gguf_provider.langchain import ChatGGUF
from scripts.test_models import ensure

pytestmark = pytest.mark.slow

N_CTX = 3072  # not 4096: other suites share 4096 servers; a distinct spec keeps this suite its own server


@pytest.fixture(scope="module", autouse=True)
def _shared_server() -> Iterator[ChatGGUF]:
    llm = ChatGGUF(model=str(ensure("qwen")), n_ctx=N_CTX).load()
    # The per-call model of the model-override tests, kept up between them the same way.
    other = ChatGGUF(model=str(ensure("smollm2")), n_ctx=N_CTX).load()
    # The model as a user configures it (automatic context) for TestChatGGUFModelAlone.
    alone = ChatGGUF(model=str(ensure("qwen"))).load()
    yield llm
    for held in (llm, other, alone):
        held.unload()


class TestChatGGUFIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatGGUF

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # temperature/max_tokens repeat the standard values for test_stop_sequence, which builds a model from these
        # params alone: with no max_tokens a rambling reply fills the KV cache that the server's slots share.
        # repeat_penalty: greedy decoding on the 0.5B model now and then loops ("It's like a superhero, but ...")
        # until max_tokens cuts a structured-output object short; a mild penalty breaks such loops.
        return {"model": str(ensure("qwen")), "n_ctx": N_CTX, "temperature": 0, "max_tokens": 100,
                "repeat_penalty": 1.1}

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
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supported_usage_metadata_details(self) -> dict[str, Any]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    @property
    def supports_model_override(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        # A name in the models dir (where the test models live): the call runs on a SmolLM2 server.
        return ensure("smollm2").stem

    @property
    def supports_image_inputs(self) -> bool:
        return True  # with vision=True and an mmproj; see the xfails below

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True

    @property
    def supports_audio_inputs(self) -> bool:
        return True  # input_audio parts, with an audio mmproj; see the xfails below

    @property
    def supports_image_urls(self) -> bool:
        return False

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> Any:
        """The same long prompt twice: the second request reads its prefix from the server's prompt cache."""
        llm = ChatGGUF(**{**self.chat_model_params, "max_tokens": 5})
        prompt = "Here is a list of fruits: " + ", ".join(["apple", "banana", "cherry", "plum"] * 40) + \
            ". Name the first one."
        llm.invoke(prompt)
        if stream:
            full: Any = None
            for chunk in llm.stream(prompt):
                full = chunk if full is None else full + chunk
            msg = full
        else:
            msg = llm.invoke(prompt)
        assert msg.usage_metadata["input_token_details"]["cache_read"] > 0
        return msg

    # Seen in about one run of ten: this test binds the tool with no tool_choice ("auto"), and whether the 0.5B
    # model calls get_weather or answers in prose is a near tie that flips with the server's batch composition
    # when other requests share it. Forced choices are enforced and always pass (test_tool_choice).
    @pytest.mark.xfail(reason="Qwen2.5-Coder-0.5B under tool_choice='auto' sometimes answers in prose instead of "
                              "calling the tool (a limit of the tiny model)", strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    # ChatGGUF passes image and audio blocks through as OpenAI image_url / input_audio parts (llama-server takes
    # them with an mmproj, ``vision=True``). These tests fetch their media from the internet and need a multimodal
    # GGUF: this machine is offline and the test models are text-only. test_chat_models.py covers Anthropic-style
    # histories without the image, tests/unit_tests the translation of the blocks.
    _NO_VISION = ("downloads its test image from the internet (offline machine) and needs a vision GGUF with an "
                  "mmproj (the test models are text-only)")

    @pytest.mark.xfail(reason="downloads its test audio from the internet (offline machine) and needs an audio GGUF "
                              "with an mmproj (the test models are text-only)", strict=True)
    def test_audio_inputs(self, model: BaseChatModel) -> None:
        super().test_audio_inputs(model)

    @pytest.mark.xfail(reason=_NO_VISION, strict=True)
    def test_image_inputs(self, model: BaseChatModel) -> None:
        super().test_image_inputs(model)

    @pytest.mark.xfail(reason=_NO_VISION, strict=True)
    def test_anthropic_inputs(self, model: BaseChatModel) -> None:
        super().test_anthropic_inputs(model)


@pytest.mark.timeout(90)
class TestChatGGUFModelAlone(TestChatGGUFIntegration):
    """The same suite with ChatGGUF built as users build it: the model and nothing else (no max_tokens, no
    sampling options, no n_ctx: the automatic context). What keeps every test well under 90 s is the library's
    defaults: the loop guard, the bounded max_tokens of structured output, the healing of repeated calls."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": str(ensure("qwen"))}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {}
