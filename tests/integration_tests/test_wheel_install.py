"""The package as a user gets it, not as this checkout runs it: ``python -m build`` makes an sdist and, from that
sdist, a wheel; the wheel (with its ``langchain`` extra) goes into a fresh venv outside the repo, and from a cwd
outside the repo, with nothing of the source tree on ``sys.path``, the installed ``gguf-provider`` says its version,
lists the devices, and a ``ChatGGUF`` answers on the real llama-server and the smallest test model.

The build and the install use the package index as pip is configured here (``PIP_FIND_LINKS``, ``PIP_INDEX_URL``,
pip's cache): the build's isolated env needs setuptools, the install the package's dependencies and langchain-core.

Measured on the 2-core dev machine with both cores busy with another test suite: the module took 83 s (89 s
with pytest's start): the build ~10 s, the venv and pip ~46 s, the import probe and two CLI calls ~1 s, the chat
test ~24 s, of which ~15 s the SmolLM2 speed measurement of tests/support/speed.py (shared with the rest of a
run) and ~8 s the chat script with its server start.
"""

from __future__ import annotations

import email
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import speed
from tests.support.runtime import RuntimeEnv, wait_until
from tests.support.timing import REACT

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gguf_provider"

# Bounds for a failure, each >= 10x what it took with both cores busy with another test suite.
BUILD_TIMEOUT = 300.0  # `python -m build`: an isolated env with setuptools, the sdist, the wheel from it: 6.5-10 s
VENV_TIMEOUT = 120.0  # `python -m venv` (with its pip): 9 s
PIP_TIMEOUT = 600.0  # the wheel with [langchain] into the fresh venv: 43 s
CLI_TIMEOUT = 60.0  # `gguf-provider --version`: 0.3 s; `devices` (llama-server --list-devices): 0.4 s
IMPORTS = 60.0  # the chat script's interpreter start and imports (langchain_core) before its server starts: ~3 s
MAX_TOKENS = 16

# The first test pays for the module's fixtures (build, venv, install): their bounds, plus the tests themselves.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(round(BUILD_TIMEOUT + VENV_TIMEOUT + PIP_TIMEOUT + 300))]


def _project() -> dict[str, str]:
    """[project]'s name, version and license, read from pyproject.toml (plain ``key = "value"`` lines)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    found = {key: re.search(rf'^{key} = "([^"]+)"$', section, re.M) for key in ("name", "version", "license")}
    assert all(found.values()), found
    return {key: m.group(1) for key, m in found.items() if m}


def _modules() -> set[str]:
    """The package's files as the source tree has them, relative to the repo (``gguf_provider/...``)."""
    return {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")}


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Venv:
    root: Path
    python: Path
    cli: Path
    purelib: Path


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build`` on the repo: the sdist, then the wheel built from the unpacked sdist (build's default),
    so a file the wheel needs but the sdist lacks fails here."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return Dist(wheel=wheels[0], sdist=sdists[0])


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would put the checkout (or this venv) on the child's sys.path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv outside the repo (the base interpreter's, not .venv's packages), the wheel installed into it
    with the ``langchain`` extra."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    assert ROOT not in root.parents
    cwd = root.parent
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=VENV_TIMEOUT, cwd=cwd)
    bin_dir = root / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           f"{dist.wheel}[langchain]"], capture_output=True, text=True, timeout=PIP_TIMEOUT, cwd=cwd,
                          env=_clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=CLI_TIMEOUT, cwd=cwd,
                             env=_clean_env()).stdout.strip()
    return Venv(root=root, python=python, cli=bin_dir / "gguf-provider", purelib=Path(purelib))


def test_the_sdist_holds_the_license_and_what_the_wheel_build_needs(dist: Dist) -> None:
    project = _project()
    top = f"{project['name'].replace('-', '_')}-{project['version']}"
    assert dist.sdist.name == f"{top}.tar.gz"
    with tarfile.open(dist.sdist) as tar:
        names = {m.name.removeprefix(top + "/") for m in tar.getmembers() if m.isfile()}
        member = tar.extractfile(f"{top}/PKG-INFO")
        assert member is not None
        pkg_info = email.message_from_bytes(member.read())
    assert {"LICENSE", "pyproject.toml", "README.md", "PKG-INFO"} <= names
    assert _modules() <= names, sorted(_modules() - names)
    assert pkg_info["License-Expression"] == project["license"]
    assert pkg_info.get_all("License-File") == ["LICENSE"]


