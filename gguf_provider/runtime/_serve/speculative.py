"""Speculative decoding: what ``speculative=`` asks for, the llama-server flags that become for a given build, and
the check that a draft model shares the main model's vocabulary.

Modes (:func:`normalize`): ``"auto"`` (default for chat servers) is the build's own n-gram self-speculation
(``--spec-default``; ``--spec-type ngram-mod`` on a build without it): no extra model, nothing worth counting in
memory. ``"off"`` is none. An n-gram type (``"ngram-simple"``, ...) is passed as ``--spec-type`` once the build's
``--help`` lists it. Anything else names a draft model, resolved like any model; its vocabulary must be the main
model's (:func:`check_draft`, from both GGUF headers, before anything starts).
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from ..._warn import warn
from ...errors import DraftModelMismatchError, SpeculationWarning
from .._common.gguf import Vocabulary, read_vocabulary
from .._install.discovery import ServerCapabilities
from .._memory import fit

AUTO, OFF, DRAFT = "auto", "off", "draft"
NGRAM_PREFIX = "ngram"
# What `--spec-default` selects in the builds we know (ngram-mod, n-match 24, n-min 48, n-max 64: the type's own
# defaults); used on a build that has `--spec-type` but no `--spec-default`.
AUTO_FALLBACK_TYPE = "ngram-mod"
_OFF_WORDS = {"off", "none", "no", "false", "0", ""}
_AUTO_WORDS = {"auto", "on", "yes", "true", "1", "ngram", "default"}
# llama.cpp's own vocabulary check (common/speculative.cpp): sizes may differ by this much, and tokens from this id
# on must have the same text.
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
_warned: set[tuple[str, str]] = set()


def normalize(value: bool | str | None) -> str:
    """``"auto"``, ``"off"``, an n-gram type, or a draft model spec (left as given). Raises ValueError for what can
    never work (a ``draft-*`` type without its model, another type)."""
    if value is None or value is False:
        return OFF
    if value is True:
        return AUTO
    if not isinstance(value, str):
        raise ValueError(f"speculative must be 'auto', 'off'/False, an n-gram type or a draft model, not "
                         f"{type(value).__name__} {value!r}")
    word = value.strip()
    low = word.lower()
    if low in _OFF_WORDS:
        return OFF
    if low in _AUTO_WORDS:
        return AUTO
    if low.startswith(NGRAM_PREFIX):
        return low
    if low.startswith("draft-"):
        raise ValueError(f"speculative={value!r}: a draft type needs its draft model; give the model instead "
                         f"(speculative='path/to/draft.gguf', a models-dir name or 'org/repo:QUANT')")
    return word


def is_draft(mode: str) -> bool:
    """Whether a normalized mode names a draft model."""
    return mode not in (AUTO, OFF) and not mode.startswith(NGRAM_PREFIX)


def check_type(mode: str, caps: ServerCapabilities) -> None:
    """Before a start: an explicit n-gram type must be one the build's ``--help`` lists (ValueError naming them)."""
    if not mode.startswith(NGRAM_PREFIX) or not caps.supports("--spec-type"):
        return
    listed = [t for t in caps.allowed("--spec-type") if t.startswith(NGRAM_PREFIX)]
    if listed and mode not in listed:
        close = difflib.get_close_matches(mode, listed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"speculative={mode!r} is not an n-gram type of this llama-server{hint}; it lists "
                         f"{', '.join(listed)} ({caps.path})")


