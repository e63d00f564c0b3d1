"""A local, Hugging Face Hub-compatible HTTP endpoint for offline tests, and the real GGUF files it serves.

It implements what ``huggingface_hub`` 2.4.0 calls for ``HfApi().model_info(files_metadata=True)`` and
``hf_hub_download`` (read from its source):

* ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{rev}``: JSON with ``sha`` and ``siblings``
  (``rfilename``, ``size``, ``blobId``, ``lfs {size, sha256, pointerSize}``).
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``, ``X-Linked-Size``,
  ``Content-Length``, ``Accept-Ranges``; ``Range: bytes=N-`` answers 206 with ``Content-Range`` (resume).
* Errors as the Hub sends them: 401 + ``X-Error-Code: RepoNotFound`` for a missing (or private, without the right
  token) repo, 404 + ``RevisionNotFound`` / ``EntryNotFound``.

No ``X-Xet-*`` headers and no ``Link: ...xet-auth`` are ever sent, so downloads take the plain HTTP path.

Fault injection: ``drop_once`` (a ``(repo, path)`` set): the first full GET of that file sends the headers and half
of the body, then drops the connection (huggingface_hub resumes with a Range request). ``truncate_always``: every GET
of that file claims and sends only half of it (a download that can never complete).

The served files are real GGUFs made from the SmolLM2 test model with the real ``llama-quantize`` and
``llama-gguf-split``; they are cached under ``<home>/test-fixtures/hf-endpoint/`` (see :func:`ensure_fixture_files`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from gguf_provider.runtime._common import paths
from scripts.test_models import ensure
from tests.support.tools import tool_path

# --- fixture files ---------------------------------------------------------------------------------------------

QUANTS = ("Q4_K_M", "IQ4_XS", "Q8_0", "Q2_K", "Q6_K", "F16")
SPLIT_MAX_TENSORS = 100  # SmolLM2 has 272 tensors -> 3 shards


def fixtures_dir() -> Path:
    return paths.home() / "test-fixtures" / "hf-endpoint"


@dataclass(frozen=True)
class FixtureFiles:
    source: Path  # the original SmolLM2-135M-Instruct.Q4_1.gguf
    quants: dict[str, Path]  # quant -> real requantized file
    split: tuple[Path, ...]  # real split of the source, shard 1 first


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}); see {log}")


def _need_tool(name: str) -> Path:
    path = tool_path(name)
    if path is None:
        raise RuntimeError(f"{name} not found (build llama.cpp's {name} target first)")
    return path


def ensure_fixture_files() -> FixtureFiles:
    """Make (once) the quant variants and the split set; a second call regenerates nothing."""
    source = ensure("smollm2")
    out = fixtures_dir()
    out.mkdir(parents=True, exist_ok=True)
    quants: dict[str, Path] = {}
    for quant in QUANTS:
        target = out / f"SmolLM2-135M-Instruct-{quant}.gguf"
        if not target.is_file():
            tmp = target.with_name(target.name + ".tmp")
            _run(
                [str(_need_tool("llama-quantize")), "--allow-requantize", str(source), str(tmp), quant,
                 str(os.cpu_count() or 2)],
                out / f"quantize-{quant}.log",
            )
            os.replace(tmp, target)
        quants[quant] = target
    split_dir = out / "split"
    done = split_dir / "done.json"
    if not done.is_file():
        split_dir.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            prefix = Path(tmp) / "SmolLM2-135M-Instruct-Q4_1"
            _run(
                [str(_need_tool("llama-gguf-split")), "--split", "--split-max-tensors", str(SPLIT_MAX_TENSORS),
                 str(source), str(prefix)],
                out / "split.log",
            )
            names = sorted(p.name for p in Path(tmp).glob("*.gguf"))
            if len(names) < 2:
                raise RuntimeError(f"llama-gguf-split made {names}, expected several shards")
            for name in names:
                os.replace(Path(tmp) / name, split_dir / name)
        done.write_text(json.dumps(names))
    names = json.loads(done.read_text())
    return FixtureFiles(source, quants, tuple(split_dir / n for n in names))


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered in a ``.sha256`` sidecar keyed on size + mtime."""
    st = path.stat()
    marker = path.with_name(path.name + ".sha256")
    try:
        sha, size, mtime = marker.read_text().split()
        if int(size) == st.st_size and int(mtime) == st.st_mtime_ns:
            return sha
    except (OSError, ValueError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    sha = h.hexdigest()
    try:
        marker.write_text(f"{sha} {st.st_size} {st.st_mtime_ns}\n")
    except OSError:
        pass
    return sha


# --- the endpoint ----------------------------------------------------------------------------------------------


@dataclass
class RepoFile:
    rfilename: str
    source: Path | bytes
    size: int
    sha256: str  # content sha256 (the Hub's LFS oid and ETag for LFS files)
    git_sha1: str  # git blob id
    lfs: bool

    def open_range(self, start: int, end: int) -> Iterator[bytes]:
        if isinstance(self.source, bytes):
            yield self.source[start : end + 1]
            return
        with open(self.source, "rb") as f:
            f.seek(start)
            left = end + 1 - start
            while left > 0:
                block = f.read(min(1 << 20, left))
                if not block:
                    return
                left -= len(block)
                yield block


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, RepoFile]
    commit: str
    token: str | None = None  # a private repo: only this bearer token sees it


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class HFEndpoint:
    """``with HFEndpoint() as hub: hub.add_repo(...); hub.url``"""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    drop_once: set[tuple[str, str]] = field(default_factory=set)
    truncate_always: set[tuple[str, str]] = field(default_factory=set)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_repo(self, repo_id: str, files: dict[str, Path | bytes], token: str | None = None) -> FakeRepo:
        entries: dict[str, RepoFile] = {}
        for name, src in files.items():
            if isinstance(src, bytes):
                entries[name] = RepoFile(name, src, len(src), hashlib.sha256(src).hexdigest(),
                                         _git_blob_sha1(src), lfs=False)
            else:
                sha = file_sha256(src)
                # a git-lfs pointer's blob id stands in for the git sha1 of an LFS file
                entries[name] = RepoFile(name, src, src.stat().st_size, sha, hashlib.sha1(sha.encode()).hexdigest(),
                                         lfs=True)
        commit = hashlib.sha1(
            json.dumps([repo_id, sorted((n, e.sha256) for n, e in entries.items())]).encode()
        ).hexdigest()
        repo = FakeRepo(repo_id, entries, commit, token)
        self.repos[repo_id] = repo
        return repo

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> HFEndpoint:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hf-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HFEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def downloads_of(self, repo_id: str, path: str) -> list[Request]:
        suffix = f"/{repo_id}/resolve/"
        return [r for r in self.requests if r.method == "GET" and suffix in r.path and r.path.endswith("/" + path)]


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?/?$")


