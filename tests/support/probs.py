"""The next-token distribution a llama-server gives a prompt, and a comparison of two within rounding.

Two placements of the same model (CPU alone, RPC workers, a Vulkan device, a split) run different kernels or
sum in a different order, so their greedy texts may part at a near tie on one CPU and not on another. What they
must share is the distribution: the first generated token's top probabilities (llama-server's ``n_probs``, taken
before sampling), equal within ``TOL``. A wrong placement (a layer missing or computed on garbage) changes it by far
more.
"""

from __future__ import annotations

import math
from typing import Any

PROMPT = "The capital of France is"
TOP = 8
TOL = 0.02  # rounding moves these probabilities by under 1e-3 (CPU vs RPC measured: identical)


def next_token_probs(engine: Any, prompt: str = PROMPT, n: int = TOP) -> dict[int, float]:
    """Token id → probability of the ``n`` likeliest first tokens after ``prompt`` (raw completion, no template)."""
    out = engine.client.post_json("/completion", {"prompt": prompt, "n_predict": 1, "n_probs": n,
                                                  "temperature": 0, "cache_prompt": False})
    (first,) = out["completion_probabilities"]
    return {p["id"]: math.exp(p["logprob"]) for p in first["top_logprobs"]}


def assert_same_distribution(a: dict[int, float], b: dict[int, float], tol: float = TOL) -> None:
    """Each token listed on either side has the other side's probability within ``tol``; a token the other side
    does not list must be below the other side's smallest listed probability (plus ``tol``)."""
    assert max(a.values()) > 2 * tol, a  # a peaked distribution: the comparison says something
    for one, other in ((a, b), (b, a)):
        floor = min(other.values())
        for token, p in one.items():
            q = other.get(token)
            assert (abs(p - q) <= tol) if q is not None else (p <= floor + tol), (token, p, q, a, b)
