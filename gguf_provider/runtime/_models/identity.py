"""What identifies a model file to a client: its content digest, the same for every name of the file, and what its
GGUF header says a client groups and shows models by (architecture, parameter count, quant, metadata, a projector
beside it). Ollama's ``/api/tags``, ``/api/show`` and ``/api/ps`` answer from it (gguf_provider/gateway/ollama.py).

The digest (``sha256:<hex>``, as Ollama gives) is the first found of:

1. the ``<file>.sha256`` marker beside the file (``<hex> <size> <mtime_ns>``, as scripts/test_models.py writes it),
   when its size and mtime are the file's now;
2. the Hugging Face cache's blob name: a snapshot file is a link to ``blobs/<sha256>``;
3. this machine's digest cache (``<home>/digests/``), one entry per (resolved path, size, mtime_ns);
4. the file hashed, in one background daemon thread (never the caller's, never an event loop; a stop never waits
   for it), the result written to the digest cache.

**While a file is being hashed** a caller waits up to its ``wait`` seconds; when the hash is not done by then it gets
a *provisional* digest: the sha256 of the file's identity on this machine (device, inode, size, mtime_ns), and this
process keeps answering that one for that file even once the hash is done (the hash goes to the cache, so the next
process answers the content's). So within one process a file has one digest whichever name it is asked by (a
symlink, a hard link, a second name resolving to it), two files never share one (two files have two identities;
a provisional digest equals a content hash only by a sha256 collision), and a file that changes (size or mtime)
is another file.

Header facts are read once per (file, size, mtime) and kept for the process.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import queue
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import GGUFFormatError, MissingShardError
from .._common import gguf, paths
from .files import _is_gguf, _is_mmproj, _select_mmproj

_HEX = re.compile(r"^[0-9a-f]{64}$")
_PROVISIONAL = b"gguf-provider provisional digest\0"
_MAX_KEPT = 4096  # entries of each in-process table; cleared whole past it (files on one machine: far fewer)

Key = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns: one file as it is now


def file_key(path: Path) -> Key:
    """The file ``path`` names (links followed) as it is now; OSError when there is none (or it is no file)."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(f"{path} is no file")
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def provisional(key: Key) -> str:
    """The digest answered for a file whose hash is not done: a hash of its identity, not of its content."""
    return hashlib.sha256(_PROVISIONAL + "|".join(map(str, key)).encode()).hexdigest()


def marker_digest(path: Path) -> str | None:
    """The sha256 in ``<file>.sha256`` beside ``path`` when it still describes the file (size and mtime_ns)."""
    for p in dict.fromkeys((path, path.resolve())):
        try:
            sha, size, mtime = p.with_name(p.name + ".sha256").read_text().split()
            st = p.stat()
        except (OSError, ValueError):
            continue
        sha = sha.lower()
        if _HEX.match(sha) and int(size) == st.st_size and int(mtime) == st.st_mtime_ns:
            return sha
    return None


