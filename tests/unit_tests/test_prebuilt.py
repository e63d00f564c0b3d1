"""The prebuilt install, offline: host → asset mapping, the releases API's answers (through httpx.MockTransport),
the digest check, safe extraction, the smoke run's verdicts on fake binaries, the markers, the order and fallback of
``install.install`` (its steps replaced), and the install on first use. The real archive, served by a local
releases API and run for real, is tested in tests/integration_tests/test_prebuilt_install.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gguf_provider.errors import BinaryNotFoundError, BuildError, PrebuiltInstallError
from gguf_provider.runtime._common import paths
from gguf_provider.runtime._install import discovery, install, installed, prebuilt
from gguf_provider.runtime._install.prebuilt import Asset, Host, Release

TAG = "b11312"
# The names release.yml gives a release's archives (b11312's set).
UPSTREAM = [f"llama-{TAG}-bin-{s}" for s in (
    "macos-arm64.tar.gz", "macos-x64.tar.gz", "ubuntu-x64.tar.gz", "ubuntu-arm64.tar.gz", "ubuntu-s390x.tar.gz",
    "ubuntu-vulkan-x64.tar.gz", "ubuntu-vulkan-arm64.tar.gz", "ubuntu-rocm-7.2-x64.tar.gz",
    "ubuntu-openvino-2026.0-x64.tar.gz", "android-arm64.tar.gz", "win-cpu-x64.zip", "win-cpu-arm64.zip",
    "win-cuda-12.4-x64.zip", "win-cuda-13.3-x64.zip", "win-vulkan-x64.zip", "win-hip-radeon-x64.zip")] + [
    "cudart-llama-bin-win-cuda-12.4-x64.zip", "cudart-llama-bin-win-cuda-13.3-x64.zip", f"llama-{TAG}-xcframework.zip"]
RELEASE = Release(TAG, tuple(Asset(n, f"https://example.invalid/{n}", 1, "0" * 64) for n in UPSTREAM))


@pytest.mark.parametrize(("system", "arch", "backend", "expected"), [
    ("linux", "x64", "cpu", "ubuntu-x64.tar.gz"),
    ("linux", "arm64", "cpu", "ubuntu-arm64.tar.gz"),
    ("linux", "s390x", "cpu", "ubuntu-s390x.tar.gz"),
    ("linux", "x64", "vulkan", "ubuntu-vulkan-x64.tar.gz"),
    ("linux", "arm64", "vulkan", "ubuntu-vulkan-arm64.tar.gz"),
    ("linux", "x64", "cuda", None),  # upstream publishes no Linux CUDA archive: the source build
    ("linux", "x64", "metal", None),
    ("darwin", "arm64", "metal", "macos-arm64.tar.gz"),
    ("darwin", "arm64", "cpu", "macos-arm64.tar.gz"),
    ("darwin", "x64", "cpu", "macos-x64.tar.gz"),
    ("darwin", "x64", "metal", None),  # the x64 archive is built with Metal off
    ("windows", "x64", "cpu", "win-cpu-x64.zip"),
    ("windows", "arm64", "cpu", "win-cpu-arm64.zip"),
    ("windows", "x64", "vulkan", "win-vulkan-x64.zip"),
    ("windows", "x64", "cuda", "win-cuda-12.4-x64.zip"),  # the driver's CUDA unknown: the oldest toolkit
    ("freebsd14", "x64", "cpu", None),
])
def test_host_to_asset(system: str, arch: str, backend: str, expected: str | None) -> None:
    host = Host(system, arch, backend)
    if expected is None:
        assert prebuilt.asset_pattern(host, TAG) is None
        with pytest.raises(PrebuiltInstallError) as err:
            prebuilt.choose_assets(RELEASE, host)
        assert err.value.reason == "no-asset" and host.describe() in str(err.value)
        return
    chosen = prebuilt.choose_assets(RELEASE, host)
    assert chosen[0].name == f"llama-{TAG}-bin-{expected}"


@pytest.mark.parametrize(("driver", "cuda"), [((12, 8), "12.4"), ((13, 0), "13.3"), ((14, 1), "13.3"),
                                              ((11, 8), "12.4")])
def test_windows_cuda_takes_the_newest_toolkit_the_driver_runs_and_its_runtime(driver: tuple[int, int],
                                                                             cuda: str) -> None:
    chosen = prebuilt.choose_assets(RELEASE, Host("windows", "x64", "cuda"), driver)
    assert [a.name for a in chosen] == [f"llama-{TAG}-bin-win-cuda-{cuda}-x64.zip",
                                        f"cudart-llama-bin-win-cuda-{cuda}-x64.zip"]


def test_a_release_without_this_hosts_archive_is_no_asset() -> None:
    release = Release(TAG, tuple(a for a in RELEASE.assets if "ubuntu-x64" not in a.name))
    with pytest.raises(PrebuiltInstallError, match="publishes no archive for Linux x64 cpu") as err:
        prebuilt.choose_assets(release, Host("linux", "x64", "cpu"))
    assert err.value.reason == "no-asset" and "ubuntu-arm64" in str(err.value)  # it lists what there is


def test_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prebuilt.platform, "machine", lambda: "AMD64")
    monkeypatch.setattr(prebuilt.sys, "platform", "win32")
    assert prebuilt.this_host("cpu") == Host("windows", "x64", "cpu")
    monkeypatch.setattr(prebuilt.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(prebuilt.sys, "platform", "linux")
    assert prebuilt.this_host("vulkan") == Host("linux", "arm64", "vulkan")


# --- the releases API ------------------------------------------------------------------------------------------


def _release_json(data: bytes, name: str = f"llama-{TAG}-bin-ubuntu-x64.tar.gz",
                  digest: str | None = "auto", url: str | None = None) -> dict[str, Any]:
    asset: dict[str, Any] = {"name": name, "size": len(data),
                             "browser_download_url": url or f"/download/{TAG}/{name}"}
    if digest is not None:
        asset["digest"] = "sha256:" + hashlib.sha256(data).hexdigest() if digest == "auto" else digest
    return {"tag_name": TAG, "assets": [asset]}


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler), follow_redirects=True)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> str:
    base = "http://mirror.test/api"
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_RELEASES_URL", base + "/")
    for var in ("GITHUB_TOKEN", "GH_TOKEN", "GGUF_PROVIDER_LLAMA_TAG"):
        monkeypatch.delenv(var, raising=False)
    return base


def test_release_by_tag_with_digests_and_relative_urls(api: str) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json=_release_json(b"abc"))

    release = prebuilt.fetch_release(_client(handler), TAG)
    assert str(seen[0].url) == f"{api}/repos/ggml-org/llama.cpp/releases/tags/{TAG}"
    assert seen[0].headers["accept"] == "application/vnd.github+json" and "authorization" not in seen[0].headers
    (asset,) = release.assets
    assert asset.digest == hashlib.sha256(b"abc").hexdigest() and asset.size == 3
    assert asset.url == f"http://mirror.test/download/{TAG}/{asset.name}"  # relative to the API answer


@pytest.mark.parametrize("digest", [None, "md5:abc", "sha256:xyz", ""])
def test_an_asset_without_a_usable_sha256_has_no_digest(api: str, digest: str) -> None:
    release = prebuilt.fetch_release(_client(lambda r: httpx.Response(200, json=_release_json(b"a", digest=digest))),
                                     TAG)
    assert release.assets[0].digest == ""


@pytest.mark.parametrize(("status", "headers", "body", "reason", "words"), [
    (403, {"x-ratelimit-remaining": "0"}, {"message": "API rate limit exceeded for 10.0.0.1."}, "rate-limit",
     ["HTTP 403", "API rate limit exceeded", "GITHUB_TOKEN"]),
    (429, {"retry-after": "60"}, {"message": "secondary rate limit"}, "rate-limit", ["HTTP 429", "GITHUB_TOKEN"]),
    (422, {}, {"message": "Validation Failed"}, "http", ["HTTP 422", "Validation Failed"]),
    (404, {}, {"message": "Not Found"}, "http", ["HTTP 404", "Not Found"]),
    (403, {}, {"message": "Resource not accessible"}, "http", ["HTTP 403", "GITHUB_TOKEN"]),
    (502, {}, None, "http", ["HTTP 502"]),
])
def test_api_errors_are_typed_with_one_line(api: str, status: int, headers: dict[str, str], body: Any, reason: str,
                                           words: list[str]) -> None:
    answer = httpx.Response(status, headers=headers, json=body) if body else httpx.Response(status, text="")
    with pytest.raises(PrebuiltInstallError) as err:
        prebuilt.fetch_release(_client(lambda r: answer), TAG)
    assert err.value.reason == reason and "\n" not in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_no_network_is_a_network_reason(api: str) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno -2] Name or service not known", request=req)

    with pytest.raises(PrebuiltInstallError, match="could not reach http://mirror.test/api .no network or DNS") as err:
        prebuilt.fetch_release(_client(handler), TAG)
    assert err.value.reason == "network"


def test_a_resolver_that_never_answers_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import threading

    answer = threading.Event()

    def stalled(*a: Any, **k: Any) -> None:  # answers only once the check has given up (or after 60 s)
        answer.wait(60)

    monkeypatch.setattr(prebuilt.socket, "getaddrinfo", stalled)
    try:
        with pytest.raises(PrebuiltInstallError, match="api.github.com did not resolve within 0 s") as err:
            prebuilt.check_dns("https://api.github.com", timeout=0.2)
        assert err.value.reason == "network"  # given up on while the resolver had not answered
    finally:
        answer.set()

    def fail(*a: Any, **k: Any) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(prebuilt.socket, "getaddrinfo", fail)
    with pytest.raises(PrebuiltInstallError, match=r"no network or DNS: \[Errno -2\] Name or service not known"):
        prebuilt.check_dns("https://api.github.com")


@pytest.mark.parametrize("var", ["GITHUB_TOKEN", "GH_TOKEN"])
def test_the_token_goes_to_the_api_origin_only(api: str, monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    monkeypatch.setenv(var, "tok-123")
    assert prebuilt._headers(f"{api}/repos/x")["Authorization"] == "Bearer tok-123"
    assert prebuilt._headers("http://mirror.test/download/x")["Authorization"] == "Bearer tok-123"  # same origin
    assert "Authorization" not in prebuilt._headers("https://objects.githubusercontent.com/x")
    assert "Authorization" not in prebuilt._headers("https://mirror.test/api/x")  # another scheme: another origin


def test_the_rate_limit_hint_is_left_out_with_a_token(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "tok")
    answer = httpx.Response(403, headers={"x-ratelimit-remaining": "0"}, json={"message": "API rate limit exceeded"})
    with pytest.raises(PrebuiltInstallError) as err:
        prebuilt.fetch_release(_client(lambda r: answer), TAG)
    assert err.value.reason == "rate-limit" and "GITHUB_TOKEN" not in str(err.value)


def test_tag_and_api_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GGUF_PROVIDER_LLAMA_TAG", raising=False)
    monkeypatch.delenv("GGUF_PROVIDER_LLAMA_RELEASES_URL", raising=False)
    assert prebuilt.release_tag() == prebuilt.PINNED_TAG == "b11312"
    assert prebuilt.api_base() == "https://api.github.com"
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_TAG", "b9999")
    assert prebuilt.release_tag() == "b9999"


# --- download and digest -----------------------------------------------------------------------------------------


def _asset(data: bytes, digest: str | None = None, size: int | None = None) -> Asset:
    return Asset("llama-b1-bin-ubuntu-x64.tar.gz", "http://mirror.test/d/a.tar.gz",
                 len(data) if size is None else size, hashlib.sha256(data).hexdigest() if digest is None else digest)


def test_download_verifies_the_digest_and_reports_bytes(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    reports: list[tuple[str, int, int, str]] = []
    path = prebuilt.download(_client(lambda r: httpx.Response(200, content=data)), _asset(data), tmp_path,
                             lambda stage, done, total, detail="": reports.append((stage, done, total, detail)))
    assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == [path.name]
    assert reports[-1] == ("download", len(data), len(data), path.name)
    assert all(r[0] == "download" for r in reports) and len(reports) >= 3


def test_a_digest_mismatch_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    data = b"x" * 1000
    with pytest.raises(PrebuiltInstallError, match="refusing to install it") as err:
        prebuilt.download(_client(lambda r: httpx.Response(200, content=data)), _asset(data, digest="ab" * 32),
                          tmp_path)
    assert err.value.reason == "digest" and list(tmp_path.iterdir()) == []


def test_a_short_download_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    data = b"x" * 1000
    with pytest.raises(PrebuiltInstallError, match="got 1000 bytes, the release lists 2000"):
        prebuilt.download(_client(lambda r: httpx.Response(200, content=data)), _asset(data, size=2000), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_broken_connection_leaves_no_partial_file(tmp_path: Path) -> None:
    class Broken(httpx.SyncByteStream):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield b"x" * 100
            raise httpx.ReadError("connection reset")

    with pytest.raises(PrebuiltInstallError, match="connection reset") as err:
        prebuilt.download(_client(lambda r: httpx.Response(200, stream=Broken())), _asset(b"x" * 200), tmp_path)
    assert err.value.reason == "network" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("status", "reason"), [(403, "rate-limit"), (404, "http"), (500, "http")])
def test_a_download_answered_with_an_error_is_typed(api: str, tmp_path: Path, status: int, reason: str) -> None:
    answer = httpx.Response(status, headers={"x-ratelimit-remaining": "0"}, json={"message": "API rate limit exceeded"})
    with pytest.raises(PrebuiltInstallError, match=f"the download of .* answered HTTP {status}") as err:
        prebuilt.download(_client(lambda r: answer), _asset(b"x"), tmp_path)
    assert err.value.reason == reason and list(tmp_path.iterdir()) == []


def test_no_digest_means_no_download(tmp_path: Path) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may be fetched without a digest to check it against")

    with pytest.raises(PrebuiltInstallError, match="publishes no sha256") as err:
        prebuilt.download(_client(handler), _asset(b"x", digest=""), tmp_path)
    assert err.value.reason == "no-digest"


def test_the_download_follows_a_redirect(api: str, tmp_path: Path) -> None:
    data = b"archive bytes"

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.startswith("/d/"):
            return httpx.Response(302, headers={"Location": "http://cdn.test/blob"})
        return httpx.Response(200, content=data)

    assert prebuilt.download(_client(handler), _asset(data), tmp_path).read_bytes() == data


# --- safe extraction ---------------------------------------------------------------------------------------------


def _tar(tmp: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    path = tmp / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for e in entries:
            if isinstance(e, tuple):
                info = tarfile.TarInfo(e[0])
                info.size, info.mode = len(e[1]), 0o755
                tar.addfile(info, io.BytesIO(e[1]))
            else:
                tar.addfile(e)
    return path


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_extraction_keeps_the_layout_links_inside_and_exec_bits(tmp_path: Path) -> None:
    archive = _tar(tmp_path, [("llama-b1/llama-server", b"#!/bin/sh\n"), ("llama-b1/libllama.so.0", b"lib"),
                              _link("llama-b1/libllama.so", "libllama.so.0"),
                              _link("llama-b1/hard.so", "llama-b1/libllama.so.0", tarfile.LNKTYPE)])
    prebuilt.safe_extract(archive, tmp_path / "out")
    top = tmp_path / "out" / "llama-b1"
    assert os.readlink(top / "libllama.so") == "libllama.so.0" and (top / "hard.so").read_bytes() == b"lib"
    assert os.access(top / "llama-server", os.X_OK)
    assert prebuilt.server_dir(tmp_path / "out") == top


@pytest.mark.parametrize("entry", [
    ("../evil", b"x"), ("llama-b1/../../evil", b"x"), ("/tmp/evil-abs", b"x"),
    _link("llama-b1/passwd", "/etc/passwd"), _link("llama-b1/up", "../../etc"),
    _link("llama-b1/hard", "../outside", tarfile.LNKTYPE), _link("llama-b1/hard-abs", "/etc/passwd", tarfile.LNKTYPE),
    _link("llama-b1/dev", "", tarfile.CHRTYPE), _link("llama-b1/fifo", "", tarfile.FIFOTYPE),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink-absolute", "symlink-up", "hardlink-up", "hardlink-absolute",
        "device", "fifo"])
def test_extraction_refuses_escapes(tmp_path: Path, entry: tarfile.TarInfo | tuple[str, bytes]) -> None:
    archive = _tar(tmp_path, [("llama-b1/llama-server", b"x"), entry])
    with pytest.raises(PrebuiltInstallError, match="not safe to extract") as err:
        prebuilt.safe_extract(archive, tmp_path / "out" / "deep")
    assert err.value.reason == "archive"
    assert not list((tmp_path / "out" / "deep").iterdir())  # checked before anything is written
    assert not (tmp_path / "out" / "evil").exists() and not Path("/tmp/evil-abs").exists()


def test_a_corrupt_archive_is_an_archive_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(PrebuiltInstallError, match="could not be extracted") as err:
        prebuilt.safe_extract(bad, tmp_path / "out")
    assert err.value.reason == "archive"


def _zip(tmp: Path, entries: list[tuple[str, bytes, int]]) -> Path:
    path = tmp / "a.zip"
    with zipfile.ZipFile(path, "w") as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def test_zip_extraction(tmp_path: Path) -> None:
    archive = _zip(tmp_path, [("llama-server.exe", b"MZ", stat.S_IFREG | 0o755), ("ggml.dll", b"dll", 0),
                              ("link.dll", b"ggml.dll", stat.S_IFLNK | 0o777)])
    prebuilt.safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "ggml.dll").read_bytes() == b"dll" and os.access(tmp_path / "out" / "llama-server.exe",
                                                                                os.X_OK)
    assert os.readlink(tmp_path / "out" / "link.dll") == "ggml.dll"


@pytest.mark.parametrize("entry", [("../evil.dll", b"x", 0), ("C:/evil.dll", b"x", 0), ("..\\evil.dll", b"x", 0),
                                   ("up.dll", b"../../evil", stat.S_IFLNK | 0o777)])
def test_zip_extraction_refuses_escapes(tmp_path: Path, entry: tuple[str, bytes, int]) -> None:
    with pytest.raises(PrebuiltInstallError, match="not safe to extract"):
        prebuilt.safe_extract(_zip(tmp_path, [entry]), tmp_path / "out")
    assert not (tmp_path / "evil.dll").exists()


def test_server_dir_in_each_upstream_layout(tmp_path: Path) -> None:
    for layout in ("llama-b1/llama-server", "build/bin/llama-server", "llama-server"):
        root = tmp_path / layout.replace("/", "_")
        (root / layout).parent.mkdir(parents=True)
        (root / layout).write_text("x")
        assert prebuilt.server_dir(root) == (root / layout).parent
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrebuiltInstallError, match="has no llama-server"):
        prebuilt.server_dir(tmp_path / "empty")


# --- smoke run ---------------------------------------------------------------------------------------------------


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("body", "words"), [
    ("echo 'llama-server: error while loading shared libraries: libggml-cpu.so: cannot open shared object file' >&2; "
     "exit 127\n", ["exit code 127", "libggml-cpu.so"]),
    ("kill -ILL $$\n", ["SIGILL", "illegal instruction"]),
    ("kill -SEGV $$\n", ["SIGSEGV"]),
])
def test_smoke_version_says_why_a_binary_dies(tmp_path: Path, body: str, words: list[str]) -> None:
    with pytest.raises(PrebuiltInstallError) as err:
        prebuilt.smoke_version(_script(tmp_path / "llama-server", body))
    assert err.value.reason == "smoke"
    for w in words:
        assert w in str(err.value)


def test_a_truncated_binary_fails_the_smoke_run(tmp_path: Path) -> None:
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 60)
    server.chmod(0o755)
    with pytest.raises(PrebuiltInstallError, match="could not run") as err:
        prebuilt.smoke_version(server)
    assert err.value.reason == "smoke"


def test_smoke_version_reads_the_version_line(tmp_path: Path) -> None:
    server = _script(tmp_path / "llama-server", "echo 'version: 11312 (0c1e5709)' >&2\n")
    assert prebuilt.smoke_version(server) == "11312 (0c1e5709)"


def test_the_source_build_reads_its_version_the_same_way(tmp_path: Path) -> None:
    """The source build's `--version` check is the prebuilt one, as a BuildError naming the log, its version
    tagged with the source pin."""
    server = _script(tmp_path / "llama-server", "echo 'version: 1 (abc)' >&2\n")
    assert install.smoke_test(server, tmp_path / "build.log") == f"1 (abc) [{install.SOURCE_PIN}]"
    with pytest.raises(BuildError, match="killed by SIGILL") as err:
        install.smoke_test(_script(tmp_path / "llama-server", "kill -ILL $$\n"), tmp_path / "build.log")
    assert err.value.log_path == tmp_path / "build.log"


def test_smoke_start_reports_a_death_while_loading(tmp_path: Path) -> None:
    server = _script(tmp_path / "llama-server", "echo loading; kill -ILL $$\n")
    with pytest.raises(PrebuiltInstallError, match="died loading m.gguf: killed by SIGILL") as err:
        prebuilt.smoke_start(server, tmp_path / "m.gguf", tmp_path / "start.log")  # its own 120 s bound
    assert err.value.reason == "smoke"


def test_the_smoke_model_is_the_smallest_chat_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.gguf_bytes import gguf, string

    def write(path: Path, arch: str, pad: int) -> None:
        path.write_bytes(gguf(string("general.architecture", arch)) + b"\0" * pad)

    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("GGUF_PROVIDER_MODELS", str(models))
    assert prebuilt.smallest_model() is None
    write(models / "big.gguf", "llama", 4000)
    write(models / "small-embedder.gguf", "bert", 10)
    write(models / "mmproj-small.gguf", "clip", 10)
    write(models / "projector-by-header.gguf", "clip", 20)
    (models / "broken.gguf").write_bytes(b"GGUF")  # smaller still, but unreadable
    assert prebuilt.smallest_model() == models / "big.gguf"
    assert prebuilt.smallest_model(limit=100) is None


# --- markers and the order -----------------------------------------------------------------------------------------


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GGUF_PROVIDER_LLAMA_TAG", raising=False)
    return tmp_path / "home"


def _fake_install(target: Path, marker: dict[str, Any]) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    _script(target / "llama-server", "echo 'version: 1 (fake)'\n")
    (target / install.MARKER).write_text(json.dumps(marker))
    return target


def test_markers_record_the_origin_and_the_newest_install_wins(home: Path) -> None:
    src = _fake_install(install.install_dir("cpu"), {"backend": "cpu", "source": install.SOURCE_PIN,
                                                      "version": "x", "built_at": 100.0})
    assert install.installed("cpu").origin == "source"  # type: ignore[union-attr]
    pre = _fake_install(install.prebuilt_dir(TAG, "cpu"), {
        "origin": "prebuilt", "backend": "cpu", "tag": TAG, "asset": f"llama-{TAG}-bin-ubuntu-x64.tar.gz",
        "digest": "sha256:" + "ab" * 32, "commit": prebuilt.PINNED_COMMIT, "version": "y", "installed_at": 200.0})
    newest = install.installed("cpu")
    assert newest is not None and newest.bin_dir == pre and newest.origin == "prebuilt"
    assert newest.describe() == (f"prebuilt llama.cpp {TAG} (llama-{TAG}-bin-ubuntu-x64.tar.gz, sha256:{'ab' * 32}, "
                                 "commit 0c1e57098)")
    assert install.installed("cpu", origin="source").bin_dir == src  # type: ignore[union-attr]
    assert install.installed("cpu", origin="prebuilt", tag="b1") is None
    assert installed.backend_of(pre / "llama-server") == "cpu" and installed.backend_of(src / "llama-server") == "cpu"
    assert install.installed("vulkan") is None
    (pre / "llama-server").unlink()  # a marker without its binary is no installation
    assert install.installed("cpu").bin_dir == src  # type: ignore[union-attr]


def _recorder(calls: list[dict[str, Any]], result: Path) -> install.SourceBuild:
    def build(backend: str, **kwargs: Any) -> install.Installation:
        calls.append({"backend": backend, **kwargs})
        return install.Installation(backend, result, "source (fake)", fresh=True)

    return build


def test_auto_falls_back_to_the_source_build_with_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: Any, **k: Any) -> install.Installation:
        raise PrebuiltInstallError("the releases API answered HTTP 429: slow down", "rate-limit")

    monkeypatch.setattr(install, "install_prebuilt", fail)
    lines: list[str] = []
    calls: list[dict[str, Any]] = []
    inst = install.install("cpu", notify=lines.append, build_source=_recorder(calls, home / "src-build"))
    assert inst.version == "source (fake)" and len(calls) == 1 and calls[0]["backend"] == "cpu"
    assert lines == [f"prebuilt llama.cpp {TAG} not used (rate-limit): the releases API answered HTTP 429: slow "
                     f"down; building {install.SOURCE_PIN} from source instead (about 8 minutes on 2 cores)"]
    with pytest.raises(PrebuiltInstallError, match="HTTP 429"):
        install.install("cpu", method="prebuilt", build_source=_recorder(calls, home))
    assert len(calls) == 1  # --from prebuilt never builds


def test_auto_uses_an_existing_install_and_tries_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _fake_install(install.install_dir("cpu"), {"backend": "cpu", "version": "x"})
    for tool in install.TOOL_TARGETS:
        _script(target / install.TARGET_FILES.get(tool, tool), "exit 0\n")
    monkeypatch.setattr(install, "install_prebuilt", lambda *a, **k: pytest.fail("no download for an existing one"))
    calls: list[dict[str, Any]] = []
    inst = install.install("cpu", build_source=_recorder(calls, home))
    assert inst.bin_dir == install.install_dir("cpu") and not inst.fresh and calls == []


def test_a_source_install_without_rpc_server_gets_it_incrementally(home: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: an install from before GGML_RPC=ON gets rpc-server on the next `server install`, built in the same
    build dir (force=False keeps it: only what the new option changes is compiled)."""
    target = _fake_install(install.install_dir("cpu"), {"backend": "cpu", "version": "x"})
    for tool in ("llama-gguf-split", "llama-quantize", "llama"):
        _script(target / tool, "exit 0\n")
    assert install.missing_tools(install.installed("cpu")) == ["ggml-rpc-server"]  # type: ignore[arg-type]
    (target / "llama").unlink()  # and one from before the unified binary was built: both, in one build
    assert install.missing_tools(install.installed("cpu")) == ["ggml-rpc-server", "llama-app"]  # type: ignore[arg-type]
    monkeypatch.setattr(install, "install_prebuilt", lambda *a, **k: pytest.fail("not for an existing install"))
    lines: list[str] = []
    calls: list[dict[str, Any]] = []
    install.install("cpu", notify=lines.append, build_source=_recorder(calls, home))
    assert [(c["force"], c["cmake_args"]) for c in calls] == [(False, None)]
    assert lines == [f"adding ggml-rpc-server, llama-app to {target} (an incremental build in the existing build "
                     "dir)"]
    assert "-DGGML_RPC=ON" in install.configure_args(Path("/src"), Path("/build"), "cpu")


