"""The loop guard (gguf_provider/loops.py) against two corpora in tests/unit_tests/data/loops/: replies of the real
test models that fell into a cycle (``loops/``, all caught within a few hundred tokens of the cycle starting) and
replies that repeat on purpose (``wanted/``, never cut). Both recorded by scripts/capture_loops.py, plus written
cases for shapes the small models did not produce."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from gguf_provider import chat
from gguf_provider.events import Collector, Finish, LoopStopped, TextDelta
from gguf_provider.loops import (
    MIN_REPEATS,
    MIN_SPAN,
    NUMBERED_REPEATS,
    NUMBERED_SPAN,
    SHORT_SPAN,
    SHORT_UNIT,
    Loop,
    LoopDetector,
)

DATA = Path(__file__).parent / "data" / "loops"
LOOPS = sorted((DATA / "loops").glob("*.txt"))
WANTED = sorted((DATA / "wanted").glob("*.txt"))
TOKEN = re.compile(r"\s?\S{1,6}|\s{1,4}")  # about the size of a model's tokens


def _feed(text: str) -> tuple[LoopDetector, int, object]:
    """Feed ``text`` in token-sized pieces; the characters fed when the detector fired, and its loop."""
    det = LoopDetector()
    fed = 0
    for piece in TOKEN.findall(text):
        fed += len(piece)
        loop = det.feed(piece)
        if loop is not None:
            return det, fed, loop
    return det, fed, None


WRITTEN_WANTED = {
    "numbers": ", ".join(str(i) for i in range(1, 401)),
    "table": "| n | 7n |\n|---|---|\n" + "".join(f"| {i} | {7 * i} |\n" for i in range(1, 101)),
    "identical_json_12": json.dumps([{"status": "ok", "code": 200}] * 12, indent=2),
    "identical_json_line_20": json.dumps([{"id": 1}] * 20),
    "repeated_code_lines": "def f():\n" + "    print('x')\n" * 30 + "    return 1\n",
    "underline": "Title\n" + "=" * 120 + "\n\nText follows here.\n",
    "blank_lines": "a" + "\n" * 40 + "b",
    "numbered": "".join(f"{i}. {chr(97 + i % 26)}{chr(97 + i // 26)}-word, number {i} of the list\n"
                        for i in range(1, 120)),
    "checklist": "".join(f"| {i} | task {i} | pending |\n" for i in range(1, 150)),
    "identical_json_24": json.dumps([{"status": "ok", "code": 200}] * 24, indent=2),
}
WRITTEN_LOOPS = {
    "sentence": "Once upon a time there was a cat. " + "The cat was happy and the cat was sad. " * 60,
    "newlines": "Here is the answer:" + "\n" * 2000,
    "spaces": "{\"a\": " + " " * 2000,
    "json_object": '[{"name": "Tom", "age": 3}, ' + '{"name": "Tom", "age": 3}, ' * 80,
    "long_paragraph": "Intro. " + ("A long paragraph about the sea, the wind and the old lighthouse keeper who "
                                   "climbs the stairs every night to light the lamp for the ships. ") * 12,
}


def test_corpora_exist() -> None:
    assert len(LOOPS) >= 4 and len(WANTED) >= 4, "record them with scripts/capture_loops.py"


@pytest.mark.parametrize("path", LOOPS, ids=lambda p: p.stem)
def test_recorded_loops_are_caught_soon(path: Path) -> None:
    text = path.read_text()
    _, fed, loop = _feed(text)
    assert loop is not None, f"{path.name} was not caught"
    assert fed <= len(text)
    kept = text[:loop.keep]  # type: ignore[attr-defined]
    assert len(kept) < fed and kept, "the reply ends after the first repetition"
    assert not (kept[-1:].isdigit() and text[len(kept):][:1].isdigit()), "never inside a number"
    # Caught within a few hundred tokens (~4 characters each) past the span the rule needs.
    assert isinstance(loop, Loop)
    needed = max(MIN_SPAN, MIN_REPEATS * loop.period) if loop.period >= SHORT_UNIT else SHORT_SPAN
    needed = max(needed, NUMBERED_SPAN, NUMBERED_REPEATS * loop.period) if loop.numbered else needed
    assert fed - (loop.keep - loop.period) <= needed + 400, (fed, loop)


@pytest.mark.parametrize("path", WANTED, ids=lambda p: p.stem)
def test_recorded_wanted_repetition_is_never_cut(path: Path) -> None:
    _, _, loop = _feed(path.read_text())
    assert loop is None, f"{path.name} was cut: {loop}"


@pytest.mark.parametrize("name", sorted(WRITTEN_WANTED))
def test_written_wanted_repetition_is_never_cut(name: str) -> None:
    _, _, loop = _feed(WRITTEN_WANTED[name])
    assert loop is None, loop


@pytest.mark.parametrize("name", sorted(WRITTEN_LOOPS))
def test_written_loops_are_caught(name: str) -> None:
    text = WRITTEN_LOOPS[name]
    _, fed, loop = _feed(text)
    assert loop is not None
    assert fed < len(text)


def test_keep_ends_after_the_first_unit() -> None:
    unit = "The cat was happy and the cat was sad. "
    text = "Once upon a time there was a cat. " + unit * 60
    _, _, loop = _feed(text)
    assert loop is not None
    kept = text[:loop.keep]  # type: ignore[attr-defined]
    assert kept.count("happy") == 1 and kept.startswith("Once upon a time")
    assert loop.period == len(unit)  # type: ignore[attr-defined]
    assert str(loop.period) in loop.describe()  # type: ignore[attr-defined]


NUMBERED_LOOP = "".join(f"{i}. Fact {i}: the {w} is different.\n" for i, w in enumerate(["sun", "sea", "sky", "hill"], 1))
NUMBERED_LOOP += "".join(f"{i}. The moon is a terrestrial planet that is the only one other than Mercury.\n"
                         for i in range(5, 60))


_RNG = random.Random(0)
_WORDS = ["sun", "sea", "sky", "hill", "tide", "rock", "dust", "orbit", "crater", "light", "night", "cold"]
VARIED = "".join(f"Note {i}: {' '.join(_RNG.choices(_WORDS, k=5))}.\n" for i in range(700))  # ~20k characters


@pytest.mark.parametrize("prefix", ["", VARIED], ids=["alone", "after-20k-characters"])
@pytest.mark.parametrize("piece", ["tokens", "characters"])
def test_a_numbered_loop_across_9_to_10_keeps_its_first_line(prefix: str, piece: str) -> None:
    """SmolLM2's loop on CI began at "5." and crossed "9." → "10."; the reply keeps lines 1-5, whole, and a number
    split over two pieces ("1" + "0.") is one number."""
    text = prefix + NUMBERED_LOOP
    det = LoopDetector()
    loop = None
    for p in (TOKEN.findall(text) if piece == "tokens" else text):
        loop = det.feed(p)
        if loop is not None:
            break
    assert loop is not None and loop.numbered
    assert text[:loop.keep] == prefix + NUMBERED_LOOP.split("6.")[0]
    assert loop.unit.startswith("5. The moon") and loop.unit.endswith("Mercury.\n")


def test_collector_truncates_at_keep() -> None:
    col = Collector()
    for ev in (TextDelta("abcabcabc"), LoopStopped("content", 4, 3), Finish("repetition")):
        col.add(ev)
    done = col.done()
    assert (done.content, done.finish_reason) == ("abca", "repetition")


def test_cost_per_token_is_small() -> None:
    """Not a timed assert on the product: a guard against an accidental quadratic check (the bench measures)."""
    text = " ".join(f"word{i}" for i in range(20000))
    pieces = TOKEN.findall(text)
    det = LoopDetector()
    t0 = time.process_time()  # this process's CPU: not what other work on the machine takes
    for p in pieces:
        det.feed(p)
    per_token = (time.process_time() - t0) / len(pieces)
    assert per_token < 50e-6, per_token  # ~2.3 µs under 2 hogs and a build on 2 cores; 20x


def test_constrained_max_tokens_is_bounded_by_the_schema() -> None:
    small = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {}}}}}
    assert 256 < chat.constrained_max_tokens(small) < 400
    assert chat.constrained_max_tokens({"type": "json_object"}) == 1024
    huge = {"type": "json_schema", "json_schema": {"schema": {"description": "x" * 10000}}}
    assert chat.constrained_max_tokens(huge) == 4096
    req = chat.ChatRequest(messages=[], response_format=small)
    assert req.payload()["max_tokens"] == chat.constrained_max_tokens(small)
    given = chat.ChatRequest(messages=[], response_format=small, params={"max_tokens": 7})
    assert given.payload()["max_tokens"] == 7
    assert "max_tokens" not in chat.ChatRequest(messages=[]).payload()  # free text: context − prompt


@pytest.mark.parametrize(("params", "asked_again"), [
    ({}, True),  # the library's default bound ran out: the reply is asked once more
    ({"max_tokens": 50}, False),  # the caller's own max_tokens: the cut reply is the answer (parsers raise on it)
    ({"repeat_penalty": 1.15}, False),  # already the retry (or the caller's penalty): never a second retry
])
def test_a_structured_reply_cut_by_its_default_bound_is_asked_again(params: dict[str, Any], asked_again: bool) -> None:

    proc = chat.EventProcessor(chat.ChatRequest(messages=[], response_format={"type": "json_object"}, params=params))
    out = proc.feed(TextDelta('{"setup": "Why did the cat cross the road and then'))
    out += proc.feed(Finish("length"))
    assert (proc.looped == "length") is asked_again
    assert (out == []) is asked_again  # held back, or released whole with its finish reason
    if not asked_again:
        assert isinstance(out[-1], Finish) and out[-1].reason == "length"
