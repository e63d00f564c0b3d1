"""Context arithmetic: whether a request fits the context, the ``max_tokens`` it gets, and how a text to embed is fit
to the model's per-text limit.

Pure functions of token counts and payloads; the engine asks the server for the counts (``/apply-template``,
``/tokenize``) only when the cheap bounds here say a request might not fit.
"""

from __future__ import annotations

from typing import Any

from . import media
from .errors import ContextOverflowError


def may_exceed(text: str, limit: int) -> bool:
    # A token covers at least one UTF-8 byte (byte-level BPE, SentencePiece byte fallback, WordPiece [UNK]), plus a
    # few special tokens: a text under that bound fits without asking the server to count.
    return len(text.encode()) + 8 > limit


def fit_text(index: int, text: str, with_special: list[int], plain: list[int], limit: int,
             truncate: bool) -> str | list[int]:
    """The text as it is when it fits, else its first tokens (``truncate``) between the model's special tokens."""
    n = len(with_special)
    if n <= limit:
        return text
    if not truncate:
        raise ContextOverflowError(
            f"text {index} to embed is {n} tokens but the model takes at most {limit} per text "
            f"(starts {text[:40]!r}): split it (a text splitter with chunks under {limit} tokens) or pass "
            f"truncate=True to embed its first {limit} tokens", n_prompt_tokens=n, n_ctx=limit)
    head = next((k for k in range(min(n - len(plain), 8) + 1) if with_special[k:k + len(plain)] == plain), None)
    if not plain or head is None:
        return with_special[:limit]
    tail = with_special[head + len(plain):]
    return [*with_special[:head], *plain[:limit - head - len(tail)], *tail]


# The special tokens llama-server puts around a query+document pair that a reranker scores: [CLS] query [SEP]
# [SEP] document [SEP] at most (BERT/XLM-RoBERTa cross-encoders; server-common.cpp's format_prompt_rerank).
PAIR_SPECIAL_TOKENS = 4


def pair_may_exceed(query: str, document: str, limit: int) -> bool:
    """Whether a query+document pair might be more tokens than ``limit`` (the cheap bound of :func:`may_exceed`)."""
    return len(query.encode()) + len(document.encode()) + PAIR_SPECIAL_TOKENS > limit


def check_pair(index: int, document: str, n_query: int, n_document: int, limit: int) -> None:
    """A pair of ``n_query`` + ``n_document`` tokens (without special tokens) that does not fit the ``limit`` a
    reranker takes per pair raises :class:`ContextOverflowError` naming the document."""
    n = n_query + n_document + PAIR_SPECIAL_TOKENS
    if n <= limit:
        return
    room = limit - n_query - PAIR_SPECIAL_TOKENS
    hint = (f"split documents into chunks under {room} tokens" if room > 0 else
            "the query alone fills it: shorten the query")
    raise ContextOverflowError(
        f"document {index} to rerank is {n_document} tokens, {n} with the query, but the reranker takes at most "
        f"{limit} per query+document pair (starts {document[:40]!r}): {hint}", n_prompt_tokens=n, n_ctx=limit)


def template_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The part of a chat payload the server's ``/apply-template`` takes, images and audio left out."""
    keys = ("messages", "tools", "chat_template_kwargs", "tool_choice", "reasoning_effort")
    out = {k: payload[k] for k in keys if k in payload}
    if "messages" in out:
        out["messages"] = media.text_only(out["messages"])  # the server's marker for an image is no count of it
    return out


def fits(payload: dict[str, Any], n_ctx: int) -> bool:
    """An explicit ``max_tokens`` that surely fits beside the prompt (no ``max_tokens``: count, to set one)."""
    max_tokens = payload.get("max_tokens")
    return max_tokens is not None and char_bound(payload) + max_tokens < n_ctx


def char_bound(payload: dict[str, Any]) -> int:
    # Every token covers at least one character of the JSON we send, except template special tokens; an image or
    # audio part counts as a fixed allowance, never as the length of its base64 data.
    return media.size_bound(payload.get("messages", "")) + len(str(payload.get("tools", ""))) + 512


def apply_limits(payload: dict[str, Any], n_prompt: int, n_ctx: int) -> dict[str, Any]:
    """The payload with ``max_tokens`` set to the room the prompt leaves (a larger one capped there); a prompt that
    alone fills the context raises :class:`ContextOverflowError`."""
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {n_prompt} tokens but the context window is {n_ctx} tokens: shorten the input, trim "
            f"the history, or start the model with a larger n_ctx", n_prompt_tokens=n_prompt, n_ctx=n_ctx)
    room = n_ctx - n_prompt
    max_tokens = payload.get("max_tokens")
    if max_tokens is None or max_tokens > room:
        payload = {**payload, "max_tokens": room}
    return payload
