"""A prompt's KV that survives a stop: llama-server's slot files (``--slot-save-path``, ``/slots/{id}?action=…``).

Saving: every stop of a server we started goes through :meth:`.registry.Registry.stop_entry` (keep_alive's
watchdog, LRU eviction, ``gguf-provider stop``, a keep_alive=0 release); before the process is terminated,
:func:`save_slots` saves each idle slot holding at least :data:`MIN_TOKENS` tokens into the server's directory
``<home>/prompt-cache/<identity key>/`` as ``<sha of its tokens>.bin`` plus a JSON sidecar (:class:`Saved`), within
:data:`SAVE_BUDGET` seconds in all (the rest is skipped; a failure only warns, the stop goes on).

Restoring: the next server of the same model and identity gets the same directory; the engine asks
:class:`ServerCache` on that server's first requests whether a saved prompt shares at least :data:`MIN_TOKENS`
tokens with the request's, restores it into a free slot and sends the request to that slot (engine.Engine.prepare).
A file whose sidecar does not match (model file, build, identity, its own tokens) or that the server refuses is
deleted with a :class:`~gguf_provider.errors.PromptCacheWarning`, never served.

Disk: ``$GGUF_PROVIDER_PROMPT_CACHE_SIZE`` (default :data:`DEFAULT_SIZE`; ``0`` turns the cache off), least
recently used files go first (:func:`trim`). Measured figures: bench/NOTES.md (P17).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._warn import warn
from ...errors import PromptCacheWarning
from ...lazy import LazyModule
from .._common import paths
from .._common.process import Address

if TYPE_CHECKING:
    import httpx
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

ENV = "GGUF_PROVIDER_PROMPT_CACHE_SIZE"
DEFAULT_SIZE = "2G"
# Slots shorter than this are not saved, nor restored for a shorter common prefix. Restoring costs ~3 ms + 5 µs a
# token here (SmolLM2/Qwen2.5-0.5B, 2 cores) against 2–10 ms a token to process the prompt again, so any length
# would pay on a CPU; 256 keeps the files to prompts whose re-processing is worth waiting for on a GPU too (tens of
# ms there), and keeps chit-chat slots off the disk.
MIN_TOKENS = 256
# Seconds a stop may spend saving (reading /slots included): a 2,000-token SmolLM2 slot (46 MB) saved in ~25 ms
# here, so this holds ~100k tokens of a small model or ~32k of an 8B one (128 KB a token) before the rest is skipped.
SAVE_BUDGET = 3.0
FIRST_REQUESTS = 8  # how many of a server's first requests (in this process) look for a saved prompt
SIDECAR_VERSION = 1
STATE_MAGIC, STATE_VERSION = 0x67677371, 3  # llama.cpp's LLAMA_STATE_SEQ_MAGIC ('ggsq') and _VERSION
TOKEN_NULL = -1  # llama-server's marker of its packed token state (server_tokens::serialize)
TMP_PREFIX = ".tmp-"
STALE_TMP = 600.0  # seconds after which a temporary file is a dead save's leftover

log = logging.getLogger(__name__)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes of ``"2G"``, ``"500M"``, ``"1.5GiB"``, ``"0"`` (units of 1024); ValueError otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 2G, 500M or 0")
    return int(float(m.group(1)) * 1024 ** "bkmgt".index((m.group(2) or "b").lower()))


def limit() -> int:
    """The disk the cache may use, in bytes (0: off): ``$GGUF_PROVIDER_PROMPT_CACHE_SIZE`` or the default."""
    raw = os.environ.get(ENV, "").strip() or DEFAULT_SIZE
    try:
        return parse_size(raw)
    except ValueError as exc:
        _warn(f"${ENV}: {exc}; using the default {DEFAULT_SIZE}")
        return parse_size(DEFAULT_SIZE)


def root() -> Path:
    return paths.home() / "prompt-cache"


def server_dir(identity: str) -> Path:
    """The (0700) directory of the servers of one identity: their ``--slot-save-path``."""
    paths.ensure_private_dir(root())
    d = paths.ensure_private_dir(root() / identity)
    try:
        os.utime(d)  # a directory handed out now is not an empty leftover for another process's trim()
    except OSError:
        pass
    return d


def why_off(*, supported: bool, mmproj: bool, draft: bool) -> str | None:
    """Why a chat server with the cache asked for runs without it, or None. llama-server saves the main model's KV
    only: a draft model would draft from a context without the restored prompt; a prompt with images holds media
    chunks that a text tokenization cannot match (and the tests have no real projector to prove it)."""
    if not supported:
        return "this llama-server has no --slot-save-path"
    if draft:
        return "a slot file holds the main model's KV, not the draft model's"
    if mmproj:
        return "a prompt with images cannot be matched by its text tokens"
    return None


def file_id(path: str | Path) -> list[Any]:
    """What identifies a model file's contents: resolved path, size, modification time (ns)."""
    p = Path(path)
    st = p.stat()
    return [str(p.resolve()), st.st_size, st.st_mtime_ns]


def tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


def read_tokens(path: Path) -> list[int] | None:
    """The tokens a slot file holds (the header llama_state_seq_save_file writes, unwrapping llama-server's packed
    form); None for a file that is not one, or one with media chunks."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12:
                return None
            magic, version, n = struct.unpack("<III", head)
            if magic != STATE_MAGIC or version != STATE_VERSION or n > 1 << 24:
                return None
            raw = f.read(4 * n)
    except OSError:
        return None
    if len(raw) != 4 * n:
        return None
    packed = list(struct.unpack(f"<{n}i", raw))
    if not packed or packed[0] != TOKEN_NULL:
        return packed  # a plain token list (older builds)
    # [TOKEN_NULL, version, count, tokens..., media count, media...] (server-common.cpp server_tokens::serialize)
    if len(packed) < 3 or packed[1] != 1 or not 0 <= packed[2] <= len(packed) - 4:
        return None
    count = packed[2]
    media = packed[3 + count]
    return packed[3:3 + count] if media == 0 else None


def checksum(path: Path) -> str:
    """CRC-32 of a whole file (3.5 GB/s here: ~15 ms for a 2,000-token SmolLM2 slot); "" when unreadable."""
    crc = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 23):
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return ""
    return f"{crc:08x}"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class Saved:
    """One saved slot: ``<name>.bin`` (llama-server's file) and ``<name>.json`` (this, its sidecar)."""

    path: Path = field(compare=False)  # the .bin
    n_tokens: int
    tokens_sha256: str
    identity: str  # the server identity key (the directory's name)
    model: list[Any]  # file_id of the model file
    build: str  # llama-server's /props build_info
    bytes: int
    crc32: str  # of the whole .bin: a file cut short or changed is never served (this build aborts on some)
    saved_at: float
    version: int = SIDECAR_VERSION

    @property
    def sidecar(self) -> Path:
        return self.path.with_suffix(".json")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["path"]
        return out

    @classmethod
    def load(cls, sidecar: Path) -> Saved | None:
        """The sidecar's record, or None for one that is not readable or not ours."""
        try:
            data = json.loads(sidecar.read_text())
            if not isinstance(data, dict) or data.get("version") != SIDECAR_VERSION:
                return None
            return cls(path=sidecar.with_suffix(".bin"), n_tokens=int(data["n_tokens"]),
                       tokens_sha256=str(data["tokens_sha256"]), identity=str(data["identity"]),
                       model=list(data["model"]), build=str(data["build"]), bytes=int(data["bytes"]),
                       crc32=str(data["crc32"]), saved_at=float(data["saved_at"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def mismatch(self, *, identity: str, model: list[Any], build: str) -> str | None:
        """Why this file must not be served to a server of ``identity``, ``model`` and ``build``; None if it may."""
        if self.identity != identity:
            return f"saved for server identity {self.identity[:12]}, not {identity[:12]}"
        if self.model != model:
            return "the model file changed since it was saved"
        if self.build != build:
            return f"saved by llama-server {self.build!r}, this one is {build!r}"
        return None


def discard(saved_bin: Path, why: str) -> None:
    """Delete a saved slot and its sidecar, saying why (a corrupt or mismatched file is never served)."""
    _warn(f"prompt cache: discarded {saved_bin.name} ({why})")
    for p in (saved_bin, saved_bin.with_suffix(".json")):
        _unlink(p)


def _warn(message: str) -> None:
    log.warning("%s", message)
    warn(message, PromptCacheWarning)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# --- saving, on a stop ---------------------------------------------------------------------------------------


def save_slots(address: Address, directory: Path, *, model: str, budget: float = SAVE_BUDGET,
               min_tokens: int = MIN_TOKENS) -> list[Saved]:
    """Save the idle slots of the server at ``address`` that hold at least ``min_tokens`` tokens, longest first,
    for at most ``budget`` seconds in all; what is left when the time is up is skipped. Never raises: a failure is
    a warning, and the caller stops the server anyway."""
    if limit() <= 0:
        return []
    try:  # another process's trim() may have removed it while it was empty
        paths.ensure_private_dir(directory)
    except OSError:
        return []
    deadline = time.monotonic() + budget
    saved: list[Saved] = []
    try:
        with address.client(timeout=min(1.0, budget)) as c:
            slots = c.get("/slots").raise_for_status().json()
            build = str(c.get("/props").raise_for_status().json().get("build_info") or "")
            todo = sorted((s for s in slots if isinstance(s, dict) and not s.get("is_processing")
                           and int(s.get("n_prompt_tokens") or 0) >= min_tokens),
                          key=lambda s: -int(s.get("n_prompt_tokens") or 0))
            ident, model_id = directory.name, file_id(model)
            for i, slot in enumerate(todo):
                left = deadline - time.monotonic()
                if left <= 0.05:
                    _warn(f"prompt cache: saving took its {budget:.0f} s bound; {len(todo) - i} slot(s) of "
                          f"{Path(model).name} not saved")
                    break
                one = _save_one(c, int(slot["id"]), directory, left, ident=ident, model_id=model_id, build=build)
                if one is not None:
                    saved.append(one)
    except (httpx.HTTPError, ValueError, OSError, KeyError, TypeError) as exc:
        _warn(f"prompt cache: the prompts of {Path(model).name} were not saved ({type(exc).__name__}: {exc}); "
              f"stopping it anyway")
    if saved:
        log.info("prompt cache: saved %d slot(s) of %s (%s tokens) in %.0f ms", len(saved), Path(model).name,
                 ", ".join(str(s.n_tokens) for s in saved), (time.monotonic() - deadline + budget) * 1e3)
        trim(limit())
    return saved


def _save_one(c: httpx.Client, slot: int, directory: Path, timeout: float, *, ident: str, model_id: list[Any],
              build: str) -> Saved | None:
    # Written under a temporary name (a save cut short by the bound leaves no half file under a real name), then
    # named after its tokens: the same prompt saved again replaces the older file.
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.bin"
    try:
        r = c.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": tmp.name}, timeout=timeout)
        r.raise_for_status()
        tokens = read_tokens(tmp)
        if tokens is None:
            return None
        sha = tokens_hash(tokens)
        final = directory / f"{sha[:32]}.bin"
        rec = Saved(path=final, n_tokens=len(tokens), tokens_sha256=sha, identity=ident, model=model_id,
                    build=build, bytes=tmp.stat().st_size, crc32=checksum(tmp), saved_at=time.time())
        os.replace(tmp, final)
        side_tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.json"
        side_tmp.write_text(json.dumps(rec.to_json()))
        os.replace(side_tmp, rec.sidecar)  # the sidecar last: a .bin without one is never served
        return rec
    finally:
        _unlink(tmp)


# --- the disk bound -------------------------------------------------------------------------------------------


def trim(max_bytes: int, *, base: Path | None = None, now: float | None = None) -> list[Path]:
    """Delete least recently used saved slots (a .bin's modification time is its last use) until the cache holds
    at most ``max_bytes``; leftovers (a .bin without sidecar, a sidecar without .bin, an old temporary file) go
    too. Returns the .bin files deleted."""
    base = root() if base is None else base
    now = time.time() if now is None else now
    files: list[tuple[float, int, Path]] = []
    removed: list[Path] = []
    try:
        dirs = [d for d in base.iterdir() if d.is_dir()]
    except OSError:
        return removed
    for d in dirs:
        try:
            entries = list(d.iterdir())
        except OSError:
            continue
        names = {p.name for p in entries}
        for p in entries:
            try:
                st = p.stat()
            except OSError:
                continue
            if p.name.startswith(TMP_PREFIX):
                if now - st.st_mtime > STALE_TMP:
                    _unlink(p)
            elif p.suffix == ".bin":
                if p.with_suffix(".json").name not in names:
                    if now - st.st_mtime > STALE_TMP:
                        _unlink(p)  # its save never finished
                    continue
                side = p.with_suffix(".json")
                try:
                    size = st.st_size + side.stat().st_size
                except OSError:
                    continue
                files.append((st.st_mtime, size, p))
            elif p.suffix == ".json" and p.with_suffix(".bin").name not in names:
                _unlink(p)
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= max_bytes:
            break
        _unlink(p)
        _unlink(p.with_suffix(".json"))
        removed.append(p)
        total -= size
    for d in dirs:
        try:  # only when empty, and not handed to a starting server just now (server_dir touches it)
            if now - d.stat().st_mtime > STALE_TMP:
                d.rmdir()
        except OSError:
            pass
    return removed


def touch(path: Path) -> None:
    """Count a saved slot as used now (LRU)."""
    try:
        os.utime(path)
    except OSError:
        pass


# --- restoring, on a server's first requests --------------------------------------------------------------------


def free_slot(slots: Any) -> int | None:
    """An idle, empty slot to restore into, from ``/slots``; None when every slot is busy or holds a prompt (a
    restore would push out what the server has cached itself)."""
    for s in slots if isinstance(slots, list) else ():
        if isinstance(s, dict) and isinstance(s.get("id"), int) and not s.get("is_processing") \
                and not s.get("n_prompt_tokens"):
            return int(s["id"])
    return None


@dataclass
class Match:
    saved: Saved
    common: int  # tokens the request shares with it


class ServerCache:
    """The saved prompts one running server may restore, and how many of its first requests are left to look
    (one per server process and client process: :func:`for_server`). Thread-safe."""

    def __init__(self, directory: Path, *, model: str, build: str, first_requests: int = FIRST_REQUESTS) -> None:
        self.directory = directory
        self.model = model
        self.build = build
        self.left = first_requests
        self.tried: set[str] = set()
        self._lock = threading.Lock()

    def pending(self) -> list[Saved]:
        """The saved prompts not yet tried on this server, while its first requests last (a directory listing;
        nothing is read when there is none)."""
        with self._lock:
            if self.left <= 0:
                return []
            self.left -= 1
        try:
            sidecars = [p for p in self.directory.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]
        except OSError:
            sidecars = []
        if not sidecars:  # nothing saved for this model and options: the next requests need not look (a thread hop
            with self._lock:  # each, ~3 ms of a gateway's time to first token: bench P21)
                self.left = 0
            return []
        out = []
        for side in sidecars:
            if side.with_suffix(".bin").name in self.tried:
                continue
            saved = Saved.load(side)
            if saved is None:
                if side.with_suffix(".bin").exists():
                    discard(side.with_suffix(".bin"), "its sidecar is unreadable")
                continue
            out.append(saved)
        return out

    def choose(self, tokens: Sequence[int], candidates: Sequence[Saved],
               min_tokens: int = MIN_TOKENS) -> Match | None:
        """The candidate sharing the longest prefix with ``tokens`` when that is at least ``min_tokens``, claimed
        (no other request restores it into this server); a file that fails its checks is discarded."""
        try:
            model_id = file_id(self.model)
        except OSError:
            return None
        best: Match | None = None
        for saved in candidates:
            if saved.path.name in self.tried:
                continue
            why = saved.mismatch(identity=self.directory.name, model=model_id, build=self.build)
            if why is None and _size(saved.path) != saved.bytes:
                why = f"its size is {_size(saved.path)} bytes, not the {saved.bytes} saved"
            if why is None and checksum(saved.path) != saved.crc32:
                why = "its checksum does not match: the file changed since it was saved"
            held = read_tokens(saved.path) if why is None else None
            if why is None and (held is None or len(held) != saved.n_tokens
                                or tokens_hash(held) != saved.tokens_sha256):
                why = "its tokens do not match its sidecar"
            if why is not None or held is None:
                with self._lock:
                    self.tried.add(saved.path.name)
                discard(saved.path, why or "unreadable")
                continue
            n = common_prefix(held, tokens)
            if n >= min_tokens and (best is None or n > best.common):
                best = Match(saved, n)
        if best is None:
            return None
        with self._lock:
            if best.saved.path.name in self.tried:
                return None
            self.tried.add(best.saved.path.name)
        return best

    def restored(self, match: Match, answer: Any) -> bool:
        """Check the server's answer to the restore: True when it restored the file's tokens (then it counts as
        used); else the file is discarded."""
        n = answer.get("n_restored") if isinstance(answer, dict) else None
        if n != match.saved.n_tokens:
            said = answer.get("error") if isinstance(answer, dict) else None
            discard(match.saved.path, f"llama-server refused it: {said}" if said else
                    f"llama-server restored {n} tokens of its {match.saved.n_tokens}")
            return False
        touch(match.saved.path)
        log.info("prompt cache: restored %s (%d tokens, %d shared with the request)", match.saved.path.name,
                 match.saved.n_tokens, match.common)
        return True


_servers: dict[tuple[int, float], ServerCache] = {}
_servers_lock = threading.Lock()


def for_server(pid: int, create_time: float, directory: Path, *, model: str, build: str) -> ServerCache:
    """The :class:`ServerCache` of one running server process, shared by the engines of this process."""
    with _servers_lock:
        cache = _servers.get((pid, create_time))
        if cache is None:
            cache = _servers[(pid, create_time)] = ServerCache(directory, model=model, build=build)
        return cache
