"""Helpers shared by the test-model scripts: sha256 of a file and the ``<file>.sha256`` marker of a verified file.

The marker records sha256 + size + mtime of a file that was hashed before, so a warm run re-checks a model with
one ``stat`` instead of hashing it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def marker_of(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_verified(path: Path, sha256: str) -> bool:
    """Whether the marker beside ``path`` says it was hashed to ``sha256`` and it has not changed since."""
    try:
        sha, size, mtime = marker_of(path).read_text().split()
        st = path.stat()
    except (OSError, ValueError):
        return False
    return sha == sha256 and int(size) == st.st_size and int(mtime) == st.st_mtime_ns


def mark(path: Path, sha256: str) -> None:
    st = path.stat()
    marker_of(path).write_text(f"{sha256} {st.st_size} {st.st_mtime_ns}\n")


def ensure_made(filename: str, sha256: str, lock_name: str, make: Callable[[Path], None]) -> Path:
    """``filename`` in the models dir, verified; made by ``make(target)`` under a lock when missing (the maker
    checks its own sha256 before moving the file into place)."""
    import filelock

    from gguf_provider.runtime._common import paths

    target = paths.models_dir() / filename
    if target.is_file() and is_verified(target, sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_dir = paths.home() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(lock_dir / lock_name)):
        if target.is_file() and (is_verified(target, sha256) or sha256_file(target) == sha256):
            mark(target, sha256)
            return target
        make(target)
    return target
