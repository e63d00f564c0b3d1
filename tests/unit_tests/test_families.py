"""The family table (gguf_provider/families.py): detection from template sources and what ``reasoning=`` sends.

The rows themselves are tested through a real llama-server in tests/integration_tests/test_families.py; here the
pieces that need no server: every row's template (llama.cpp's models/templates/, shipped in the pinned sdist that
the source build unpacks; the sdist is also what ``make setup-test`` builds from) is detected as its own family.
"""

from __future__ import annotations

import warnings

import pytest

from gguf_provider import families
from gguf_provider.chat import ChatRequest, _warned
from gguf_provider.errors import ReasoningWarning
from tests.support.templates import template_source

QWEN3, GPT_OSS = families.by_name("Qwen3"), families.by_name("gpt-oss")
LLAMA, MINISTRAL = families.by_name("Llama 3.1"), families.by_name("Ministral 3 Reasoning")


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.name)
def test_every_rows_template_is_detected_as_its_family(family: families.Family) -> None:
    assert families.detect(template_source(family.template)) == family


@pytest.mark.parametrize("template, name", sorted(families.TESTED_AS.items()))
def test_templates_tested_under_another_row(template: str, name: str) -> None:
    assert families.detect(template_source(template)) == families.by_name(name)


def test_an_unknown_template_is_no_family() -> None:
    assert families.detect("{{ messages }}") is None and families.detect(None) is None


def _body(reasoning: object = None, budget: int | None = None, family: families.Family | None = None) -> dict:
    return ChatRequest(messages=[], reasoning=reasoning, reasoning_budget=budget,  # type: ignore[arg-type]
                       max_time=None).payload(family)


def test_reasoning_on_a_family_with_a_switch() -> None:
    assert "reasoning_effort" not in _body(None, family=QWEN3) and "chat_template_kwargs" not in _body(family=QWEN3)
    assert _body(False, family=QWEN3)["reasoning_effort"] == "none"
    assert _body(True, family=QWEN3)["chat_template_kwargs"] == {"enable_thinking": True}
    low = _body("low", family=QWEN3)
    assert low["chat_template_kwargs"] == {"enable_thinking": True} and low["reasoning_budget_tokens"] == 1024
    assert "reasoning_budget_tokens" not in _body("high", family=QWEN3)
    assert _body("low", 64, family=QWEN3)["reasoning_budget_tokens"] == 64  # an explicit budget wins
    assert _body(False) == {"messages": [], "reasoning_effort": "none"}  # unknown family: the server's switch


def test_reasoning_on_gpt_oss_maps_to_effort_and_warns_once_for_off() -> None:
    _warned.clear()
    assert _body("high", family=GPT_OSS)["reasoning_effort"] == "high"
    assert "reasoning_effort" not in _body(True, family=GPT_OSS)
    with pytest.warns(ReasoningWarning, match="cannot switch thinking off"):
        assert _body(False, family=GPT_OSS)["reasoning_effort"] == "low"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _body(False, family=GPT_OSS)  # once


def test_reasoning_that_a_family_cannot_do_warns() -> None:
    _warned.clear()
    with pytest.warns(ReasoningWarning, match="always thinks"):
        assert "reasoning_effort" not in _body(False, family=MINISTRAL)
    with pytest.warns(ReasoningWarning, match="no thinking"):
        assert _body(True, family=LLAMA) == {"messages": []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _body(False, family=LLAMA) == {"messages": []}  # nothing to switch off: no warning
        assert "reasoning_budget_tokens" not in _body(None, 10, family=LLAMA)


def test_bad_reasoning_values_are_refused() -> None:
    with pytest.raises(ValueError, match="reasoning must be"):
        _body("max")
    with pytest.raises(ValueError, match="reasoning_budget"):
        _body(None, -5)


def test_mistral_templates_get_nine_character_ids_consistently() -> None:
    msgs = [{"role": "assistant", "content": "", "tool_calls": [{"id": "a" * 32, "type": "function",
                                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a" * 32, "content": "1"}]
    body = ChatRequest(messages=msgs).payload(families.by_name("Mistral Small 3.2"))
    new = body["messages"][0]["tool_calls"][0]["id"]
    assert len(new) == 9 and new.isalnum() and body["messages"][1]["tool_call_id"] == new
    assert msgs[0]["tool_calls"][0]["id"] == "a" * 32  # the caller's messages are left alone
    assert families.nine_char_id("abcDEF123") == "abcDEF123"
    assert ChatRequest(messages=msgs).payload(QWEN3)["messages"] == msgs


def test_a_family_without_tool_calls_gets_them_as_text_and_results_as_user_turns() -> None:
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "one"},
            {"role": "tool", "tool_call_id": "2", "content": "two"}]
    body = ChatRequest(messages=msgs, max_time=None).payload(families.by_name("Gemma 2/3"))
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == '{"name": "f", "arguments": {"x": 1}}\n{"name": "g", "arguments": {}}'
    assert body["messages"][2]["content"] == "f returned: one\ng returned: two"
    smol = ChatRequest(messages=msgs, max_time=None).payload(families.by_name("SmolLM3"))
    assert smol["messages"][1]["content"].startswith('<tool_call>\n{"name": "f"')
    assert [m["role"] for m in smol["messages"]] == ["user", "assistant", "tool", "tool"]  # its template maps them


def test_the_models_doc_is_generated_from_the_table() -> None:
    from scripts import gen_models

    assert gen_models.TARGET.read_text() == gen_models.render(), "docs/models.md: run python scripts/gen_models.py"
