"""Write a tiny vision projector (mmproj) for SmolLM2-135M, with seeded random weights, as a test model.

No small vision model or projector ships on the package registries, but llama.cpp's clip loader takes a projector
written with the ``gguf`` package. This one is the ``gemma3`` kind: a one-block ViT (64x64 images, 16x16 patches,
width 32, 2 heads) whose 4x4 patch grid is average-pooled 2x2 and projected to 576 = SmolLM2's n_embd, so
llama-server loads it beside ``SmolLM2-135M-Instruct.Q4_1.gguf`` with ``--mmproj`` and turns an image into 4
embeddings. The weights are random (a seeded ``numpy.random.RandomState``, whose stream numpy keeps frozen): what
the model says about an image is meaningless, but the whole multimodal path (image decoding, the encoder, the
tokens an image adds to a prompt) is real. The file is byte-identical on every run; its sha256 is recorded below.

The ``gguf`` package is the one in the pinned llama.cpp source tree (``gguf-py``), put on ``sys.path``: it is no
dependency of the project.

Usage: ``python scripts/make_projector.py [OUT.gguf]`` (no argument: into the models dir, like test_models.py).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from gguf_provider.runtime._common import paths
from scripts.model_files import is_verified, mark, sha256_file

# `_select_mmproj` picks a .gguf whose name contains "mmproj" beside the model; the models-dir scan leaves it out.
FILENAME = "mmproj-SmolLM2-135M-Instruct-test-F32.gguf"
SHA256 = "aa6dadeec04f328101a7157fe9a76800ad502d2fade3b0c33b6f94bb2d6b85f9"
SEED = 135
TEXT_N_EMBD = 576  # SmolLM2-135M's embedding length: the projector's output width

N_EMBD, N_FF, N_HEAD, PATCH, IMAGE = 32, 64, 2, 16, 64
N_POS = (IMAGE // PATCH) ** 2

KEYS: dict[str, Any] = {
    "general.architecture": "clip",
    "general.name": "SmolLM2-135M-Instruct test projector (random weights)",
    "general.file_type": 0,  # all F32
    "clip.projector_type": "gemma3",
    "clip.has_vision_encoder": True,
    "clip.use_gelu": True,
    "clip.vision.image_size": IMAGE,
    "clip.vision.patch_size": PATCH,
    "clip.vision.embedding_length": N_EMBD,
    "clip.vision.feed_forward_length": N_FF,
    "clip.vision.block_count": 1,
    "clip.vision.attention.head_count": N_HEAD,
    "clip.vision.attention.layer_norm_epsilon": 1e-6,
    "clip.vision.projection_dim": TEXT_N_EMBD,
    "clip.vision.projector.scale_factor": 2,
    "clip.vision.image_mean": [0.5, 0.5, 0.5],
    "clip.vision.image_std": [0.5, 0.5, 0.5],
}

# name -> (shape as GGUF stores it (ne, innermost first; as GGUFReader reports it), what to fill it with)
TENSORS: dict[str, tuple[tuple[int, ...], str]] = {
    "v.patch_embd.weight": ((PATCH, PATCH, 3, N_EMBD), "normal"),
    "v.patch_embd.bias": ((N_EMBD,), "zeros"),
    "v.position_embd.weight": ((N_EMBD, N_POS), "normal"),
    **{f"v.blk.0.{p}.weight": ((N_EMBD, N_EMBD), "normal") for p in ("attn_q", "attn_k", "attn_v", "attn_out")},
    **{f"v.blk.0.{p}.bias": ((N_EMBD,), "zeros") for p in ("attn_q", "attn_k", "attn_v", "attn_out")},
    **{f"v.blk.0.{p}.weight": ((N_EMBD,), "ones") for p in ("ln1", "ln2")},
    **{f"v.blk.0.{p}.bias": ((N_EMBD,), "zeros") for p in ("ln1", "ln2")},
    "v.blk.0.ffn_up.weight": ((N_EMBD, N_FF), "normal"),
    "v.blk.0.ffn_up.bias": ((N_FF,), "zeros"),
    "v.blk.0.ffn_down.weight": ((N_FF, N_EMBD), "normal"),
    "v.blk.0.ffn_down.bias": ((N_EMBD,), "zeros"),
    "v.post_ln.weight": ((N_EMBD,), "ones"),
    "v.post_ln.bias": ((N_EMBD,), "zeros"),
    "mm.soft_emb_norm.weight": ((N_EMBD,), "ones"),
    "mm.input_projection.weight": ((TEXT_N_EMBD, N_EMBD), "normal"),
}


def gguf_py_dir() -> Path:
    """The ``gguf-py`` folder of the pinned llama.cpp source tree (the tree is downloaded on first use)."""
    from gguf_provider.runtime._install import install

    return install.fetch_source() / "gguf-py"


def load_gguf() -> ModuleType:
    """The source tree's ``gguf`` package (put on ``sys.path`` on first call)."""
    where = str(gguf_py_dir())
    if where not in sys.path:
        sys.path.insert(0, where)
    import gguf

    if not Path(gguf.__file__).resolve().is_relative_to(Path(where).resolve()):
        raise RuntimeError(f"imported a gguf package from {gguf.__file__}, not from the source tree {where}")
    return gguf


