"""JSON on the request path: orjson where it is installed (the gateway extra installs it), else the standard
library's, with the same result. Measured on Claude Code's 76 KB request (bench P21): parsing 0.21 -> 0.08 ms,
encoding 0.57 -> 0.02 ms (the standard library's as httpx encodes a ``json=`` body)."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - the gateway extra installs it
    orjson = None  # type: ignore[assignment]


def loads(data: bytes | str) -> Any:
    """``json.loads``; a ValueError for what is not JSON (orjson's JSONDecodeError is one)."""
    return orjson.loads(data) if orjson is not None else json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, as httpx encodes ``json=``. What orjson refuses (an int key, an int past 64 bits) goes
    through the standard library instead; NaN becomes null with orjson, a ValueError without."""
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
