"""A local stand-in for the part of GitHub's releases API that the prebuilt install uses, and archives laid out as
llama.cpp's release workflow packs them, built from our own llama-server.

``ReleasesServer`` answers ``GET /repos/ggml-org/llama.cpp/releases/tags/<tag>`` with assets carrying
``digest: "sha256:..."`` and ``browser_download_url``; ``/download/<tag>/<name>`` redirects (302) to
``/files/<name>``, which serves the bytes. ``status`` makes the API answer a rate limit (403 with
``x-ratelimit-remaining: 0``, 422, 429) instead; ``corrupt`` serves an asset with one byte changed while the API
still publishes the good digest; ``stall`` holds a download halfway until it is set. Every request is recorded
with its headers.

``build_archive`` packs files as ``llama-<tag>-bin-ubuntu-x64.tar.gz`` does: everything under one top directory
``llama-<tag>/`` (release.yml: ``tar -czvf ... --transform "s,^\\.,llama-<tag>," -C ./build/bin .``), with the
shared libraries beside the binaries.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = "ggml-org/llama.cpp"
SYSTEM_LIBS = ("linux-vdso", "libc.so", "libm.so", "libdl.so", "librt.so", "libpthread.so", "ld-linux")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class ReleasesServer:
    tag: str
    files: dict[str, bytes]  # asset name → bytes
    digests: dict[str, str | None] = field(default_factory=dict)  # override a published digest (None: none)
    status: int | None = None  # answer the release lookup with this HTTP status instead
    corrupt: set[str] = field(default_factory=set)
    requests: list[Request] = field(default_factory=list)
    # Set: an asset's download sends half its bytes, then waits for the event (a download to interrupt).
    stall: threading.Event | None = None
    # More releases: tag → their assets; `GET /repos/.../releases` lists every tag, the highest build number first
    more: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                server.requests.append(Request("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                server._answer(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def api_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith("/repos/")]

    def tags(self) -> list[str]:
        return sorted([self.tag, *self.more], key=lambda t: int(t.lstrip("b")), reverse=True)

    def release_json(self, tag: str | None = None) -> dict[str, Any]:
        tag = tag or self.tag
        files = self.files if tag == self.tag else self.more[tag]
        assets = []
        for i, (name, data) in enumerate(files.items()):
            digest = self.digests.get(name, "sha256:" + hashlib.sha256(data).hexdigest())
            assets.append({"id": i + 1, "name": name, "size": len(data), "digest": digest,
                           "content_type": "application/gzip", "state": "uploaded",
                           "url": f"{self.base_url}/repos/{REPO}/releases/assets/{i + 1}",
                           "browser_download_url": f"{self.base_url}/download/{tag}/{name}"})
        return {"tag_name": tag, "name": tag, "draft": False, "prerelease": False, "assets": assets}

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?")[0]
        if path == f"/repos/{REPO}/releases/tags/{self.tag}" and self.status:
            messages = {403: "API rate limit exceeded for 127.0.0.1. (But here's the good news: Authenticated "
                             "requests get a higher rate limit.)",
                        422: "Validation Failed", 429: "You have exceeded a secondary rate limit."}
            headers = {"x-ratelimit-remaining": "0"} if self.status == 403 else {"retry-after": "60"}
            self._send(h, self.status, json.dumps({"message": messages.get(self.status, "error")}).encode(),
                       "application/json", headers)
        elif (m := re.fullmatch(rf"/repos/{REPO}/releases/tags/([^/]+)", path)) and m.group(1) in self.tags():
            self._send(h, 200, json.dumps(self.release_json(m.group(1))).encode(), "application/json")
        elif path == f"/repos/{REPO}/releases":
            body = [self.release_json(t) for t in self.tags()]
            self._send(h, 200, json.dumps(body).encode(), "application/json")
        elif m := re.fullmatch(r"/download/(b\d+)/([^/]+)", path):
            self._send(h, 302, b"", "text/plain", {"Location": f"/files/{m.group(2)}"})
        elif (m := re.fullmatch(r"/files/([^/]+)", path)) and m.group(1) in self._all_files():
            data = self._all_files()[m.group(1)]
            if m.group(1) in self.corrupt:
                data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
            if self.stall is not None:
                self._send_stalled(h, data, self.stall)
            else:
                self._send(h, 200, data, "application/octet-stream")
        else:
            self._send(h, 404, json.dumps({"message": "Not Found"}).encode(), "application/json")

    def _all_files(self) -> dict[str, bytes]:
        return {k: v for files in (self.files, *self.more.values()) for k, v in files.items()}

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str,
              headers: dict[str, str] | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        try:
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


    @staticmethod
    def _send_stalled(h: BaseHTTPRequestHandler, body: bytes, stall: threading.Event) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        try:
            h.wfile.write(body[:len(body) // 2])
            h.wfile.flush()
            stall.wait(120)
            h.wfile.write(body[len(body) // 2:])
        except (BrokenPipeError, ConnectionResetError):
            pass


def shared_libs(binary: Path) -> list[Path]:
    """The shared libraries ``binary`` loads (``ldd``) that are not glibc itself: they go beside it, as upstream's
    libllama/libggml do."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"=>\s*(/\S+)", line)
        if m and not any(s in line.split("=>")[0] for s in SYSTEM_LIBS):
            libs.append(Path(m.group(1)))
    return libs


