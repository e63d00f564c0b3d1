"""Build a llama-server two years older than our pin, for the tests that run gguf-provider on it end to end.

The source is llama-cpp-python 0.3.2's sdist on PyPI (its vendored llama.cpp is commit 74d73dc of 2024-11-16; our
pin, 0.3.36, vendors a tree of 2026). Only the ``llama-server`` target is built, once, into the user cache dir
(``<home>/test-fixtures/old-llama-server-0.3.2/llama-server``); about 6 minutes on 2 cores. `make setup-test` runs it.

Usage: ``python scripts/old_llama_server.py`` (prints the binary's path).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_provider.runtime._common import paths

VERSION = "0.3.2"
SHA256 = "8fbf246a55a999f45015ed0d48f91b4ae04ae959827fac1cd6ac6ec65aed2e2f"
COMMIT = "74d73dc"  # its vendor/llama.cpp, committed 2024-11-16
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # as our own build (runtime/_install/install.py)


def target() -> Path:
    return paths.home() / "test-fixtures" / f"old-llama-server-{VERSION}" / "llama-server"


def ensure() -> Path:
    """The old llama-server, built if missing."""
    out = target()
    if out.is_file() and os.access(out, os.X_OK):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        work = Path(tmp)
        print(f"building llama-server from llama-cpp-python {VERSION} (llama.cpp {COMMIT}, 2024-11-16) ...",
              flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(work)], check=True)
        sdist = next(work.glob("*.tar.gz"))
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != SHA256:
            raise RuntimeError(f"{sdist.name}: sha256 {digest} != {SHA256}")
        with tarfile.open(sdist) as tf:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
            tf.extractall(work / "src", **safe)  # type: ignore[arg-type]
        src = next((work / "src").glob("*/vendor/llama.cpp"))
        build = work / "build"
        flags = NO_AMX if os.uname().machine in ("x86_64", "AMD64") else ""
        log_path = paths.logs_dir() / f"build-old-llama-server-{VERSION}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:  # the compiler's many warnings go there; its tail is shown on failure
            for step in (["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                          "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF",
                          f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"],
                         ["cmake", "--build", str(build), "--config", "Release", "-j", str(os.cpu_count() or 2),
                          "--target", "llama-server"]):
                if subprocess.run(step, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                    raise RuntimeError(f"{' '.join(step[:3])} failed; the log: {log_path}\n"
                                       + "".join(log_path.read_text().splitlines(True)[-30:]))
        built = next(build.rglob("llama-server"))
        shutil.copy2(built, out.with_suffix(".tmp"))
        os.replace(out.with_suffix(".tmp"), out)
    return out


if __name__ == "__main__":
    print(ensure())
