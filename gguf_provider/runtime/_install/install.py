"""Install llama-server: an existing install, else llama.cpp's published release archive for this host
(:mod:`.prebuilt`), else a build from a pinned llama.cpp source (a registry sdist), in that order.

Only the MIT-licensed llama.cpp tree inside the sdist (``vendor/llama.cpp``) is extracted; none of the wrapper's
Python code is used. docs/install.md describes the order, pinning, mirrors and measured times.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import filelock
import httpx

from ..._warn import warn
from ...errors import BackendWarning, BinaryNotFoundError, BuildError, PrebuiltInstallError
from .._common import host, paths, process
from .._common.paths import exe
from .._common.progress import Progress
from . import discovery, prebuilt
from .backend import announce_once
from .installed import (
    MARKER,
    SDIST_NAME,
    SDIST_SHA256,
    SDIST_VERSION,
    SERVER_TARGET,
    SOURCE_PIN,
    Installation,
    install_dir,
    installations,
    installed,
    is_pinned,
    prebuilt_dir,
    read,
    resolve_backend,
)

SDIST_TREE = "vendor/llama.cpp"  # the llama.cpp tree inside the sdist (SDIST_NAME, pinned in installed.py)
RPC_TARGET = "ggml-rpc-server"  # llama.cpp's RPC worker (GGML_RPC=ON); older trees and archives call it rpc-server
TOOL_TARGETS = (RPC_TARGET, "llama-gguf-split", "llama-quantize", "llama-app")
# A target's file where it is not the target's name: llama-app is the unified `llama` (`llama serve`, `llama
# fit-params`, ...), built so that what a user of llama.cpp's own installer runs is tested here too.
TARGET_FILES = {"llama-app": "llama"}
METHODS = ("auto", "prebuilt", "source")
log = logging.getLogger(__name__)


def say(message: str) -> None:
    """One line on stderr: what the install is doing when it is not what was asked (a fallback, a first use)."""
    print(f"gguf-provider: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def install_lock(timeout: float = 3600.0) -> Iterator[None]:
    """One install at a time per home (a second process waits, then finds the first one's result)."""
    locks = paths.home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(locks / "install.lock"), timeout=timeout):
        yield


def ensure_installed(explicit: str | os.PathLike[str] | None = None, *, auto_install: bool | None = None) -> Path:
    """The llama-server binary :func:`.discovery.find_llama_server` finds, installed first when there is none.

    The install is ``gguf-provider server install``'s order (the pinned llama.cpp release archive, else the source
    build) unless ``auto_install=False`` or ``$GGUF_PROVIDER_AUTO_INSTALL`` says otherwise ("prebuilt": the archive
    only; "0": never, and BinaryNotFoundError says how to install). What a model's first start runs.
    """
    found = discovery.locate(explicit)
    if found is not None:
        log.debug("llama-server: %s (found by %s)", found[0], found[1])
        return found[0]
    mode = discovery.auto_install_mode() if auto_install is None else ("auto" if auto_install else "off")
    log.info("no llama-server found; $GGUF_PROVIDER_AUTO_INSTALL mode %s", mode)
    if mode == "off":
        raise BinaryNotFoundError(discovery.NOT_FOUND)
    say(f"no llama-server found: installing one now (from {mode}; set GGUF_PROVIDER_AUTO_INSTALL=0 to "
        "turn this off)")
    server = install(method=mode).server
    announce_once(server, say=say)  # which backend and why, in one line (the first start's own line)
    return server


SourceBuild = Callable[..., Installation]


