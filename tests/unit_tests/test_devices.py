"""Devices as llama-server sees them (runtime/_memory/devices.py), offline: `--list-devices` outputs of every backend as
llama.cpp printed them (tests/unit_tests/data/list_devices, sources in SOURCES.md), the nvidia-smi fallback with
CUDA_VISIBLE_DEVICES, unified memory counted once, `--device KIND:MEMORY`, and fake binaries that list, fail or
hang. The real binary with a real RPC worker is in tests/integration_tests/test_devices_real.py."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_provider.runtime._memory import devices, fit
from gguf_provider.runtime._memory.devices import Device

DATA = Path(__file__).parent / "data" / "list_devices"
MiB = 2**20
GiB = 2**30


def _parse(name: str) -> list[tuple[str, str, str, int, int]]:
    return [(d.name, d.kind, d.description, d.total, d.free)
            for d in devices.parse_list_devices((DATA / name).read_text())]


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in devices.VISIBILITY_ENV:
        monkeypatch.delenv(name, raising=False)
    devices.clear_cache()
    yield
    devices.clear_cache()


# --- parsing -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fixture", "expected"), [
    ("cuda.txt", [("CUDA0", "cuda", "NVIDIA GeForce RTX 5090", 32106 * MiB, 55372 * MiB)]),
    ("cuda-two.txt", [("CUDA0", "cuda", "NVIDIA GeForce RTX 4090", 24080 * MiB, 23665 * MiB),
                      ("CUDA1", "cuda", "NVIDIA GeForce RTX 3060", 11909 * MiB, 11788 * MiB)]),
    ("cuda-masked.txt", [("CUDA0", "cuda", "NVIDIA GeForce RTX 3060", 11909 * MiB, 11788 * MiB)]),
    ("rocm.txt", [("ROCm0", "rocm", "AMD Radeon Graphics", 120000 * MiB, 124704 * MiB)]),
    ("rocm-windows.txt", [("ROCm0", "rocm", "AMD Radeon(TM) Graphics", 110511 * MiB, 110357 * MiB)]),
    ("vulkan.txt", [("Vulkan0", "vulkan", "NVIDIA GeForce RTX 2060", 6144 * MiB, 5136 * MiB)]),
    ("vulkan-windows.txt", [("Vulkan0", "vulkan", "NVIDIA GeForce RTX 4060 Laptop GPU", 7957 * MiB, 7189 * MiB)]),
    ("metal.txt", [("MTL0", "metal", "Apple M4", 18186 * MiB, 18185 * MiB),
                   ("BLAS", "blas", "Accelerate", 0, 0),
                   ("RPC0", "rpc", "192.168.1.39:50052", 18186 * MiB, 18185 * MiB),
                   ("RPC1", "rpc", "192.168.1.39:50052", 0, 0)]),
    ("metal-old.txt", [("Metal", "metal", "Apple M4 Max", 98304 * MiB, 98303 * MiB),
                       ("BLAS", "blas", "Accelerate", 0, 0)]),
    ("sycl.txt", [("SYCL0", "sycl", "Intel(R) Arc(TM) Pro B70 Graphics", 32656 * MiB, 31665 * MiB),
                  ("SYCL1", "sycl", "Intel(R) Graphics", 29115 * MiB, 11642 * MiB)]),
    ("rpc.txt", [("RPC0", "rpc", "127.0.0.1:58751", 24105 * MiB, 24105 * MiB)]),
    ("rpc-two.txt", [("RPC0", "rpc", "127.0.0.1:50611", 24105 * MiB, 24105 * MiB),
                     ("RPC1", "rpc", "127.0.0.1:50612", 24105 * MiB, 24105 * MiB)]),
    ("cpu.txt", []),
])
def test_every_backend_as_printed(fixture: str, expected: list[tuple[str, str, str, int, int]]) -> None:
    assert _parse(fixture) == expected


def test_every_fixture_is_parsed_and_has_a_source() -> None:
    sources = (DATA / "SOURCES.md").read_text()
    for path in DATA.glob("*.txt"):
        assert f"`{path.name}`" in sources, f"{path.name} has no line in SOURCES.md"
        if path.name != "cpu.txt":
            assert devices.parse_list_devices(path.read_text()), path.name


def test_banners_are_ignored_wherever_they_are() -> None:
    """Banner lines before the header, between the device lines, and device-shaped lines before the header (an
    rpc-server's own "Devices:" list) are not devices."""
    text = ("  CPU: AMD EPYC (24105 MiB, 24105 MiB free)\n"  # before the header: not llama-server's list
            "load_backend: loaded CUDA backend from /opt/libggml-cuda.so\n"
            "Available devices:\n"
            "ggml_backend_cuda_get_available_uma_memory: final available_memory_kb: 56701456\n"
            "  CUDA0: NVIDIA A100-SXM4-80GB (81153 MiB, 80600 MiB free)\n"
            "warning: something (1 MiB)\n"
            "  (none)\n")
    assert [d.name for d in devices.parse_list_devices(text)] == ["CUDA0"]


def test_descriptions_with_parentheses_and_colons() -> None:
    # Shapes llama.cpp prints: Mesa's Vulkan names carry "(RADV ...)"; an older RPC build named the device
    # "RPC[host:port]" with the same text as description (ggml-org/llama.cpp pull request #11424).
    text = ("Available devices:\n"
            "  Vulkan0: AMD Radeon Graphics (RADV GFX1151) (65536 MiB, 60000 MiB free)\n"
            "  RPC[10.0.0.2:50052]: RPC[10.0.0.2:50052] (16000 MiB, 15000 MiB free)\n"
            "  HIP0: gfx1100: Radeon RX 7900 XTX (24560 MiB, 24000 MiB free)\n"
            "  CUDA1:  (1024 MiB, 512 MiB free)\n")
    assert [(d.name, d.kind, d.description) for d in devices.parse_list_devices(text)] == [
        ("Vulkan0", "vulkan", "AMD Radeon Graphics (RADV GFX1151)"),
        ("RPC[10.0.0.2:50052]", "rpc", "RPC[10.0.0.2:50052]"),
        ("HIP0", "rocm", "gfx1100: Radeon RX 7900 XTX"),
        ("CUDA1", "cuda", ""),
    ]


def test_metal_is_unified_on_macos_only(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DATA / "metal.txt").read_text()
    monkeypatch.setattr(sys, "platform", "linux")
    assert not any(d.unified for d in devices.parse_list_devices(text))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert [d.name for d in devices.parse_list_devices(text) if d.unified] == ["MTL0"]


def test_to_json_has_every_field() -> None:
    d = Device("CUDA0", "cuda", "NVIDIA X", 8 * GiB, 7 * GiB)
    assert d.to_json() == {"name": "CUDA0", "kind": "cuda", "description": "NVIDIA X", "total": 8 * GiB,
                           "free": 7 * GiB, "unified": False}


# --- nvidia-smi fallback -------------------------------------------------------------------------------------

SMI = ("echo '0, GPU-11111111-aaaa, 24564, 20000, NVIDIA GeForce RTX 4090'; "
       "echo '1, GPU-22222222-bbbb, 12288, 12000, NVIDIA GeForce RTX 3060'; "
       "echo '2, GPU-23333333-cccc, 8192, 8000, NVIDIA T400, rev. 2'")


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str = SMI) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")


