"""Find the llama-server binary to use and probe what it supports. Finding never installs: that is
:func:`.install.ensure_installed`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BinaryNotFoundError, GGUFProviderError
from .._common import paths
from . import installed

COMMON_BUILD_DIRS = ("~/llama.cpp/build/bin", "~/.unsloth/llama.cpp/build/bin")

# Optional flags whose presence we probe in --help rather than trusting version numbers.
OPTIONAL_FLAGS = (
    "--jinja", "--alias", "--no-webui", "--offline", "--api-key-file", "--metrics", "--fit", "--fit-ctx",
    "--sleep-idle-seconds", "--reasoning-format", "--reasoning-budget", "--chat-template-file",
    "--chat-template-kwargs", "--kv-unified", "--embedding", "--pooling", "--rpc", "--mmproj", "--slots",
    "--no-mmap", "--flash-attn", "--cache-reuse", "--props", "--spec-default", "--spec-type", "--spec-draft-model",
    "--model-draft", "--cache-type-k", "--cache-type-v", "--spec-draft-type-k", "--spec-draft-type-v",
    "--cache-type-k-draft", "--cache-type-v-draft", "--rerank", "--slot-save-path", "--cache-ram",
    # listed by builds whose context shift is off unless asked (older ones list only --no-context-shift)
    "--context-shift",
    # written by every start (runtime/_serve/features.py: a build without one is refused) or by the memory plan
    "--model", "--ctx-size", "--host", "--port", "--parallel", "--n-gpu-layers", "--tensor-split", "--n-cpu-moe",
    "--device", "--threads", "--threads-batch", "--batch-size", "--ubatch-size", "--chat-template",
)
# What --help says in words rather than as a flag: ``--host`` taking a Unix socket path (builds before 2025 bind
# TCP only: those servers listen on loopback with a key file instead).
UNIX_SOCKET = "unix-socket"
# Flags whose allowed values we read from --help: `--spec-type a,b,c`, `allowed values: a, b` below the flag,
# `[a|b|c]` or `{a,b,c}` after it.
CHOICE_FLAGS = ("--spec-type", "--cache-type-k", "--cache-type-v", "--flash-attn")


NOT_FOUND = ("no llama-server binary found. Run `gguf-provider server install` (llama.cpp's prebuilt archive in "
             "seconds, else a source build of about 8 minutes on 2 cores), or point $GGUF_PROVIDER_LLAMA_SERVER at "
             "your own build.")

AUTO_INSTALL_MODES = {"1": "auto", "auto": "auto", "true": "auto", "yes": "auto", "on": "auto",
                      "prebuilt": "prebuilt", "0": "off", "false": "off", "no": "off", "off": "off"}


UNIFIED = "llama"  # llama.cpp's one binary (app/llama.cpp; llama.app's installer): `llama serve` is llama-server
SERVER_NAMES = ("llama-server", UNIFIED)  # in each place, in this order
# Where installers put llama.cpp, after PATH: llama.app's (install.sh: ~/.llama-app/llama linked from ~/.local/bin;
# install.ps1: %LOCALAPPDATA%\Microsoft\WindowsApps), Homebrew's, winget's.
KNOWN_LOCATIONS = (("llama.app installer", "~/.llama-app"), ("llama.app installer", "~/.local/bin"),
                   ("llama.app installer", "%LOCALAPPDATA%/Microsoft/WindowsApps"),
                   ("Homebrew", "/opt/homebrew/bin"), ("Homebrew", "/home/linuxbrew/.linuxbrew/bin"),
                   ("Homebrew", "/usr/local/bin"), ("winget", "%LOCALAPPDATA%/Microsoft/WinGet/Links"))


def is_unified(binary: str | os.PathLike[str]) -> bool:
    """Whether ``binary`` is llama.cpp's unified ``llama`` (run as ``llama serve``) rather than ``llama-server``."""
    return Path(binary).name.lower() in (UNIFIED, f"{UNIFIED}.exe")


def command(binary: str | os.PathLike[str]) -> list[str]:
    """The command line's head that runs ``binary`` as llama-server: itself, or ``llama serve``."""
    return [str(binary), "serve"] if is_unified(binary) else [str(binary)]