def server_args(mode: str, draft: Path | None, caps: ServerCapabilities, cache_type: str) -> list[str]:
    """The flags for ``mode`` on this build; none when the build cannot (:func:`unsupported` says why)."""
    if mode == OFF or unsupported(mode, caps):
        return []
    if mode == AUTO:
        if caps.supports("--spec-default"):
            return ["--spec-default"]
        return ["--spec-type", AUTO_FALLBACK_TYPE]
    if mode.startswith(NGRAM_PREFIX):
        return ["--spec-type", mode]
    assert draft is not None, "a draft mode needs its resolved draft model"
    flag = "--spec-draft-model" if caps.supports("--spec-draft-model") else "--model-draft"
    argv = [flag, str(draft)]
    if "draft-simple" in caps.allowed("--spec-type"):  # newer builds draft only when the type is named
        argv = ["--spec-type", "draft-simple", *argv]
    if cache_type != fit.DEFAULT_CACHE_TYPE:  # the draft's own KV cache, in the same type as the model's
        for new_name, old_name in (("--spec-draft-type-k", "--cache-type-k-draft"),
                                   ("--spec-draft-type-v", "--cache-type-v-draft")):
            if caps.supports(new_name) or caps.supports(old_name):
                argv += [new_name if caps.supports(new_name) else old_name, cache_type]
    return argv


def unsupported(mode: str, caps: ServerCapabilities) -> str | None:
    """Why this build cannot do ``mode`` (None when it can)."""
    if mode == OFF:
        return None
    if mode == AUTO:
        if caps.supports("--spec-default") or AUTO_FALLBACK_TYPE in caps.allowed("--spec-type"):
            return None
        return "it has neither --spec-default nor --spec-type ngram-mod"
    if mode.startswith(NGRAM_PREFIX):
        return None if caps.supports("--spec-type") else "it has no --spec-type"
    if caps.supports("--spec-draft-model") or caps.supports("--model-draft"):
        return None
    return "it has no --spec-draft-model"


def warn_once(reason: str, key: str) -> None:
    """One :class:`SpeculationWarning` per (key, reason) in this process."""
    if (key, reason) in _warned:
        return
    _warned.add((key, reason))
    warn(reason, SpeculationWarning)


# --- draft vocabulary ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _vocabulary(path: str, size: int, mtime_ns: int) -> Vocabulary:
    return read_vocabulary(path)


def vocabulary(path: Path) -> Vocabulary:
    st = path.stat()
    return _vocabulary(str(path), st.st_size, st.st_mtime_ns)


def vocab_difference(model: Vocabulary, draft: Vocabulary) -> str | None:
    """Why ``draft`` cannot draft for ``model`` (llama.cpp's own test, from the headers), or None."""
    if model.model != draft.model:
        return f"tokenizer {draft.model!r} vs {model.model!r}"
    n_model, n_draft = len(model.tokens), len(draft.tokens)
    if abs(n_model - n_draft) > VOCAB_MAX_SIZE_DIFFERENCE:
        return f"{n_draft} tokens vs {n_model}"
    for which in ("bos", "eos"):
        add_m, add_d = getattr(model, f"add_{which}"), getattr(draft, f"add_{which}")
        if add_m is not None and add_d is not None and add_m != add_d:
            return f"add_{which}_token {add_d} vs {add_m}"
        id_m, id_d = getattr(model, f"{which}_id"), getattr(draft, f"{which}_id")
        if (add_m or add_d) and id_m != id_d:
            return f"{which.upper()} token id {id_d} vs {id_m}"
    n = min(n_model, n_draft)
    for i in range(VOCAB_CHECK_START_TOKEN_ID, n):
        if model.tokens[i] != draft.tokens[i]:
            return f"token {i} is {_piece(draft.tokens[i])} vs {_piece(model.tokens[i])}"
    return None


def _piece(token: bytes) -> str:
    return repr(token.decode("utf-8", "replace"))[:40]


def check_draft(model: Path, draft: Path) -> None:
    """Raise :class:`DraftModelMismatchError` naming both when ``draft`` cannot draft for ``model``."""
    why = vocab_difference(vocabulary(model), vocabulary(draft))
    if why is not None:
        raise DraftModelMismatchError(
            f"the draft model {draft.name} cannot draft for {model.name}: their vocabularies differ ({why}; "
            f"draft vs model). Use a smaller model of the same family (same tokenizer) as the draft, or "
            f"speculative='auto' for n-gram speculation without a draft model", model=model, draft=draft)


def describe(mode: str, draft: Path | None) -> str:
    """A short label (``auto``, ``off``, ``ngram-simple``, ``draft:NAME``) for summaries."""
    return f"draft:{draft.name}" if is_draft(mode) and draft is not None else mode