def test_the_source_build_leaves_out_ggml_amx_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """ggml's AMX kernels segfault at the first compute on Sapphire Rapids Xeons (seen on these machines; llama.cpp
    issue 20824): an x86 source build turns them off over -march=native, in C and C++ alike."""
    monkeypatch.setattr(install.platform, "machine", lambda: "x86_64")
    args = install.configure_args(Path("/src"), Path("/build"), "cpu")
    assert "-DGGML_NATIVE=ON" in args
    for lang in ("C", "CXX"):
        assert f"-DCMAKE_{lang}_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in args
    monkeypatch.setattr(install.platform, "machine", lambda: "aarch64")  # no AMX, and no such gcc flag
    assert not any("amx" in a for a in install.configure_args(Path("/src"), Path("/build"), "cpu"))


def test_a_source_install_built_with_amx_is_rebuilt_without_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An install whose marker lacks a configure flag of today's build (the AMX-off flags) is built again in its
    build dir on the next `server install`; one that has them all is reused, and a marker that records no flags is
    not second-guessed."""
    monkeypatch.setattr(install.platform, "machine", lambda: "x86_64")
    today = install.configure_args(Path("/src"), Path("/build"), "cpu")[1:]
    old = [a for a in today if "amx" not in a]
    target = _fake_install(install.install_dir("cpu"), {"backend": "cpu", "version": "x", "cmake_args": old})
    for tool in install.TOOL_TARGETS:
        _script(target / install.TARGET_FILES.get(tool, tool), "exit 0\n")
    inst = install.installed("cpu")
    assert inst is not None and install.outdated(inst) == (
        f"rebuilding {target} with -DCMAKE_C_FLAGS={install.NO_AMX_FLAGS} -DCMAKE_CXX_FLAGS={install.NO_AMX_FLAGS}")
    monkeypatch.setattr(install, "install_prebuilt", lambda *a, **k: pytest.fail("not for an existing install"))
    lines: list[str] = []
    calls: list[dict[str, Any]] = []
    install.install("cpu", notify=lines.append, build_source=_recorder(calls, home))
    assert [(c["force"], c["cmake_args"]) for c in calls] == [(False, None)]
    assert lines == [f"{install.outdated(inst)} (an incremental build in the existing build dir)"]
    for marker in ({"backend": "cpu", "version": "x", "cmake_args": today}, {"backend": "cpu", "version": "x"}):
        _fake_install(target, marker)
        assert install.outdated(install.installed("cpu")) is None  # type: ignore[arg-type]


def test_a_source_build_whose_kernels_crash_fails_its_start_check(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that runs --version but dies at the first compute (ggml's AMX kernels did, on Sapphire Rapids) is a
    BuildError naming the signal and a way out, before it gets a marker; with no model at hand there is no check."""
    server = _script(tmp_path / "llama-server", "echo 'load_tensors: AMX model buffer size = 52 MiB'; kill -SEGV $$\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(BuildError) as err:
        install.smoke_start(server, tmp_path / "start.log", model)
    assert "SIGSEGV" in str(err.value) and "m.gguf" in str(err.value) and "GGML_NATIVE=OFF" in str(err.value)
    assert err.value.log_path == tmp_path / "start.log"
    monkeypatch.setattr(prebuilt, "smallest_model", lambda: None)
    assert install.smoke_start(server, tmp_path / "start.log") is None


def test_prebuilt_reuses_only_its_own_tag(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_install(install.install_dir("cpu"), {"backend": "cpu", "version": "x"})  # a source build is not it
    tried: list[str] = []

    def fake_prebuilt(backend: str, tag: str, **k: Any) -> install.Installation:
        tried.append(tag)
        return install.Installation(backend, _fake_install(install.prebuilt_dir(tag, backend), {
            "origin": "prebuilt", "backend": backend, "tag": tag, "version": "p"}), "p", "prebuilt", fresh=True)

    monkeypatch.setattr(install, "install_prebuilt", fake_prebuilt)
    assert install.install("cpu", method="prebuilt").fresh and tried == [TAG]
    assert not install.install("cpu", method="prebuilt").fresh and tried == [TAG]  # now it is there
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_TAG", "b12000")
    assert install.install("cpu", method="prebuilt").origin == "prebuilt" and tried == [TAG, "b12000"]
    install.install("cpu", method="auto", force=True)
    assert tried == [TAG, "b12000", "b12000"]  # force: the archive again, not the existing one


def test_cmake_args_and_source_go_straight_to_the_build(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "install_prebuilt", lambda *a, **k: pytest.fail("not for a source build"))
    calls: list[dict[str, Any]] = []
    install.install("cpu", cmake_args=["-DX=1"], build_source=_recorder(calls, home))
    install.install("cpu", method="source", build_source=_recorder(calls, home))
    assert [c["cmake_args"] for c in calls] == [["-DX=1"], None]
    with pytest.raises(ValueError, match="source build only"):
        install.install("cpu", method="prebuilt", cmake_args=["-DX=1"])
    with pytest.raises(ValueError, match="method='binary'"):
        install.install("cpu", method="binary")


def test_install_prebuilt_moves_the_staged_dir_into_place(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Path] = {}

    def fake_stage(host: Host, tag: str, staging: Path, **k: Any) -> prebuilt.Staged:
        seen["staging"] = staging
        assert staging.parent == paths.bin_dir() and staging.name.startswith(".staging-")
        bin_dir = staging / "tree" / f"llama-{tag}"
        bin_dir.mkdir(parents=True)
        _script(bin_dir / "llama-server", "echo 'version: 2'\n")
        (bin_dir / "rpc-server").write_text("x")
        return prebuilt.Staged(bin_dir, {"origin": "prebuilt", "backend": host.backend, "tag": tag, "version": "2",
                                         "installed_at": 1.0})

    (paths.bin_dir() / ".staging-old").mkdir(parents=True)  # a killed install's leftovers
    monkeypatch.setattr(prebuilt, "stage", fake_stage)
    inst = install.install_prebuilt("cpu", TAG)
    assert inst.bin_dir == install.prebuilt_dir(TAG, "cpu") and inst.fresh and inst.origin == "prebuilt"
    assert (inst.bin_dir / "rpc-server").is_file()  # the tools come along with the server
    assert json.loads((inst.bin_dir / install.MARKER).read_text())["tag"] == TAG
    assert not seen["staging"].exists() and not list(paths.bin_dir().glob(".staging-*"))
    install.install_prebuilt("cpu", TAG)  # a reinstall replaces the directory
    assert [p.name for p in paths.bin_dir().iterdir()] == [f"llama.cpp-{TAG}-cpu"]


def test_a_failed_stage_leaves_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_stage(host: Host, tag: str, staging: Path, **k: Any) -> prebuilt.Staged:
        (staging / "download").mkdir()
        (staging / "download" / "a.tar.gz.part").write_bytes(b"half")
        raise PrebuiltInstallError("bad", "digest")

    monkeypatch.setattr(prebuilt, "stage", failing_stage)
    with pytest.raises(PrebuiltInstallError):
        install.install_prebuilt("cpu", TAG)
    assert list(paths.bin_dir().iterdir()) == []


def test_stage_refuses_a_host_without_an_archive_before_any_request(tmp_path: Path) -> None:
    client = _client(lambda r: pytest.fail("no request for a host upstream does not build for"))
    with pytest.raises(PrebuiltInstallError) as err:
        prebuilt.stage(Host("linux", "x64", "cuda"), TAG, tmp_path, client=client)
    assert err.value.reason == "no-asset"


# --- install on first use ------------------------------------------------------------------------------------------


@pytest.fixture
def nothing_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "userhome"))


