"""Whether a request its client walked away from stopped generating on the server: llama-server's ``/slots`` and
``/metrics`` (our servers run with ``--metrics``).

The check needs no clock: a request asked for ``max_tokens`` tokens with ``ignore_eos`` either was cancelled, and
the server generated fewer, or it ran on to ``max_tokens``. The wait for the slot to go idle has no bound of its
own: the test's timeout is it (``speed_timeout`` for ``max_tokens``, so a slot that ran on is still caught by the
count, not by the timeout).
"""

from __future__ import annotations

import time

from gguf_provider.client import EngineClient
from gguf_provider.runtime._serve.metrics import PREFIX, parse_prometheus


def busy(client: EngineClient) -> int:
    """Slots processing a request now."""
    return sum(1 for s in client.get_json("/slots") if s.get("is_processing"))


def generated(client: EngineClient) -> int:
    """Tokens the server has generated since it started; a request's count is added when its slot is released,
    a cancelled request's too."""
    r = client.http.get("/metrics")
    r.raise_for_status()
    return int(parse_prometheus(r.text).get(PREFIX + "tokens_predicted_total", 0))


def wait_idle(client: EngineClient) -> None:
    while busy(client):
        time.sleep(0.02)


def assert_stopped_early(client: EngineClient, before: int, max_tokens: int) -> int:
    """Once no slot is busy: the tokens generated since ``generated()`` read ``before``, asserted to be fewer
    than the ``max_tokens`` of the one request made meanwhile (it did not run to its end)."""
    wait_idle(client)
    n = generated(client) - before
    print(f"generation stopped after {n} of {max_tokens} tokens")
    assert 0 < n < max_tokens, f"{n} tokens generated of {max_tokens}: the slot kept generating after the client left"
    return n
