"""Find llama.cpp helper tools (``llama-quantize``, ``llama-gguf-split``, ...) for tests.

Looks in the installed bin dir (``<home>/bin/llama-cpp-python-0.3.36-cpu/``) first, then every other install
(a release archive's ``<home>/bin/llama.cpp-<tag>-<backend>/`` carries the tools too), then the build dir
(``<home>/build/llama-cpp-python-0.3.36-cpu/bin/``), then ``$PATH``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gguf_provider.runtime._common import paths

BUILD_TAG = "llama-cpp-python-0.3.36-cpu"


def candidate_dirs() -> list[Path]:
    from gguf_provider.runtime._install import installed

    installs = [i.bin_dir for i in installed.installations() if i.bin_dir.name != BUILD_TAG]
    return [paths.bin_dir() / BUILD_TAG, *installs, paths.build_dir() / BUILD_TAG / "bin"]


def tool_path(name: str) -> Path | None:
    """The path of llama.cpp tool ``name`` or None when it is nowhere to be found."""
    exe = name + (".exe" if os.name == "nt" else "")
    for d in candidate_dirs():
        p = d / exe
        if p.is_file() and os.access(p, os.X_OK):
            return p
    found = shutil.which(name)
    return Path(found) if found else None
