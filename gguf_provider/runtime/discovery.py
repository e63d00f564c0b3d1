"""Find the llama-server binary to use and probe what it supports."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BinaryNotFoundError, GGUFProviderError
from . import install, paths

COMMON_BUILD_DIRS = ("~/llama.cpp/build/bin", "~/.unsloth/llama.cpp/build/bin")

# Optional flags whose presence we probe in --help rather than trusting version numbers.
OPTIONAL_FLAGS = (
    "--jinja", "--alias", "--no-webui", "--offline", "--api-key-file", "--metrics", "--fit", "--fit-ctx",
    "--sleep-idle-seconds", "--reasoning-format", "--reasoning-budget", "--chat-template-file",
    "--chat-template-kwargs", "--kv-unified", "--embedding", "--pooling", "--rpc", "--mmproj", "--slots",
    "--no-mmap", "--flash-attn", "--cache-reuse", "--props",
)


def find_llama_server(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The llama-server binary, by the documented discovery order.

    explicit ``llama_server=`` → ``$GGUF_PROVIDER_LLAMA_SERVER`` → ``$LLAMA_SERVER_PATH`` → ``llama-server`` on
    PATH → our installed build → common build dirs.
    """
    for origin, value in (("llama_server=", explicit),
                          ("$GGUF_PROVIDER_LLAMA_SERVER", os.environ.get("GGUF_PROVIDER_LLAMA_SERVER")),
                          ("$LLAMA_SERVER_PATH", os.environ.get("LLAMA_SERVER_PATH"))):
        if value:
            path = Path(value).expanduser()
            if path.is_dir():
                path = path / install.exe("llama-server")
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise BinaryNotFoundError(f"{origin} points to {path}, which is not an executable llama-server")
            return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    inst = install.any_installed()
    if inst is not None:
        return inst.server
    for d in COMMON_BUILD_DIRS:
        cand = Path(d).expanduser() / install.exe("llama-server")
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    raise BinaryNotFoundError(
        "no llama-server binary found. Run `gguf-provider server install` to build one (about 8 minutes on 2 "
        "cores), or point $GGUF_PROVIDER_LLAMA_SERVER at your own build."
    )


@dataclass
class ServerCapabilities:
    """What a llama-server binary reports about itself."""

    path: str
    version: str
    flags: dict[str, bool] = field(default_factory=dict)

    def supports(self, flag: str) -> bool:
        return self.flags.get(flag, False)


def _cache_key(binary: Path) -> str:
    st = binary.stat()
    return hashlib.sha256(f"{binary.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]


def probe(binary: Path) -> ServerCapabilities:
    """Version and optional flags of ``binary``, from ``--version`` and ``--help``; cached per binary."""
    cache = paths.home() / "probe-cache"
    key = _cache_key(binary)
    cached = cache / f"{key}.json"
    try:
        data = json.loads(cached.read_text())
        return ServerCapabilities(path=str(binary), version=data["version"], flags=data["flags"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        ver = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        hlp = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GGUFProviderError(f"{binary} could not be run ({exc}); is it built for this machine?") from exc
    if hlp.returncode != 0:
        raise GGUFProviderError(
            f"{binary} --help failed with exit code {hlp.returncode}: {(hlp.stderr or hlp.stdout)[-300:]}"
        )
    text = ver.stdout + ver.stderr
    m = re.search(r"version:\s*(.+)", text)
    version = m.group(1).strip() if m else (text.strip().splitlines() or ["unknown"])[0]
    help_text = hlp.stdout + hlp.stderr
    flags = {f: re.search(rf"(^|[\s,]){re.escape(f)}([\s,=]|$)", help_text, re.M) is not None for f in OPTIONAL_FLAGS}
    caps = ServerCapabilities(path=str(binary), version=version, flags=flags)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": version, "flags": flags}))
    os.replace(tmp, cached)
    return caps
