"""Where gguf-provider keeps binaries, sources, models, logs and sockets."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import platformdirs

from ...errors import GGUFProviderError

APP = "gguf-provider"


def exe(name: str) -> str:
    """A program's file name on this OS (``llama-server.exe`` on Windows)."""
    return name + (".exe" if os.name == "nt" else "")


def home() -> Path:
    """``$GGUF_PROVIDER_HOME`` or the user cache dir (``~/.cache/gguf-provider`` on Linux)."""
    env = os.environ.get("GGUF_PROVIDER_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir(APP))


def bin_dir() -> Path:
    return home() / "bin"


def src_dir() -> Path:
    return home() / "src"


def build_dir() -> Path:
    return home() / "build"


def logs_dir() -> Path:
    path = home() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    return home() / "models"


def models_dirs() -> list[Path]:
    """The dirs searched for models by name: ``<home>/models`` then ``$GGUF_PROVIDER_MODELS`` (os.pathsep list)."""
    dirs = [models_dir()]
    extra = os.environ.get("GGUF_PROVIDER_MODELS", "")
    dirs += [Path(p).expanduser() for p in extra.split(os.pathsep) if p]
    return dirs


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` as a 0700 directory owned by us, or refuse one that someone else could use."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise GGUFProviderError(f"{path} is not a directory; remove it and try again")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise GGUFProviderError(f"{path} belongs to another user; refusing to put sockets or keys there")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def runtime_dir() -> Path:
    """A private (0700) per-user dir for sockets, key files and server logs.

    Unix socket paths are limited to ~107 bytes, so this stays short: ``$XDG_RUNTIME_DIR/gguf-provider`` when that
    exists, else ``<tmp>/gguf-provider-<uid>``. ``$GGUF_PROVIDER_RUNTIME_DIR`` overrides it.
    """
    env = os.environ.get("GGUF_PROVIDER_RUNTIME_DIR")
    if env:
        return ensure_private_dir(Path(env))
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
        return ensure_private_dir(Path(xdg) / APP)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return ensure_private_dir(Path(tempfile.gettempdir()) / f"{APP}-{uid}")
