"""Helpers shared by the test-model scripts: sha256 of a file and the ``<file>.sha256`` marker of a verified file.

The marker records sha256 + size + mtime of a file that was hashed before, so a warm run re-checks a model with
one ``stat`` instead of hashing it again.
"""

from __future__ import annotations

import hashlib
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
