"""The memory plan on the real test model (issue 36's acceptance), and the tensor tables the offline plan tests use
(tests/support/gguf_tables.py) checked against the real files. Nothing is started: only headers are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_provider import cli
from gguf_provider.runtime._common.gguf import read_tensors
from tests.support.gguf_tables import qwen_tensors, smol8_tensors, tensor_bytes


def test_qwen_tensor_table_is_the_stand_ins(qwen_path: Path) -> None:
    got = [(t.name, t.shape, t.ggml_type, t.nbytes) for t in read_tensors(qwen_path)]
    assert got == [(n, shape, t, tensor_bytes(shape, t)) for n, shape, t in qwen_tensors()]


def test_smol8_tensor_table_is_smollm2_cut_to_8_layers(smollm2_path: Path) -> None:
    """The H200 runs used SmolLM2 cut to its first 8 blocks (the same tensors, fewer of them): the stored table
    is the real file's minus blocks 8-29."""
    keep = [t for t in read_tensors(smollm2_path)
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < 8]
    got = sorted((t.name, t.shape, t.ggml_type, tensor_bytes(t.shape, t.ggml_type)) for t in keep)
    assert got == sorted((n, shape, t, tensor_bytes(shape, t)) for n, shape, t in smol8_tensors())


def test_plan_qwen_on_300mib_vulkan(qwen_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", str(qwen_path), "--device", "vulkan:1260MiB", "--device", "cpu:64GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["fits"] is True and out["split"] is True
    vk, cpu = out["devices"]
    assert vk["device"]["name"] == "Vulkan0" and vk["output"] is True and vk["layers"] and cpu["layers"]
    assert min(vk["layers"]) > max(cpu["layers"]) and 1 <= out["n_gpu_layers"] <= 24
    assert out["args"] == ["-ngl", str(out["n_gpu_layers"])]
