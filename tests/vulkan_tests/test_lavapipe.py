"""The Vulkan build on a real Vulkan device (issue 36): Mesa's lavapipe, a Vulkan implementation in software, as
`make test-vulkan` sets it up (scripts/setup_vulkan.sh). SmolLM2 with every layer on the device and with a split
(the device capped with $GGUF_PROVIDER_DEVICE_LIMIT), each against the CPU build's next-token distribution (the
Vulkan shaders and the CPU kernels round differently: the greedy texts may part at a near tie).

Not part of `make test` (its own target: the Vulkan build takes long on 2 cores, see docs/gpu.md)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime import default
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._install import installed
from gguf_provider.runtime._memory import devices
from tests.support.memory import SLACK, buffers
from tests.support.probs import assert_same_distribution, next_token_probs
from tests.support.runtime import RuntimeEnv, wait_until

pytestmark = pytest.mark.timeout(900)
QUESTION = {"messages": [{"role": "user", "content": "Name three colors of the rainbow."}], "temperature": 0,
            "max_tokens": 24}


@dataclass
class Builds:
    cpu: Path
    vulkan: Path


@pytest.fixture(scope="session")
def vulkan_server() -> Path:
    """The Vulkan build in the real home (looked up before `rt` moves the home to a temp dir)."""
    vk = installed.installed("vulkan")
    if vk is None:
        msg = "no Vulkan build: run `make test-vulkan` (scripts/setup_vulkan.sh builds it)"
        if os.environ.get("GGUF_PROVIDER_TESTS_STRICT"):
            pytest.fail(msg)
        pytest.skip(msg)
    return vk.server


@pytest.fixture
def builds(vulkan_server: Path, rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[Builds]:
    # lavapipe is a CPU-type Vulkan device, which llama.cpp's Vulkan backend uses only when it is chosen by index
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    yield Builds(cpu=rt.binary, vulkan=vulkan_server)


def _reply(model: Path, binary: Path, **config: object) -> tuple[str, dict[int, float], str]:
    """The reply's text, the next-token distribution (tests/support/probs.py) and the server's log; the Vulkan
    device's buffers in the log checked against what the plan charged it (`ps`'s placement)."""
    engine = Engine(EngineConfig(model_path=str(model), n_ctx=1024, llama_server=str(binary),
                                 server_args=("-lv", "4"), **config))  # type: ignore[arg-type]
    try:
        text, probs = engine.chat(QUESTION).content, next_token_probs(engine)
        log = Path(engine.info.log_path).read_text(errors="replace")
        (server,) = default().status().servers
        planned = {p["device"]: p["bytes"] for p in server.placement}
        if "Vulkan0" in planned:  # weights and KV exact, compute erring high (tests/support/memory.py)
            seen = sum(buffers(log)["Vulkan0"].values())
            assert seen <= planned["Vulkan0"] <= 1.25 * seen + SLACK, (buffers(log), planned)
        return text, probs, log
    finally:
        engine.unload()


def test_lavapipe_is_a_vulkan_device(builds: Builds, monkeypatch: pytest.MonkeyPatch) -> None:
    listed = devices.list_devices(builds.vulkan)
    assert [d.kind for d in listed] == ["vulkan"] and "llvmpipe" in listed[0].description, listed
    assert listed[0].free > 0
    assert devices.machine_devices(builds.vulkan)[0] == listed[0]
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES")  # not chosen: llama.cpp leaves a CPU-type device out
    assert devices.list_devices(builds.vulkan) == []


def test_every_layer_on_lavapipe_and_a_split(rt: RuntimeEnv, builds: Builds,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    n_layer = gguf.read_header(rt.model).block_count or 0
    on_cpu, cpu_probs, _ = _reply(rt.model, builds.cpu)
    wait_until(lambda: not rt.servers(), 15)

    whole, whole_probs, log = _reply(rt.model, builds.vulkan)
    assert f"offloaded {n_layer + 1}/{n_layer + 1} layers to GPU" in log
    assert re.search(r"Vulkan0 model buffer size", log)
    wait_until(lambda: not rt.servers(), 15)

    monkeypatch.setenv("GGUF_PROVIDER_DEVICE_LIMIT", "Vulkan0=1145MiB")
    split, split_probs, log = _reply(rt.model, builds.vulkan)
    (offloaded,) = re.findall(r"offloaded (\d+)/\d+ layers to GPU", log)
    assert 1 <= int(offloaded) < n_layer
    for text in (on_cpu, whole, split):
        assert text.strip()
    # What the three runs gave, for docs/gpu.md (the Vulkan shaders and the CPU kernels round differently).
    print(json.dumps({"cpu": on_cpu, "vulkan": whole, "split": split, "offloaded": int(offloaded)}, indent=1))
    assert_same_distribution(whole_probs, cpu_probs)
    assert_same_distribution(split_probs, cpu_probs)
