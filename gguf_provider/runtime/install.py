"""Fetch a pinned llama.cpp source from a registry sdist and build ``llama-server`` from it.

Only the MIT-licensed llama.cpp tree inside the sdist (``vendor/llama.cpp``) is extracted; none of the wrapper's
Python code is used.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..errors import BuildError
from . import paths
from .progress import Progress

# The source pin: a registry sdist that carries the llama.cpp tree. Record it: tarball builds report no commit.
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_TREE = "vendor/llama.cpp"
SOURCE_PIN = f"{SDIST_NAME}-{SDIST_VERSION}"

SERVER_TARGET = "llama-server"
TOOL_TARGETS = ("llama-gguf-split", "llama-quantize")
BACKENDS = ("auto", "cpu", "cuda", "vulkan", "metal")
MARKER = "installed.json"

@dataclass(frozen=True)
class Installation:
    backend: str
    bin_dir: Path
    version: str

    @property
    def server(self) -> Path:
        return self.bin_dir / exe(SERVER_TARGET)


def exe(name: str) -> str:
    return name + (".exe" if os.name == "nt" else "")


def resolve_backend(backend: str = "auto") -> str:
    """``auto`` → cuda when a CUDA toolkit *and* an NVIDIA GPU are present, metal on macOS, else cpu."""
    if backend not in BACKENDS:
        raise BuildError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if sys.platform == "darwin":
        return "metal"
    if shutil.which("nvcc") and _has_nvidia_gpu():
        return "cuda"
    return "cpu"


def _has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def install_dir(backend: str) -> Path:
    return paths.bin_dir() / f"{SOURCE_PIN}-{backend}"


def installed(backend: str = "auto") -> Installation | None:
    """The recorded installation for ``backend``, if its marker and binary are intact."""
    target = install_dir(resolve_backend(backend))
    try:
        data = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return None
    inst = Installation(backend=data["backend"], bin_dir=target, version=data.get("version", ""))
    return inst if inst.server.is_file() else None


def any_installed() -> Installation | None:
    """Our build for this host's default backend, else any other backend installed from the same source pin."""
    preferred = installed("auto") or installed("cpu")
    if preferred is not None:
        return preferred
    others = (installed(b) for b in BACKENDS if b not in ("auto", "cpu"))
    return next((inst for inst in others if inst is not None), None)


def backend_of(binary: Path) -> str | None:
    """The backend of our installed build that ``binary`` is, or None for any other binary."""
    target = binary.resolve()
    for backend in BACKENDS[1:]:
        inst = installed(backend)
        if inst is not None and inst.server.resolve() == target:
            return inst.backend
    return None


def install(
    backend: str = "auto",
    *,
    force: bool = False,
    cmake_args: list[str] | None = None,
    progress: Progress | None = None,
    jobs: int | None = None,
) -> Installation:
    """Build and install llama-server (plus llama-gguf-split and llama-quantize) for ``backend``.

    A second call finds the marker and returns at once unless ``force``. ``progress`` gets "build" reports (see
    :mod:`.progress`). Raises :class:`BuildError` naming the log
    file when any step fails.
    """
    backend = resolve_backend(backend)
    if not force and not cmake_args:
        done = installed(backend)
        if done is not None:
            return done
    src = fetch_source()
    build = paths.build_dir() / f"{SOURCE_PIN}-{backend}"
    log_path = paths.logs_dir() / f"build-{SOURCE_PIN}-{backend}.log"
    if force and build.exists():
        shutil.rmtree(build)
    args = configure_args(src, build, backend) + list(cmake_args or [])
    targets = [SERVER_TARGET, *TOOL_TARGETS]
    build_cmd = ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs or os.cpu_count() or 2)]
    build_cmd += ["--target", *targets]
    with open(log_path, "w") as log:
        _run_logged(args, log, log_path, "configure", None)
        _run_logged(build_cmd, log, log_path, "build", progress)
    target = install_dir(backend)
    target.mkdir(parents=True, exist_ok=True)
    for name in targets:
        found = _find_binary(build, exe(name))
        if found is None:
            raise BuildError(f"the build finished but {exe(name)} was not produced; see the log: {log_path}", log_path)
        shutil.copy2(found, target / exe(name))
    version = smoke_test(target / exe(SERVER_TARGET), log_path)
    marker = {"backend": backend, "source": SOURCE_PIN, "sha256": SDIST_SHA256, "version": version,
              "built_at": time.time(), "cmake_args": args[1:]}
    (target / MARKER).write_text(json.dumps(marker, indent=2))
    return Installation(backend=backend, bin_dir=target, version=version)


def configure_args(src: Path, build: Path, backend: str) -> list[str]:
    args = [
        "cmake", "-S", str(src), "-B", str(build),
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
        "-DGGML_NATIVE=ON",
    ]
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
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as exc:
        raise BuildError(
            f"could not run {cmd[0]!r} for the llama.cpp {step} step ({exc}). Install cmake and a C++ compiler "
            f"(Debian: apt-get install cmake g++), then run `gguf-provider server install` again. Log: {log_path}",
            log_path,
        ) from exc
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        log.write(line)
        tail = (tail + [line.rstrip()])[-5:]
        if progress is not None:
            step_done = parse_progress(line)
            if step_done:
                progress("build", step_done[0], step_done[1], line.rstrip()[:80])
    rc = proc.wait()
    log.flush()
    if rc != 0:
        last = " | ".join(t for t in tail if t)[-400:]
        raise BuildError(
            f"llama.cpp {step} failed (exit code {rc}). The full output is in the log file {log_path}; "
            f"its last lines: {last}. Fix the cause (missing compiler or toolkit, bad cmake argument) and run "
            f"`gguf-provider server install --force`.",
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
        out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"{server} --version could not run ({exc}); log: {log_path}", log_path) from exc
    text = (out.stdout + out.stderr).strip()
    if out.returncode != 0:
        raise BuildError(f"{server} --version failed with exit code {out.returncode}: {text[-300:]}", log_path)
    m = re.search(r"version:\s*(.+)", text)
    return f"{m.group(1).strip() if m else text.splitlines()[0] if text else '?'} [{SOURCE_PIN}]"


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


def _check_sha256(path: Path) -> None:
    import hashlib

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