def write(out: Path, gguf: ModuleType | None = None) -> None:
    """Write the projector to ``out`` (any name: the writer does not care)."""
    gguf = gguf or load_gguf()
    rng = np.random.RandomState(SEED)
    w = gguf.GGUFWriter(str(out), arch=KEYS["general.architecture"])
    for key, value in KEYS.items():
        if key == "general.architecture":
            continue  # the writer adds it
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, (ne, fill) in TENSORS.items():
        shape = tuple(reversed(ne))  # numpy order: outermost first
        if fill == "normal":
            data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        elif fill == "ones":
            data = np.ones(shape, dtype=np.float32)
        else:
            data = np.zeros(shape, dtype=np.float32)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check(path: Path, gguf: ModuleType | None = None) -> None:
    """Read ``path`` back with ``gguf.GGUFReader``; RuntimeError unless its keys and tensors are the ones above."""
    gguf = gguf or load_gguf()
    reader = gguf.GGUFReader(str(path))
    problems = []
    for key, want in KEYS.items():
        field = reader.get_field(key)
        got = None if field is None else field.contents()
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            ok = got is not None and bool(np.allclose(got, want, rtol=0, atol=1e-7))
        else:
            ok = got == want
        if not ok:
            problems.append(f"{key} = {got!r}, want {want!r}")
    tensors = {t.name: t for t in reader.tensors}
    if set(tensors) != set(TENSORS):
        problems.append(f"tensors {sorted(set(tensors) ^ set(TENSORS))} missing or unexpected")
    for name, (ne, _fill) in TENSORS.items():
        t = tensors.get(name)
        if t is None:
            continue
        if tuple(int(d) for d in t.shape) != ne or t.tensor_type != gguf.GGMLQuantizationType.F32:
            problems.append(f"{name}: {t.tensor_type.name} {[int(d) for d in t.shape]}, want F32 {list(ne)}")
    if problems:
        raise RuntimeError(f"{path.name} is not the expected projector: " + "; ".join(problems))


def ensure() -> Path:
    """The projector's path in the models dir, written and verified if missing."""
    target = paths.models_dir() / FILENAME
    if target.is_file() and is_verified(target, SHA256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file() and sha256_file(target) == SHA256:
        mark(target, SHA256)
        return target
    print(f"writing test projector {FILENAME} ...", flush=True)
    gguf = load_gguf()
    # a temp name that does not end in .gguf: the models-dir scan never takes it for a model
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".projector-") as tmp:
        partial = Path(tmp) / (FILENAME + ".part")
        write(partial, gguf)
        check(partial, gguf)
        got = sha256_file(partial)
        if got != SHA256:
            raise RuntimeError(f"{FILENAME}: sha256 {got} != expected {SHA256} (the writer is not deterministic, "
                               "or the gguf package writes differently)")
        os.replace(partial, target)
    mark(target, SHA256)
    return target


def main(argv: list[str]) -> int:
    if argv:
        out = Path(argv[0])
        write(out)
        check(out)
        print(f"{out} sha256 {sha256_file(out)}")
    else:
        print(ensure())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