def install(
    backend: str = "auto",
    *,
    method: str = "auto",
    force: bool = False,
    cmake_args: list[str] | None = None,
    progress: Progress | None = None,
    jobs: int | None = None,
    tag: str | None = None,
    notify: Callable[[str], None] | None = None,
    build_source: SourceBuild | None = None,
) -> Installation:
    """Install llama-server for ``backend``; what `gguf-provider server install` and the first use run.

    ``method="auto"``: an existing installation, else llama.cpp release ``tag`` (default
    ``$GGUF_PROVIDER_LLAMA_TAG`` or :data:`prebuilt.PINNED_TAG`) for this host, else the source build; a failed
    prebuilt step is one line through ``notify`` (default: stderr) saying why, then the build. ``"prebuilt"``: the
    archive only (raises PrebuiltInstallError). ``"source"``: the build only (as before). ``force`` reinstalls;
    ``cmake_args`` imply the source build. ``build_source`` replaces :func:`build_from_source` (tests use it to
    observe the fallback without a real build). Held under :func:`install_lock`.

    ``backend="auto"`` is :func:`.host.choose`'s; when that backend has only an archive here (Vulkan without glslc
    and its headers) and the archive cannot be used, the CPU build is installed instead, with a BackendWarning
    naming why. `server install` and :func:`ensure_installed` say the backend in use in one line (:mod:`.backend`).
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r}: choose one of {', '.join(METHODS)}")
    if cmake_args and method == "prebuilt":
        raise ValueError("cmake_args apply to the source build only (method='source' or 'auto')")
    choice = host.choose(host.current_host()) if backend == "auto" else None
    backend = choice.backend if choice is not None else resolve_backend(backend)
    tag = tag or prebuilt.release_tag()
    build = build_source or build_from_source
    log.info("install: backend %s (%s), method %s, llama.cpp release %s, force %s", backend,
             choice.reason if choice is not None else "asked for", method, tag, force)
    with install_lock():
        try:
            return _install(backend, method, force, cmake_args, progress, jobs, tag, notify, build)
        except PrebuiltInstallError as exc:
            # The archive was the only way to this backend here (no toolchain to build it, e.g. Vulkan without
            # glslc): the CPU build instead, said loudly rather than a build that cannot succeed.
            if method != "auto" or choice is None or choice.method != "prebuilt" or backend == "cpu":
                raise
            name = host.BACKEND_NAMES[backend]
            why = (f"the {name} archive of llama.cpp {tag} could not be used ({exc.reason}: {exc}) and this "
                   f"machine cannot build one from source: the CPU build instead")
            (notify or say)(why)
            log.warning("install: %s", why)
            warn(f"{why}; fix the cause, then `gguf-provider server install --backend "
                 f"{backend} --force`", BackendWarning)
            return _install("cpu", method, force, cmake_args, progress, jobs, tag, notify, build)


def _install(backend: str, method: str, force: bool, cmake_args: list[str] | None, progress: Progress | None,
             jobs: int | None, tag: str, notify: Callable[[str], None] | None, build: SourceBuild) -> Installation:
    """:func:`install`'s steps for one backend, under its lock."""
    pinned = tag == prebuilt.PINNED_TAG
    if method == "source" or cmake_args:
        log.info("install: the %s build from source %s (--from source or cmake arguments)", backend,
                 SOURCE_PIN if pinned else prebuilt.source_url(tag))
        return build(backend, force=force, cmake_args=cmake_args, progress=progress, jobs=jobs,
                     **({} if pinned else {"tag": tag}))
    if not force:
        if not pinned:  # that release's install, from its archive or its source
            done = installed(backend, tag=tag)
        elif method == "auto":  # the pin's: our source build or its archive
            done = next((i for i in installations() if i.backend == backend and is_pinned(i)), None)
        else:
            done = installed(backend, "prebuilt", tag)
        why = outdated(done) if done is not None and done.origin == "source" and pinned else None
        if why is not None:
            # An older build (no RPC worker, or other configure flags): rebuilt in the same build dir, where
            # only what changed is compiled.
            (notify or say)(f"{why} (an incremental build in the existing build dir)")
            return build(backend, force=False, cmake_args=None, progress=progress, jobs=jobs)
        if done is not None:
            log.info("install: %s already installed at %s (%s)", backend, done.server, done.describe())
            return done
    try:
        log.info("install: llama.cpp %s's %s release archive", tag, backend)
        return install_prebuilt(backend, tag, progress=progress)
    except PrebuiltInstallError as exc:
        log.warning("install: the llama.cpp %s archive was not used (%s): %s", tag, exc.reason, exc)
        if method == "prebuilt" or methods_here(backend) == "prebuilt":
            raise
        source = SOURCE_PIN if pinned else prebuilt.source_url(tag)
        (notify or say)(f"prebuilt llama.cpp {tag} not used ({exc.reason}): {exc}; building {source} "
                        "from source instead (about 8 minutes on 2 cores)")
    if not pinned:
        return build(backend, force=force, cmake_args=cmake_args, progress=progress, jobs=jobs, tag=tag)
    return build(backend, force=force, cmake_args=cmake_args, progress=progress, jobs=jobs)