class _Handler(BaseHTTPRequestHandler):
    hub: HFEndpoint
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    # -- helpers --
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return None
        if repo.token is not None and self.headers.get("authorization") != f"Bearer {repo.token}":
            return None
        return repo

    def _repo_not_found(self) -> None:
        self._error(401, "RepoNotFound", "Repository not found")

    # -- verbs --
    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.record(Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        try:
            if m := _API.match(path):
                self._model_info(m["repo"], m["rev"])
            elif m := _RESOLVE.match(path):
                self._resolve(m["repo"], m["rev"], m["path"])
            else:
                self._error(404, "NotFound", f"no route for {path}")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _model_info(self, repo_id: str, rev: str | None) -> None:
        repo = self._repo(repo_id)
        if repo is None or self.command != "GET":
            return self._repo_not_found()
        if rev not in (None, "main", repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        siblings = []
        for f in repo.files.values():
            entry: dict[str, object] = {"rfilename": f.rfilename, "size": f.size, "blobId": f.git_sha1}
            if f.lfs:
                entry["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            siblings.append(entry)
        body = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": repo.commit,
            "lastModified": "2026-11-01T00:00:00.000Z",
            "private": repo.token is not None,
            "gated": False,
            "disabled": False,
            "tags": ["gguf"],
            "library_name": "gguf",
            "siblings": siblings,
        }
        self._send(200, json.dumps(body).encode())

    def _resolve(self, repo_id: str, rev: str, rel: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return self._repo_not_found()
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        f = repo.files.get(rel)
        if f is None:
            return self._error(404, "EntryNotFound", f"{rel} does not exist on main",
                               {"X-Repo-Commit": repo.commit})
        etag = f.sha256 if f.lfs else f.git_sha1
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if f.lfs:
            headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(f.size)}
        start, end, status = 0, f.size - 1, 200
        rng = self.headers.get("Range")
        if rng and (m := re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())):
            start = int(m[1])
            end = min(int(m[2]), f.size - 1) if m[2] else f.size - 1
            if start >= f.size:
                return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        key = (repo_id, rel)
        length = end + 1 - start
        drop = False
        if self.command == "GET" and key in self.hub.truncate_always:
            end = start + length // 2 - 1
            length = end + 1 - start
            headers.pop("Content-Range", None)
        elif self.command == "GET" and status == 200 and key in self.hub.drop_once:
            self.hub.drop_once.discard(key)
            drop = True
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        stop_at = start + length // 2 if drop else end + 1
        sent = start
        for block in f.open_range(start, stop_at - 1):
            self.wfile.write(block)
            sent += len(block)
        self.wfile.flush()
        if drop:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
