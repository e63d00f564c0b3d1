"""Foundation, offline: package import hygiene, binary discovery order (fake binaries), install progress parsing,
the probe cache. The parts that need the real build are in tests/integration_tests/test_server_install.py."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_provider.errors import BinaryNotFoundError, BuildError
from gguf_provider.runtime._common import host
from gguf_provider.runtime._install import discovery, install

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "gguf_provider.cli"]


def test_import_does_not_load_frameworks() -> None:
    code = ("import sys, gguf_provider; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('langchain_core', 'llama_index', 'IPython')]; "
            "print(bad); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import gguf_provider

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "langchain_core" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'gguf-provider\[langchain\]'"):
        gguf_provider.__getattr__("ChatGGUF")


def _fake_server(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'version: 1 (fake)'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def clean_discovery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "userhome"))
    return tmp_path


def test_discovery_order(clean_discovery: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = clean_discovery
    with pytest.raises(BinaryNotFoundError, match="gguf-provider server install"):
        discovery.find_llama_server()
    # lowest first: common build dirs, then our installed build, PATH, $LLAMA_SERVER_PATH, $GGUF_..., explicit
    common = _fake_server(tmp / "userhome/llama.cpp/build/bin/llama-server")
    assert discovery.find_llama_server() == common
    vulkan = _fake_server(install.install_dir("vulkan") / "llama-server")  # `server install --backend vulkan`
    (install.install_dir("vulkan") / install.MARKER).write_text(json.dumps({"backend": "vulkan", "version": "x"}))
    assert discovery.find_llama_server() == vulkan
    ours = _fake_server(install.install_dir("cpu") / "llama-server")  # the host's default backend comes first
    (install.install_dir("cpu") / install.MARKER).write_text(json.dumps({"backend": "cpu", "version": "x"}))
    assert discovery.find_llama_server() == ours
    on_path = _fake_server(tmp / "empty-path/llama-server")
    assert discovery.find_llama_server() == on_path
    lsp = _fake_server(tmp / "lsp/llama-server")
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(lsp))
    assert discovery.find_llama_server() == lsp
    gps = _fake_server(tmp / "gps/llama-server")
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_SERVER", str(gps.parent))  # a dir works too
    assert discovery.find_llama_server() == gps
    explicit = _fake_server(tmp / "explicit/llama-server")
    assert discovery.find_llama_server(explicit) == explicit
    with pytest.raises(BinaryNotFoundError, match="llama_server="):
        discovery.find_llama_server(tmp / "nope/llama-server")


@pytest.mark.parametrize(("line", "expected"), [
    ("[12/212] Building CXX object src/llama.cpp.o", (12, 212)),
    ("[ 45%] Building CXX object common/CMakeFiles/common.dir/arg.cpp.o", (45, 100)),
    ("[100%] Built target llama-server", (100, 100)),
    ("-- Configuring done", None),
])
def test_build_progress_lines(line: str, expected: tuple[int, int] | None) -> None:
    assert install.parse_progress(line) == expected


def test_backend_auto_is_cpu_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "current_host", lambda: host.Host("linux", "x64", gpus=(), nvcc=True))
    assert install.resolve_backend("auto") == "cpu"  # a CUDA toolkit without an NVIDIA GPU is no reason for cuda
    with pytest.raises(BuildError, match="unknown backend"):
        install.resolve_backend("rocm-please")


def test_probe_is_cached_per_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--version`/`--help` run once per binary (keyed by its path, size and mtime); later probes read the cache."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n"
                      "case \"$1\" in\n"
                      "  --version) echo 'version: 1234 (abcdef)' >&2 ;;\n"
                      "  --help) printf '%s\\n' '-h, --help' '--jinja   use jinja' '--alias STRING' "
                      "'--api-key-file FNAME' '-np, --parallel N' ;;\n"
                      "esac\n")
    binary.chmod(0o755)
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    runs: list[list[str]] = []
    real_run = subprocess.run

    def spy(cmd: list[str], *args: object, **kwargs: object) -> object:
        runs.append(cmd)
        return real_run(cmd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(discovery.subprocess, "run", spy)
    first = discovery.probe(binary)
    assert [c[1] for c in runs] == ["--version", "--help"]
    assert first.version == "1234 (abcdef)"
    assert first.supports("--jinja") and first.supports("--alias") and first.supports("--api-key-file")
    assert not first.supports("--no-webui") and not first.supports("--rpc")
    cached = list((tmp_path / "home" / "probe-cache").glob("*.json"))
    assert [p.stem for p in cached] == [discovery._cache_key(binary)]
    assert discovery.probe(binary) == first and len(runs) == 2  # from the cache: nothing run
    binary.write_text(binary.read_text().replace("1234", "12345"))  # a rebuilt binary is probed again
    assert discovery.probe(binary).version == "12345 (abcdef)" and len(runs) == 4