def blob_digest(path: Path) -> str | None:
    """The sha256 a Hugging Face cache file is stored under: its snapshot entry links to ``blobs/<sha256>``."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if target.parent.name == "blobs" and _HEX.match(target.name):
        return target.name
    return None


def _cache_file(path: Path) -> Path:
    st = path.stat()
    ident = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return paths.home() / "digests" / hashlib.sha256(ident).hexdigest()


def cached_digest(path: Path) -> str | None:
    """The sha256 this machine computed before for the file at ``path`` with its size and mtime now."""
    try:
        sha = _cache_file(path).read_text().strip()
    except OSError:
        return None
    return sha if _HEX.match(sha) else None


def hash_file(path: Path) -> str:
    """The sha256 of the file (hashlib gives the GIL back while it hashes a block)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _remember(path: Path, sha: str) -> None:
    with contextlib.suppress(OSError):
        target = _cache_file(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(sha + "\n")
        os.replace(tmp, target)


class Digests:
    """The digests of this process (:func:`digests` is the process's): one per file, found, cached or hashed in
    one background thread (see the module docstring for the rule while a hash is under way)."""

    def __init__(self, hasher: Callable[[Path], str] = hash_file) -> None:
        self._hasher = hasher
        self._lock = threading.Lock()
        self._known: dict[Key, str] = {}  # the digest this process answers for the file (hex)
        self._pending: dict[Key, threading.Event] = {}
        self._queue: queue.Queue[tuple[Key, Path]] = queue.Queue()
        self._worker: threading.Thread | None = None

    def digest(self, path: Path, *, wait: float = 0.0) -> str | None:
        """``sha256:<hex>`` of the file at ``path`` (None: no such file)."""
        return self.many([path], wait=wait)[0]

    def many(self, files: Sequence[Path], *, wait: float = 0.0) -> list[str | None]:
        """:meth:`digest` of each of ``files``, the hashes started at once and waited for together, ``wait``
        seconds in all."""
        keys: list[Key | None] = []
        for path in files:
            try:
                keys.append(self._start(path))
            except OSError:
                keys.append(None)
        deadline = time.monotonic() + max(wait, 0.0)
        out: list[str | None] = []
        for key in keys:
            if key is None:
                out.append(None)
                continue
            with self._lock:
                event = self._pending.get(key) if key not in self._known else None
            if event is not None:
                event.wait(max(deadline - time.monotonic(), 0.0))
            with self._lock:
                out.append("sha256:" + self._known.setdefault(key, provisional(key)))
        return out

    def _start(self, path: Path) -> Key:
        """The file's key, its digest known (found without hashing) or its hash queued."""
        key = file_key(path)
        with self._lock:
            if key in self._known or key in self._pending:
                return key
        sha = marker_digest(path) or blob_digest(path) or cached_digest(path)
        with self._lock:
            if len(self._known) > _MAX_KEPT:
                self._known.clear()
            if sha is not None:
                self._known.setdefault(key, sha)
            elif key not in self._known and key not in self._pending:
                self._pending[key] = threading.Event()
                self._queue.put((key, path))
                if self._worker is None or not self._worker.is_alive():
                    self._worker = threading.Thread(target=self._work, name="gguf-digest", daemon=True)
                    self._worker.start()
        return key

    def _work(self) -> None:
        while True:
            try:
                key, path = self._queue.get(timeout=5.0)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._worker = None
                        return
                continue
            sha: str | None = None
            try:
                if file_key(path) == key:  # unchanged since it was queued
                    sha = self._hasher(path)
                    if file_key(path) == key:
                        _remember(path, sha)
                    else:
                        sha = None
            except OSError:
                sha = None
            with self._lock:
                if sha is not None:
                    self._known.setdefault(key, sha)  # a provisional digest answered meanwhile stays
                event = self._pending.pop(key, None)
            if event is not None:
                event.set()


_digests = Digests()


def digests() -> Digests:
    """The process's digests."""
    return _digests


# --- the header's facts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What a model file's header says of it (``header`` None: no GGUF header could be read)."""

    header: gguf.GGUFHeader | None
    parameter_count: int = 0  # elements of every tensor, every shard
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)  # scalars and short arrays, no template

    @property
    def embedder(self) -> bool:
        return self.header is not None and self.header.pooling_type not in (None, 0)


_facts: dict[Key, Facts] = {}
_facts_lock = threading.Lock()


def facts(path: Path) -> Facts:
    """The header facts of the model at ``path`` (shard 1 of a split set: every shard's tensors counted), read
    once per file as it is (kept by device, inode, size and mtime). OSError: no such file."""
    key = file_key(path)
    with _facts_lock:
        known = _facts.get(key)
    if known is not None:
        return known
    made = _read_facts(path)
    with _facts_lock:
        if len(_facts) > _MAX_KEPT:
            _facts.clear()
        _facts[key] = made
    return made


def _shards(path: Path) -> tuple[Path, ...]:
    from .local import _shard_set

    try:
        return _shard_set(path)
    except MissingShardError:
        return (path,)


def _read_facts(path: Path) -> Facts:
    try:
        tables = gguf.read_tables(_shards(path))
    except GGUFFormatError:
        return Facts(None)
    header = tables[0][0]
    count = sum(math.prod(t.shape) for _, tensors in tables for t in tensors)
    meta: dict[str, Any] = {}
    for k, v in header.metadata.items():
        if k == "tokenizer.chat_template" or isinstance(v, gguf.SkippedArray):
            continue
        if isinstance(v, tuple):
            if len(v) <= 64:  # short arrays (per-layer head counts); a vocabulary's are left out
                meta[k] = list(v)
        else:
            meta[k] = v
    meta["general.parameter_count"] = count
    return Facts(header, count, meta)


def projector(path: Path, embedding_length: int | None) -> Path | None:
    """The projector (mmproj) a vision start would take beside the model at ``path``, when its projection fits the
    model (``clip.vision.projection_dim`` equal to the model's embedding length, when both say)."""
    folder = path.parent
    try:
        files = {p.name: p.stat().st_size for p in folder.iterdir()
                 if p.is_file() and _is_gguf(p.name) and _is_mmproj(p.name)}
    except OSError:
        return None
    choice = _select_mmproj(files, path.name)
    if choice is None:
        return None
    found = folder / choice
    try:
        dim = gguf.read_header(found).metadata.get("clip.vision.projection_dim")
    except (OSError, GGUFFormatError):
        return None
    if isinstance(dim, int) and embedding_length and dim != embedding_length:
        return None
    return found


def parameter_size(count: int) -> str:
    """A parameter count as Ollama writes it: ``494.03M``, ``1.5B``, ``7B``, ``135M``, ``22K``."""
    for unit, scale, digits in (("B", 1e9, 1), ("M", 1e6, 2)):
        if count >= scale:
            n = count / scale
            return f"{n:.0f}{unit}" if n == int(n) else f"{n:.{digits}f}{unit}"
    return f"{count / 1e3:.0f}K" if count >= 1000 else str(count)
