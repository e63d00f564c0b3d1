"""How the engine fits a text to the embedding model's per-text limit: sent as it is, refused with a typed error
naming it, or (``truncate``) cut to its first tokens with the model's special tokens kept."""

from __future__ import annotations

import pytest

from gguf_provider.errors import ContextOverflowError
from gguf_provider.limits import fit_text, may_exceed
from gguf_provider.runtime._serve.server_options import user_ubatch

CLS, SEP = 101, 102


def test_short_texts_are_not_counted() -> None:
    assert not may_exceed("a" * 100, 512)
    assert may_exceed("a" * 600, 512)
    assert may_exceed("é" * 300, 512)  # 600 UTF-8 bytes: a byte-level tokenizer may need a token per byte


def test_a_text_that_fits_is_sent_as_text() -> None:
    assert fit_text(0, "hello", [CLS, 7, SEP], [7], 512, truncate=False) == "hello"


def test_a_long_text_is_a_typed_error_naming_it() -> None:
    tokens = [CLS, *range(1000, 1600), SEP]
    with pytest.raises(ContextOverflowError, match="text 3 .* 602 tokens .* at most 512") as info:
        fit_text(3, "a very long text", tokens, [], 512, truncate=False)
    assert (info.value.n_prompt_tokens, info.value.n_ctx) == (602, 512)
    assert "truncate=True" in str(info.value)


def test_truncation_keeps_the_special_tokens_around_the_first_tokens() -> None:
    body = list(range(1000, 1600))
    cut = fit_text(0, "long", [CLS, *body, SEP], body, 512, truncate=True)
    assert cut == [CLS, *body[:510], SEP]
    bos_only = fit_text(0, "long", [1, *body], body, 100, truncate=True)  # a BOS and no EOS
    assert bos_only == [1, *body[:99]]
    # When the two tokenizations do not line up, the first `limit` tokens
    assert fit_text(0, "long", [CLS, *body, SEP], [5, 6], 10, truncate=True) == [CLS, *body[:9]]


def test_the_physical_batch_flag_is_read_from_server_args() -> None:
    assert user_ubatch(("-ub", "256")) == 256
    assert user_ubatch(("--ubatch-size=128", "-c", "9")) == 128
    assert user_ubatch(("-c", "9")) is None