def _runs_serve(binary: Path) -> bool:
    """Whether a ``llama`` is llama.cpp's (its command list has ``serve``), not another program of that name."""
    try:
        out = subprocess.run([str(binary), "help"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"^\s+serve\s", out.stdout + out.stderr, re.M) is not None


# What we run beside the server: the file next to it, else the unified binary's subcommand. rpc-server has none.
TOOLS = {"rpc-server": ("ggml-rpc-server", "rpc-server"), "quantize": ("llama-quantize",),
         "gguf-split": ("llama-gguf-split",), "fit-params": ("llama-fit-params",)}


def tools(binary: Path) -> dict[str, list[str]]:
    """Each tool of :data:`TOOLS` there is for ``binary``: its command line's head (``[".../llama-quantize"]`` or
    ``[".../llama", "quantize"]``)."""
    found: dict[str, list[str]] = {}
    commands: set[str] = set()
    if is_unified(binary):
        try:
            out = subprocess.run([str(binary), "help", "all"], capture_output=True, text=True, timeout=30,
                                 stdin=subprocess.DEVNULL)
            commands = set(re.findall(r"^\s{2}([a-z-]+)\s", out.stdout + out.stderr, re.M))
        except (OSError, subprocess.SubprocessError):
            pass
    for tool, files in TOOLS.items():
        beside = next((binary.parent / paths.exe(f) for f in files if _executable(binary.parent / paths.exe(f))),
                      None)
        if beside is not None:
            found[tool] = [str(beside)]
        elif tool in commands:
            found[tool] = [str(binary), tool]
    return found


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _in(folder: Path) -> Path | None:
    """The server binary in ``folder``: ``llama-server``, else a ``llama`` that is llama.cpp's."""
    for name in SERVER_NAMES:
        cand = folder / paths.exe(name)
        if _executable(cand) and (name != UNIFIED or _runs_serve(cand)):
            return cand
    return None


def _how(binary: Path, where: str) -> str:
    return f"{where} (the unified binary, run as `{UNIFIED} serve`)" if is_unified(binary) else where


def locate(explicit: str | os.PathLike[str] | None = None) -> tuple[Path, str] | None:
    """``(binary, how it was found)`` by the documented discovery order, or None when nothing is there.

    explicit ``llama_server=`` → ``$GGUF_PROVIDER_LLAMA_SERVER`` → ``$LLAMA_SERVER_PATH`` (each a ``llama-server``
    or a unified ``llama``, or a folder holding one) → ``llama-server``, then ``llama``, on PATH → installers'
    locations (:data:`KNOWN_LOCATIONS`) → our installed build → common build dirs; in each folder ``llama-server``
    before ``llama``. An explicit choice that is not an executable raises BinaryNotFoundError (no fall-through).
    """
    for origin, value in (("llama_server=", explicit),
                          ("$GGUF_PROVIDER_LLAMA_SERVER", os.environ.get("GGUF_PROVIDER_LLAMA_SERVER")),
                          ("$LLAMA_SERVER_PATH", os.environ.get("LLAMA_SERVER_PATH"))):
        if value:
            path = Path(value).expanduser()
            if path.is_dir():
                path = _in(path) or path / paths.exe("llama-server")
            if not _executable(path):
                raise BinaryNotFoundError(f"{origin} points to {path}, which is not an executable llama-server or "
                                          f"{UNIFIED}")
            return path, _how(path, origin)
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path), "PATH"
    for folder in os.environ.get("PATH", "").split(os.pathsep):  # the first `llama` that is llama.cpp's
        cand = Path(folder or ".") / paths.exe(UNIFIED)
        if folder and _executable(cand) and _runs_serve(cand):
            return cand, _how(cand, "PATH")
    for where, folder in KNOWN_LOCATIONS:
        expanded = os.path.expandvars(folder)
        if "%" in expanded or "$" in expanded:  # a Windows folder elsewhere, or the variable is unset
            continue
        found = _in(Path(expanded).expanduser())
        if found is not None:
            return found, _how(found, f"{where} ({folder})")
    inst = installed.any_installed()
    if inst is not None:
        return inst.server, "installed by gguf-provider server install"
    for d in COMMON_BUILD_DIRS:
        found = _in(Path(d).expanduser())
        if found is not None:
            return found, _how(found, f"common build dir {d}")
    return None


def auto_install_mode() -> str:
    """``$GGUF_PROVIDER_AUTO_INSTALL``: "auto" (default: prebuilt, else source), "prebuilt" or "off"."""
    value = os.environ.get("GGUF_PROVIDER_AUTO_INSTALL", "auto").strip().lower() or "auto"
    if value not in AUTO_INSTALL_MODES:
        raise ValueError(f"GGUF_PROVIDER_AUTO_INSTALL={value!r}: use 1/auto, prebuilt or 0/off")
    return AUTO_INSTALL_MODES[value]