def build_archive(bin_dir: Path, tag: str, *, server: bytes | None = None, extra: dict[str, bytes] | None = None,
                  level: int = 1) -> bytes:
    """``llama-<tag>-bin-ubuntu-x64.tar.gz`` from our built binaries in ``bin_dir`` and their shared libraries.

    ``server`` replaces llama-server's bytes (a truncated binary, a script); ``extra`` adds executables (name →
    bytes) beside it."""
    top = f"llama-{tag}"
    buf = io.BytesIO()
    real_server = bin_dir / "llama-server"
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=level) as tar:
        dir_info = tarfile.TarInfo(top)
        dir_info.type, dir_info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(dir_info)

        def add_bytes(name: str, data: bytes, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for name in ("llama-server", "ggml-rpc-server", "llama-gguf-split", "llama-quantize"):
            path = bin_dir / name
            if name == "llama-server" and server is not None:
                add_bytes(name, server)
            elif path.is_file():
                tar.add(str(path), f"{top}/{name}")
        for lib in shared_libs(real_server):
            tar.add(str(lib.resolve()), f"{top}/{lib.name}")
            stem = lib.name.split(".so")[0] + ".so"
            if stem != lib.name:  # the unversioned name as a link inside the directory, as shared-lib builds have
                link = tarfile.TarInfo(f"{top}/{stem}")
                link.type, link.linkname = tarfile.SYMTYPE, lib.name
                tar.addfile(link)
        for name, data in (extra or {}).items():
            add_bytes(name, data)
        add_bytes("LICENSE", b"MIT License (llama.cpp)\n", 0o644)
    return buf.getvalue()


def asset_name(tag: str) -> str:
    return f"llama-{tag}-bin-ubuntu-x64.tar.gz"


def other_assets(tag: str) -> dict[str, bytes]:
    """Archives for other hosts, as a real release lists them (tiny placeholders: never the host's choice)."""
    names = [f"llama-{tag}-bin-{s}" for s in ("macos-arm64.tar.gz", "ubuntu-arm64.tar.gz", "win-cpu-x64.zip",
                                               "ubuntu-vulkan-x64.tar.gz")]
    return {n: b"not for this host" for n in names}


def env_without_build_tools(tmp: Path) -> dict[str, str]:
    """PATH reduced to an empty directory: no cmake, ninja, cc, c++, gcc or llama-server can run from it."""
    empty = tmp / "empty-path"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH", "GITHUB_TOKEN", "GH_TOKEN")}
    env["PATH"] = str(empty)
    return env