@pytest.mark.parametrize(("value", "method"), [("1", "auto"), ("auto", "auto"), ("prebuilt", "prebuilt"),
                                               ("", "auto")])
def test_first_use_installs(nothing_found: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str], value: str, method: str) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_AUTO_INSTALL", value)
    asked: list[str] = []
    server = _script(tmp_path / "llama-server", "")

    def fake_install(backend: str = "auto", *, method: str = "auto", **k: Any) -> install.Installation:
        asked.append(method)
        return install.Installation("cpu", server.parent, "1")

    monkeypatch.setattr(install, "install", fake_install)
    with pytest.raises(BinaryNotFoundError, match="prebuilt archive in seconds"):
        discovery.find_llama_server()  # finding never installs, whatever the setting
    assert asked == [] and capsys.readouterr().err == ""
    assert install.ensure_installed() == server and asked == [method]
    assert f"no llama-server found: installing one now (from {method}" in capsys.readouterr().err
    with pytest.raises(BinaryNotFoundError):
        install.ensure_installed(auto_install=False)


def test_ensure_installed_finds_before_it_installs(nothing_found: None, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine").mkdir()
    server = _script(tmp_path / "mine" / "llama-server", "")
    monkeypatch.setattr(install, "install", lambda *a, **k: pytest.fail("found: nothing to install"))
    assert install.ensure_installed(server) == server
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_SERVER", str(server))
    assert install.ensure_installed() == server and capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["0", "off", "no"])
