"""The gateway's store of Responses API responses (``store: true``), read back by ``previous_response_id``,
``GET /v1/responses/{id}`` and ``DELETE /v1/responses/{id}``.

Each record holds one response: the input items of its request, the Response object returned (its ``output`` items
included) and the id of the response it continued, so a conversation is a chain of records, each holding only its
own turn. Records belong to an owner (a hash of the API key the request was sent with, "" when the gateway has
none): another owner's lookup finds nothing, as if the id did not exist.

Bounded: at most :data:`MAX_RESPONSES` records and :data:`MAX_BYTES` bytes of them (their JSON); past either, the
least recently used record is evicted. Using a record (continuing it, reading it) uses its whole chain, the earlier
records last, so a conversation's later turns are evicted before the turns they continue. A record over
:data:`MAX_BYTES` on its own is not kept. In memory by default (:class:`MemoryBackend`); on disk with
:class:`DiskBackend` (one file per record, mode 0600, in a 0700 directory), which keeps the store across restarts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

# 1,024 responses and 64 MiB: a long agent session's turns (each record holds its own turn only: a few KB, a
# tool's schemas and prompt once) with room for inline images; a gateway's memory stays bounded whatever the load.
MAX_RESPONSES = 1024
MAX_BYTES = 64 * 2**20
_ID = re.compile(r"resp_[0-9a-f]{24}")  # the ids this gateway gives (common.new_id("resp_")); any other is unknown


def owner_of(api_key: str | None) -> str:
    """The owner of the records made with ``api_key``: a hash of it (the key itself is never kept), "" for none."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32] if api_key else ""


