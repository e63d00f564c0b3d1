"""The memory plan on the real test model (issue 36's acceptance), and the tensor tables the offline plan tests use
(tests/support/gguf_tables.py) checked against the real files. Nothing is started: only headers are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_provider import cli
from gguf_provider.runtime.gguf import read_tensors
from tests.support.gguf_tables import qwen_tensors, smol8_tensors, tensor_bytes

SMOL8 = Path(__file__).resolve().parents[2] / ".devcarry" / "smol8.gguf"  # a dev-machine file, absent in CI


def test_qwen_tensor_table_is_the_stand_ins(qwen_path: Path) -> None:
    got = [(t.name, t.shape, t.ggml_type, t.nbytes) for t in read_tensors(qwen_path)]
    assert got == [(n, shape, t, tensor_bytes(shape, t)) for n, shape, t in qwen_tensors()]


@pytest.mark.skipif(not SMOL8.is_file(), reason=f"{SMOL8} (SmolLM2 cut to 8 layers) is only on the dev machine")
def test_smol8_tensor_table_is_the_stand_ins() -> None:
    got = [(t.name, t.shape, t.ggml_type, t.nbytes) for t in read_tensors(SMOL8)]
    assert got == [(n, shape, t, tensor_bytes(shape, t)) for n, shape, t in smol8_tensors()]


def test_plan_qwen_on_300mib_vulkan(qwen_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", str(qwen_path), "--device", "vulkan:300MiB", "--device", "cpu:64GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["fits"] is True and out["split"] is True
    vk, cpu = out["devices"]
    assert vk["device"]["name"] == "Vulkan0" and vk["output"] is True and vk["layers"] and cpu["layers"]
    assert min(vk["layers"]) > max(cpu["layers"]) and 1 <= out["n_gpu_layers"] <= 24
    assert out["args"] == ["-ngl", str(out["n_gpu_layers"])]
