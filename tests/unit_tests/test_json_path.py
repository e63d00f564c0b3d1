"""gguf_provider._json: orjson where installed, the standard library otherwise, one result."""

from __future__ import annotations

import json

import pytest

from gguf_provider import _json


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
def test_both_ways_give_what_the_standard_library_gives(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fast:
        monkeypatch.setattr(_json, "orjson", None)
    elif _json.orjson is None:
        pytest.fail("orjson is not installed: the gateway extra installs it")
    value = {"messages": [{"role": "user", "content": "héllo \u2028 ✓"}], "n": 2**40, "t": 0.1, "ok": True,
             "none": None, "tools": [{"a": [1, 2, {"b": "c"}]}]}
    assert json.loads(_json.dumps(value)) == value
    assert _json.dumps(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert _json.loads(_json.dumps(value)) == value == _json.loads(_json.dumps(value).decode())
    # what orjson refuses goes through the standard library
    assert json.loads(_json.dumps({1: "int key", "big": 2**70})) == {"1": "int key", "big": 2**70}
    with pytest.raises(ValueError):
        _json.loads(b"{not json")
