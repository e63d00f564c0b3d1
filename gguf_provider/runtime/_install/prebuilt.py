"""llama.cpp's published release archives: the asset for this host, downloaded with its sha256 checked against the
digest the release publishes, extracted safely and smoke-run in a staging directory.

:mod:`.install` decides when to use this (under its lock) and falls back to the source build on any
:class:`~gguf_provider.errors.PrebuiltInstallError`. docs/install.md describes the order, the table of assets,
pinning and mirrors.
"""

from __future__ import annotations

import hashlib
import os
import platform
import posixpath
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from ...errors import GGUFProviderError, PrebuiltInstallError
from .._common import process
from .._common.gguf import read_header
from .._common.host import ASSETS, arch_name, system_name
from .._common.paths import exe
from .._common.progress import Progress
from .._models.local import list_models_dirs
from . import discovery
from .installed import PINNED_COMMIT as PINNED_COMMIT
from .installed import PINNED_TAG as PINNED_TAG

REPO = "ggml-org/llama.cpp"
DEFAULT_API = "https://api.github.com"
TOOLS = ("ggml-rpc-server", "rpc-server", "llama-gguf-split", "llama-quantize")

TIMEOUT = httpx.Timeout(60.0, connect=4.0)  # a black-holed network costs 4 s, a DNS failure milliseconds
MAX_UNPACKED = 8 << 30  # refuse archives that would unpack to more than this
SMOKE_MODEL_LIMIT = 1 << 30  # the start check uses the smallest local model only if it is at most this big
SMOKE_START_TIMEOUT = 120.0
# Not used for the start check: projectors are no models, and encoders may abort where a chat model starts (seen:
# all-MiniLM-L6-v2 with -np 1 aborts in llama_context::output_reserve).
SMOKE_SKIP_ARCHS = frozenset({"clip", "bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                              "modern-bert", "neo-bert", "t5encoder"})


def api_base() -> str:
    """``$GGUF_PROVIDER_LLAMA_RELEASES_URL`` (a mirror of the releases API) or https://api.github.com."""
    return (os.environ.get("GGUF_PROVIDER_LLAMA_RELEASES_URL") or DEFAULT_API).rstrip("/")


def release_tag() -> str:
    """``$GGUF_PROVIDER_LLAMA_TAG`` or the pinned tag."""
    return os.environ.get("GGUF_PROVIDER_LLAMA_TAG") or PINNED_TAG


DEFAULT_SOURCE = "https://github.com"


def source_url(tag: str) -> str:
    """Where release ``tag``'s source is: ``$GGUF_PROVIDER_LLAMA_SOURCE_URL`` (a mirror of github.com) or GitHub's
    tag archive."""
    base = (os.environ.get("GGUF_PROVIDER_LLAMA_SOURCE_URL") or DEFAULT_SOURCE).rstrip("/")
    return f"{base}/{REPO}/archive/refs/tags/{tag}.tar.gz"


def newest_tags(client: httpx.Client | None = None, count: int = 5) -> list[str]:
    """The newest published releases' tags, newest first (``GET /repos/{repo}/releases``; drafts and prereleases
    left out). Raises PrebuiltInstallError when the API cannot be asked."""
    url = f"{api_base()}/repos/{REPO}/releases?per_page={count}"
    own = client is None
    client = client or httpx.Client(timeout=TIMEOUT, follow_redirects=True)
    try:
        resp = client.get(url, headers=_headers(url))
    except httpx.TransportError as exc:
        raise PrebuiltInstallError(f"could not reach {api_base()} ({_network_why(exc)})", "network") from None
    finally:
        if own:
            client.close()
    if resp.status_code != 200:
        raise _http_error(resp, f"the releases API ({url})")
    try:
        tags = [str(r["tag_name"]) for r in resp.json() if not r.get("draft") and not r.get("prerelease")]
    except (ValueError, KeyError, TypeError) as exc:
        raise PrebuiltInstallError(f"the releases API answered {url} with unexpected JSON ({exc})", "http") from None
    if not tags:
        raise PrebuiltInstallError(f"the releases API lists no release at {url}", "http")
    return tags


def resolve_tag(tag: str | None) -> str:
    """``pin`` or None: the pinned tag (or ``$GGUF_PROVIDER_LLAMA_TAG``); ``latest``: the newest release; else the
    tag as given (``b`` and a build number)."""
    if tag in (None, "", "pin"):
        return release_tag()
    if tag == "latest":
        return newest_tags(count=1)[0]
    if not re.fullmatch(r"b\d+", tag):
        raise ValueError(f"tag={tag!r}: give a llama.cpp release tag such as {PINNED_TAG}, 'latest' or 'pin'")
    return tag


def _token() -> str | None:
    return os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN") or None


# --- which asset -------------------------------------------------------------------------------------------------


def host_system() -> str:
    return system_name(sys.platform)


def host_arch() -> str:
    return arch_name(platform.machine())


@dataclass(frozen=True)
class Host:
    system: str  # "linux" | "darwin" | "windows"
    arch: str  # "x64" | "arm64" | "s390x" | ...
    backend: str  # "cpu" | "cuda" | "vulkan" | "metal"

    def describe(self) -> str:
        name = {"linux": "Linux", "darwin": "macOS", "windows": "Windows"}.get(self.system, self.system)
        return f"{name} {self.arch} {self.backend}"


def this_host(backend: str) -> Host:
    return Host(host_system(), host_arch(), backend)


# (system, arch, backend) → the asset name after "llama-<tag>-bin-": host.ASSETS, where the backend choice reads it
# too.
_ASSETS = ASSETS


def asset_pattern(host: Host, tag: str) -> re.Pattern[str] | None:
    """The name of this host's archive in release ``tag`` as a pattern, or None when upstream publishes none."""
    suffix = _ASSETS.get((host.system, host.arch, host.backend))
    if suffix is None:
        return None
    body = re.escape(f"llama-{tag}-bin-{suffix}").replace(re.escape("{cuda}"), r"(?P<cuda>\d+(?:\.\d+)*)")
    return re.compile(body + "$")


@dataclass(frozen=True)
class Asset:
    name: str
    url: str
    size: int
    digest: str  # the lowercase sha256 hex the release publishes, "" when it publishes none


@dataclass(frozen=True)
class Release:
    tag: str
    assets: tuple[Asset, ...]


def choose_assets(release: Release, host: Host, cuda_driver: tuple[int, ...] | None = None) -> list[Asset]:
    """This host's archive, then any archive it needs beside it (the CUDA runtime DLLs on Windows).

    Raises PrebuiltInstallError("no-asset") when the release has none for ``host``."""
    pattern = asset_pattern(host, release.tag)
    matches = [(a, m) for a in release.assets if pattern is not None and (m := pattern.match(a.name))]
    if pattern is None or not matches:
        published = ", ".join(sorted(a.name for a in release.assets if a.name.startswith("llama-"))) or "none"
        raise PrebuiltInstallError(f"llama.cpp {release.tag} publishes no archive for {host.describe()} "
                                   f"(its archives: {published})", "no-asset")
    if "cuda" not in pattern.groupindex:
        return [matches[0][0]]
    # Windows CUDA: the newest toolkit the driver runs (the oldest one when the driver's is unknown).
    def ver(m: re.Match[str]) -> tuple[int, ...]:
        return tuple(int(x) for x in m.group("cuda").split("."))

    usable = [(a, m) for a, m in matches if cuda_driver is not None and ver(m)[:1] <= cuda_driver[:1]]
    asset, m = max(usable, key=lambda am: ver(am[1])) if usable else min(matches, key=lambda am: ver(am[1]))
    runtime = f"cudart-llama-bin-win-cuda-{m.group('cuda')}-x64.zip"
    return [asset] + [a for a in release.assets if a.name == runtime]


def cuda_driver_version() -> tuple[int, ...] | None:
    """The CUDA version the NVIDIA driver supports (``nvidia-smi``'s header), or None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


# --- the releases API --------------------------------------------------------------------------------------------


def _headers(url: str, accept: str = "application/vnd.github+json") -> dict[str, str]:
    """The token goes only to the releases API's own origin (a download redirected elsewhere never gets it)."""
    headers = {"Accept": accept, "User-Agent": "gguf-provider", "X-GitHub-Api-Version": "2022-11-28"}
    token, api = _token(), _origin(api_base())
    if token and api is not None and _origin(url) == api:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _origin(url: str) -> tuple[str, str] | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts.scheme, parts.netloc


def _network_why(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"no network or DNS: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out: {exc or type(exc).__name__}"
    return f"{type(exc).__name__}: {exc}"


def _http_error(resp: httpx.Response, what: str) -> PrebuiltInstallError:
    try:
        message = str(resp.json().get("message", ""))[:200]
    except (ValueError, AttributeError):
        message = resp.text.strip()[:200]
    detail = f"{what} answered HTTP {resp.status_code}" + (f": {message}" if message else "")
    limited = resp.status_code == 429 or (resp.status_code == 403 and (
        resp.headers.get("x-ratelimit-remaining") == "0" or "rate limit" in message.lower()))
    if limited or resp.status_code == 403:
        hint = "" if _token() else "; set GITHUB_TOKEN (or GH_TOKEN) for a higher limit"
        return PrebuiltInstallError(detail + hint, "rate-limit" if limited else "http")
    return PrebuiltInstallError(detail, "http")


def check_dns(url: str, timeout: float = TIMEOUT.connect or 4.0) -> None:
    """Resolve ``url``'s host within ``timeout``: a resolver that never answers would otherwise hold the lookup
    (which no socket timeout bounds) for tens of seconds before the fallback."""
    try:
        host = urlsplit(url).hostname
    except ValueError as exc:
        raise PrebuiltInstallError(f"{url} is not a usable URL ({exc})", "http") from None
    if not host:
        return  # not a network URL: the request itself says what is wrong with it
    failure: list[BaseException] = []
    done = threading.Event()

    def resolve() -> None:
        try:
            socket.getaddrinfo(host, None)
        except OSError as exc:
            failure.append(exc)
        done.set()

    threading.Thread(target=resolve, daemon=True).start()
    if not done.wait(timeout):
        raise PrebuiltInstallError(f"could not reach {url} (no network or DNS: {host} did not resolve within "
                                   f"{timeout:.0f} s)", "network")
    if failure:
        raise PrebuiltInstallError(f"could not reach {url} (no network or DNS: {failure[0]})", "network")


def fetch_release(client: httpx.Client, tag: str) -> Release:
    """Release ``tag`` of llama.cpp from the releases API (``GET /repos/{repo}/releases/tags/{tag}``)."""
    url = f"{api_base()}/repos/{REPO}/releases/tags/{tag}"
    try:
        resp = client.get(url, headers=_headers(url))
    except httpx.TransportError as exc:
        raise PrebuiltInstallError(f"could not reach {api_base()} ({_network_why(exc)})", "network") from None
    except httpx.InvalidURL as exc:
        raise PrebuiltInstallError(f"{url} is not a usable URL ({exc})", "http") from None
    if resp.status_code != 200:
        raise _http_error(resp, f"the releases API ({url})")
    try:
        data = resp.json()
        assets = tuple(
            Asset(name=str(a["name"]), url=urljoin(str(resp.url), str(a["browser_download_url"])),
                  size=int(a.get("size") or 0), digest=_sha256_of(a.get("digest")))
            for a in data.get("assets", [])
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PrebuiltInstallError(f"the releases API answered {url} with unexpected JSON ({exc})", "http") from None
    return Release(tag=str(data.get("tag_name") or tag), assets=assets)


def _sha256_of(digest: Any) -> str:
    if isinstance(digest, str) and digest.lower().startswith("sha256:"):
        hexdigest = digest[7:].strip().lower()
        if re.fullmatch(r"[0-9a-f]{64}", hexdigest):
            return hexdigest
    return ""


# --- download ------------------------------------------------------------------------------------------------------


def download(client: httpx.Client, asset: Asset, dest: Path, progress: Progress | None = None) -> Path:
    """``asset`` into ``dest``, verified against its published sha256 before the file gets its name.

    The bytes go to ``<name>.part`` while hashing; a short, failed or mismatching download is deleted and raises
    PrebuiltInstallError, so nothing partial or unverified is ever extracted. The bar is huggingface_hub's, as for
    model downloads (``HF_HUB_DISABLE_PROGRESS_BARS=1`` hides it); ``progress`` gets "download" reports."""
    if not asset.digest:
        raise PrebuiltInstallError(f"the release publishes no sha256 digest for {asset.name}, so it cannot be "
                                   "verified", "no-digest")
    from huggingface_hub.utils.tqdm import tqdm as hf_tqdm  # imported here: huggingface_hub is slow to import

    part = dest / f"{asset.name}.part"
    sha = hashlib.sha256()
    done = 0
    bar: Any = hf_tqdm(total=asset.size or None, unit="B", unit_scale=True, desc=asset.name)  # type: ignore[no-untyped-call]
    try:
        with client.stream("GET", asset.url, headers=_headers(asset.url, "application/octet-stream")) as resp:
            if resp.status_code != 200:
                resp.read()  # the error body, for its message
                raise _http_error(resp, f"the download of {asset.name}")
            with open(part, "wb") as f:
                for chunk in resp.iter_bytes(1 << 20):
                    f.write(chunk)
                    sha.update(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
                    if progress is not None:
                        progress("download", done, asset.size or done, asset.name)
    except httpx.TransportError as exc:
        part.unlink(missing_ok=True)
        raise PrebuiltInstallError(f"downloading {asset.name} failed ({_network_why(exc)})", "network") from None
    except httpx.InvalidURL as exc:
        part.unlink(missing_ok=True)
        raise PrebuiltInstallError(f"{asset.url} is not a usable URL ({exc})", "http") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    if asset.size and done != asset.size:
        part.unlink(missing_ok=True)
        raise PrebuiltInstallError(f"{asset.name}: got {done} bytes, the release lists {asset.size}", "network")
    got = sha.hexdigest()
    if got != asset.digest:
        part.unlink(missing_ok=True)
        raise PrebuiltInstallError(f"{asset.name} has sha256 {got} but the release publishes {asset.digest}: "
                                   "refusing to install it", "digest")
    final = dest / asset.name
    os.replace(part, final)
    return final


# --- extraction ----------------------------------------------------------------------------------------------------


def _unsafe(why: str, archive: Path) -> PrebuiltInstallError:
    return PrebuiltInstallError(f"{archive.name} is not safe to extract: {why}", "archive")


def _inside(name: str, archive: Path) -> str:
    """``name`` as a normalised relative path that stays in the target, or raise."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or re.match(r"^[A-Za-z]:", norm):
        raise _unsafe(f"{name!r} is an absolute path", archive)
    rel = posixpath.normpath(norm)
    if rel == ".." or rel.startswith("../"):
        raise _unsafe(f"{name!r} escapes the target directory", archive)
    return rel


def _check_link(member: str, target: str, archive: Path, *, hard: bool) -> None:
    """A link ``member`` → ``target`` must point inside (hard links are relative to the archive root)."""
    if target.startswith("/") or re.match(r"^[A-Za-z]:", target.replace("\\", "/")):
        raise _unsafe(f"link {member!r} points to the absolute path {target!r}", archive)
    base = "" if hard else posixpath.dirname(_inside(member, archive))
    joined = posixpath.normpath(posixpath.join(base, target.replace("\\", "/")))
    if joined == ".." or joined.startswith("../"):
        raise _unsafe(f"link {member!r} points outside the target ({target!r})", archive)


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a ``.tar.gz`` or ``.zip`` into ``dest``, refusing absolute paths, ``..`` escapes, links that point
    outside, device files and archives that unpack to more than MAX_UNPACKED bytes."""
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        _extract_zip(archive, dest)
        return
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            total = 0
            for m in members:
                _inside(m.name, archive)
                if m.issym() or m.islnk():
                    _check_link(m.name, m.linkname, archive, hard=m.islnk())
                elif not (m.isfile() or m.isdir()):
                    raise _unsafe(f"{m.name!r} is a device or fifo", archive)
                total += m.size
            if total > MAX_UNPACKED:
                raise _unsafe(f"it would unpack to {total} bytes", archive)
            if hasattr(tarfile, "data_filter"):  # the stdlib's own check too (PEP 706)
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PrebuiltInstallError(f"{archive.name} could not be extracted ({exc})", "archive") from None


def _extract_zip(archive: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as z:
            infos = z.infolist()
            if sum(i.file_size for i in infos) > MAX_UNPACKED:
                raise _unsafe("it would unpack to more than the limit", archive)
            for info in infos:
                rel = _inside(info.filename, archive)
                mode = info.external_attr >> 16
                target = dest / rel
                if stat.S_ISLNK(mode):
                    link = z.read(info).decode()
                    _check_link(info.filename, link, archive, hard=False)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(link, target)
                elif info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    if mode & 0o111:
                        os.chmod(target, 0o755)
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        raise PrebuiltInstallError(f"{archive.name} could not be extracted ({exc})", "archive") from None


def server_dir(root: Path) -> Path:
    """The directory of the extracted archive that holds llama-server (``llama-<tag>/`` in current archives,
    ``build/bin/`` in older ones, the root in Windows zips)."""
    hits = sorted((p for p in root.rglob(exe("llama-server")) if p.is_file() and not p.is_symlink()),
                  key=lambda p: len(p.parts))
    if not hits:
        raise PrebuiltInstallError(f"the archive has no {exe('llama-server')}", "archive")
    return hits[0].parent


# --- smoke run -----------------------------------------------------------------------------------------------------


def _death(rc: int, output: str) -> str:
    """What an exit code says, for the one-line reason."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        why = {"SIGILL": " (illegal instruction: built for another CPU)"}.get(name, "")
        return f"killed by {name}{why}"
    tail = " | ".join(line for line in output.strip().splitlines()[-3:] if line)[-300:]
    return f"exit code {rc}" + (f": {tail}" if tail else "")


def smoke_version(server: Path) -> str:
    """``llama-server --version``: the line after "version:", or raise PrebuiltInstallError("smoke")."""
    try:
        out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60,
                             errors="replace")
    except (OSError, subprocess.SubprocessError) as exc:
        raise PrebuiltInstallError(f"{server.name} --version could not run ({exc})", "smoke") from None
    text = (out.stdout + out.stderr).strip()
    if out.returncode != 0:
        raise PrebuiltInstallError(f"{server.name} --version failed: {_death(out.returncode, text)}", "smoke")
    return discovery.parse_version(text, "?")


def smallest_model(limit: int = SMOKE_MODEL_LIMIT) -> Path | None:
    """The smallest model in the models dirs (up to ``limit`` bytes) whose GGUF header reads, neither a projector
    nor an encoder (:data:`SMOKE_SKIP_ARCHS`)."""
    try:
        models = sorted(list_models_dirs(), key=lambda m: m.size_bytes)
    except (OSError, GGUFProviderError):
        return None
    for m in models:
        if m.size_bytes > limit:
            break
        try:
            if read_header(m.path).architecture not in SMOKE_SKIP_ARCHS:
                return m.path
        except (OSError, GGUFProviderError):
            continue
    return None


def smoke_start(server: Path, model: Path, log_path: Path, timeout: float = SMOKE_START_TIMEOUT) -> float:
    """Start ``server`` on ``model`` (context 256, loopback) until ``/health`` answers 200; seconds it took."""
    port = process.free_port()
    argv = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "256"]
    t0 = time.monotonic()
    log_path.write_bytes(b"")
    try:
        # As a private server: it dies with the installer, even one that is SIGKILLed mid-run (PR_SET_PDEATHSIG).
        proc = process.spawn(argv, log_path, private=True)
    except OSError as exc:
        raise PrebuiltInstallError(f"{server.name} could not start ({exc})", "smoke") from None
    try:
        outcome = process.poll_health(process.Address(url=f"http://127.0.0.1:{port}"), timeout=timeout,
                                      exited=lambda: proc.poll() is not None)
        took = time.monotonic() - t0
    finally:
        process.stop_child(proc)
    if outcome == "exited":
        text = log_path.read_text(errors="replace")
        raise PrebuiltInstallError(f"{server.name} died loading {model.name}: {_death(proc.returncode, text)}",
                                   "smoke")
    if outcome == "timeout":
        raise PrebuiltInstallError(f"{server.name} did not become healthy on {model.name} within {timeout:.0f} s",
                                   "smoke")
    return took


@dataclass(frozen=True)
class SmokeResult:
    version: str
    flags: dict[str, bool]
    model: str | None  # the model the start check used, None when there was none at hand
    start_s: float | None


def smoke(bin_dir: Path, log_path: Path, model: Path | None) -> SmokeResult:
    """``--version``, the ``--help`` flag probe, then a start on ``model`` (if any): a binary built for another
    CPU, lacking a shared library or unable to load a model dies here, in staging, never in front of a user."""
    server = bin_dir / exe("llama-server")
    version = smoke_version(server)
    try:
        caps = discovery.probe_uncached(server)
    except GGUFProviderError as exc:
        raise PrebuiltInstallError(f"the --help probe failed: {exc}", "smoke") from None
    start_s = smoke_start(server, model, log_path) if model is not None else None
    return SmokeResult(version, caps.flags, str(model) if model else None, start_s)


# --- all of it, in a staging directory -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Staged:
    bin_dir: Path  # inside the staging directory; install.py moves it into place
    marker: dict[str, Any]


def stage(host: Host, tag: str, staging: Path, *, progress: Progress | None = None,
          client: httpx.Client | None = None, model: Path | None = None) -> Staged:
    """Look up release ``tag``, download this host's archive(s), verify, extract and smoke-run them inside
    ``staging``. ``model`` defaults to :func:`smallest_model`. Raises PrebuiltInstallError on any failure."""
    pattern = asset_pattern(host, tag)
    if pattern is None:
        raise PrebuiltInstallError(f"llama.cpp publishes no archive for {host.describe()}", "no-asset")
    own = client is None
    if own:
        check_dns(api_base())
    client = client or httpx.Client(timeout=TIMEOUT, follow_redirects=True)
    try:
        release = fetch_release(client, tag)
        assets = choose_assets(release, host, cuda_driver_version() if host.backend == "cuda" else None)
        (staging / "download").mkdir(parents=True, exist_ok=True)
        archives = [download(client, a, staging / "download", progress) for a in assets]
    finally:
        if own:
            client.close()
    safe_extract(archives[0], staging / "tree")
    bin_dir = server_dir(staging / "tree")
    for extra in archives[1:]:
        safe_extract(extra, bin_dir)
    result = smoke(bin_dir, staging / "smoke-start.log", model if model is not None else smallest_model())
    marker = {
        "origin": "prebuilt",
        "backend": host.backend,
        "tag": release.tag,
        "commit": PINNED_COMMIT if release.tag == PINNED_TAG else None,
        "asset": assets[0].name,
        "digest": f"sha256:{assets[0].digest}",
        "url": assets[0].url,
        "extras": [{"asset": a.name, "digest": f"sha256:{a.digest}"} for a in assets[1:]],
        "host": host.describe(),
        "version": f"{result.version} [llama.cpp {release.tag}]",
        "tools": [t for t in TOOLS if (bin_dir / exe(t)).is_file()],
        "smoke": {"version": result.version, "help_flags": sum(result.flags.values()), "model": result.model,
                  "start_s": round(result.start_s, 2) if result.start_s is not None else None},
        "installed_at": time.time(),
    }
    return Staged(bin_dir=bin_dir, marker=marker)
