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
different items are never cut. That rule reads the text with every run of digits made one ``#``: a loop that
crosses "9." → "10." stays one loop, and the reply ends after its first unit, never inside a number.
Legitimate exact repetition (a short JSON array of identical objects, a few identical code lines) stays far below
the span. The thresholds were set against the two corpora in tests/unit_tests/data/loops/ (loops captured from the
real test models, and repetitive but wanted outputs).

:class:`LoopGuard` watches one reply's events with a detector per channel (content, reasoning) and says how the
reply ends once either loops (:class:`~gguf_provider.events.LoopStopped`, then ``Finish("repetition")``).

Cost: per check (every ``CHECK_EVERY`` characters), one ``str.rfind`` and one slice comparison on each of the two
texts, all in C.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ._warn import warn
from .errors import LoopWarning
from .events import Event, Finish, LoopStopped, ReasoningDelta, TextDelta

log = logging.getLogger(__name__)

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
_RUN = re.compile(r"\d+")  # a run of digits: one "#" in the digit-blind text
KEEP = MAX_PERIOD * MIN_REPEATS + PROBE  # the text window the detector holds


@dataclass(frozen=True)
class Loop:
    """A detected cycle: ``period`` characters repeated; the reply should end at ``keep`` characters (the end of
    the first repetition of the unit)."""

    period: int
    repeats: int
    keep: int
    unit: str
    numbered: bool = False  # the units differ in their numbers

    def describe(self) -> str:
        shown = self.unit if len(self.unit) <= 60 else self.unit[:57] + "..."
        kind = " (equal but for its numbers)" if self.numbered else ""
        return f"a {self.period}-character unit{kind} repeated {self.repeats} times ({shown!r})"


class LoopDetector:
    """Feed it the reply's text as it streams; :meth:`feed` returns a :class:`Loop` once the tail is a cycle."""

    __slots__ = ("_digit", "_norm", "_offset", "_since", "_text")

    def __init__(self) -> None:
        self._text = ""  # the last KEEP characters (at most 2 × KEEP), never cut inside a run of digits
        self._norm = ""  # the same with every run of digits made one "#"
        self._offset = 0  # characters dropped from the front of _text
        self._since = 0  # characters since the last check
        self._digit = False  # _text ends with a digit (a run may go on in the next piece)

    def feed(self, piece: str) -> Loop | None:
        if not piece:
            return None
        norm = _RUN.sub("#", piece)
        if self._digit and piece[0].isdigit():
            norm = norm[1:]  # the run goes on: still the one "#"
        self._digit = piece[-1].isdigit()
        self._text += piece
        self._norm += norm
        self._since += len(piece)
        if len(self._text) > 2 * KEEP:
            self._trim()
        if self._since < CHECK_EVERY or len(self._text) < MIN_SPAN:
            return None
        self._since = 0
        return self._exact() or self._numbered()

    def _trim(self) -> None:
        text = self._text
        cut = len(text) - KEEP
        while cut > 0 and text[cut - 1].isdigit() and text[cut].isdigit():
            cut -= 1
        self._norm = self._norm[len(_RUN.sub("#", text[:cut])):]
        self._text, self._offset = text[cut:], self._offset + cut

    def _exact(self) -> Loop | None:
        text = self._text
        n = len(text)
        period = _period(text)
        if period is None:
            return None
        span = max(MIN_SPAN, MIN_REPEATS * period) if period >= SHORT_UNIT else SHORT_SPAN
        if span > n or text[n - span + period:] != text[n - span:n - period]:
            return None
        start = _start(text, period)
        keep = _end(text, start, period)
        return Loop(period, (n - start) // period, self._offset + keep, text[keep - period:keep])

    def _numbered(self) -> Loop | None:
        """Units equal but for their numbers; a unit with few letters is counting or figures (wanted)."""
        norm = self._norm
        n = len(norm)
        period = _period(norm)
        if period is None or sum(c.isalpha() for c in norm[n - period:]) < NUMBERED_LETTERS:
            return None
        span = max(NUMBERED_SPAN, NUMBERED_REPEATS * period)
        if span > n or norm[n - span + period:] != norm[n - span:n - period]:
            return None
        start = _start(norm, period)
        end = _end(norm, start, period)
        first, keep = self._raw(end - period), self._raw(end)
        return Loop(keep - first, (n - start) // period, self._offset + keep, self._text[first:keep], numbered=True)

    def _raw(self, k: int) -> int:
        """The index in _text of index ``k`` of _norm (both start at the same character)."""
        shrink = 0
        for m in _RUN.finditer(self._text):
            if m.start() - shrink >= k:
                break
            shrink += m.end() - m.start() - 1
        return k + shrink


class LoopGuard:
    """Watches the content and reasoning deltas of one reply."""

    __slots__ = ("content", "reasoning")

    def __init__(self) -> None:
        self.content = LoopDetector()
        self.reasoning = LoopDetector()

    def check(self, ev: Event) -> list[Event] | None:
        """None while the reply goes on; once it became a loop, the events that end it (and a :class:`LoopWarning`)."""
        if isinstance(ev, TextDelta):
            channel, loop = "content", self.content.feed(ev.text)
        elif isinstance(ev, ReasoningDelta):
            channel, loop = "reasoning", self.reasoning.feed(ev.text)
        else:
            return None
        if loop is None:
            return None
        log.info("loop guard: stopped a reply at a loop in its %s: %s", channel, loop.describe())
        warn(f"stopped a reply that became a loop: {loop.describe()} in its {channel}; the reply ends "
             f"after the first repetition (finish_reason 'repetition'). Pass loop_guard=False (per call "
             f"or on the model) to let it run", LoopWarning)
        return [LoopStopped(channel, loop.keep, loop.period), Finish("repetition")]


def _period(text: str) -> int | None:
    """The smallest period of the last ``2 × period + PROBE`` characters of ``text``, or None."""
    n = len(text)
    probe = text[n - PROBE:]
    hi = n - 1  # an earlier occurrence ends before the last character
    lo = max(0, n - PROBE - MAX_PERIOD)
    for _ in range(CANDIDATES):
        i = text.rfind(probe, lo, hi)
        if i < 0:
            return None
        period = n - PROBE - i
        local = min(n, 2 * period + PROBE)
        if text[n - local + period:] == text[n - local:n - period]:
            return period  # the smallest period of the tail: the unit (its multiples are no other answer)
        hi = i + PROBE - 1  # not the period of the tail: try an earlier occurrence
    return None


def _start(text: str, period: int) -> int:
    """Where the cycle of ``period`` at the tail of ``text`` begins; the reply keeps up to its first unit, whole."""
    start = len(text) - period
    while start > 0 and text[start - 1] == text[start - 1 + period]:
        start -= 1
    return start


def _end(text: str, start: int, period: int) -> int:
    """Where the reply ends: after the first unit of the cycle at ``start``, or, for a unit of lines, at the end of
    the line that unit ends in (the unit found may begin mid-line)."""
    keep = start + period
    if text[keep - 1] != "\n" and "\n" in text[start:keep]:
        line_end = text.find("\n", keep, start + 2 * period)
        if line_end >= 0:
            keep = line_end + 1
    return keep
