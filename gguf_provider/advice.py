"""Advice in the words of where the user is. Errors and warnings name Python keywords (``pass truncate=True``); the
command line and the magics show the flag that does the same (``--truncate``). :func:`render` is the one mapping,
applied where the CLI and the magics print an error or a warning.

A keyword of a llama-server option (:data:`gguf_provider.runtime.OPTIONS`) becomes its flag as :mod:`.flags` makes
it; :data:`FLAGS` names the others. A keyword with no flag on a surface (``offline``) is dropped with the words that
introduce it, where the message gives another way (``unset HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import re
from typing import Literal

Surface = Literal["python", "cli", "magic"]

# keyword → {surface: flag}; absent surface: no such lever there. Options of the runtime's OPTIONS are added below.
FLAGS: dict[str, dict[str, str]] = {
    "truncate": {"cli": "--truncate"},
    "top_n": {"cli": "--top-n"},
    "quant": {"cli": "--quant", "magic": "--quant"},
    "max_time": {"magic": "--max-time"},
    "max_tokens": {"magic": "--max-tokens"},
    "temperature": {"magic": "--temperature"},
    "reasoning": {"magic": "--think/--no-think"},
    "keep_alive": {"cli": "--keep-alive"},
    "method": {"cli": "--from"},
    "cmake_args": {"cli": "--cmake-arg"},
    "offline": {},
    "token": {},
    "cache_dir": {},
    "loop_guard": {},
    "media_allow_hosts": {},
}

# Whole phrases whose other words change with the surface; each surface's text, else the phrase is kept.
PHRASES: dict[str, dict[str, str]] = {
    "unset HF_HUB_OFFLINE / pass offline=False": {"cli": "unset HF_HUB_OFFLINE", "magic": "unset HF_HUB_OFFLINE"},
    "pass token=... (or set HF_TOKEN, or run `hf auth login`)": {
        "cli": "set HF_TOKEN (or run `hf auth login`)", "magic": "set HF_TOKEN (or run `hf auth login`)"},
    "point HF_HUB_CACHE (or cache_dir=) at": {"cli": "point HF_HUB_CACHE at", "magic": "point HF_HUB_CACHE at"},
    "`.unload()`, `%gguf unload`": {"cli": "`.unload()`, `%gguf unload`", "magic": "`%gguf unload`"},
    ", or None for ": {"cli": ", or leave it out for ", "magic": ", or leave it out for "},
}

_VALUE = r"""(?:'[^']*'|"[^"]*"|\.\.\.|-?[\w.]+)"""


def _option_flags() -> dict[str, dict[str, str]]:
    from . import flags  # the runtime's declarations, as the CLI and %gguf load make their flags

    made: dict[str, dict[str, str]] = {}
    for o in flags.options(("server", "chat", "embedding", None)):  # type: ignore[arg-type]
        flag = flags.names(o)[0]
        made[o.name] = {"cli": flag, "magic": flag}
    return made


_table: dict[str, dict[str, str]] | None = None
_pattern: re.Pattern[str] | None = None


def table() -> dict[str, dict[str, str]]:
    """Every keyword advice may name, with its flag per surface."""
    global _table, _pattern
    if _table is None:
        _table = {**_option_flags(), **FLAGS}
        # A keyword with an underscore is one alone (``n_ctx``); a plain word only as ``word=value`` (prose says
        # "speculative decoding").
        words = "|".join(sorted(_table, key=len, reverse=True))
        _pattern = re.compile(rf"(?<![\w$.\-`])({words})(?:=({_VALUE}))?(?![\w(])")
    return _table


def flag(keyword: str, value: str | None, surface: Surface) -> str | None:
    """``keyword=value`` as ``surface`` says it: ``--truncate``, ``--no-prompt-cache``, ``--ctx 4096``; None when
    the surface has no such flag."""
    name = table()[keyword].get(surface)
    if name is None:
        return None
    if value is None or value == "True" or value == "...":
        return name if value != "..." else f"{name} {'PATH' if keyword == 'mmproj' else 'VALUE'}"
    if value == "False":
        if keyword == "speculative":
            return f"{name} off"
        return f"--no-{name[2:]}" if name.startswith("--") and "/" not in name else name
    if value == "None":
        return f"{name} 0" if keyword == "max_time" else name
    return f"{name} {value.strip(chr(39) + chr(34))}"


def render(text: str, surface: Surface) -> str:
    """``text`` (a message naming Python keywords) in ``surface``'s words."""
    if surface == "python":
        return text
    for phrase, forms in PHRASES.items():
        if phrase in text and surface in forms:
            text = text.replace(phrase, forms[surface])
    table()
    assert _pattern is not None

    def sub(m: re.Match[str]) -> str:
        if m.group(2) is None and "_" not in m.group(1):
            return m.group(0)
        said = flag(m.group(1), m.group(2), surface)
        return m.group(0) if said is None else f"`{said}`" if said.startswith("-") else said

    return _pattern.sub(sub, text)
