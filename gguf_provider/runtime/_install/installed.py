"""The llama-server installs in our bin dir: where each kind goes, the marker each records, and reading them back.

:mod:`.install` writes them; :mod:`.discovery` (and the RPC worker lookup) read them, without importing the
installer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import BuildError
from .._common import host, paths

# The source pin: a registry sdist that carries the llama.cpp tree. Record it: tarball builds report no commit.
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SOURCE_PIN = f"{SDIST_NAME}-{SDIST_VERSION}"

SERVER_TARGET = "llama-server"
BACKENDS = ("auto", "cpu", "cuda", "vulkan", "metal")
MARKER = "installed.json"
# The upstream build of the commit llama-cpp-python 0.3.36 vendors (0c1e57098), i.e. the source of our source
# build; how that was determined: docs/install.md#a-newer-llamacpp-and-back.
PINNED_TAG = "b11312"
PINNED_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
NAMED = "backend-named"  # in the bin dir: the backend `server install --backend` named last
NAMED_TAG = "tag-named"  # in the bin dir: the llama.cpp release `server install --tag` named last


@dataclass(frozen=True)
class Installation:
    backend: str
    bin_dir: Path
    version: str
    origin: str = "source"  # "source" (built from SOURCE_PIN) or "prebuilt" (a llama.cpp release archive)
    marker: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    fresh: bool = field(default=False, compare=False)  # installed by this call

    @property
    def server(self) -> Path:
        return self.bin_dir / paths.exe(SERVER_TARGET)

    def describe(self) -> str:
        """Where the binary came from, in one line."""
        m = self.marker
        if self.origin == "prebuilt":
            return (f"prebuilt llama.cpp {m.get('tag')} ({m.get('asset')}, {m.get('digest')}"
                    + (f", commit {str(m['commit'])[:9]}" if m.get("commit") else "") + ")")
        if m.get("tag"):
            return f"source build of llama.cpp {m['tag']} ({m.get('source')})"
        return f"source build of {m.get('source', SOURCE_PIN)}"


def resolve_backend(backend: str = "auto") -> str:
    """``auto`` → the backend that fits this machine (:func:`.host.choose`: CUDA for an NVIDIA GPU with a CUDA
    toolkit, Vulkan for an NVIDIA, AMD or Intel GPU without one, Metal on Apple silicon, else CPU), probed once
    per process; any other name is itself."""
    if backend not in BACKENDS:
        raise BuildError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    return host.choose(host.current_host()).backend


def install_dir(backend: str) -> Path:
    """Where the source build for ``backend`` goes."""
    return paths.bin_dir() / f"{SOURCE_PIN}-{backend}"


def prebuilt_dir(tag: str, backend: str) -> Path:
    """Where llama.cpp release ``tag``'s archive for ``backend`` goes."""
    return paths.bin_dir() / f"llama.cpp-{tag}-{backend}"


def read(target: Path) -> Installation | None:
    """The installation in ``target``, or None when its marker or binary is missing or unreadable."""
    try:
        data = json.loads((target / MARKER).read_text())
        inst = Installation(backend=data["backend"], bin_dir=target, version=data.get("version", ""),
                            origin=data.get("origin", "source"), marker=data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return inst if inst.server.is_file() else None


def installations() -> list[Installation]:
    """Every intact installation (marker and binary present) in the bin dir, newest first."""
    try:
        dirs = [d for d in paths.bin_dir().iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        return []
    found = [inst for inst in map(read, dirs) if inst is not None]
    return sorted(found, key=lambda i: float(i.marker.get("installed_at") or i.marker.get("built_at") or 0),
                  reverse=True)


def installed(backend: str = "auto", origin: str | None = None, tag: str | None = None) -> Installation | None:
    """The newest intact installation for ``backend`` (of that ``origin`` and release ``tag`` when given)."""
    backend = resolve_backend(backend)
    for inst in installations():
        if inst.backend == backend and origin in (None, inst.origin) and tag in (None, inst.marker.get("tag")):
            return inst
    return None


def named_backend() -> str | None:
    """The backend the last ``gguf-provider server install --backend NAME`` named, or None (the machine's)."""
    try:
        name = (paths.bin_dir() / NAMED).read_text().strip()
    except OSError:
        return None
    return name if name in BACKENDS[1:] else None


def name_backend(backend: str | None) -> None:
    """Record ``backend`` as the one to use while installed (what `server install --backend` does); None or
    ``auto`` forgets it (`server install` without ``--backend``)."""
    target = paths.bin_dir() / NAMED
    if backend in (None, "auto"):
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{backend}\n")


def named_tag() -> str | None:
    """The release the last ``gguf-provider server install --tag TAG`` named, or None (the pinned one)."""
    try:
        return (paths.bin_dir() / NAMED_TAG).read_text().strip() or None
    except OSError:
        return None


def name_tag(tag: str | None) -> None:
    """Record release ``tag`` as the one to use while installed; None goes back to the pinned build."""
    target = paths.bin_dir() / NAMED_TAG
    if tag is None:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{tag}\n")


def is_pinned(inst: Installation) -> bool:
    """Our source build of the pin, or the pinned release's archive."""
    return (inst.origin == "source" and not inst.marker.get("tag")) or inst.marker.get("tag") == PINNED_TAG


def in_use_order(found: list[Installation]) -> list[Installation]:
    """``found`` (of one backend) as they are preferred: the release `server install --tag` named, else the pinned
    build, then the newest."""
    named = named_tag()
    return sorted(found, key=lambda i: 0 if (named and i.marker.get("tag") == named)
                  else 1 if is_pinned(i) else 2)  # sorted() keeps the newest-first order within each rank


def any_installed() -> Installation | None:
    """Our install for the backend `server install --backend` named last, else the backend that fits this machine
    (``auto``), else another that can use its GPU, else cpu, else any other (:func:`.host.preference`): a CPU build
    never wins over a usable GPU build unless it was named."""
    found = installations()
    named = named_backend()
    order = host.preference(host.current_host())
    for backend in ([named] if named else []) + [b for b in order if b != named]:
        inst = next(iter(in_use_order([i for i in found if i.backend == backend])), None)
        if inst is not None:
            return inst
    return None


def backend_of(binary: Path) -> str | None:
    """The backend of our installation that ``binary`` is, or None for any other binary."""
    target = binary.resolve()
    return next((inst.backend for inst in installations() if inst.server.resolve() == target), None)
