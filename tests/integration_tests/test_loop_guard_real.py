"""The loop guard on a real llama-server.

Two ways into a loop: SmolLM2-135M at temperature 0 on "List facts about the moon." (it fell into a numbered loop on
every CPU tried so far, but at a different line and with different text on each), and a grammar that only admits
one line over and over (its numbers are the model's choice), so that a loop happens whatever the CPU. Nothing here
depends on what the model writes: each test asserts what the guard promises about whatever text came —

- the call ends with ``finish_reason="repetition"`` and a :class:`LoopWarning` naming the repeated unit;
- the reply keeps the text up to the end of the first repetition of that unit: it ends with the unit the warning
  names, and that unit is not repeated before it (for a unit that differs only in its numbers, not even with the
  digits masked);
- it stopped in time: the streamed text runs at most ``_lag(period)`` characters past the kept text (the span the
  guard needs to call a loop a loop), and the stream ended at the first piece at which the guard's detector sees
  the loop.

With the defaults (no max_tokens: up to the whole context) the natural test shows that a user who sets nothing
gets a reply in seconds instead of minutes; if on some CPU the model does not loop at all, the reply must then end by
itself. Timeouts derive from the model's measured speed (tests/support/speed.py).
"""

from __future__ import annotations

import ast
import re
import warnings

import pytest
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF, loops
from gguf_provider.errors import LoopWarning
from gguf_provider.llama_index import GGUF
from scripts.test_models import ensure

PROMPT = "List facts about the moon."
# One line again and again; the model picks the numbers (the same each time: an exact loop; counting: a loop that
# differs only in its numbers). There is no way out of the grammar but the guard.
LOOP_GRAMMAR = 'root ::= line root\nline ::= [1-9] [0-9]? ". The moon is a terrestrial planet made of rock and metal.\\n"'
# The most a reply may generate per call: the guard's largest span plus the text before the loop; SmolLM2's
# reply to PROMPT loops within a few hundred tokens on the CPUs seen, 2048 leaves room for one that rambles first.
TOKENS_PER_CALL = 2048

pytestmark = pytest.mark.slow

_DESCRIBED = re.compile(r"a (\d+)-character unit( \(equal but for its numbers\))? repeated (\d+) times \((.*)\) in "
                        r"its content")


def _mask(text: str) -> str:
    return re.sub(r"\d+", "#", text)


def _lag(period: int) -> int:
    """The most characters the guard lets a loop run past the end of its first unit before it stops the reply."""
    span = max(loops.MIN_SPAN, loops.SHORT_SPAN, loops.NUMBERED_SPAN, loops.MIN_REPEATS * period,
               loops.NUMBERED_REPEATS * period)
    return span + 2 * period + loops.CHECK_EVERY


def _warned_unit(caught: list[warnings.WarningMessage]) -> tuple[int, bool, str]:
    """(period, numbered, unit as shown) from the one LoopWarning of the call."""
    found = [w for w in caught if issubclass(w.category, LoopWarning)]
    assert len(found) == 1, [str(w.message) for w in caught]
    m = _DESCRIBED.search(str(found[0].message))
    assert m, found[0].message
    return int(m[1]), bool(m[2]), ast.literal_eval(m[4])


def _assert_kept_first_unit(text: str, period: int, numbered: bool, shown: str) -> None:
    """``text`` ends with the unit the warning names, and that unit is not repeated before it."""
    assert len(text) >= period, (period, text)
    unit = text[-period:]
    assert (unit if len(unit) <= 60 else unit[:57] + "...") == shown, (shown, text[-300:])
    before = text[:-period]
    assert not before.endswith(unit), text[-3 * period:]
    if numbered:
        assert any(c.isdigit() for c in unit), unit
        assert not _mask(before).endswith(_mask(unit)), text[-3 * period:]


