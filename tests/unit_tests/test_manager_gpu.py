"""The memory plan at a start (issue 36), with the manager's collaborators faked as in test_manager_races: the plan's
layers reach the command line and the registry (what `ps` shows), and a start that runs out of device memory is
retried once with a smaller plan, then refused with a typed error naming the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.errors import DeviceOutOfMemoryError, MemoryBudgetWarning, ServerStartError
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._common.progress import Progress
from gguf_provider.runtime._memory import plan
from gguf_provider.runtime._memory.devices import Device
from gguf_provider.runtime._serve import manager as mgr
from tests.unit_tests.test_manager_races import FakeHealth, World

MiB, GiB = 1 << 20, 1 << 30
# The last lines of a real start that ran out of memory on an NVIDIA H200 (this project's CUDA build).
OOM_LOG = (Path(__file__).parent / "data" / "logs" / "cuda-oom-h200.log").read_text()


def gpu_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vram: int) -> World:
    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(tmp_path / "run"))
    w = World(tmp_path)
    gpu = Device("CUDA0", "cuda", "NVIDIA GeForce RTX 3060", vram, vram)
    host = Device("CPU", "cpu", "host RAM", 64 * GiB, 64 * GiB)
    w.budget.devices = lambda binary, rpc: [gpu, host]  # type: ignore[method-assign]
    return w


def ngl(argv: list[str]) -> int:
    """Layers on the GPU: -ngl's value, 0 with `--device none` (the GPU not used at all)."""
    if "--device" in argv and argv[argv.index("--device") + 1] == "none":
        return 0
    return int(argv[argv.index("-ngl") + 1])


def test_the_plan_reaches_the_command_line_and_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = gpu_world(tmp_path, monkeypatch, 8 * GiB)
    model = w.spec("qwen", n_ctx=2048).model
    # the GPU's reserve, a compute buffer and half the model: it does not fit whole
    vram = plan.FIT_TARGET + plan.compute_bytes(gguf.read_header(model), 2048) + model.stat().st_size // 2
    w.budget.devices = lambda binary, rpc: [Device("CUDA0", "cuda", "small GPU", vram, vram),  # type: ignore
                                            Device("CPU", "cpu", "host RAM", 64 * GiB, 64 * GiB)]
    lease = w.client().acquire(w.spec("qwen", n_ctx=2048))
    argv = w.launcher.argvs[-1]
    assert 0 < ngl(argv) < 25  # a split: some layers on the GPU, the rest in RAM
    placement = {p["device"]: p for p in w.entry(lease).placement}
    assert set(placement) == {"CUDA0", "CPU"}
    assert placement["CUDA0"]["n_layers"] == ngl(argv) and "output" in placement["CUDA0"]["layers"]
    assert 0 < placement["CUDA0"]["bytes"] <= vram


def test_without_a_gpu_nothing_is_placed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(tmp_path / "run"))
    w = World(tmp_path)
    lease = w.client().acquire(w.spec("qwen"))
    assert "-ngl" not in w.launcher.argvs[-1] and w.entry(lease).placement == ()


def test_the_users_n_gpu_layers_is_kept_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = gpu_world(tmp_path, monkeypatch, 24 * GiB)
    from dataclasses import replace

    lease = w.client().acquire(replace(w.spec("qwen"), n_gpu_layers=3))
    argv = w.launcher.argvs[-1]
    assert ngl(argv) == 3 and argv.count("-ngl") == 1
    assert {p["device"]: p["n_layers"] for p in w.entry(lease).placement}["CUDA0"] == 3


class OutOfMemoryHealth(FakeHealth):
    """The first ``failures`` starts end the way a real one ran out of CUDA memory."""

    def __init__(self, base: FakeHealth, failures: int) -> None:
        super().__init__(base.procs, base.servers)
        self.failures = failures

    def wait_healthy(self, proc: mgr.Proc, address: Address, log_path: Path, *, timeout: float,
                     progress: Progress | None) -> None:
        if self.failures:
            self.failures -= 1
            self.procs.die(self.servers[address.describe()].pid)
            raise ServerStartError("llama-server exited with code 1 while starting", OOM_LOG, log_path)
        super().wait_healthy(proc, address, log_path, timeout=timeout, progress=progress)