def test_first_use_install_can_be_turned_off(nothing_found: None, monkeypatch: pytest.MonkeyPatch,
                                             value: str) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_AUTO_INSTALL", value)
    monkeypatch.setattr(install, "install", lambda *a, **k: pytest.fail("turned off"))
    with pytest.raises(BinaryNotFoundError, match="prebuilt archive in seconds"):
        install.ensure_installed()
    monkeypatch.setenv("GGUF_PROVIDER_AUTO_INSTALL", "maybe")
    with pytest.raises(ValueError, match="GGUF_PROVIDER_AUTO_INSTALL"):
        install.ensure_installed()


def test_a_tag_is_a_release_latest_or_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GGUF_PROVIDER_LLAMA_TAG", raising=False)
    assert prebuilt.resolve_tag(None) == prebuilt.resolve_tag("pin") == prebuilt.PINNED_TAG
    assert prebuilt.resolve_tag("b12000") == "b12000"
    monkeypatch.setattr(prebuilt, "newest_tags", lambda count=5: ["b12345", "b12340"])
    assert prebuilt.resolve_tag("latest") == "b12345"
    with pytest.raises(ValueError, match="give a llama.cpp release tag such as b11312, 'latest' or 'pin'"):
        prebuilt.resolve_tag("v1.2")
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_SOURCE_URL", "http://mirror.local/")
    assert prebuilt.source_url("b12000") == "http://mirror.local/ggml-org/llama.cpp/archive/refs/tags/b12000.tar.gz"