def _assert_stopped_in_time(pieces: list[str], kept: str, period: int) -> None:
    """The streamed pieces (the text as generated, past the kept end) stop at the first piece at which a fresh
    detector sees the loop, and that is at most ``_lag(period)`` characters past the kept text."""
    streamed = "".join(pieces)
    assert streamed.startswith(kept), (kept[-200:], streamed[:len(kept)][-200:])
    assert len(streamed) - len(kept) <= _lag(period), (len(streamed), len(kept), period)
    detector = loops.LoopDetector()
    hits = [i for i, piece in enumerate(pieces) if detector.feed(piece) is not None]
    assert hits and hits[0] == len(pieces) - 1, (hits, len(pieces))


def _check_invoke(llm: ChatGGUF, prompt: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reply = llm.invoke(prompt)
    if reply.response_metadata["finish_reason"] != "repetition":
        # The model did not loop on this CPU: then it ended by itself, and nothing was warned.
        assert reply.response_metadata["finish_reason"] == "stop", reply.response_metadata
        assert not [w for w in caught if issubclass(w.category, LoopWarning)]
        return
    period, numbered, shown = _warned_unit(caught)
    text = str(reply.content)
    _assert_kept_first_unit(text, period, numbered, shown)
    if reply.usage_metadata is not None:  # every generated token, the dropped ones too: one per byte at most
        assert reply.usage_metadata["output_tokens"] <= len(text.encode()) + _lag(period)


def _check_stream(llm: ChatGGUF, prompt: str) -> bool:
    """Whether the reply looped (and then: the guard's promises on the streamed text)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chunks = list(llm.stream(prompt))
    if chunks[-1].response_metadata.get("finish_reason") != "repetition":
        assert chunks[-1].response_metadata.get("finish_reason") == "stop", chunks[-1].response_metadata
        return False
    period, numbered, shown = _warned_unit(caught)
    pieces = [str(c.content) for c in chunks if c.content]
    streamed = "".join(pieces)
    # The kept text, by the same rule as the invoke above: up to the end of the first unit of the loop.
    kept = streamed
    detector = loops.LoopDetector()
    for piece in pieces:
        loop = detector.feed(piece)
        if loop is not None:
            kept = streamed[:loop.keep]
    _assert_kept_first_unit(kept, period, numbered, shown)
    _assert_stopped_in_time(pieces, kept, period)
    return True


@pytest.mark.speed_timeout("smollm2", tokens=2 * TOKENS_PER_CALL)
def test_a_looping_reply_ends_with_repetition() -> None:
    """The defaults (nothing set but temperature 0): the guard ends the model's own loop."""
    llm = ChatGGUF(model=str(ensure("smollm2")), temperature=0)
    try:
        _check_invoke(llm, PROMPT)
        _check_stream(llm, PROMPT)
    finally:
        llm.unload()


@pytest.mark.speed_timeout("smollm2", tokens=2 * TOKENS_PER_CALL)
def test_a_forced_loop_ends_with_repetition_whatever_the_model_writes() -> None:
    """A grammar with no way out but the guard: the loop happens on any CPU, so this always tests the guard."""
    llm = ChatGGUF(model=str(ensure("smollm2")), temperature=0, model_kwargs={"grammar": LOOP_GRAMMAR})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reply = llm.invoke(PROMPT)
        assert reply.response_metadata["finish_reason"] == "repetition"
        period, numbered, shown = _warned_unit(caught)
        _assert_kept_first_unit(str(reply.content), period, numbered, shown)
        assert _check_stream(llm, PROMPT)
    finally:
        llm.unload()


@pytest.mark.speed_timeout("smollm2", tokens=TOKENS_PER_CALL)
async def test_a_looping_reply_ends_with_repetition_async_llama_index() -> None:
    llm = GGUF(model=str(ensure("smollm2")), temperature=0, additional_kwargs={"grammar": LOOP_GRAMMAR})
    try:
        with pytest.warns(LoopWarning):
            reply = await llm.achat([ChatMessage(role="user", content=PROMPT)])
        assert reply.raw and reply.raw["finish_reason"] == "repetition"
        assert reply.message.content and reply.message.content.endswith("\n")
    finally:
        llm.unload()