def _smi(monkeypatch: pytest.MonkeyPatch, visible: str | None) -> list[tuple[str, str]]:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return [(d.name, d.description) for d in devices.nvidia_smi_devices()]


def test_nvidia_smi_devices_honour_cuda_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path, monkeypatch)
    all3 = [("CUDA0", "NVIDIA GeForce RTX 4090"), ("CUDA1", "NVIDIA GeForce RTX 3060"),
            ("CUDA2", "NVIDIA T400, rev. 2")]
    assert _smi(monkeypatch, None) == all3
    (first,) = devices.nvidia_smi_devices()[:1]
    assert (first.kind, first.total, first.free, first.unified) == ("cuda", 24564 * MiB, 20000 * MiB, False)
    assert _smi(monkeypatch, "") == []  # empty: no GPU visible
    assert _smi(monkeypatch, "1") == [("CUDA0", "NVIDIA GeForce RTX 3060")]  # renumbered from 0, as CUDA does
    assert _smi(monkeypatch, "2,0") == [("CUDA0", "NVIDIA T400, rev. 2"), ("CUDA1", "NVIDIA GeForce RTX 4090")]
    assert _smi(monkeypatch, " 0 , 1 ") == all3[:2]
    assert _smi(monkeypatch, "GPU-22222222-bbbb") == [("CUDA0", "NVIDIA GeForce RTX 3060")]
    assert _smi(monkeypatch, "gpu-2222,0") == [("CUDA0", "NVIDIA GeForce RTX 3060"),
                                               ("CUDA1", "NVIDIA GeForce RTX 4090")]  # a unique prefix will do
    assert _smi(monkeypatch, "GPU-2") == []  # ambiguous prefix: CUDA stops there
    assert _smi(monkeypatch, "0,7,1") == all3[:1]  # an unknown index ends the list
    assert _smi(monkeypatch, "0,-1,1") == all3[:1]
    assert _smi(monkeypatch, "1,1") == [("CUDA0", "NVIDIA GeForce RTX 3060")]  # a repeat ends it too
    assert _smi(monkeypatch, "MIG-0123,0") == []


