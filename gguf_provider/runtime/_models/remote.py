"""A GGUF file on the Hugging Face Hub read by HTTP ranges: its header and tensor table without downloading it.

The automatic quant choice (:mod:`..._memory.choose`) plans every quant of a repo; that needs each file's header
and tensor table, which sit in its first megabytes. :class:`RangeFile` is a read-only file object over
``huggingface_hub``'s own session (its endpoint, headers and token), fetching 1 MiB ranges as the GGUF reader asks
for them; a 150k-token vocabulary makes a header of 3-8 MB, so that is what a quant costs to decide, not its size.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from ...errors import GGUFFormatError, ModelNotFoundError
from .._common import paths
from .._common.gguf import GGUFHeader, TensorInfo, read_table

CHUNK = 1 << 20
MAX_HEADER = 256 << 20  # a header this large is no header: stop reading (a hostile or broken file)
TIMEOUT = 30.0


class RangeFile(io.RawIOBase):
    """``repo``'s ``filename`` at ``revision`` as a seekable, read-only file of ``size`` bytes."""

    def __init__(self, repo: str, filename: str, *, revision: str | None, size: int,
                 token: str | bool | None = None, keep: Path | None = None) -> None:
        from huggingface_hub import hf_hub_url

        self.url = hf_hub_url(repo, filename, revision=revision)
        self.size, self.token, self.pos, self.fetched = size, token, 0, 0
        self.name = f"{repo}/{filename}"
        # ``keep``: where the bytes read from the start are kept (by the file's sha256), so a second choice asks
        # the Hub nothing
        self.keep = keep
        self.prefix = b""
        if keep is not None:
            with contextlib.suppress(OSError):
                self.prefix = keep.read_bytes()[:size]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(base + offset, 0)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        if self.pos + want <= len(self.prefix):
            data = self.prefix[self.pos:self.pos + want]
        else:
            data = self._get(self.pos, self.pos + max(want, CHUNK) - 1)
            if self.pos == len(self.prefix):  # read on from the kept bytes: keep these too
                self.prefix += data
            data = data[:want]
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def _get(self, start: int, end: int) -> bytes:
        from huggingface_hub import get_session
        from huggingface_hub.utils import (  # type: ignore[attr-defined]  # public, documented
            build_hf_headers,
            hf_raise_for_status,
        )

        if self.fetched > MAX_HEADER:
            raise GGUFFormatError(f"{self.name}: no end of the header in its first {MAX_HEADER >> 20} MiB")
        headers = {**build_hf_headers(token=self.token), "Range": f"bytes={start}-{min(end, self.size - 1)}"}
        response = get_session().get(self.url, headers=headers, timeout=TIMEOUT, follow_redirects=True)
        hf_raise_for_status(response)
        body = response.content
        if response.status_code == 200:  # the server ignored the range: the whole file came (take our part)
            body = body[start:end + 1]
        self.fetched += len(body)
        return bytes(body)


    def save(self) -> None:
        """Keep the bytes read from the start (written whole, then renamed: a reader never sees half)."""
        if self.keep is None or not self.prefix:
            return
        with contextlib.suppress(OSError):
            self.keep.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.keep.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(self.prefix)
            os.replace(tmp, self.keep)


def kept(sha256: str | None) -> Path | None:
    """Where the first bytes of the Hub file with this content hash are kept (``<home>/gguf-headers/``)."""
    if not sha256 or not all(c in "0123456789abcdef" for c in sha256.lower()):
        return None
    return paths.home() / "gguf-headers" / f"{sha256.lower()}.bin"


def read_remote_table(repo: str, filename: str, *, revision: str | None, size: int,
                      token: str | bool | None = None, sha256: str | None = None) -> tuple[GGUFHeader, list[TensorInfo]]:
    """The header and tensor table of a GGUF file on the Hub, by range reads, the bytes kept by the file's
    ``sha256`` for the next time (ModelNotFoundError when the Hub cannot be asked or refuses; GGUFFormatError for
    a file that is not GGUF)."""
    f = RangeFile(repo, filename, revision=revision, size=size, token=token, keep=kept(sha256))
    try:
        table = read_table(f, size, f.name)  # type: ignore[arg-type]
    except (GGUFFormatError, ModelNotFoundError):
        raise
    except Exception as exc:  # the Hub's errors (HTTP, network): the choice cannot be made from here
        raise ModelNotFoundError(f"could not read the header of {f.name} from the Hub: {exc}") from exc
    f.save()
    return table