def test_the_wheel_has_every_module_py_typed_and_the_license_metadata(dist: Dist) -> None:
    project = _project()
    info = f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
        metadata = email.message_from_bytes(whl.read(f"{info}/METADATA"))
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert _modules() <= names, sorted(_modules() - names)  # a folder without __init__.py would be left out
    if (PACKAGE / "py.typed").is_file():
        assert "gguf_provider/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names
    assert metadata["Name"] == project["name"] and metadata["Version"] == project["version"]
    assert metadata["License-Expression"] == project["license"]
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None  # PEP 639: the expression replaces the free-text field
    assert "gguf-provider = gguf_provider.cli:main" in entry_points
    assert not any(n.startswith(("tests/", "scripts/", "bench/")) for n in names)


def _run(cwd: Path, *args: str, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    assert ROOT != cwd and ROOT not in cwd.parents
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_clean_env(**env))


def _venv_env(rt: RuntimeEnv) -> dict[str, str]:
    """What a user of the installed package would set: the llama-server to use (the one the tests built), a private
    home and runtime dir (the ``rt`` fixture's), no install on first use, no Hub."""
    return {"GGUF_PROVIDER_HOME": str(rt.home), "GGUF_PROVIDER_RUNTIME_DIR": str(rt.run_dir),
            "GGUF_PROVIDER_LLAMA_SERVER": str(rt.binary), "GGUF_PROVIDER_KEEP_ALIVE": "0",
            "GGUF_PROVIDER_AUTO_INSTALL": "0", "HF_HUB_OFFLINE": "1"}


def test_the_installed_package_runs_outside_the_checkout(venv: Venv, rt: RuntimeEnv, tmp_path: Path) -> None:
    project = _project()
    probe = ("import json, sys, importlib.metadata as md, gguf_provider; d = md.distribution('gguf-provider'); "
             "print(json.dumps({'file': gguf_provider.__file__, 'path': sys.path, 'version': d.version, "
             "'direct_url': d.read_text('direct_url.json')}))")
    proc = _run(tmp_path, str(venv.python), "-c", probe, timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    module = Path(seen["file"]).resolve()
    assert venv.purelib.resolve() in module.parents, module
    assert ROOT not in module.parents, module
    assert not [p for p in seen["path"] if p and (Path(p).resolve() == ROOT or ROOT in Path(p).resolve().parents)]
    assert seen["version"] == project["version"]
    assert "dir_info" not in json.loads(seen["direct_url"] or "{}")  # installed from the wheel, not editable

    proc = _run(tmp_path, str(venv.cli), "--version", timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gguf-provider {project['version']}"

    proc = _run(tmp_path, str(venv.cli), "devices", timeout=CLI_TIMEOUT, **_venv_env(rt))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.strip()


def test_chatgguf_from_the_installed_wheel_answers(venv: Venv, rt: RuntimeEnv, tmp_path: Path) -> None:
    """Structure only: an AIMessage with a non-empty string content (never what SmolLM2 says). Its server stops
    once the script has exited (the installed package's own watchdog, KEEP_ALIVE 0)."""
    script = tmp_path / "chat.py"
    script.write_text(
        "import json, sys\n"
        "import gguf_provider\n"
        "from gguf_provider import ChatGGUF\n"
        f"llm = ChatGGUF(model=sys.argv[1], temperature=0, max_tokens={MAX_TOKENS})\n"
        "msg = llm.invoke('Say hello.')\n"
        "print(json.dumps({'type': type(msg).__name__, 'content': msg.content, 'file': gguf_provider.__file__}))\n",
        encoding="utf-8")
    timeout = IMPORTS + speed.measure("smollm2").bound(tokens=MAX_TOKENS)
    proc = _run(tmp_path, str(venv.python), str(script), str(rt.model), timeout=timeout, **_venv_env(rt))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    assert venv.purelib.resolve() in Path(reply["file"]).resolve().parents
    assert reply["type"] == "AIMessage"
    assert isinstance(reply["content"], str) and reply["content"]
    wait_until(lambda: not rt.servers(), REACT)
