"""How many rounds a scenario runs: the first ones, then more while its verdict is within noise, within the run's
schedule (``Config.until``); the scenarios the schedule cut short are listed in ``CUT`` for the report."""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.config import MORE, Config
from bench.log import log
from bench.stats import Goal, undecided

CUT: list[str] = []  # "what (n rounds)" of every scenario that stopped early for the schedule, in this process


def late(cfg: Config, what: str, rounds: int) -> bool:
    """Whether the run is past this scenario's point in the schedule (recorded in ``CUT`` once, with the rounds)."""
    if time.monotonic() < cfg.until:
        return False
    if not any(c.startswith(f"{what} (") for c in CUT):
        log(f"{what}: past its point in the run's schedule: no more rounds ({rounds} run)")
        CUT.append(f"{what} ({rounds} round{'s' if rounds != 1 else ''})")
    return True


def adaptive(cfg: Config, what: str, step: Callable[[int], None], values: Callable[[], list[float]],
             goal: Goal | None, least: int = 2) -> int:
    """Run ``step(round)`` ``cfg.rounds`` times, then more while the goal's verdict is within noise (up to
    ``cfg.max_rounds``); past ``cfg.until``, no more than ``least`` rounds. The number of rounds run."""
    r = 0
    while True:
        step(r)
        r += 1
        if r < least:
            continue
        if r < cfg.rounds:
            if late(cfg, what, r):
                return r
            continue
        if goal is None or not undecided(values(), goal) or r >= cfg.max_rounds or late(cfg, what, r):
            return r
        if (r - cfg.rounds) % MORE == 0:
            log(f"{what}: within noise after {r} rounds: adding rounds")
