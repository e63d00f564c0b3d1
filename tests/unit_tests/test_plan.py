"""The memory plan's decisions (runtime/_memory/plan.py) on device lists, and `gguf-provider plan` (issue 36, points 3 and 5(c)).

Models are real tensor tables written by the tests (tests/support/gguf_tables.py: Qwen2.5-Coder-0.5B's and an
8-layer SmolLM2's, checked against the real files by tests/integration_tests/test_plan_real.py) or tables built here
(a 7B-like dense model, a 48-layer MoE). Device lists are the ones users have: named (``cuda:8GiB``) or parsed from
the ``--list-devices`` captures in data/list_devices.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gguf_provider import cli
from gguf_provider.errors import GGUFFormatError
from gguf_provider.runtime._common.gguf import GGUFHeader, TensorInfo, read_header, read_tensors
from gguf_provider.runtime._memory import devices, fit
from gguf_provider.runtime._memory.devices import Device
from gguf_provider.runtime._memory.plan import (
    FIT_MIN_CONTEXT,
    SPECULATIVE_OUTPUTS,
    GiB,
    MiB,
    ModelSizes,
    Placement,
    Plan,
    for_model,
    place,
    plan,
    usable,
)
from tests.support.gguf_tables import (
    F32,
    Q8_0,
    QWEN_FILE,
    QWEN_META,
    SMOL8_META,
    Meta,
    qwen_tensors,
    smol8_tensors,
    tensor_bytes,
    write_gguf,
)

LIST_DEVICES = Path(__file__).parent / "data" / "list_devices"


# --- helpers ---------------------------------------------------------------------------------------------------------

def named(*specs: str) -> list[Device]:
    """Devices as `plan --device` names them: ``named("cuda:8GiB", "cpu:64GiB")`` → CUDA0, CPU."""
    return devices.number_devices([devices.parse_device_arg(s) for s in specs])


def host(free: int, total: int | None = None) -> Device:
    return Device("CPU", "cpu", "host RAM", total or free, free)


def by_name(p: Plan) -> dict[str, Placement]:
    return {q.device.name: q for q in p.placements}


def header_of(tmp: Path, metadata: Meta, name: str = "model.gguf") -> GGUFHeader:
    return read_header(write_gguf(tmp / name, metadata, [], data=False))


def table(tensors: Sequence[tuple[str, tuple[int, ...], int]]) -> list[TensorInfo]:
    return [TensorInfo(n, shape, t, tensor_bytes(shape, t)) for n, shape, t in tensors]


def assert_llama_order(p: Plan, n_layer: int) -> None:
    """llama.cpp's -ngl N: the last N-1 layers and the output head on the GPUs, GPU by GPU in order, the rest (the
    first layers) in RAM; every layer placed exactly once."""
    gpus = [q for q in p.placements if q.device.kind != "cpu"]
    cpu = next(q for q in p.placements if q.device.kind == "cpu")
    on_gpus = [il for q in gpus for il in q.layers]
    assert on_gpus == list(range(n_layer - len(on_gpus), n_layer))  # contiguous, earlier GPUs get earlier layers
    assert cpu.layers == tuple(range(n_layer - len(on_gpus)))
    assert len(on_gpus) + int(any(q.output for q in gpus)) == p.n_gpu_layers
    assert sum(q.output for q in p.placements) == 1


# A 7B-like dense model: 32 layers of 200 MiB, an untied 250 MiB head, 250 MiB embeddings, 32k native context,
# f16 KV of 128 KiB a token (4 GiB at 32k, 512 MiB at 4k).
DENSE_META: Meta = {
    "general.architecture": "llama",
    "llama.context_length": 32768,
    "llama.block_count": 32,
    "llama.embedding_length": 4096,
    "llama.feed_forward_length": 14336,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
}
DENSE_LAYER, DENSE_OUT, DENSE_EMBD = 200 * MiB, 250 * MiB, 250 * MiB


def dense_tensors(n_layer: int = 32, layer: int = DENSE_LAYER) -> list[TensorInfo]:
    out = [TensorInfo("token_embd.weight", (4096, 32000), 0, DENSE_EMBD)]
    for i in range(n_layer):
        out += [TensorInfo(f"blk.{i}.attn_norm.weight", (4096,), F32, 16384),
                TensorInfo(f"blk.{i}.attn_q.weight", (4096, 4096), 0, layer // 4),
                TensorInfo(f"blk.{i}.ffn_up.weight", (4096, 14336), 0, layer - layer // 4 - 16384)]
    return out + [TensorInfo("output.weight", (4096, 32000), 0, DENSE_OUT - 16384),
                  TensorInfo("output_norm.weight", (4096,), F32, 16384)]


@pytest.fixture(scope="module")
def dense_header(tmp_path_factory: pytest.TempPathFactory) -> GGUFHeader:
    return header_of(tmp_path_factory.mktemp("dense"), DENSE_META, "dense-7b.gguf")


@pytest.fixture(scope="module")
def dense() -> ModelSizes:
    return ModelSizes.from_tensors(dense_tensors(), 32)


# --- the issue's acceptance: Qwen2.5-Coder-0.5B on vulkan:1260MiB + cpu:64GiB -----------------------------------

@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Qwen2.5-Coder-0.5B's header keys and tensor table; the data section a hole of its real size."""
    return write_gguf(tmp_path_factory.mktemp("qwen") / QWEN_FILE, QWEN_META, qwen_tensors())


