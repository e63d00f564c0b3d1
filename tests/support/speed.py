"""Timeouts from the speed of the test models on this machine, measured once per test run.

A fixed timeout (60 s, 90 s) written on one machine fails on a slower or busier one, and a generous one hides a
hang for longer than needed. A test marked ``@pytest.mark.speed_timeout(model, tokens=N, starts=S)`` instead gets
a pytest-timeout bound of ``SLACK × (S × the model's measured start time + N / its measured tokens/s)`` (never
under ``FLOOR`` seconds): ``N`` is the most tokens the test can make the model generate, by the library's own
bounds (the loop guard's span, a structured reply's default ``max_tokens``, a retry), not by what one CPU's model
happens to write. The measurement (one server start and one 128-token reply at temperature 0 that ignores the
end-of-sequence token) runs just before the first test that needs it, with its own fixed bound
(``MEASURE_TIMEOUT``), and its figures are printed in the terminal summary.

A pytest plugin (tests/conftest.py's ``pytest_plugins``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

SLACK = 4.0  # room for a machine busier during the test than during the measurement
FLOOR = 30.0  # seconds: the least any marked test gets
MEASURE_TOKENS = 128
MEASURE_TIMEOUT = 300.0  # the measurement's own bound: a cold model on a busy 2-core machine takes ~10 s


@dataclass(frozen=True)
class Speed:
    model: str
    start_s: float  # from nothing to a server that answers (model load included)
    tokens_per_s: float  # generation, as llama-server times it

    def bound(self, tokens: int, starts: int = 1) -> float:
        return max(FLOOR, SLACK * (starts * self.start_s + tokens / self.tokens_per_s))


_measured: dict[str, Speed] = {}
_failed: dict[str, str] = {}  # model → why its measurement failed (not tried again)


def measure(model: str) -> Speed:
    """``model``: a name scripts/test_models.py knows ("smollm2", "qwen", ...). Cached for the run."""
    if model in _measured:
        return _measured[model]
    from gguf_provider.engine import Engine, EngineConfig
    from scripts.test_models import ensure

    engine = Engine(EngineConfig(model=str(ensure(model)), timeout=MEASURE_TIMEOUT, start_timeout=MEASURE_TIMEOUT,
                                 speculative=False))
    t0 = time.monotonic()
    try:
        engine.load()
        start_s = time.monotonic() - t0
        reply = engine.chat({"messages": [{"role": "user", "content": "Count upwards from one."}],
                             "max_tokens": MEASURE_TOKENS, "temperature": 0, "ignore_eos": True},
                            loop_guard=False)
    finally:
        engine.unload()
    tps = float(reply.timings.get("predicted_per_second") or 0.0)
    assert tps > 0, f"no generation speed in the timings of {model}: {reply.timings}"
    _measured[model] = Speed(model, start_s, tps)
    return _measured[model]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "speed_timeout(model, tokens, starts=1): a timeout from the model's "
                                       "measured speed on this machine (tests/support/speed.py)")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Before pytest-timeout reads the item's ``timeout`` marker: turn ``speed_timeout`` into one (prepended, so it
    is the closest)."""
    mark = item.get_closest_marker("speed_timeout")
    if mark is not None and item.get_closest_marker("skip") is None:
        model = mark.args[0]
        bound = MEASURE_TIMEOUT
        if model not in _failed:
            try:
                bound = measure(model).bound(**mark.kwargs)
            except Exception as exc:  # the test itself then meets (and reports) the same failure
                _failed[model] = f"{type(exc).__name__}: {exc}"
        item.add_marker(pytest.mark.timeout(round(bound)), append=False)
    yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for s in _measured.values():
        terminalreporter.write_line(f"measured speed of {s.model}: start {s.start_s:.1f} s, "
                                    f"{s.tokens_per_s:.0f} tokens/s (timeouts of speed_timeout tests derive from it)")
    for model, why in _failed.items():
        terminalreporter.write_line(f"speed measurement of {model} failed ({MEASURE_TIMEOUT:.0f} s bounds used): {why}")
