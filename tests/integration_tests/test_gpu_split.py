"""A model split between a device and RAM, end to end (issue 36): a local `gguf-provider rpc-worker` is a real
non-CPU device to llama.cpp (RPC0), capped below the model's size with $GGUF_PROVIDER_DEVICE_LIMIT, so the memory
plan puts the last layers on it and the rest in RAM instead of refusing. llama-server's own load log (at -lv 4)
must say what the plan said, `ps` shows the split, and the next-token distribution is the single machine's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime._common import gguf
from tests.integration_tests.test_rpc import QUESTION, Worker
from tests.support.memory import EXACT, SLACK, buffers
from tests.support.probs import assert_same_distribution, next_token_probs
from tests.support.runtime import RuntimeEnv, wait_until

pytestmark = pytest.mark.timeout(300)  # a hang guard: the slowest test takes ~5 s under load; 60x
MiB = 1 << 20
# The RPC device's cap: its reserve (1 GiB, llama.cpp's --fit-target), a compute buffer, the drafted tokens' logits
# (speculation is on by default, 49 MiB) and room for a few of SmolLM2's 30 layers with its tied output head (a 28.7 MiB copy of the
# embeddings), so some layers go to it and most stay in RAM.
CAP = "RPC0=1145MiB"


def test_a_model_larger_than_the_device_is_split_between_it_and_ram(
        rt: RuntimeEnv, worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    n_layer = gguf.read_header(rt.model).block_count
    assert n_layer
    monkeypatch.setenv("GGUF_PROVIDER_DEVICE_LIMIT", CAP)

    # The plan, without starting anything.
    out = rt.gguf_cli("plan", str(rt.model), "--rpc", worker.endpoint, "--ctx", "1024", "--speculative", "--json")
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    by_name = {d["device"]["name"]: d for d in planned["devices"]}
    assert planned["fits"] and planned["split"] and set(by_name) == {"RPC0", "CPU"}
    ngl = planned["n_gpu_layers"]
    assert 1 <= ngl < n_layer and by_name["RPC0"]["output"] and by_name["RPC0"]["n_layers"] == ngl - 1
    assert max(by_name["CPU"]["layers"]) < min(by_name["RPC0"]["layers"])  # llama.cpp offloads the last layers
    assert planned["args"] == ["-ngl", str(ngl)]

    local = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024))
    try:
        expected = next_token_probs(local)
    finally:
        local.unload()
    wait_until(lambda: not rt.servers(), 15)  # unload stopped it before returning: ~0.01 s under load

    split = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, rpc_servers=(worker.endpoint,),
                                server_args=("-lv", "4")))  # -lv 4: llama-server logs where each tensor went
    try:
        got = next_token_probs(split)
        reply = split.chat(QUESTION).content
        (server,) = rt.servers()
        argv = server.cmdline()
        assert argv[argv.index("-ngl") + 1] == str(ngl) and argv[argv.index("--fit") + 1] == "off"
        log = Path(split.info.log_path).read_text(errors="replace")
        # What llama.cpp did is what the plan said: the layer count and the device's weights.
        assert f"offloaded {ngl}/{n_layer + 1} layers to GPU" in log
        (rpc_mib,) = (float(m) for m in re.findall(r"RPC0\[[^\]]*\] model buffer size =\s+([\d.]+) MiB", log))
        assert abs(rpc_mib * MiB - by_name["RPC0"]["weights"]) < 1.5 * MiB, (rpc_mib, by_name["RPC0"])
        # Its KV cache and compute buffer too, within the bounds of test_memory_real.py.
        rpc0 = buffers(log)["RPC0"]
        assert abs(rpc0["kv"] - by_name["RPC0"]["kv"]) <= EXACT, (rpc0, by_name["RPC0"])
        assert rpc0["compute"] <= by_name["RPC0"]["compute"] <= 1.25 * rpc0["compute"] + SLACK, (rpc0, by_name["RPC0"])
        # (The host's "CPU_Mapped" size is the span of the mapped file from its first to its last host tensor,
        # offloaded tensors between them included, not memory in use: nothing to compare.)
        # The split computes what the single machine computes, within rounding, and answers.
        assert_same_distribution(got, expected)
        assert reply.strip()

        ps = json.loads(rt.gguf_cli("ps", "--json").stdout)
        (placement,) = [r["placement"] for r in ps["servers"]]
        assert {p["device"]: p["n_layers"] for p in placement} == {"RPC0": ngl, "CPU": n_layer - ngl + 1}
        # the budget counts what each device holds
        assert ps["budget"]["devices"] == {p["device"]: p["bytes"] for p in placement}
        assert "on RPC0 layers" in rt.gguf_cli("ps").stdout
    finally:
        split.unload()


def test_a_device_with_room_takes_every_layer(rt: RuntimeEnv, worker: Worker) -> None:
    out = rt.gguf_cli("plan", str(rt.model), "--rpc", worker.endpoint, "--ctx", "1024", "--json")
    planned = json.loads(out.stdout)
    by_name = {d["device"]["name"]: d for d in planned["devices"]}
    assert planned["fits"] and not planned["split"] and by_name["CPU"]["n_layers"] == 0
    assert planned["n_gpu_layers"] == (gguf.read_header(rt.model).block_count or 0) + 1