def qwen_layer_bytes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, shape, t in qwen_tensors():
        key = name.split(".")[1] if name.startswith("blk.") else name
        sizes[key] = sizes.get(key, 0) + tensor_bytes(shape, t)
    return sizes


def test_qwen_splits_between_a_small_vulkan_device_and_ram(qwen_file: Path) -> None:
    devs = named("vulkan:1260MiB", "cpu:64GiB")
    header = read_header(qwen_file)
    p = for_model(header, [qwen_file], devs)
    vk, cpu = p.placements
    assert (vk.device.name, cpu.device.name) == ("Vulkan0", "CPU")
    assert p.fits and p.split, p.describe()
    assert 1 <= p.n_gpu_layers <= 24
    assert vk.output and not cpu.output  # the output head counts as the last layer: offloaded first
    assert vk.layers and cpu.layers
    assert min(vk.layers) > max(cpu.layers)  # llama.cpp offloads the LAST layers
    assert_llama_order(p, 24)
    assert p.gpus == ("Vulkan0",) and p.tensor_split == () and p.n_cpu_moe == 0
    assert p.args() == ["-ngl", str(p.n_gpu_layers)]
    # 300 MiB cannot hold the 138 MiB head, 24 layers and a 32k cache: the context is cut to llama.cpp's fit minimum
    # first, then layers move to RAM
    assert p.n_ctx == FIT_MIN_CONTEXT
    assert "split:" in p.reason and "fit minimum" in p.reason
    # weights from the real tensor table: the untied head (Q8_0) + its norm on the GPU, token_embd in RAM
    b = qwen_layer_bytes()
    assert vk.weights == b["output.weight"] + b["output_norm.weight"] + sum(b[str(i)] for i in vk.layers)
    assert cpu.weights == b["token_embd.weight"] + sum(b[str(i)] for i in cpu.layers)
    assert vk.kv > 0 and cpu.kv > 0 and vk.compute > 0
    # as many layers as fit: one more would not
    more = place(header, ModelSizes.of_files(header, [qwen_file]), devs, n_ctx=p.n_ctx,
                 n_gpu_layers=p.n_gpu_layers + 1)
    assert not more[0].fits