def find_llama_server(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The llama-server binary, by the discovery order of :func:`locate`; BinaryNotFoundError when there is none.

    It never installs one: :func:`.install.ensure_installed` does, on a model's first start.
    """
    found = locate(explicit)
    if found is None:
        raise BinaryNotFoundError(NOT_FOUND)
    return found[0]


def parse_version(text: str, default: str = "unknown") -> str:
    """The version in ``llama-server --version``'s output: what follows "version:", else its first line."""
    m = re.search(r"version:\s*(.+)", text)
    return m.group(1).strip() if m else (text.strip().splitlines() or [default])[0]


@dataclass
class ServerCapabilities:
    """What a llama-server binary reports about itself."""

    path: str
    version: str
    flags: dict[str, bool] = field(default_factory=dict)
    choices: dict[str, list[str]] = field(default_factory=dict)  # allowed values of CHOICE_FLAGS, as --help lists

    def supports(self, flag: str) -> bool:
        return self.flags.get(flag, False)

    def allowed(self, flag: str) -> list[str]:
        """The values ``--help`` lists for ``flag`` (empty when it lists none or the flag is absent)."""
        return self.choices.get(flag, [])


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
        if not {*OPTIONAL_FLAGS, UNIX_SOCKET} <= set(data["flags"]):
            raise KeyError("a flag probed since")  # written before a flag joined OPTIONAL_FLAGS: probe again
        return ServerCapabilities(path=str(binary), version=data["version"], flags=data["flags"],
                                  choices=data["choices"])
    except (OSError, ValueError, KeyError):  # also a cache written before `choices` existed: probe again
        pass
    caps = probe_uncached(binary)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": caps.version, "flags": caps.flags, "choices": caps.choices}))
    os.replace(tmp, cached)
    return caps


def probe_uncached(binary: Path) -> ServerCapabilities:
    """Run ``--version`` and ``--help`` (the install's smoke run uses this on a staged binary)."""
    try:
        ver = subprocess.run([*command(binary), "--version"], capture_output=True, text=True, timeout=30)
        hlp = subprocess.run([*command(binary), "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GGUFProviderError(f"{binary} could not be run ({exc}); is it built for this machine?") from exc
    if hlp.returncode != 0:
        raise GGUFProviderError(
            f"{binary} --help failed with exit code {hlp.returncode}: {(hlp.stderr or hlp.stdout)[-300:]}"
        )
    return from_help(str(binary), ver.stdout + ver.stderr, hlp.stdout + hlp.stderr)


def from_help(path: str, version_text: str, help_text: str) -> ServerCapabilities:
    """What a build can do, read from its ``--version`` and ``--help`` output."""
    flags = {f: re.search(rf"(^|[\s,]){re.escape(f)}([\s,=]|$)", help_text, re.M) is not None for f in OPTIONAL_FLAGS}
    flags[UNIX_SOCKET] = re.search(r"^--host\b.*unix socket", help_text, re.M | re.I) is not None
    choices = {f: found for f in CHOICE_FLAGS if (found := help_choices(help_text, f))}
    return ServerCapabilities(path=path, version=parse_version(version_text), flags=flags, choices=choices)


def help_choices(help_text: str, flag: str) -> list[str]:
    """The values llama-server's ``--help`` allows for ``flag``: a comma list as its metavar (``--spec-type
    none,ngram-mod,...``), ``[on|off|auto]`` / ``{a,b}`` after it, or an ``allowed values:`` line in its entry."""
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("-"):
            continue
        names, metavar = [], ""
        words = line.split()
        for j, word in enumerate(words):  # "-ctk,  --cache-type-k TYPE   description..."
            if not word.startswith("-"):
                break
            names.append(word.rstrip(","))
            if not word.endswith(","):
                metavar = words[j + 1] if j + 1 < len(words) else ""
                break
        if flag not in names:
            continue
        if re.fullmatch(r"[a-z0-9_.-]+(,[a-z0-9_.-]+)+", metavar):
            return metavar.split(",")
        bracket = re.fullmatch(r"[\[{]([a-z0-9_.|,-]+)[\]}]", metavar)
        if bracket:
            return re.split(r"[|,]", bracket.group(1))
        for below in lines[i + 1:]:
            if below[:1].strip():  # the next option's entry starts at column 0
                break
            allowed = re.search(r"allowed values:\s*(.+)", below)
            if allowed:
                return [v.strip() for v in allowed.group(1).split(",") if v.strip()]
        return []
    return []