def test_nvidia_smi_failures_give_no_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for body in ("echo 'NVIDIA-SMI has failed'; exit 9", "echo '0, GPU-1, [N/A], [N/A], X'", "echo 1024"):
        _fake_smi(tmp_path, monkeypatch, body)
        assert devices.nvidia_smi_devices() == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert devices.nvidia_smi_devices() == []


# --- host RAM and the machine --------------------------------------------------------------------------------


def test_host_device_is_ram_available_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit, "cgroup_memory_available", lambda: 3 * GiB)  # a container's limit caps it
    host = devices.host_device()
    assert (host.name, host.kind, host.description) == ("CPU", "cpu", "host RAM")
    assert host.free <= 3 * GiB and host.free <= host.total


def _fake_binary(tmp_path: Path, body: str, name: str = "llama-server") -> Path:
    exe = tmp_path / name
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return exe


def _host(monkeypatch: pytest.MonkeyPatch, free: int = 40 * GiB, total: int = 64 * GiB) -> None:
    monkeypatch.setattr(devices, "host_device", lambda: Device("CPU", "cpu", "host RAM", total, free))


def test_unified_memory_is_counted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Mac the Metal device's memory is the RAM: the CPU entry keeps only what Metal does not count."""
    _host(monkeypatch, free=30 * GiB, total=24 * GiB + 18186 * MiB)
    text = "Available devices:\n" + (DATA / "metal.txt").read_text()  # the note quoted the lines alone
    binary = _fake_binary(tmp_path, f"cat <<'EOF'\n{text}EOF")
    monkeypatch.setattr(sys, "platform", "darwin")
    found = devices.machine_devices(binary)
    assert [d.name for d in found] == ["MTL0", "RPC0", "CPU"]  # BLAS and the 0 MiB RPC1 hold nothing
    mtl, _, cpu = found
    assert mtl.unified and not cpu.unified
    assert cpu.total == 24 * GiB and cpu.free == 30 * GiB - 18185 * MiB
    assert sum(d.total for d in found if d.kind in ("metal", "cpu")) == 24 * GiB + 18186 * MiB  # once, not twice
    devices.clear_cache()
    monkeypatch.setattr(sys, "platform", "linux")  # not a Mac: nothing is shared
    assert devices.machine_devices(binary)[-1].free == 30 * GiB


def test_machine_devices_free_never_exceeds_total(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch)
    binary = _fake_binary(tmp_path, f"cat '{DATA / 'cuda.txt'}'")  # the 5090 that reported host RAM as free
    (gpu, cpu) = devices.machine_devices(binary)
    assert gpu.free == gpu.total == 32106 * MiB and cpu.name == "CPU"


def test_a_cpu_build_sees_no_gpu_even_where_nvidia_smi_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch)
    _fake_smi(tmp_path, monkeypatch)
    binary = _fake_binary(tmp_path, f"cat '{DATA / 'cpu.txt'}'")
    assert [d.name for d in devices.machine_devices(binary)] == ["CPU"]
    assert [d.name for d in devices.machine_devices(None)] == ["CUDA0", "CUDA1", "CUDA2", "CPU"]


@pytest.mark.parametrize("body", ["echo 'error: invalid argument: --list-devices' >&2; exit 1",
                                  "echo 'Failed to connect to 127.0.0.1:1' >&2; kill -ABRT $$",
                                  "echo 'version: 1 (no device list)'"])
def test_a_binary_that_cannot_list_falls_back_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            body: str) -> None:
    _host(monkeypatch)
    _fake_smi(tmp_path, monkeypatch)
    binary = _fake_binary(tmp_path, body)
    assert devices.list_devices(binary) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [(d.name, d.description) for d in devices.machine_devices(binary)] == [
        ("CUDA0", "NVIDIA GeForce RTX 3060"), ("CPU", "host RAM")]