def test_cli_plan_json_reports_the_split(qwen_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", str(qwen_file), "--device", "vulkan:1260MiB", "--device", "cpu:64GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["fits"] is True and out["split"] is True
    assert out["n_ctx"] == FIT_MIN_CONTEXT and out["n_layer"] == 24
    vk, cpu = out["devices"]
    assert (vk["device"]["name"], cpu["device"]["name"]) == ("Vulkan0", "CPU")
    assert vk["device"]["total"] == 1260 * MiB and cpu["device"]["total"] == 64 * GiB
    assert vk["output"] is True and cpu["output"] is False
    assert vk["n_layers"] >= 1 and cpu["n_layers"] >= 1 and vk["n_layers"] + cpu["n_layers"] == 24
    assert min(vk["layers"]) > max(cpu["layers"])
    assert out["n_gpu_layers"] == vk["n_layers"] + 1
    assert out["args"] == ["-ngl", str(out["n_gpu_layers"])]
    for d in (vk, cpu):
        assert d["bytes"] == d["weights"] + d["kv"] + d["compute"] > 0
        assert d["fits"] is True and d["bytes"] <= d["usable"]


def test_cli_plan_text_says_the_command_line(qwen_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", str(qwen_file), "--device", "vulkan:1260MiB", "--device", "cpu:64GiB"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "fits" in out and "Vulkan0" in out and "+ output" in out
    assert "llama-server -ngl " in out and f"-c {FIT_MIN_CONTEXT}" in out
    assert "(planned for the devices named; nothing was started." in out


def test_cli_plan_does_not_fit_exits_1(qwen_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", str(qwen_file), "--device", "vulkan:1260MiB", "--device", "cpu:256MiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["fits"] is False
    cpu = out["devices"][-1]
    assert cpu["device"]["name"] == "CPU" and cpu["fits"] is False
    assert "CPU needs" in out["reason"] and f"{cpu['usable'] / MiB:,.0f} MiB usable" in out["reason"]


def test_cli_plan_ctx_and_layers_honoured(qwen_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", str(qwen_file), "--device", "cuda:8GiB", "--device", "cpu:64GiB", "--ctx", "8192",
                   "--n-gpu-layers", "10", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["n_ctx"] == 8192 and out["n_gpu_layers"] == 10
    assert out["devices"][0]["layers"] == list(range(15, 24)) and out["devices"][0]["output"] is True
    assert out["args"] == ["-ngl", "10"]


def test_cli_plan_bad_device_is_a_usage_error(qwen_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", str(qwen_file), "--device", "gpu:8GiB"]) == 2
    assert "unknown device kind 'gpu'" in capsys.readouterr().err


# --- sizes as llama.cpp reported them on an NVIDIA H200 -----------------------------------------------------------
# SmolLM2-135M cut to 8 layers (tied output head), llama-server -lv 4 -c 2048 at -ngl 99 / 4 / 0 (the logs are in the
# project's device notes). "model buffer size" and "KV buffer size" lines, MiB. At -ngl 99 llama.cpp logs
# "offloading 7 repeating layers" but "offloaded 9/9 layers" and 45.62 MiB on CUDA0, which is all 8 layers (2.11 MiB
# each) plus the 28.69 MiB tied head: the plan's "every layer" is what it did.
LLAMA_CPP_H200 = {
    99: {"CUDA0": (45.62, 12.00), "CPU": (28.69, 0.0)},
    4: {"CUDA0": (35.04, 4.50), "CPU": (39.26, 7.50)},
    0: {"CUDA0": (0.0, 0.0), "CPU": (45.60, 12.00)},
}
LLAMA_CPP_H200_COMPUTE = {99: 14.38, 4: 15.70, 0: 15.70}  # "CUDA0 compute buffer size"
SMOL8_LAYERS_ON_GPU = {99: (range(8), True), 4: (range(5, 8), True), 0: (range(0), False)}


@pytest.fixture(scope="module")
def smol8_header(tmp_path_factory: pytest.TempPathFactory) -> GGUFHeader:
    return header_of(tmp_path_factory.mktemp("smol8"), SMOL8_META, "smol8.gguf")


def test_smol8_sizes_from_its_tensor_table() -> None:
    sizes = ModelSizes.from_tensors(table(smol8_tensors()), 8)
    assert sizes.input == 30081024  # token_embd.weight, Q8_0
    assert sizes.layers == (2216448,) * 8 and not sizes.is_moe
    assert sizes.output == 30081024 + 2304  # tied: the GPU that holds the output gets a copy of token_embd
    assert sizes.output_on_host == 2304  # in RAM the tied head is token_embd itself: only its norm is added


@pytest.mark.parametrize("ngl", [99, 4, 0])
def test_smol8_matches_llama_cpp_on_h200(ngl: int, smol8_header: GGUFHeader) -> None:
    h200 = devices.parse_list_devices((LIST_DEVICES / "cuda-h200.txt").read_text())
    sizes = ModelSizes.from_tensors(table(smol8_tensors()), 8)
    p = plan(smol8_header, sizes, [*h200, host(64 * GiB)], n_ctx=2048, n_gpu_layers=ngl)
    assert p.fits and p.n_ctx == 2048
    got = by_name(p)
    for name, (weights, kv) in LLAMA_CPP_H200[ngl].items():
        assert abs(got[name].weights / MiB - weights) < 1.0, (name, got[name].weights / MiB, weights)
        assert abs(got[name].kv / MiB - kv) < 0.1, (name, got[name].kv / MiB, kv)
    layers, output = SMOL8_LAYERS_ON_GPU[ngl]
    assert got["CUDA0"].layers == tuple(layers) and got["CUDA0"].output is output
    assert got["CPU"].layers == tuple(il for il in range(8) if il not in layers)
    assert p.args() == ["-ngl", str(min(ngl, 9))]
    # llama.cpp reserves a compute buffer on CUDA0 even at -ngl 0; the estimate errs high, not by much
    assert LLAMA_CPP_H200_COMPUTE[ngl] * MiB <= got["CUDA0"].compute <= (LLAMA_CPP_H200_COMPUTE[ngl] + 16) * MiB


# --- device lists -----------------------------------------------------------------------------------------------

def test_one_small_gpu_splits(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    p = plan(dense_header, dense, named("cuda:4GiB", "cpu:64GiB"))
    gpu, cpu = p.placements
    assert p.fits and p.split
    assert 1 < p.n_gpu_layers < 33 and gpu.output and gpu.layers and cpu.layers
    assert_llama_order(p, 32)
    assert p.n_ctx == FIT_MIN_CONTEXT  # cut to the fit minimum before any layer moved
    assert p.args() == ["-ngl", str(p.n_gpu_layers)]
    assert gpu.total <= usable(gpu.device)
    one_more = place(dense_header, dense, named("cuda:4GiB", "cpu:64GiB"), n_ctx=p.n_ctx,
                     n_gpu_layers=p.n_gpu_layers + 1)
    assert not one_more[0].fits  # as many layers as fit
    assert cpu.weights == DENSE_EMBD + len(cpu.layers) * DENSE_LAYER
    assert gpu.weights == DENSE_OUT + len(gpu.layers) * DENSE_LAYER


def test_one_large_gpu_holds_everything(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    h200 = devices.parse_list_devices((LIST_DEVICES / "cuda-h200.txt").read_text())
    p = plan(dense_header, dense, [*h200, host(64 * GiB)])
    gpu, cpu = p.placements
    assert p.fits and not p.split
    assert gpu.layers == tuple(range(32)) and gpu.output and not cpu.layers and not cpu.output
    assert p.n_gpu_layers == 33 and p.args() == ["-ngl", "33"]  # no --tensor-split, no --n-cpu-moe
    assert p.n_ctx == 32768 and p.reason == "every layer on the GPU; n_ctx=32768: the native context"
    assert cpu.weights == DENSE_EMBD and cpu.kv == 0  # the input embeddings always stay in host memory
    assert gpu.kv == fit.kv_cache_bytes(dense_header, 32768)


def test_two_uneven_gpus_share_in_proportion(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    devs = named("cuda:8GiB", "cuda:24GiB", "cpu:64GiB")
    p = plan(dense_header, dense, devs)
    a, b, cpu = p.placements
    assert (a.device.name, b.device.name) == ("CUDA0", "CUDA1")
    assert p.fits and not p.split and p.n_gpu_layers == 33 and p.n_ctx == 32768
    assert p.gpus == ("CUDA0", "CUDA1") and a.layers and b.layers and not cpu.layers
    assert max(a.layers) < min(b.layers) and b.output  # the first GPU gets the earlier layers
    assert_llama_order(p, 32)
    ua, ub = usable(devs[0]), usable(devs[1])
    assert p.tensor_split == (round(ua / (ua + ub), 3), round(ub / (ua + ub), 3))
    assert p.args() == ["-ngl", "33", "--tensor-split", f"{p.tensor_split[0]:g},{p.tensor_split[1]:g}"]
    # llama.cpp's rule: layer il goes to the first GPU whose cumulative split exceeds il / 33
    assert len(a.layers) == sum(1 for il in range(32) if il / 33 < p.tensor_split[0])
    assert a.fits and b.fits


def test_two_small_gpus_and_ram(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    p = plan(dense_header, dense, named("cuda:2GiB", "cuda:4GiB", "cpu:64GiB"))
    a, b, cpu = p.placements
    assert p.fits and p.split and p.gpus == ("CUDA0", "CUDA1")
    assert a.layers and b.layers and cpu.layers and b.output
    assert max(cpu.layers) < min(a.layers) <= max(a.layers) < min(b.layers)
    assert_llama_order(p, 32)
    assert "--tensor-split" in p.args() and p.args()[:2] == ["-ngl", str(p.n_gpu_layers)]
    assert f"split: {p.n_gpu_layers} of 33 layers on the GPUs" in p.reason


def test_unified_memory_is_counted_once(monkeypatch: pytest.MonkeyPatch, dense_header: GGUFHeader) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    listed = devices.parse_list_devices((LIST_DEVICES / "metal.txt").read_text())
    mtl = listed[0]
    assert (mtl.name, mtl.kind, mtl.unified) == ("MTL0", "metal", True)
    ram = host(20 * GiB, 24 * GiB)
    monkeypatch.setattr(devices, "_listed", lambda binary, rpc, timeout: listed)
    monkeypatch.setattr(devices, "host_device", lambda: ram)
    machine = devices.machine_devices(Path("/nonexistent/llama-server"))
    assert [d.name for d in machine] == ["MTL0", "RPC0", "CPU"]  # BLAS and the empty RPC1 hold nothing
    cpu = machine[-1]
    assert cpu.free == ram.free - mtl.free and cpu.total == ram.total - mtl.total
    assert usable(cpu) < usable(ram)
    # a model that needs more than the Metal device: with RAM counted twice it would "fit"; counted once it does not
    big = ModelSizes.from_tensors(dense_tensors(layer=600 * MiB), 32)
    once = plan(dense_header, big, [mtl, cpu])
    twice = plan(dense_header, big, [mtl, ram])
    assert twice.fits and not once.fits
    assert "CPU needs" in once.reason
    # what fits the Metal device sits there entirely
    small = plan(dense_header, ModelSizes.from_tensors(dense_tensors(), 32), [mtl, cpu])
    assert small.fits and small.args() == ["-ngl", "33"] and small.gpus == ("MTL0",)


def test_masked_cuda_device_is_the_only_gpu(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    # CUDA_VISIBLE_DEVICES=1 on a two-GPU box: the runtime shows the one visible card, renumbered CUDA0
    listed = devices.parse_list_devices((LIST_DEVICES / "cuda-masked.txt").read_text())
    assert [d.name for d in listed] == ["CUDA0"]
    p = plan(dense_header, dense, [*listed, host(64 * GiB)])
    assert [q.device.name for q in p.placements] == ["CUDA0", "CPU"]
    assert p.gpus == ("CUDA0",) and p.tensor_split == ()
    assert p.fits and p.args() == ["-ngl", "33"]
    # 11.5 GiB free: the 32k cache does not fit beside the weights, 4k does → the context shrinks, layers stay
    assert FIT_MIN_CONTEXT < p.n_ctx < 32768


def test_cpu_only(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    roomy = plan(dense_header, dense, [host(64 * GiB)])
    assert roomy.fits and roomy.args() == [] and roomy.n_gpu_layers == 0 and roomy.gpus == ()
    assert roomy.n_ctx == 32768 and "native context" in roomy.reason
    (cpu,) = roomy.placements
    assert cpu.layers == tuple(range(32)) and cpu.output
    assert cpu.weights == DENSE_EMBD + 32 * DENSE_LAYER + DENSE_OUT
    # 12 GiB free: the weights fit, the native cache does not → the largest context that fits in RAM
    tight = plan(dense_header, dense, [host(12 * GiB)])
    assert tight.fits and FIT_MIN_CONTEXT < tight.n_ctx < 32768 and tight.n_ctx % fit.CONTEXT_STEP == 0
    assert "largest that fits in host RAM" in tight.reason
    assert not plan(dense_header, dense, [host(12 * GiB)], n_ctx=tight.n_ctx + fit.CONTEXT_STEP).fits


def test_does_not_fit_at_all(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    devs = named("cuda:1GiB", "cpu:2GiB")
    p = plan(dense_header, dense, devs)
    assert not p.fits
    cpu = by_name(p)["CPU"]
    assert not cpu.fits
    assert f"CPU needs {cpu.total / MiB:,.0f} MiB but has {usable(devs[-1]) / MiB:,.0f} MiB usable" in p.reason
    assert "(2,048 MiB free)" in p.reason
    assert "does NOT fit" in p.describe()


def test_gpu_named_without_ram_gets_the_host(qwen_file: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "host_device", lambda: host(32 * GiB))
    assert cli.main(["plan", str(qwen_file), "--device", "cuda:8GiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [d["device"]["name"] for d in out["devices"]] == ["CUDA0", "CPU"]
    assert out["devices"][1]["device"]["total"] == 32 * GiB
    assert out["n_gpu_layers"] == 25 and out["n_ctx"] == 32768  # 0.5B on 8 GiB: everything, native context


# --- a MoE model: experts to RAM first -------------------------------------------------------------------------

MOE_META: Meta = {
    "general.architecture": "qwen3moe",
    "qwen3moe.context_length": 40960,
    "qwen3moe.block_count": 48,
    "qwen3moe.embedding_length": 2048,
    "qwen3moe.feed_forward_length": 6144,
    "qwen3moe.expert_feed_forward_length": 768,
    "qwen3moe.expert_count": 128,
    "qwen3moe.expert_used_count": 8,
    "qwen3moe.attention.head_count": 32,
    "qwen3moe.attention.head_count_kv": 4,
    "qwen3moe.attention.key_length": 128,
    "qwen3moe.attention.value_length": 128,
}
MOE_EXPERT = 105 * MiB  # each of ffn_{up,down,gate}_exps: 315 MiB of experts in a 350 MiB layer (90%)


def moe_tensors() -> list[TensorInfo]:
    out = [TensorInfo("token_embd.weight", (2048, 151936), Q8_0, 150 * MiB)]
    for i in range(48):
        out += [TensorInfo(f"blk.{i}.ffn_{w}_exps.weight", (2048, 768, 128), Q8_0, MOE_EXPERT)
                for w in ("up", "down", "gate")]
        out += [TensorInfo(f"blk.{i}.{w}.weight", (2048, 2048), Q8_0, size) for w, size in (
            ("attn_q", 12 * MiB), ("attn_k", 4 * MiB), ("attn_v", 4 * MiB), ("attn_output", 12 * MiB),
            ("ffn_gate_inp", 2 * MiB), ("attn_norm", MiB))]  # dense: the router is not an expert tensor
    return out + [TensorInfo("output.weight", (2048, 151936), Q8_0, 150 * MiB - 8192),
                  TensorInfo("output_norm.weight", (2048,), F32, 8192)]


def test_moe_sizes() -> None:
    sizes = ModelSizes.from_tensors(moe_tensors(), 48)
    assert sizes.is_moe and sizes.n_layer == 48
    assert sizes.layers == (350 * MiB,) * 48 and sizes.experts == (315 * MiB,) * 48
    assert (sizes.output, sizes.input) == (150 * MiB, 150 * MiB)


def test_moe_experts_of_the_first_layers_go_to_ram(tmp_path: Path) -> None:
    header = header_of(tmp_path, MOE_META, "qwen3-30b-a3b.gguf")
    sizes = ModelSizes.from_tensors(moe_tensors(), 48)
    devs = named("cuda:8GiB", "cpu:64GiB")  # 16.7 GiB of weights, 1.8 GiB of them dense: too small for all
    p = plan(header, sizes, devs)
    gpu, cpu = p.placements
    assert p.fits and p.split
    assert p.n_gpu_layers == 49  # every layer (and the head) stays on the GPU ...
    assert 0 < p.n_cpu_moe < 48  # ... the experts of the first n_cpu_moe layers go to RAM
    assert gpu.layers == tuple(range(48)) and gpu.output and not cpu.layers
    assert p.args() == ["-ngl", "49", "--n-cpu-moe", str(p.n_cpu_moe)]
    assert f"--n-cpu-moe {p.n_cpu_moe}" in p.reason
    assert cpu.weights == sizes.input + p.n_cpu_moe * 315 * MiB
    assert gpu.weights == sizes.output + 48 * 350 * MiB - p.n_cpu_moe * 315 * MiB
    assert p.n_ctx == FIT_MIN_CONTEXT
    # the fewest experts moved: one layer fewer would not fit the GPU
    fewer = place(header, sizes, devs, n_ctx=p.n_ctx, n_gpu_layers=49, n_cpu_moe=p.n_cpu_moe - 1)
    assert not fewer[0].fits


def test_moe_that_fits_keeps_its_experts(tmp_path: Path) -> None:
    header = header_of(tmp_path, MOE_META, "qwen3-30b-a3b.gguf")
    p = plan(header, ModelSizes.from_tensors(moe_tensors(), 48), named("cuda:48GiB", "cpu:64GiB"))
    assert p.fits and p.n_cpu_moe == 0 and p.args() == ["-ngl", "49"]


# --- the context ------------------------------------------------------------------------------------------------

def test_context_shrinks_before_layers_move(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    devs = named("cuda:10GiB", "cpu:64GiB")  # 6.6 GiB of weights + 4 GiB of 32k cache: too much; 4k fits
    p = plan(dense_header, dense, devs)
    assert p.fits and p.n_gpu_layers == 33 and not p.split
    assert FIT_MIN_CONTEXT <= p.n_ctx < 32768 and p.n_ctx % fit.CONTEXT_STEP == 0
    assert "largest that fits in GPU memory" in p.reason
    bigger = place(dense_header, dense, devs, n_ctx=p.n_ctx + fit.CONTEXT_STEP, n_gpu_layers=33)
    assert not bigger[0].fits  # the largest such context


def test_user_context_is_honoured(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    devs = named("cuda:10GiB", "cpu:64GiB")
    small = plan(dense_header, dense, devs, n_ctx=8192)
    assert small.n_ctx == 8192 and small.n_gpu_layers == 33 and small.fits and "n_ctx=8192 requested" in small.reason
    # the native context asked for: kept, and layers move to RAM to make room for its cache
    full = plan(dense_header, dense, devs, n_ctx=32768)
    assert full.n_ctx == 32768 and full.fits and full.split and full.n_gpu_layers < 33
    assert_llama_order(full, 32)


def test_user_layers_are_honoured(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    devs = named("cuda:80GiB", "cpu:64GiB")
    p = plan(dense_header, dense, devs, n_gpu_layers=5)
    gpu, cpu = p.placements
    assert p.n_gpu_layers == 5 and p.args() == ["-ngl", "5"]
    assert gpu.layers == (28, 29, 30, 31) and gpu.output and cpu.layers == tuple(range(28))
    assert p.n_ctx == 32768 and "n_gpu_layers=5 requested" in p.reason
    none = plan(dense_header, dense, devs, n_gpu_layers=0)
    assert none.args() == ["-ngl", "0"] and by_name(none)["CPU"].layers == tuple(range(32))
    assert by_name(none)["CPU"].output and not by_name(none)["CUDA0"].weights
    assert plan(dense_header, dense, devs, n_gpu_layers=999).n_gpu_layers == 33


def test_max_ctx_caps_the_automatic_context(dense_header: GGUFHeader, dense: ModelSizes) -> None:
    devs = named("cuda:80GiB", "cpu:64GiB")
    assert plan(dense_header, dense, devs).n_ctx == 32768
    p = plan(dense_header, dense, devs, max_ctx=8192)
    assert p.n_ctx == 8192 and p.fits and p.n_gpu_layers == 33
    assert by_name(p)["CUDA0"].kv == fit.kv_cache_bytes(dense_header, 8192)


# --- read_tensors -----------------------------------------------------------------------------------------------

def test_read_tensors_of_a_real_table(tmp_path: Path, qwen_file: Path) -> None:
    got = read_tensors(qwen_file)
    assert [t.name for t in got] == [n for n, _, _ in qwen_tensors()]
    assert len(got) == read_header(qwen_file).tensor_count == 291
    assert got[0] == TensorInfo("output.weight", (896, 151936), Q8_0, 144643072)
    assert {t.name for t in got} >= {"token_embd.weight", "output_norm.weight", "blk.23.attn_v.weight"}
    # the sizes add up to the data section: the file less its header and table, aligned to 32
    table_end = write_gguf(tmp_path / "table.gguf", QWEN_META, qwen_tensors(), data=False).stat().st_size
    assert sum(t.nbytes for t in got) == qwen_file.stat().st_size - -(-table_end // 32) * 32


@pytest.mark.parametrize("alignment", [32, 64])
def test_read_tensors_counts_padding(tmp_path: Path, alignment: int) -> None:
    tensors = [("a", (3,), F32), ("b", (8,), F32), ("c", (5,), F32), ("d", (64,), Q8_0)]
    meta: Meta = {"general.architecture": "llama"}
    if alignment != 32:
        meta["general.alignment"] = alignment
    path = write_gguf(tmp_path / "padded.gguf", meta, tensors, alignment=alignment)
    got = read_tensors(path)
    exact = [tensor_bytes(shape, t) for _, shape, t in tensors]
    assert [t.nbytes for t in got[:-1]] == [-(-b // alignment) * alignment for b in exact[:-1]]
    assert got[-1].nbytes == exact[-1]  # the last runs to the file's end
    assert 0 <= sum(t.nbytes for t in got) - sum(exact) < alignment * len(tensors)
    assert [(t.name, t.shape, t.ggml_type) for t in got] == tensors


def test_read_tensors_of_a_truncated_table(tmp_path: Path, qwen_file: Path) -> None:
    whole = qwen_file.read_bytes()[:8192]  # the header and the start of the tensor table
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: read_header(qwen_file).metadata_end + 1000])
    with pytest.raises(GGUFFormatError, match="not a valid GGUF file"):
        read_tensors(cut)


def test_read_tensors_absurd_dimensions(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "dims.gguf", {"general.architecture": "llama"}, [("x", (1,) * 9, F32)])
    with pytest.raises(GGUFFormatError, match="9 dimensions"):
        read_tensors(path)


def test_plan_of_an_unreadable_table_is_estimated(tmp_path: Path, qwen_file: Path) -> None:
    """for_model: sizes from the file's size when the tensor table cannot be read (its docstring)."""
    cut = tmp_path / QWEN_FILE
    cut.write_bytes(qwen_file.read_bytes()[: read_header(qwen_file).metadata_end] + b"\xff" * 64)
    with open(cut, "r+b") as f:
        f.truncate(qwen_file.stat().st_size)  # as large as the model; its first tensor name claims 2**64 bytes
    with pytest.raises(GGUFFormatError):
        read_tensors(cut)
    p = for_model(read_header(cut), [cut], named("cuda:8GiB", "cpu:64GiB"))
    assert p.fits and p.n_layer == 24
    assert sum(q.weights for q in p.placements) >= qwen_file.stat().st_size * 0.9


def test_moe_whose_dense_part_does_not_fit_keeps_experts_in_ram(tmp_path: Path) -> None:
    header = header_of(tmp_path, MOE_META, "qwen3-30b-a3b.gguf")
    sizes = ModelSizes.from_tensors(moe_tensors(), 48)
    # 1.6 GiB of dense weights + head + cache: too much. llama.cpp's fit (common/fit.cpp, "filling dense-only
    # layers back-to-front") keeps every offloaded layer dense-only, its experts in RAM, so far more layers fit.
    p = plan(header, sizes, named("cuda:2867MiB", "cpu:64GiB"))
    gpu, cpu = p.placements
    assert p.fits and p.split
    assert p.n_cpu_moe == 48  # every offloaded layer dense-only
    assert gpu.weights == sizes.output + len(gpu.layers) * 35 * MiB
    assert len(gpu.layers) > 20  # 35 MiB dense-only layers, not 350 MiB whole ones


def test_a_gpu_too_small_for_its_op_offload_buffer_is_not_used(qwen_file: Path) -> None:
    """llama.cpp computes the logits and large host operations on the first GPU even at -ngl 0; when not even that
    buffer fits (a speculating server's logits on a tiny device), the plan keeps everything in RAM and leaves the
    GPU out (`--device none`) instead of planning a start that runs out of device memory."""
    header = read_header(qwen_file)
    meta = {**header.metadata, "qwen2.vocab_size": 151936}
    header = dataclasses.replace(header, metadata=meta)
    sizes = ModelSizes.of_files(header, [qwen_file])
    tiny = plan(header, sizes, named("vulkan:1080MiB", "cpu:64GiB"), n_outputs=SPECULATIVE_OUTPUTS)
    assert tiny.fits and tiny.devices_off and tiny.args() == ["--device", "none"] and tiny.n_gpu_layers == 0
    vk, cpu = tiny.placements
    assert vk.total == 0 and len(cpu.layers) == 24 and cpu.output
    assert "--device none" in tiny.reason
    # Without speculation's logits the same device holds the op-offload buffer: -ngl 0, the GPU used for compute.
    plain = plan(header, sizes, named("vulkan:1080MiB", "cpu:64GiB"))
    assert not plain.devices_off and plain.args()[:2] == ["-ngl", str(plain.n_gpu_layers)]
