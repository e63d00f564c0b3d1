"""`gguf-provider server install|path|version` and the probe on the real llama-server build of `make test`'s set-up
(and the llama.cpp source it was built from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_provider.runtime._install import discovery, install

CLI = [sys.executable, "-m", "gguf_provider.cli"]


def test_second_install_is_a_noop() -> None:
    """`gguf-provider server install` when installed: no rebuild, the binary untouched (timing printed)."""
    inst = install.installed("auto")
    assert inst is not None, "make test's set-up installs llama-server first"
    mtime = inst.server.stat().st_mtime_ns
    t0 = time.monotonic()
    out = subprocess.run([*CLI, "server", "install"], capture_output=True, text=True, check=True)
    took = time.monotonic() - t0
    print(f"second install took {took:.2f} s")
    assert "already installed" in out.stdout
    assert inst.server.stat().st_mtime_ns == mtime


def test_broken_build_names_the_log(tmp_path: Path) -> None:
    """A bad CMake argument ends in one paragraph naming the log file (the source tree is reused, not fetched)."""
    src = install.fetch_source()
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "src" / install.SOURCE_PIN).symlink_to(src, target_is_directory=True)
    env = dict(os.environ, GGUF_PROVIDER_HOME=str(home))
    out = subprocess.run([*CLI, "server", "install", "--backend", "cpu", "--cmake-arg=-DCMAKE_TOOLCHAIN_FILE=/nope.cmake"],
                         capture_output=True, text=True, env=env, timeout=300)  # ~0.5 s under load; 600x
    assert out.returncode == 1
    err = out.stderr.strip()
    assert err.startswith("gguf-provider: error: llama.cpp configure failed")
    log = home / "logs" / f"build-{install.SOURCE_PIN}-cpu.log"
    assert str(log) in err and log.is_file()
    assert "\n\n" not in err  # one paragraph
    assert not list(home.rglob(install.MARKER))  # a failed build records no installation


def test_server_path_and_version_cli() -> None:
    path = subprocess.run([*CLI, "server", "path"], capture_output=True, text=True, check=True).stdout.strip()
    assert Path(path).name == "llama-server" and os.access(path, os.X_OK)
    out = subprocess.run([*CLI, "server", "version", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["path"] == path
    assert data["flags"]["--jinja"] and data["flags"]["--api-key-file"] and data["flags"]["--alias"]
    assert data["version"]


def test_probe_is_cached_per_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--version`/`--help` run once per binary (keyed by its path, size and mtime); later probes read the cache."""
    binary = discovery.find_llama_server()  # before the home moves
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    runs: list[list[str]] = []
    real_run = subprocess.run

    def spy(cmd: list[str], *args: object, **kwargs: object) -> object:
        runs.append(cmd)
        return real_run(cmd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(discovery.subprocess, "run", spy)
    first = discovery.probe(binary)
    assert [c[1] for c in runs] == ["--version", "--help"] and first.supports("--jinja")
    cached = list((tmp_path / "home" / "probe-cache").glob("*.json"))
    assert [p.stem for p in cached] == [discovery._cache_key(binary)]
    assert discovery.probe(binary) == first and len(runs) == 2  # from the cache: nothing run
