"""bench/gpu.py's pure parts (issue 51, point 5), offline and without a server: llama.cpp's log lines and
fit-params output read, the plan set against them, P1's arithmetic, the docs table and its markers, and the twins
(a GGUF file's header and tensor table kept, its tensor data replaced by valid seeded random blocks)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from bench import gpu
from gguf_provider.runtime._common import gguf
from tests.support.gguf_tables import F16, F32, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, write_gguf

ROOT = Path(__file__).resolve().parents[2]

# llama-server -lv 4 on a CUDA build, in llama.cpp's formats (llama-model.cpp, llama-context.cpp, llama-kv-cache.cpp):
# the target's buffers, then a draft model's, which are not the target's allocation.
CUDA_LOG = """\
0.00.408.249 I load_tensors: offloaded 31/31 layers to GPU
0.00.408.260 I load_tensors:   CPU_Mapped model buffer size =    28.69 MiB
0.00.408.261 I load_tensors:        CUDA0 model buffer size =    63.42 MiB
0.00.409.893 I llama_context:  CUDA_Host  output buffer size =     0.75 MiB
0.00.410.068 I llama_kv_cache:      CUDA0 KV buffer size =   180.00 MiB
0.00.630.296 I sched_reserve:      CUDA0 compute buffer size =    98.50 MiB
0.00.630.297 I sched_reserve:  CUDA_Host compute buffer size =    17.13 MiB
0.00.930.095 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free     self   model   context   compute    unaccounted |
0.00.930.096 I common_memory_breakdown_print: |   - CUDA0 (H100 80GB HBM3) | 81079 =  80300 + (  342 =    63 +     180 +      98) +         437 |
0.00.930.097 I common_memory_breakdown_print: |   - Host               |                   46 =    28 +       0 +      17                |
0.01.100.000 I load_tensors: offloaded 25/25 layers to GPU
0.01.100.001 I load_tensors:        CUDA0 model buffer size =   400.00 MiB
0.01.100.002 I llama_kv_cache:      CUDA0 KV buffer size =    48.00 MiB
"""
# The CPU build here (a real log of the dry run's SmolLM2 twin).
CPU_LOG = """\
0.00.264.805 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.264.813 I common_memory_breakdown_print: |   - Host               |                  322 =    92 +     180 +      50                |
0.00.408.249 I load_tensors: offloaded 31/31 layers to GPU
0.00.408.260 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
0.00.409.893 I llama_context:        CPU  output buffer size =     0.75 MiB
0.00.410.068 I llama_kv_cache:        CPU KV buffer size =   180.00 MiB
0.00.630.296 I sched_reserve:        CPU compute buffer size =    50.45 MiB
"""


def test_buffers_per_device_of_the_first_model_only() -> None:
    got = gpu.parse_buffers(CUDA_LOG)
    assert got == {"CPU": {"weights": 28.69, "kv": 0.0, "compute": 17.13, "output": 0.75},
                   "CUDA0": {"weights": 63.42, "kv": 180.0, "compute": 98.5, "output": 0.0}}
    assert gpu.parse_buffers(CPU_LOG) == {"CPU": {"weights": 92.1, "kv": 180.0, "compute": 50.45, "output": 0.75}}
    assert gpu.parse_offloaded(CUDA_LOG) == (31, 31)
    assert gpu.parse_offloaded("no such line") is None


@pytest.mark.parametrize("buffer, device", [("CPU", "CPU"), ("CPU_Mapped", "CPU"), ("CPU_REPACK", "CPU"),
                                            ("CUDA_Host", "CPU"), ("Vulkan_Host", "CPU"), ("CUDA0", "CUDA0"),
                                            ("CUDA1", "CUDA1"), ("RPC0[127.0.0.1:50052]", "RPC0")])
def test_buffer_names_map_to_the_plans_devices(buffer: str, device: str) -> None:
    assert gpu.device_of(buffer) == device


def test_memory_breakdown_rows() -> None:
    assert gpu.parse_breakdown(CUDA_LOG) == {
        "CUDA0": {"total": 81079, "free": 80300, "self": 342, "model": 63, "context": 180, "compute": 98,
                  "unaccounted": 437},
        "CPU": {"self": 46, "model": 28, "context": 0, "compute": 17}}
    assert gpu.parse_breakdown(CPU_LOG) == {"CPU": {"self": 322, "model": 92, "context": 180, "compute": 50}}
    assert gpu.parse_breakdown("") == {}


def test_fit_params_output() -> None:
    out = "CUDA0 63 180 98 \nHost 28 0 17 \n"
    assert gpu.parse_fit_print(out) == {"CUDA0": {"model": 63, "context": 180, "compute": 98},
                                        "CPU": {"model": 28, "context": 0, "compute": 17}}
    assert gpu.fit_args("llama_fit_params: printing fitted CLI arguments to stdout...\n-c 8192 -ngl -1\n") == \
        "-c 8192 -ngl -1"
    assert gpu.fit_args("") is None


def _plan() -> dict[str, object]:
    def dev(name: str, w: float, kv: float, c: float) -> dict[str, object]:
        return {"device": {"name": name}, "weights": int(w * gpu.MiB), "kv": int(kv * gpu.MiB),
                "compute": int(c * gpu.MiB)}
    return {"n_ctx": 8192, "devices": [dev("CUDA0", 63.42, 180, 100), dev("CPU", 28.69, 0, 17)]}


def test_the_plan_set_against_llama_cpps_buffers() -> None:
    rows = gpu.compare(_plan(), gpu.parse_buffers(CUDA_LOG))
    assert [r["device"] for r in rows] == ["CUDA0", "CPU"]
    cuda = rows[0]
    assert cuda["plan"] == {"weights": 63.42, "kv": 180.0, "compute": 100.0, "total": 343.42}
    assert cuda["llama"] == {"weights": 63.42, "kv": 180.0, "compute": 98.5, "total": 341.92}
    assert cuda["diff"]["compute"] == -1.5 and cuda["diff"]["weights"] == 0
    assert rows[1]["llama"]["compute"] == 17.88  # compute and output buffers: the plan counts logits with compute
    # a device llama.cpp used that the plan did not name is a row of its own
    extra = gpu.compare({"devices": []}, {"CUDA1": {"weights": 5.0}})
    assert extra == [{"device": "CUDA1", "plan": {"weights": 0.0, "kv": 0.0, "compute": 0.0, "total": 0.0},
                      "llama": {"weights": 5.0, "kv": 0.0, "compute": 0.0, "total": 5.0},
                      "diff": {"weights": 5.0, "kv": 0.0, "compute": 0.0, "total": 5.0}}]


def test_p1_ratios_to_raw_httpx() -> None:
    runs = {"raw httpx": [{"wall": 1.0, "server": 0.9}, {"wall": 1.0, "server": 0.9}],
            "ChatGGUF": [{"wall": 1.25, "server": 0.9}, {"wall": 1.0, "server": 0.9}],
            "bare socket": [{"wall": 0.5}, {"wall": 0.5}]}
    m = gpu.p1_metrics(runs, 100)
    assert m["tok_s"] == {"raw httpx": 100.0, "ChatGGUF": 90.0, "bare socket": 200.0}
    assert m["ratio"] == {"ChatGGUF": 0.9, "bare socket": 2.0}
    assert m["server_ratio"] == {"ChatGGUF": pytest.approx(0.9)}  # a client without server times has none


def _results() -> dict[str, object]:
    case = {"label": "SmolLM2-135M-Q4_1", "ngl": "31", "n_ctx": 8192,
            "compare": gpu.compare(_plan(), gpu.parse_buffers(CUDA_LOG))}
    return {"backend": "cuda", "date": "2026-11-28",
            "card": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "580.159.04", "arch": "90"},
            "alloc": [case, {"label": "auto", "error": "timed out after 60 s"}],
            "p1": gpu.p1_metrics({"raw httpx": [{"wall": 0.5, "server": 0.45}],
                                  "ChatGGUF": [{"wall": 0.5, "server": 0.45}]}, 256),
            "p7": {"edit_ratio": {"median": 1.8}, "chat_ratio": {"median": 1.0}},
            "p16": {"edit_ratio": {"median": 0.7}, "ceiling": {"ratio": 31.2}}}


def test_the_docs_table_names_the_card_and_stays_short() -> None:
    text = gpu.render_section(_results())
    assert text.startswith("NVIDIA H100 80GB HBM3 (81559 MiB, sm_90, driver 580.159.04)")
    assert "| SmolLM2-135M-Q4_1 | 31,8192 | 63/63 | 180/180 | 100/98 |" in text  # the GPU's row, plan/llama.cpp
    assert "| auto | failed | | | |" in text
    assert "P1 ÷ raw httpx (512 tok/s): ChatGGUF 1.00." in text
    assert "P7 n-gram ÷ off: edit 1.80x" in text and "ceiling 31x" in text
    assert len(text.split()) <= 100  # docs/ has a word budget: four models and the speed line


def test_the_section_goes_between_the_markers_of_docs_gpu_md() -> None:
    doc = (ROOT / "docs" / "gpu.md").read_text()
    assert doc.count(gpu.START) == 1 and doc.count(gpu.END) == 1
    new = gpu.replace_section(doc, "the table")
    assert f"{gpu.START}\nthe table\n{gpu.END}" in new
    assert new.split(gpu.START)[0] == doc.split(gpu.START)[0] and new.split(gpu.END)[1] == doc.split(gpu.END)[1]
    assert gpu.replace_section(new, "again") == gpu.replace_section(doc, "again")  # rewritable
    with pytest.raises(ValueError):
        gpu.replace_section("no markers", "x")


TENSORS = [("token_embd.weight", (256, 64), Q4_K), ("blk.0.attn_norm.weight", (256,), F32),
           ("blk.0.attn_q.bias", (256,), F32), ("blk.0.attn_q.weight", (256, 256), Q6_K),
           ("blk.0.attn_k.weight", (64, 256), Q8_0), ("blk.0.ffn_up.weight", (64, 96), Q4_1),
           ("blk.0.ffn_down.weight", (96, 64), Q5_0), ("output.weight", (256, 64), F16)]


def test_a_twin_has_the_real_files_header_and_table_and_valid_blocks(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    real = write_gguf(tmp_path / "m.gguf", {"general.architecture": "llama", "llama.block_count": 1}, TENSORS)
    head = real.read_bytes()
    header = gguf.read_header(real)
    table, data_start = gpu.read_tensor_table(head, header.metadata_end)
    theirs = gguf.read_tensors(real)
    assert [(t.name, t.shape, t.ggml_type) for t in table] == [(t.name, t.shape, t.ggml_type) for t in theirs]
    assert all(t.nbytes <= u.nbytes for t, u in zip(table, theirs, strict=True))  # theirs count the padding
    size = real.stat().st_size
    twins = []
    for name in ("a.gguf", "b.gguf"):
        gpu.write_twin(head[:data_start], table, data_start, size, tmp_path / name, seed=51)
        twins.append((tmp_path / name).read_bytes())
    assert twins[0] == twins[1]  # seeded: the same twin every run
    twin = twins[0]
    assert len(twin) == size and twin[:data_start] == head[:data_start]
    assert gguf.read_tensors(tmp_path / "a.gguf") == theirs
    at = {t.name: data_start + t.offset for t in table}
    assert np.frombuffer(twin, np.float32, 256, at["blk.0.attn_norm.weight"]).tolist() == [1.0] * 256
    assert not any(twin[at["blk.0.attn_q.bias"]:at["blk.0.attn_q.bias"] + 1024])
    q4k = np.frombuffer(twin, np.uint8, 144 * 64, at["token_embd.weight"]).reshape(64, 144)
    d, dmin = (q4k[:, i:i + 2].copy().view(np.float16).ravel() for i in (0, 2))
    assert set(d.tolist()) == {float(np.float16(0.00012))} and set(dmin.tolist()) == {float(np.float16(0.0009))}
    assert len(set(q4k[:, 16:].tobytes())) > 200  # the quants themselves are random
    q6k = np.frombuffer(twin, np.uint8, 210 * 256, at["blk.0.attn_q.weight"]).reshape(256, 210)
    assert np.isfinite(q6k[:, 208:210].copy().view(np.float16)).all()
    f16 = np.frombuffer(twin, np.float16, 256 * 64, at["output.weight"])
    assert np.isfinite(f16).all() and 0.01 < float(f16.astype(np.float32).std()) < 0.03
    assert hashlib.sha256(twin).hexdigest() != hashlib.sha256(head).hexdigest()


def test_every_block_type_is_whole_and_its_fp16_fields_inside_the_block() -> None:
    for b in gpu.BLOCKS.values():
        assert all(0 <= off <= b.size - 2 for off, _ in b.fp16), b
        assert all(abs(float(struct.unpack("<e", struct.pack("<e", v))[0])) > 0 for _, v in b.fp16), b
    with pytest.raises(ValueError, match="whole"):
        _ = gpu.Tensor("x", Q4_K, (100,), 0).nbytes


def test_the_source_tree_keeps_what_the_build_reads() -> None:
    for kept in ("./ggml/src/ggml-cuda/ggml-cuda.cu", "./tools/server/server.cpp", "./tools/ui/CMakeLists.txt",
                 "./src/models/models.h", "./CMakeLists.txt", "./vendor/cpp-httplib/httplib.h"):
        assert not gpu._skipped(kept), kept
    for dropped in ("./docs/build.md", "./models/ggml-vocab-qwen2.gguf", "./ggml/src/ggml-vulkan/ggml-vulkan.cpp",
                    "./tools/ui/src/app.html", "./tests/test-chat.cpp"):
        assert gpu._skipped(dropped), dropped
