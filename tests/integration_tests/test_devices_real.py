"""Devices as the real llama-server sees them: a real local rpc-server worker is listed as RPC0 with its memory; the
CPU build alone lists no GPU device; the host RAM comes last."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_provider.runtime._common.process import free_port
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._memory import devices, rpc

pytestmark = pytest.mark.timeout(120)  # a hang guard: each test takes under 1 s under load


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    devices.clear_cache()
    yield
    devices.clear_cache()


@pytest.fixture
def binary() -> Path:
    return discovery.find_llama_server()


@pytest.fixture
def worker(binary: Path) -> Iterator[str]:
    """A real rpc-server (installed beside llama-server) on a free loopback port."""
    exe = rpc.find_rpc_server(binary)
    assert exe is not None, f"no rpc-server beside {binary}: reinstall with `gguf-provider server install --force`"
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    proc = subprocess.Popen(rpc.worker_argv(exe, port=port, threads=1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30  # ~0.1 s under load
        while not rpc.reachable(endpoint, timeout=0.5):
            assert proc.poll() is None and time.monotonic() < deadline, f"rpc-server on {endpoint} did not start"
            time.sleep(0.1)
        yield endpoint
    finally:
        proc.kill()
        proc.wait(10)  # SIGKILLed: it exits at once


def test_a_local_worker_is_listed_as_rpc0_with_its_memory(binary: Path, worker: str) -> None:
    listed = devices.list_devices(binary, rpc=[worker])
    assert [(d.name, d.kind, d.description) for d in listed] == [("RPC0", "rpc", worker)]
    assert listed[0].total > 0 and 0 < listed[0].free <= listed[0].total
    found = devices.machine_devices(binary, rpc=[worker])
    assert [d.name for d in found] == ["RPC0", "CPU"]
    assert found[-1].kind == "cpu" and found[-1].free > 0


def test_the_cpu_build_alone_lists_no_gpu(binary: Path) -> None:
    assert devices.list_devices(binary) == []
    (cpu,) = devices.machine_devices(binary)
    assert (cpu.name, cpu.kind) == ("CPU", "cpu") and 0 < cpu.free <= cpu.total


def test_a_worker_that_is_down_leaves_the_local_devices(binary: Path) -> None:
    """llama-server aborts when a --rpc worker is unreachable: listing gives up on it (at the latest after its own
    timeout) and still reports what the machine has."""
    t0 = time.monotonic()
    found = devices.machine_devices(binary, rpc=[f"127.0.0.1:{free_port()}"])
    # the abort takes ~0.1 s; the library's LIST_TIMEOUT (30 s) bounds a listing that hangs, 10 s of margin
    assert [d.name for d in found] == ["CPU"] and time.monotonic() - t0 < devices.LIST_TIMEOUT + 10