def methods_here(backend: str) -> str:
    """How ``backend`` can be installed on this machine (:func:`.host.methods`)."""
    return host.methods(host.current_host(), backend)


def install_prebuilt(backend: str, tag: str, *, progress: Progress | None = None,
                     client: Any = None, model: Path | None = None) -> Installation:
    """Stage release ``tag``'s archive in the bin dir, smoke-run it, then move it into place with a rename. The
    caller holds :func:`install_lock`. Raises PrebuiltInstallError; nothing of a failed attempt is left behind."""
    bin_root = paths.bin_dir()
    bin_root.mkdir(parents=True, exist_ok=True)
    for stale in bin_root.glob(".staging-*"):  # a killed install's leftovers (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=bin_root))
    try:
        staged = prebuilt.stage(prebuilt.this_host(backend), tag, staging, progress=progress, client=client,
                                model=model)
        (staged.bin_dir / MARKER).write_text(json.dumps(staged.marker, indent=2))
        target = prebuilt_dir(str(staged.marker["tag"]), backend)
        if target.exists():
            target.rename(staging / "old")
        staged.bin_dir.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    inst = read(target)
    if inst is None:
        raise PrebuiltInstallError(f"{target} is incomplete after the move", "archive")
    return Installation(inst.backend, inst.bin_dir, inst.version, inst.origin, inst.marker, fresh=True)


def build_from_source(
    backend: str = "auto",
    *,
    force: bool = False,
    cmake_args: list[str] | None = None,
    progress: Progress | None = None,
    jobs: int | None = None,
    tag: str | None = None,
) -> Installation:
    """Build and install llama-server (plus rpc-server, llama-gguf-split, llama-quantize and the unified
    ``llama``) for ``backend`` from SOURCE_PIN, or from release ``tag``'s source (:func:`.prebuilt.source_url`).

    A second call finds the marker and returns at once unless ``force``. ``progress`` gets "build" reports (see
    :mod:`.progress`). Raises :class:`BuildError` naming the log
    file when any step fails.
    """
    backend = resolve_backend(backend)
    other = tag is not None and tag != prebuilt.PINNED_TAG
    label = f"llama.cpp-{tag}" if other else SOURCE_PIN
    target = prebuilt_dir(str(tag), backend) if other else install_dir(backend)
    if not force and not cmake_args:
        done = read(target)
        if done is not None and (other or outdated(done) is None):
            return done
    src = fetch_tag_source(str(tag)) if other else fetch_source()
    build = paths.build_dir() / f"{label}-{backend}"
    log_path = paths.logs_dir() / f"build-{label}-{backend}.log"
    if force and build.exists():
        shutil.rmtree(build)
    args = configure_args(src, build, backend) + list(cmake_args or [])
    targets = [SERVER_TARGET, *TOOL_TARGETS]
    build_cmd = ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs or os.cpu_count() or 2)]
    build_cmd += ["--target", *targets]
    with open(log_path, "w") as log:
        _run_logged(args, log, log_path, "configure", None)
        _run_logged(build_cmd, log, log_path, "build", progress)
    target.mkdir(parents=True, exist_ok=True)
    for name in targets:
        file = exe(TARGET_FILES.get(name, name))
        found = _find_binary(build, file)
        if found is None:
            raise BuildError(f"the build finished but {file} was not produced; see the log: {log_path}", log_path)
        shutil.copy2(found, target / file)
    version = smoke_test(target / exe(SERVER_TARGET), log_path)
    smoke_start(target / exe(SERVER_TARGET), paths.logs_dir() / f"smoke-{SOURCE_PIN}-{backend}.log")
    marker = {"origin": "source", "backend": backend, "source": SOURCE_PIN, "sha256": SDIST_SHA256,
              "version": version, "built_at": time.time(), "cmake_args": args[1:], "tools": list(TOOL_TARGETS)}
    if other:
        marker.update(source=prebuilt.source_url(str(tag)), sha256=None, tag=tag)
    (target / MARKER).write_text(json.dumps(marker, indent=2))
    return Installation(backend=backend, bin_dir=target, version=version, marker=marker, fresh=True)