def test_the_install_in_use_is_the_named_tag_else_the_pin_else_the_newest(home: Path) -> None:
    from gguf_provider.runtime._install import installed

    pin = _fake_install(install.install_dir("cpu"), {"backend": "cpu", "version": "x", "built_at": 100.0})
    newer = _fake_install(install.prebuilt_dir("b12000", "cpu"), {"backend": "cpu", "origin": "prebuilt", "version": "y",
                                                                   "tag": "b12000", "installed_at": 200.0})
    assert installed.any_installed().bin_dir == pin  # type: ignore[union-attr]  # newest, but not named
    installed.name_tag("b12000")
    assert installed.any_installed().bin_dir == newer  # type: ignore[union-attr]
    installed.name_tag(None)
    assert installed.any_installed().bin_dir == pin  # type: ignore[union-attr]


def test_a_release_without_an_archive_is_built_from_its_own_source(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the pin's source: that release's, from GitHub (or its mirror), said in the one line."""
    def fail(*a: Any, **k: Any) -> install.Installation:
        raise PrebuiltInstallError("no such release", "http")

    monkeypatch.setattr(install, "install_prebuilt", fail)
    lines: list[str] = []
    calls: list[dict[str, Any]] = []
    install.install("cpu", tag="b12000", notify=lines.append, build_source=_recorder(calls, home))
    assert [c.get("tag") for c in calls] == ["b12000"]
    assert lines == [f"prebuilt llama.cpp b12000 not used (http): no such release; building "
                     f"{prebuilt.source_url('b12000')} from source instead (about 8 minutes on 2 cores)"]
    install.install("cpu", method="source", tag="b12000", build_source=_recorder(calls, home))
    assert [c.get("tag") for c in calls] == ["b12000", "b12000"]
