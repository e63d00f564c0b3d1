"""LangChain content blocks → the OpenAI parts llama-server takes."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from gguf_provider.langchain._utils import to_openai


def _parts(*blocks: dict[str, object]) -> object:
    return to_openai([HumanMessage([{"type": "text", "text": "look"}, *blocks])], keep_reasoning=False)[0]["content"]


def test_image_blocks_of_every_style_become_image_url() -> None:
    want = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
    assert _parts({"type": "image", "base64": "QUJD", "mime_type": "image/png"})[1] == want  # type: ignore[index]
    assert _parts({"type": "image", "source": {"type": "base64", "media_type": "image/png",  # Anthropic
                                               "data": "QUJD"}})[1] == want  # type: ignore[index]
    assert _parts({"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}})[1] == want  # type: ignore[index]
    assert _parts({"type": "image", "url": "https://x/y.png"})[1] == {  # type: ignore[index]
        "type": "image_url", "image_url": {"url": "https://x/y.png"}}


def test_audio_blocks_become_input_audio() -> None:
    assert _parts({"type": "audio", "base64": "UklG", "mime_type": "audio/wav"})[1] == {  # type: ignore[index]
        "type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}
    assert _parts({"type": "audio", "base64": "SUQz", "mime_type": "audio/mpeg"})[1] == {  # type: ignore[index]
        "type": "input_audio", "input_audio": {"data": "SUQz", "format": "mp3"}}
    raw = {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}
    assert _parts(raw)[1] == raw  # type: ignore[index]


def test_text_only_blocks_collapse_to_a_string() -> None:
    msg = HumanMessage([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, "b"])
    assert to_openai([msg], keep_reasoning=False)[0]["content"] == "ab"
