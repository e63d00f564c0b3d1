"""Ollama identities through a real gateway, with the real ``ollama`` client and the real test models: digests that
tell files apart and names of one file alike, header details, one /api/ps entry per file, and capabilities.

The gateway's models dir holds links to the test models (their ``.sha256`` markers sit beside the real files), a
second name of Qwen (another link), the SmolLM2 projector, and a copy of MiniLM with no marker: its digest is
hashed by the gateway itself."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import closed_after_test
from tests.support.gateway import GatewayProc, gateway

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct.Q4_1"
QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"
QWEN_SHORT = "Qwen2.5-Coder-0.5B-Instruct"  # the same file by its name without the quant
QWEN_LINK = "Coder-Half-B.Q4_K_M"  # a second file name (a link) of the same file
MINILM = "all-MiniLM-L6-v2.F16"
MINILM_COPY = "MiniLM-copy.F16"  # a copy: another file with the same bytes, no marker


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, qwen_path: Path, minilm_path: Path,
           projector_path: Path) -> Path:
    d = tmp_path_factory.mktemp("identity-models")
    for p in (smollm2_path, qwen_path, minilm_path, projector_path):
        (d / p.name).symlink_to(p)
    (d / f"{QWEN_LINK}.gguf").symlink_to(qwen_path)
    shutil.copyfile(minilm_path, d / f"{MINILM_COPY}.gguf")
    return d


@pytest.fixture(scope="module")
def gw(models: Path) -> Iterator[GatewayProc]:
    with gateway(models, "--ctx", "1024") as g:
        yield g


def client(gw: GatewayProc) -> Any:
    import ollama

    return closed_after_test(ollama.Client(host=gw.url, timeout=300))


def expected_sha(key: str) -> str:
    """The sha256 scripts/test_models.py checked the test model against."""
    from scripts import convert_minilm
    from scripts.test_models import MODELS

    return convert_minilm.SHA256 if key == "minilm" else MODELS[key].sha256


def tensor_count(path: Path) -> int:
    from gguf_provider.runtime._common import gguf

    return sum(math.prod(t.shape) for t in gguf.read_tensors(path))


def as_number(size: str) -> float:
    return float(size[:-1]) * {"K": 1e3, "M": 1e6, "B": 1e9}[size[-1]]


def test_digests_tell_files_apart_and_every_name_of_one_file_alike(gw: GatewayProc, qwen_path: Path,
                                                                 smollm2_path: Path) -> None:
    listed = {m.model: m for m in client(gw).list().models}
    assert {SMOL, QWEN, QWEN_LINK, MINILM, MINILM_COPY} <= set(listed)
    assert listed[SMOL].digest == f"sha256:{expected_sha('smollm2')}"
    assert listed[QWEN].digest == listed[QWEN_LINK].digest == f"sha256:{expected_sha('qwen')}"
    # the copy had no marker: the gateway hashed it (in the background), and a copy is its content
    assert listed[MINILM_COPY].digest == listed[MINILM].digest == f"sha256:{expected_sha('minilm')}"
    assert len({listed[n].digest for n in (SMOL, QWEN, MINILM)}) == 3
    again = {m.model: m.digest for m in client(gw).list().models}
    assert again == {n: m.digest for n, m in listed.items()}

    qwen, smol, minilm = listed[QWEN].details, listed[SMOL].details, listed[MINILM].details
    assert (qwen.family, qwen.families, qwen.quantization_level, qwen.format) == ("qwen2", ["qwen2"], "Q4_K_M",
                                                                                   "gguf")
    assert (smol.family, smol.families, smol.quantization_level) == ("llama", ["llama", "clip"], "Q4_1")
    assert (minilm.family, minilm.quantization_level) == ("bert", "F16")
    for details, path, low, high in ((qwen, qwen_path, 0.4e9, 0.7e9), (smol, smollm2_path, 0.12e9, 0.15e9)):
        n = tensor_count(path)
        assert low < n < high  # a 0.5B and a 135M model
        assert abs(as_number(details.parameter_size) - n) <= n * 0.001, (details.parameter_size, n)


def test_show_answers_the_header_and_capabilities(gw: GatewayProc, qwen_path: Path) -> None:
    c = client(gw)
    qwen = c.show(QWEN_SHORT)
    assert qwen.details.family == "qwen2" and qwen.details.quantization_level == "Q4_K_M"
    info = qwen.modelinfo
    assert info["general.architecture"] == "qwen2" and info["qwen2.context_length"] == 32768
    assert info["general.parameter_count"] == tensor_count(qwen_path)
    assert "tokenizer.chat_template" not in info and "{%" in (qwen.template or "")
    assert qwen.capabilities == ["completion", "tools"]  # Qwen2.5's template takes tools; its projector: none
    smol = c.show(SMOL)
    assert "completion" in smol.capabilities and "vision" in smol.capabilities  # the projector made for it
    assert "embedding" not in smol.capabilities
    assert c.show(MINILM).capabilities == ["embedding"]


def test_ps_lists_one_file_once_whatever_names_it_was_used_by(gw: GatewayProc) -> None:
    c = client(gw)
    for name in (QWEN, QWEN_SHORT, QWEN_LINK):
        c.chat(model=name, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 1},
               keep_alive="5m")
    c.embed(model=MINILM, input="hello", keep_alive="5m")
    ps = c.ps().models
    qwen = [m for m in ps if m.digest == f"sha256:{expected_sha('qwen')}"]
    assert len(qwen) == 1, [(m.name, m.digest) for m in ps]
    assert {m.digest for m in ps} == {f"sha256:{expected_sha('qwen')}", f"sha256:{expected_sha('minilm')}"}
    assert len(ps) == 2
    entry = qwen[0]
    assert entry.model in (QWEN, QWEN_SHORT, QWEN_LINK)
    assert entry.details.family == "qwen2" and entry.details.parameter_size
    assert entry.context_length and entry.context_length <= 1024 and entry.size and entry.size > 0

    # size_vram is what the servers' placement put on GPU-like devices: 0 when everything is in RAM
    out = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "ps", "--json"], env=gw.env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    servers = json.loads(out)["servers"]
    on_devices = sum(int(p.get("bytes") or 0) for s in servers if "Qwen2.5" in s["model"] or "Coder" in s["model"]
                     for p in s.get("placement") or [] if not str(p.get("device", "CPU")).startswith("CPU"))
    assert entry.size_vram == on_devices
