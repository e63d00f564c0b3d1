"""How many rounds a scenario runs: the first ones, then more while its verdict is within noise."""

from __future__ import annotations

from collections.abc import Callable

from bench.config import MORE, Config
from bench.log import log
from bench.stats import Goal, undecided


def adaptive(cfg: Config, what: str, step: Callable[[int], None], values: Callable[[], list[float]],
             goal: Goal | None) -> int:
    """Run ``step(round)`` ``cfg.rounds`` times, then more while the goal's verdict is within noise (up to
    ``cfg.max_rounds``); the number of rounds run."""
    r = 0
    while True:
        step(r)
        r += 1
        if r < cfg.rounds or goal is None:
            if r >= cfg.rounds:
                return r
            continue
        if not undecided(values(), goal) or r >= cfg.max_rounds:
            return r
        if (r - cfg.rounds) % MORE == 0:
            log(f"{what}: within noise after {r} rounds: adding rounds")