@dataclass(frozen=True)
class Record:
    id: str
    owner: str
    previous: str | None  # the response this one continued
    input: list[dict[str, Any]]  # this request's input items
    response: dict[str, Any]  # the Response object as it was returned

    def dump(self) -> bytes:
        return json.dumps({"id": self.id, "owner": self.owner, "previous": self.previous, "input": self.input,
                           "response": self.response}, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def load(cls, raw: bytes) -> Record:
        data = json.loads(raw)
        return cls(str(data["id"]), str(data["owner"]), data.get("previous"), list(data["input"]),
                   dict(data["response"]))


class Missing(LookupError):
    """A response the chain needs is not in the store (never stored, evicted, deleted, or another owner's)."""

    def __init__(self, wanted: str, missing: str) -> None:
        super().__init__(missing)
        self.wanted, self.missing = wanted, missing


class Backend(Protocol):
    """Where the records' bytes live."""

    def existing(self) -> Iterator[tuple[str, bytes]]:
        """The records kept from before, least recently used first."""
        ...

    def write(self, id: str, data: bytes) -> None: ...

    def read(self, id: str) -> bytes | None: ...

    def remove(self, id: str) -> None: ...

    def touch(self, id: str) -> None:
        """Mark ``id`` used now (its place in the order :meth:`existing` gives)."""
        ...


class MemoryBackend:
    """Records in this process's memory: gone when the gateway stops."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def existing(self) -> Iterator[tuple[str, bytes]]:
        return iter(())

    def write(self, id: str, data: bytes) -> None:
        self.data[id] = data

    def read(self, id: str) -> bytes | None:
        return self.data.get(id)

    def remove(self, id: str) -> None:
        self.data.pop(id, None)

    def touch(self, id: str) -> None:
        pass


class DiskBackend:
    """One file per record, ``<dir>/<id>.json``, mode 0600 in a directory of mode 0700; its modification time is
    when it was last used (the eviction order after a restart). Written on the event loop: a record is one turn's
    items (kilobytes; more with inline images)."""

    def __init__(self, directory: str | Path) -> None:
        self.last = 0  # the last time stamped: each later stamp is after it, however coarse the clock
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)  # an existing dir too: the records are the conversations

    def _path(self, id: str) -> Path:
        return self.dir / f"{id}.json"

    def existing(self) -> Iterator[tuple[str, bytes]]:
        found = []
        for p in self.dir.glob("resp_*.json"):
            with contextlib.suppress(OSError):
                found.append((p.stat().st_mtime_ns, p))
        for _, p in sorted(found):
            with contextlib.suppress(OSError):
                yield p.stem, p.read_bytes()

    def write(self, id: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")  # mkstemp: mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(id))  # whole or not at all
            self.touch(id)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read(self, id: str) -> bytes | None:
        try:
            return self._path(id).read_bytes()
        except OSError:
            return None

    def remove(self, id: str) -> None:
        with contextlib.suppress(OSError):
            self._path(id).unlink()

    def touch(self, id: str) -> None:
        self.last = max(time.time_ns(), self.last + 1000)  # 1 µs apart: distinct where mtimes keep µs (ext4, APFS)
        with contextlib.suppress(OSError):
            os.utime(self._path(id), ns=(self.last, self.last))


@dataclass
class _Entry:
    owner: str
    previous: str | None
    size: int


class ResponseStore:
    """The records, bounded (:data:`MAX_RESPONSES`, :data:`MAX_BYTES`, least recently used evicted first)."""

    def __init__(self, backend: Backend | None = None, *, max_responses: int = MAX_RESPONSES,
                 max_bytes: int = MAX_BYTES) -> None:
        self.backend: Backend = backend if backend is not None else MemoryBackend()
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self.index: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.bytes = 0
        for id, raw in self.backend.existing():
            try:
                rec = Record.load(raw)
            except (ValueError, KeyError, TypeError):
                log.warning("responses store: %s is not a record; left out", id)
                continue
            self._add(rec.id, _Entry(rec.owner, rec.previous, len(raw)))
        self._evict()

    def __len__(self) -> int:
        return len(self.index)

    def put(self, record: Record) -> bool:
        """Keep ``record`` (False: it is over :data:`MAX_BYTES` on its own, and was not kept)."""
        raw = record.dump()
        if len(raw) > self.max_bytes:
            log.info("responses store: %s is %d bytes, over the store's %d: not kept", record.id, len(raw),
                     self.max_bytes)
            return False
        self.backend.write(record.id, raw)
        self._drop(record.id)
        self._add(record.id, _Entry(record.owner, record.previous, len(raw)))
        self._use(record.id)
        self._evict()
        return True

    def get(self, owner: str, id: str) -> Record | None:
        """The record ``id`` of ``owner`` (None: unknown, evicted, deleted or another owner's); it is used now."""
        rec = self._read(owner, id)
        if rec is not None:
            self._use(id)
        return rec

    def chain(self, owner: str, id: str) -> list[Record]:
        """The records of the conversation that ``id`` ends, the first first; :class:`Missing` names the one not
        found (``id`` itself, or an earlier one evicted or deleted since)."""
        out: list[Record] = []
        at: str | None = id
        while at is not None:
            rec = self._read(owner, at)
            if rec is None:
                raise Missing(id, at)
            out.append(rec)
            at = rec.previous
            if len(out) > self.max_responses:  # a cycle (a hand-edited store): nothing is that long
                raise Missing(id, at or id)
        self._use(id)
        out.reverse()
        return out

    def delete(self, owner: str, id: str) -> bool:
        entry = self.index.get(id)
        if entry is None or entry.owner != owner:
            return False
        self._drop(id)
        self.backend.remove(id)
        return True

    def _read(self, owner: str, id: str) -> Record | None:
        entry = self.index.get(id) if _ID.fullmatch(id) else None
        if entry is None or entry.owner != owner:
            return None
        raw = self.backend.read(id)
        if raw is None:  # its file went away
            self._drop(id)
            return None
        return Record.load(raw)

    def _add(self, id: str, entry: _Entry) -> None:
        self.index[id] = entry
        self.bytes += entry.size

    def _drop(self, id: str) -> None:
        entry = self.index.pop(id, None)
        if entry is not None:
            self.bytes -= entry.size

    def _use(self, id: str) -> None:
        """``id`` and then each earlier record of its chain become the most recently used."""
        at: str | None = id
        seen: set[str] = set()
        while at is not None and at in self.index and at not in seen:
            seen.add(at)
            self.index.move_to_end(at)
            self.backend.touch(at)
            at = self.index[at].previous

    def _evict(self) -> None:
        while self.index and (len(self.index) > self.max_responses or self.bytes > self.max_bytes):
            id, entry = self.index.popitem(last=False)
            self.bytes -= entry.size
            self.backend.remove(id)
            log.info("responses store: %s evicted (least recently used)", id)
