"""The runaway-loop guard: notice when the tail of a reply has become one unit repeated over and over.

Small and quantized models fall into cycles (the same sentence again and again, endless newlines, the same JSON
object inside a grammar) and would then generate until the context is full. :class:`LoopDetector` is fed the text
as it streams and says when the last characters are a cycle:

- the tail of the text is periodic with some period ``p`` (1 ≤ p ≤ ``MAX_PERIOD`` characters): every character
  equals the one ``p`` before it;
- over at least ``MIN_SPAN`` characters and ``MIN_REPEATS`` units; a short unit (under ``SHORT_UNIT``
  characters: a word, a JSON object, whitespace) over at least ``SHORT_SPAN`` characters, so an array of a few
  dozen identical small objects that was asked for is not cut.

Repetition that differs only in its numbers ("36. The moon is a planet." / "37. The moon is a planet.", a loop
SmolLM2 falls into) counts too, but under a stricter rule: ``NUMBERED_SPAN`` characters, ``NUMBERED_REPEATS``
units, and a unit with at least ``NUMBERED_LETTERS`` letters, so counting, tables of figures and numbered lists of
different items are never cut. Legitimate exact repetition (a short JSON array of identical objects, a few
identical code lines) stays far below the span. The thresholds were set against the two corpora in tests/unit_tests/data/loops/ (loops captured
from the real test models, and repetitive but wanted outputs).

Cost: one ``str.rfind`` and one slice comparison per check, both in C, a check every ``CHECK_EVERY`` characters.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SPAN = 600  # characters the repetition must cover before it is called a loop
MIN_REPEATS = 4  # units in that span (so a long unit needs MIN_REPEATS × its length)
SHORT_UNIT = 64  # a unit shorter than this ...
SHORT_SPAN = 1200  # ... must cover this many characters
MAX_PERIOD = 1500  # the longest unit looked for
PROBE = 12  # characters of the tail whose earlier occurrences give the candidate periods
CANDIDATES = 6  # earlier occurrences tried per check
CHECK_EVERY = 16  # characters between two checks
NUMBERED_SPAN = 1200  # the same, for units that differ only in their digits
NUMBERED_REPEATS = 8
NUMBERED_LETTERS = 12
_DIGITS = str.maketrans("0123456789", "##########")
KEEP = MAX_PERIOD * MIN_REPEATS + PROBE  # the text window the detector holds


@dataclass(frozen=True)
class Loop:
    """A detected cycle: ``period`` characters repeated; the reply should end at ``keep`` characters (the end of
    the first repetition of the unit)."""

    period: int
    repeats: int
    keep: int
    unit: str

    def describe(self) -> str:
        shown = self.unit if len(self.unit) <= 60 else self.unit[:57] + "..."
        return f"a {self.period}-character unit repeated {self.repeats} times ({shown!r})"


class LoopDetector:
    """Feed it the reply's text as it streams; :meth:`feed` returns a :class:`Loop` once the tail is a cycle."""

    __slots__ = ("_norm", "_offset", "_since", "_text")

    def __init__(self) -> None:
        self._text = ""  # the last KEEP characters (at most 2 × KEEP)
        self._norm = ""  # the same with every digit made "#"
        self._offset = 0  # characters dropped from the front of _text
        self._since = 0  # characters since the last check

    def feed(self, piece: str) -> Loop | None:
        self._text += piece
        self._norm += piece.translate(_DIGITS)
        self._since += len(piece)
        if len(self._text) > 2 * KEEP:
            cut = len(self._text) - KEEP
            self._text, self._norm, self._offset = self._text[cut:], self._norm[cut:], self._offset + cut
        if self._since < CHECK_EVERY or len(self._text) < MIN_SPAN:
            return None
        self._since = 0
        return self._check()

    def _check(self) -> Loop | None:
        text, norm, n = self._text, self._norm, len(self._text)
        probe = norm[n - PROBE:]
        hi = n - 1  # an earlier occurrence ends before the last character
        lo = max(0, n - PROBE - MAX_PERIOD)
        for _ in range(CANDIDATES):
            i = norm.rfind(probe, lo, hi)
            if i < 0:
                return None
            period = n - PROBE - i
            local = min(n, 2 * period + PROBE)
            if norm[n - local + period:] != norm[n - local:n - period]:
                hi = i + PROBE - 1  # not the period of the tail: try an earlier occurrence
                continue
            # The smallest period of the tail: the unit. Its multiples are no other answer.
            span = max(MIN_SPAN, MIN_REPEATS * period) if period >= SHORT_UNIT else SHORT_SPAN
            if span > n or norm[n - span + period:] != norm[n - span:n - period]:
                return None
            if text[n - span + period:] == text[n - span:n - period]:
                return self._loop(text, period)
            # Equal but for digits: a unit with few letters is counting or figures (wanted); else the stricter rule.
            if sum(c.isalpha() for c in norm[n - period:]) < NUMBERED_LETTERS:
                return None
            numbered = max(NUMBERED_SPAN, NUMBERED_REPEATS * period)
            if numbered <= n and norm[n - numbered + period:] == norm[n - numbered:n - period]:
                return self._loop(norm, period)
            return None
        return None

    def _loop(self, text: str, period: int) -> Loop:
        """The loop of ``period`` at the tail of ``text`` (the reply, or its digit-blind twin): how far back it
        reaches, and where the reply should end."""
        n = len(text)
        start = n - period
        while start > 0 and text[start - 1] == text[start - 1 + period]:
            start -= 1
        # The cycle occupies text[start:]; keep its first unit, whole.
        repeats = (n - start) // period
        return Loop(period, repeats, self._offset + start + period, self._text[start:start + period])
