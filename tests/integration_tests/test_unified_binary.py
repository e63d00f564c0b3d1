"""llama.cpp as its own installer leaves it: one binary, ``llama``, run as ``llama serve`` (app/llama.cpp of the pinned
tree, which our source build makes beside llama-server). Found on PATH, by $GGUF_PROVIDER_LLAMA_SERVER, before an
install of ours; ``llama-server`` first where both are; `make demo` on a machine with only ``llama``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gguf_provider.runtime._install import discovery, installed

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "gguf_provider.cli"]
# `make demo`: a pip check of the venv (~30 s, network) and one short answer from SmolLM2; 10x under load.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def llama() -> Path:
    """The unified binary of our source build (`gguf-provider server install` makes it, `make test` runs that)."""
    inst = installed.any_installed()
    assert inst is not None, "run `gguf-provider server install` (make test does)"
    found = inst.bin_dir / "llama"
    assert found.is_file(), f"{inst.bin_dir} has no unified llama: `gguf-provider server install` adds it"
    return found


def _fresh_env(tmp_path: Path, path: str, **extra: str) -> dict[str, str]:
    """A machine where gguf-provider installed nothing: an empty home, no configured binary, ``path`` as PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH")}
    env.update(GGUF_PROVIDER_HOME=str(tmp_path / "home"), GGUF_PROVIDER_RUNTIME_DIR=str(tmp_path / "run"),
               PATH=path, GGUF_PROVIDER_AUTO_INSTALL="0", **extra)
    return env


def _bin(tmp_path: Path, name: str, *links: tuple[str, Path]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for file, target in links:
        (folder / file).symlink_to(target)
    return folder


def test_make_demo_runs_on_the_unified_binary_alone(llama: Path, smollm2_path: Path, tmp_path: Path) -> None:
    """The acceptance of issue 48: only ``llama`` on PATH (its installer's layout), nothing of ours installed:
    `make demo` answers through it and installs no other llama.cpp."""
    only = _bin(tmp_path, "only-llama", ("llama", llama))
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    for f in smollm2_path.parent.glob(smollm2_path.name + "*"):  # the model and its verified mark: not fetched again
        shutil.copy2(f, models / f.name)
    env = _fresh_env(tmp_path, f"{only}:/usr/bin:/bin")
    out = subprocess.run(["make", "--no-print-directory", "demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=800)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "no llama-server found: installing" not in out.stdout + out.stderr
    assert not (tmp_path / "home" / "bin").exists() and not (tmp_path / "home" / "build").exists()
    info = json.loads(subprocess.run([*CLI, "server", "info", "--json"], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    assert info["path"] == str(only / "llama") and info["command"] == [str(only / "llama"), "serve"]
    assert info["found_by"] == "PATH (the unified binary, run as `llama serve`)"
    assert set(info["tools"]) == {"quantize", "fit-params"}  # its subcommands


def test_a_server_runs_as_llama_serve_and_is_ours_to_stop(llama: Path, smollm2_path: Path, tmp_path: Path) -> None:
    """Named by $GGUF_PROVIDER_LLAMA_SERVER: the server's command line is ``llama serve ...``; `ps` lists it, its
    devices are listed through it, and `stop` proves it ours (pid, start time, marker) and stops it."""
    env = _fresh_env(tmp_path, os.environ["PATH"], GGUF_PROVIDER_LLAMA_SERVER=str(llama))
    script = ("from gguf_provider import ChatGGUF\n"
              f"llm = ChatGGUF(model={str(smollm2_path)!r}, max_tokens=4, keep_alive=-1)\n"
              "print(repr(llm.invoke('Say hi.').content))\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(subprocess.run([*CLI, "ps", "--json"], env=env, capture_output=True, text=True,
                                     check=True).stdout)["servers"]
    assert len(rows) == 1
    argv = psutil.Process(rows[0]["pid"]).cmdline()
    assert argv[:2] == [str(llama), "serve"] and "-m" in argv
    devices = json.loads(subprocess.run([*CLI, "devices", "--json"], env=env, capture_output=True, text=True,
                                        check=True).stdout)
    assert [d["kind"] for d in devices] == ["cpu"]  # `llama serve --list-devices`: no GPU here, then the RAM
    stop = subprocess.run([*CLI, "stop", "--all"], env=env, capture_output=True, text=True, check=True)
    assert f"stopped pid {rows[0]['pid']}" in stop.stdout
    assert not psutil.pid_exists(rows[0]["pid"]) or psutil.Process(rows[0]["pid"]).status() == psutil.STATUS_ZOMBIE


def test_where_both_are_llama_server_comes_first(llama: Path, tmp_path: Path) -> None:
    """The documented order (docs/install.md): in one folder ``llama-server`` before ``llama``; on PATH any
    ``llama-server`` before any ``llama``; a ``llama`` that is not llama.cpp's is passed over."""
    server = installed.any_installed().server  # type: ignore[union-attr]
    both = _bin(tmp_path, "both", ("llama", llama), ("llama-server", server))
    env = _fresh_env(tmp_path, f"{both}:/usr/bin:/bin")
    assert _path(env) == str(both / "llama-server")
    first = _bin(tmp_path, "first", ("llama", llama))
    later = _bin(tmp_path, "later", ("llama-server", server))
    assert _path(_fresh_env(tmp_path, f"{first}:{later}:/usr/bin:/bin")) == str(later / "llama-server")
    other = tmp_path / "other"
    other.mkdir()
    (other / "llama").write_text("#!/bin/sh\necho 'a file manager called llama'\n")
    (other / "llama").chmod(0o755)
    assert _path(_fresh_env(tmp_path, f"{other}:{first}:/usr/bin:/bin")) == str(first / "llama")
    folder = _fresh_env(tmp_path, "/usr/bin:/bin", GGUF_PROVIDER_LLAMA_SERVER=str(first))  # a folder holding llama
    assert _path(folder) == str(first / "llama")
    assert discovery.command(first / "llama") == [str(first / "llama"), "serve"]


def _path(env: dict[str, str]) -> str:
    out = subprocess.run([*CLI, "server", "path"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