def outdated(inst: Installation) -> str | None:
    """Why a source build must be built again with today's :func:`configure_args` (None when it need not): a tool
    it lacks (an install from before the RPC worker), or a configure flag its marker does not record."""
    missing = missing_tools(inst)
    if missing:
        return f"adding {', '.join(missing)} to {inst.bin_dir}"
    recorded = inst.marker.get("cmake_args")
    if not isinstance(recorded, list):  # a marker from before flags were recorded: nothing to compare
        return None
    wanted = [a for a in configure_args(Path(), Path(), inst.backend) if a.startswith("-D")]
    new = [a for a in wanted if a not in recorded]
    return f"rebuilding {inst.bin_dir} with {' '.join(new)}" if new else None


def missing_tools(inst: Installation) -> list[str]:
    """The tools a source build makes that ``inst`` lacks (an install from before rpc-server was built)."""
    return [t for t in TOOL_TARGETS if not (inst.bin_dir / exe(TARGET_FILES.get(t, t))).is_file()]


# ggml's AMX matrix kernels (built by GGML_NATIVE on Sapphire Rapids and later Xeons) segfault in
# ggml_backend_amx_mul_mat at the first compute of every model in the pinned tree (seen on these machines with
# SmolLM2 and Qwen; llama.cpp issue 20824, open upstream). The AVX-512 kernels serve those CPUs instead. GCC and
# Clang let an explicit -mno-* win over -march=native whatever their order.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _x86_gcc_like() -> bool:
    return os.name != "nt" and platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def configure_args(src: Path, build: Path, backend: str) -> list[str]:
    args = [
        "cmake", "-S", str(src), "-B", str(build),
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
        "-DGGML_NATIVE=ON", "-DGGML_RPC=ON",
    ]
    if _x86_gcc_like():
        args += [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]
    if shutil.which("ninja"):
        args[1:1] = ["-G", "Ninja"]
    if backend == "cuda":
        args.append("-DGGML_CUDA=ON")
    elif backend == "vulkan":
        args.append("-DGGML_VULKAN=ON")
    elif backend == "metal":
        args.append("-DGGML_METAL=ON")
    return args


# Ninja prints "[12/212] ..."; the Makefile generator prints "[ 45%] ...".
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def parse_progress(line: str) -> tuple[int, int] | None:
    """``(done, total)`` from one line of cmake/ninja build output, or None."""
    m = _NINJA_STEP.match(line)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _MAKE_PERCENT.match(line)
    if m:
        return int(m.group(1)), 100
    return None