def test_out_of_device_memory_is_retried_once_with_fewer_layers(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    w = gpu_world(tmp_path, monkeypatch, 8 * GiB)  # the plan puts everything on the GPU; the start says no
    w.health = OutOfMemoryHealth(w.health, failures=1)
    with pytest.warns(MemoryBudgetWarning, match="ran out of CUDA0 memory.*retrying once with a smaller plan"):
        lease = w.client().acquire(w.spec("qwen", n_ctx=2048))
    first, second = w.launcher.argvs
    assert ngl(second) < ngl(first) == 25
    assert w.entry(lease).placement and lease.info.pid == w.launcher.spawned[-1]


def test_a_second_failure_names_the_device_and_what_was_free(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    w = gpu_world(tmp_path, monkeypatch, 8 * GiB)
    w.health = OutOfMemoryHealth(w.health, failures=2)
    with pytest.warns(MemoryBudgetWarning), pytest.raises(DeviceOutOfMemoryError) as err:
        w.client().acquire(w.spec("qwen", n_ctx=2048))
    e = err.value
    assert e.device == "CUDA0" and e.needed == int(351562.5 * MiB)
    assert "failed again after a retry with" in str(e) and "CUDA0 had 8,192 MiB free" in str(e)
    assert "n_gpu_layers" in str(e) and "kv_cache_type" in str(e) and e.log_tail
    assert len(w.launcher.spawned) == 2 and not w.reg.read()  # nothing left registered


def test_a_user_placement_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = gpu_world(tmp_path, monkeypatch, 8 * GiB)
    w.health = OutOfMemoryHealth(w.health, failures=1)
    from dataclasses import replace

    with pytest.raises(DeviceOutOfMemoryError):
        w.client().acquire(replace(w.spec("qwen", n_ctx=2048), server_args=("-ngl", "99")))
    assert len(w.launcher.spawned) == 1


def test_the_projector_is_planned_on_the_first_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A projector (mmproj) goes to the first GPU with llama.cpp's default `--mmproj-offload`: the plan counts it
    there, so fewer layers go beside it, and `ps` (the registry's placement) shows its bytes on that device."""
    from gguf_provider.runtime._serve.server_options import ServerSpec
    from tests.support.gguf_tables import QWEN_FILE, QWEN_META, qwen_tensors, write_gguf

    w = gpu_world(tmp_path, monkeypatch, 8 * GiB)
    model = write_gguf(tmp_path / "real" / QWEN_FILE, QWEN_META, qwen_tensors())  # the real table, sparse
    size = model.stat().st_size
    vram = plan.FIT_TARGET + plan.compute_bytes(gguf.read_header(model), 2048) + size * 9 // 8
    w.budget.devices = lambda binary, rpc: [Device("CUDA0", "cuda", "small GPU", vram, vram),  # type: ignore
                                            Device("CPU", "cpu", "host RAM", 64 * GiB, 64 * GiB)]
    projector = tmp_path / "mmproj-f16.gguf"
    with open(projector, "wb") as f:
        f.truncate(size // 2)
    from gguf_provider.runtime._install import discovery

    caps = discovery.ServerCapabilities(path="llama-server", version="test", flags={"--mmproj": True})
    w.installer.capabilities = lambda binary: caps  # type: ignore[method-assign]
    without = w.client().acquire(ServerSpec(model=model, n_ctx=2048, speculative="off"))
    alone = ngl(w.launcher.argvs[-1])
    without.release(stop=True)
    lease = w.client().acquire(ServerSpec(model=model, n_ctx=2048, speculative="off", mmproj=projector))
    beside = ngl(w.launcher.argvs[-1])
    assert alone == 25 and 0 < beside < alone  # the projector takes the room of about half the layers
    placement = {p["device"]: p for p in w.entry(lease).placement}
    assert placement["CUDA0"]["bytes"] >= size // 2