def test_a_hanging_binary_is_given_up_within_the_timeout(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "exec sleep 600")
    t0 = time.monotonic()
    assert devices.list_devices(binary, timeout=0.5) == []
    assert time.monotonic() - t0 < 10  # not the binary's 600 s: ~0.5 s under 2 hogs and a build on 2 cores, 20x


def test_list_devices_runs_the_binary_with_rpc_and_our_environment(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls"
    binary = _fake_binary(tmp_path, f'echo "$* | $CUDA_VISIBLE_DEVICES | $GGML_NO_BACKTRACE" >> "{log}"\n'
                                    f"cat '{DATA / 'rpc-two.txt'}'")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    found = devices.list_devices(binary, rpc=["127.0.0.1:50611", "127.0.0.1:50612"])
    assert [d.name for d in found] == ["RPC0", "RPC1"]
    assert log.read_text().splitlines() == ["--rpc 127.0.0.1:50611,127.0.0.1:50612 --list-devices | 0 | 1"]


def test_list_devices_is_cached_per_binary_rpc_and_visibility(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls"
    binary = _fake_binary(tmp_path, f'echo run >> "{log}"\ncat \'{DATA / "cuda-two.txt"}\'')
    runs = lambda: len(log.read_text().splitlines())  # noqa: E731
    first = devices.list_devices(binary)
    assert devices.list_devices(binary) == first and runs() == 1
    first.clear()  # the caller's list is its own
    assert len(devices.list_devices(binary)) == 2 and runs() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    devices.list_devices(binary)
    assert runs() == 2
    devices.list_devices(binary, rpc=["127.0.0.1:50052"])
    assert runs() == 3
    st = binary.stat()
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new build at the same path
    devices.list_devices(binary)
    assert runs() == 4


def test_an_unreachable_worker_does_not_hide_the_local_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server aborts when an RPC worker is down; the local devices are listed again without it, and the
    failure is not kept (the worker may come up)."""
    _host(monkeypatch)
    binary = _fake_binary(tmp_path, 'case "$*" in *--rpc*) echo "Failed to connect" >&2; exit 134;; esac\n'
                                    f"cat '{DATA / 'vulkan.txt'}'")
    assert [d.name for d in devices.machine_devices(binary, rpc=["127.0.0.1:1"])] == ["Vulkan0", "CPU"]
    assert devices.list_devices(binary, rpc=["127.0.0.1:1"]) == []
    st = binary.stat()
    binary.write_text(f"#!/bin/sh\ncat '{DATA / 'rpc.txt'}'\n")  # the worker is up now
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns))  # same binary as far as the cache can tell
    assert [d.name for d in devices.list_devices(binary, rpc=["127.0.0.1:1"])] == ["RPC0"]


def test_a_missing_binary_is_no_listing(tmp_path: Path) -> None:
    assert devices.list_devices(tmp_path / "nope") == []


# --- devices the user names ----------------------------------------------------------------------------------


def test_parse_device_arg() -> None:
    d = devices.parse_device_arg("cuda:8GiB")
    assert (d.name, d.kind, d.total, d.free, d.unified) == ("CUDA", "cuda", 8 * GiB, 8 * GiB, False)
    assert devices.parse_device_arg("vulkan:300MiB").total == 300 * MiB
    assert devices.parse_device_arg(" CPU : 64 GiB").kind == "cpu"
    assert devices.parse_device_arg("metal:24GiB").unified
    assert devices.parse_device_arg("hip:16GiB").kind == "rocm"
    assert devices.parse_device_arg("rpc:2GB").total == 2 * 10**9


@pytest.mark.parametrize(("text", "message"), [
    ("cuda", r"KIND:MEMORY \(e\.g\. cuda:8GiB"),
    ("8GiB", r"KIND:MEMORY"),
    ("cuda:", r"KIND:MEMORY"),
    ("tpu:8GiB", r"unknown device kind 'tpu'.*kinds: cuda, rocm, vulkan, metal, sycl, rpc, cpu"),
    ("cuda:8 gigs", r"device 'cuda:8 gigs': not a memory size.*e\.g\. 6GiB"),
    ("cuda:0", r"has no memory; give its size, e\.g\. cuda:8GiB"),
])
def test_parse_device_arg_rejects_with_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        devices.parse_device_arg(text)


def test_number_devices_names_per_kind_and_puts_ram_last() -> None:
    given = [devices.parse_device_arg(t) for t in ("cpu:64GiB", "cuda:8GiB", "vulkan:300MiB", "cuda:12GiB")]
    named = devices.number_devices(given)
    assert [(d.name, d.total) for d in named] == [("CUDA0", 8 * GiB), ("Vulkan0", 300 * MiB),
                                                  ("CUDA1", 12 * GiB), ("CPU", 64 * GiB)]
    with pytest.raises(ValueError, match="host RAM once"):
        devices.number_devices([*given, devices.parse_device_arg("cpu:1GiB")])


# --- `gguf-provider devices` and `%gguf devices` -------------------------------------------------------------

LISTED = [Device("CUDA0", "cuda", "NVIDIA GeForce RTX 4090", 24080 * MiB, 23665 * MiB),
          Device("RPC0", "rpc", "127.0.0.1:50052", 24105 * MiB, 24105 * MiB),
          Device("CPU", "cpu", "host RAM", 64 * GiB, 40 * GiB)]


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Path | None, tuple[str, ...]]]:
    """machine_devices answers LISTED; the calls it got are recorded; discovery finds a fake binary."""
    from gguf_provider.runtime._install import discovery

    calls: list[tuple[Path | None, tuple[str, ...]]] = []
    binary = tmp_path / "llama-server"

    def fake(b: Path | None, *, rpc: tuple[str, ...] = ()) -> list[Device]:
        calls.append((b, tuple(rpc)))
        return [d for d in LISTED if rpc or d.kind != "rpc"]

    monkeypatch.setattr(devices, "machine_devices", fake)
    monkeypatch.setattr(discovery, "locate", lambda *a: (binary, "test"))
    return calls


def test_cli_devices_table(machine: list[tuple[Path | None, tuple[str, ...]]],
                           capsys: pytest.CaptureFixture[str]) -> None:
    from gguf_provider import cli

    assert cli.main(["devices", "--rpc", "127.0.0.1:50052"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].split() == ["name", "kind", "description", "free", "/", "total"]
    assert lines[1].split()[:2] == ["CUDA0", "cuda"] and lines[1].endswith("23.1 / 23.5 GiB")
    assert "NVIDIA GeForce RTX 4090" in lines[1] and lines[2].startswith("RPC0 ")
    assert lines[3].split()[:4] == ["CPU", "cpu", "host", "RAM"] and lines[3].endswith("40.0 / 64.0 GiB")
    assert lines[0].index("kind") == lines[1].index("cuda") == lines[3].index("cpu")  # aligned columns
    assert lines[4].startswith("as seen by ") and out.err == ""
    assert machine[0][1] == ("127.0.0.1:50052",)


def test_cli_devices_json_and_rpc_checks(machine: list[tuple[Path | None, tuple[str, ...]]],
                                         capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from gguf_provider import cli

    assert cli.main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == [d.to_json() for d in LISTED if d.kind != "rpc"]
    assert data[-1]["name"] == "CPU" and isinstance(data[0]["free"], int)
    assert machine == [(machine[0][0], ())]
    assert cli.main(["devices", "--rpc", "nonsense"]) == 2
    assert "--rpc: RPC worker 'nonsense' is not host:port" in capsys.readouterr().err
    # a worker listed nowhere is named, with what to check
    monkeypatch.setattr(devices, "machine_devices", lambda b, *, rpc=(): LISTED[::2])
    assert cli.main(["devices", "--rpc", "10.0.0.9:50052"]) == 0
    assert "no RPC device listed for 10.0.0.9:50052: is `gguf-provider rpc-worker` running" in capsys.readouterr().err


def test_magic_devices(machine: list[tuple[Path | None, tuple[str, ...]]]) -> None:
    from IPython.core.error import UsageError
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "gguf_provider")
    table = shell.run_line_magic("gguf", "devices --rpc 127.0.0.1:50052")
    assert [r["name"] for r in table.rows] == ["CUDA0", "RPC0", "CPU"]
    assert list(table.rows[0]) == ["name", "kind", "description", "free / total"]
    assert table.rows[-1]["free / total"] == "40.0 / 64.0 GiB"
    assert "| CUDA0 | cuda | NVIDIA GeForce RTX 4090 | 23.1 / 23.5 GiB |" in table._repr_markdown_()
    assert repr(table).splitlines()[0].split() == ["name", "kind", "description", "free", "/", "total"]
    assert "as seen by" in table.footer
    with pytest.raises(UsageError, match="%gguf devices: RPC worker 'x' is not host:port"):
        shell.run_line_magic("gguf", "devices --rpc x")