def _run_logged(cmd: list[str], log: TextIO, log_path: Path, step: str, progress: Progress | None) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        if shutil.which(cmd[0]) is None:
            raise FileNotFoundError(f"{cmd[0]} is not on PATH")
        # Through runtime/_common/guard.py (POSIX): the step's whole process tree (cmake, ninja, the compilers) stops when
        # this process stops, however it is stopped (docs/reliability.md, the kill matrix).
        guarded = [sys.executable, "-m", "gguf_provider.runtime._common.guard", *cmd] if os.name == "posix" else cmd
        proc = subprocess.Popen(guarded, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", preexec_fn=process.dies_with_parent(signal.SIGTERM))
    except OSError as exc:
        raise BuildError(
            f"could not run {cmd[0]!r} for the llama.cpp {step} step ({exc}). Install cmake and a C++ compiler "
            f"(Debian: apt-get install cmake g++), then run `gguf-provider server install` again. Log: {log_path}",
            log_path,
        ) from exc
    assert proc.stdout is not None
    tail: list[str] = []
    try:
        for line in proc.stdout:
            log.write(line)
            tail = (tail + [line.rstrip()])[-5:]
            if progress is not None:
                step_done = parse_progress(line)
                if step_done:
                    progress("build", step_done[0], step_done[1], line.rstrip()[:80])
        rc = proc.wait()
    except BaseException:  # Ctrl-C, or an error in a progress callback: the build stops with us
        proc.terminate()
        proc.wait()
        raise
    log.flush()
    if rc != 0:
        last = " | ".join(t for t in tail if t)[-400:]
        raise BuildError(
            f"llama.cpp {step} failed (exit code {rc}). The full output is in the log file {log_path}; "
            f"its last lines: {last}. Fix the cause (missing compiler or toolkit, bad cmake argument) and run "
            f"`gguf-provider server install --from source --force`.",
            log_path,
        )


def _find_binary(build: Path, name: str) -> Path | None:
    for cand in (build / "bin" / name, build / "bin" / "Release" / name):
        if cand.is_file():
            return cand
    return None


def smoke_test(server: Path, log_path: Path) -> str:
    """Run ``llama-server --version``; a binary built for another CPU dies here, not in front of a user."""
    try:
        return f"{prebuilt.smoke_version(server)} [{SOURCE_PIN}]"
    except PrebuiltInstallError as exc:
        raise BuildError(f"the build finished but {exc} (log: {log_path})", log_path) from None


def smoke_start(server: Path, log_path: Path, model: Path | None = None) -> float | None:
    """Start the new build on the smallest model at hand (as the prebuilt check does): ``--version`` runs no kernel,
    and a build whose compute kernels crash on this CPU must fail here, not at a user's first request. Seconds it
    took, or None when no model is at hand (a fresh machine installs the server before any model)."""
    model = model or prebuilt.smallest_model()
    if model is None:
        return None
    try:
        return prebuilt.smoke_start(server, model, log_path)
    except PrebuiltInstallError as exc:
        raise BuildError(f"the build finished but {exc} (log: {log_path}). Report it with the log; `gguf-provider "
                         f"server install --from source --force --cmake-arg=-DGGML_NATIVE=OFF` builds generic "
                         f"kernels", log_path
                         ) from None


def fetch_source() -> Path:
    """The extracted llama.cpp tree of the pinned sdist, downloaded with pip on first use."""
    dest = paths.src_dir() / SOURCE_PIN
    if (dest / "CMakeLists.txt").is_file() and (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"{SDIST_NAME}=={SDIST_VERSION}", "-d", tmp]
        out = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if out.returncode != 0 or not sdists:
            raise BuildError(f"could not download the llama.cpp source ({SDIST_NAME}=={SDIST_VERSION}) from the "
                             f"package index: {(out.stderr or out.stdout).strip()[-400:]}")
        _check_sha256(sdists[0])
        staging = Path(tmp) / "tree"
        _extract_tree(sdists[0], staging)
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    (dest / ".complete").write_text(SOURCE_PIN)
    return dest


def fetch_tag_source(tag: str) -> Path:
    """The extracted source tree of llama.cpp release ``tag``, downloaded from :func:`.prebuilt.source_url` (GitHub,
    or ``$GGUF_PROVIDER_LLAMA_SOURCE_URL``) on first use; BuildError naming where it was asked for."""
    dest = paths.src_dir() / f"llama.cpp-{tag}"
    if (dest / "CMakeLists.txt").is_file() and (dest / ".complete").exists():
        return dest
    url = prebuilt.source_url(tag)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        archive = Path(tmp) / "src.tar.gz"
        try:
            with httpx.stream("GET", url, timeout=prebuilt.TIMEOUT, follow_redirects=True) as r:
                r.raise_for_status()
                with open(archive, "wb") as f:
                    for block in r.iter_bytes(1 << 20):
                        f.write(block)
        except httpx.HTTPError as exc:
            raise BuildError(f"the source of llama.cpp {tag} could not be downloaded from {url} ({exc}); build it "
                             f"yourself and point $GGUF_PROVIDER_LLAMA_SERVER at its llama-server, or set "
                             f"$GGUF_PROVIDER_LLAMA_SOURCE_URL to a mirror of github.com") from None
        prebuilt.safe_extract(archive, Path(tmp) / "tree")
        roots = [p for p in (Path(tmp) / "tree").iterdir() if (p / "CMakeLists.txt").is_file()]
        if not roots:
            raise BuildError(f"{url} holds no llama.cpp source tree (no CMakeLists.txt at its top)")
        if dest.exists():
            shutil.rmtree(dest)
        roots[0].rename(dest)
    (dest / ".complete").write_text(url)
    return dest


def _check_sha256(path: Path) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != SDIST_SHA256:
        raise BuildError(f"{path.name} has sha256 {h.hexdigest()}, expected {SDIST_SHA256}: refusing to build it")


def _extract_tree(sdist: Path, staging: Path) -> None:
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        root = members[0].name.split("/")[0]
        prefix = f"{root}/{SDIST_TREE}/"
        picked = []
        for m in members:
            if m.name.startswith(prefix):
                m.name = m.name[len(prefix):]
                picked.append(m)
        if not picked:
            raise BuildError(f"{sdist.name} carries no {SDIST_TREE}/ tree")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(staging, members=picked, filter="data")
        else:  # Python without PEP 706 filters
            tar.extractall(staging, members=picked)


def host_summary() -> str:
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cpus"
