"""Verdicts that hold: the median of paired per-round values, the band it rests on, and yes / no / within noise.

The band is the distribution-free ~95% confidence interval of the median (order statistics of the rounds: no
assumption about the noise's shape). A verdict is "yes" when the whole band meets the goal, "no" when none of it
does, and "within noise" when the band straddles the goal: the run could not tell, so it says so instead of
guessing. Rounds are added while any verdict straddles (up to a cap), so a close call gets more evidence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

CONFIDENCE = 0.95


def band_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) of the sorted values bounding the median's interval, or None if n is too small."""
    alpha = (1 - confidence) / 2
    k, cdf = -1, 0.0
    while True:  # the largest k with P(Binomial(n, 1/2) <= k) <= alpha
        p = math.comb(n, k + 1) / 2 ** n
        if cdf + p > alpha:
            break
        cdf += p
        k += 1
    if k < 0:
        return None
    return k, n - 1 - k


def band(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The median's confidence band; the full range when there are too few values for one."""
    s = sorted(values)
    ranks = band_ranks(len(s), confidence)
    if ranks is None:
        return s[0], s[-1]
    return s[ranks[0]], s[ranks[1]]


Verdict = Literal["yes", "no", "within noise"]


@dataclass(frozen=True)
class Goal:
    """``op`` is ">=" or "<="; ``value`` in the metric's unit."""

    op: Literal[">=", "<="]
    value: float

    def __str__(self) -> str:
        return f"{self.op} {self.value:.4g}"

    def verdict(self, lo: float, hi: float) -> Verdict:
        if self.op == ">=":
            return "yes" if lo >= self.value else "no" if hi < self.value else "within noise"
        return "yes" if hi <= self.value else "no" if lo > self.value else "within noise"


def summary(values: list[float], goal: Goal | None = None) -> dict[str, Any]:
    lo, hi = band(values)
    out: dict[str, Any] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "band": [lo, hi], "n": len(values), "values": values}
    if goal is not None:
        out["goal"] = str(goal)
        out["verdict"] = goal.verdict(lo, hi)
    return out


def undecided(values: list[float], goal: Goal) -> bool:
    return goal.verdict(*band(values)) == "within noise"
