"""The backend chooser on fake hosts (issue 36, points 1 and 5(d)): what each machine gets and the release archive
that picks from a local release mirror (tests/support/llama_releases.py, answering over loopback HTTP as the
releases API does), the probes of /sys and nvidia-smi on fake trees, which of several installs is used, the one
line, and the warning for a CPU build on a machine with a GPU."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from gguf_provider import cli
from gguf_provider.errors import BackendWarning, PrebuiltInstallError
from gguf_provider.runtime._common import host
from gguf_provider.runtime._common.host import GPU, Choice, Host
from gguf_provider.runtime._install import backend, discovery, install, installed, prebuilt
from tests.support.llama_releases import ReleasesServer
from tests.unit_tests.test_prebuilt import TAG, UPSTREAM

GIB = 1 << 30
RX7800 = GPU("amd", "AMD Radeon RX 7800 XT", 16 * GIB)
RTX4090 = GPU("nvidia", "NVIDIA GeForce RTX 4090", 24564 << 20)


# --- fake machines ------------------------------------------------------------------------------------------------


def card(root: Path, name: str, vendor: str, **files: str) -> Path:
    """``/sys/class/drm/<name>/device`` with ``vendor`` (and other attribute files) under ``root``."""
    device = root / "sys" / "devices" / "pci0000:00" / name / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    for attr, value in files.items():
        (device / attr).write_text(value + "\n")
    link = root / "sys" / "class" / "drm" / name
    link.mkdir(parents=True)
    (link / "device").symlink_to(device)
    return device


def which_of(*tools: str) -> Callable[[str], str | None]:
    return lambda name: f"/usr/bin/{name}" if name in tools else None


def runner(answers: dict[str, str]) -> Callable[[Sequence[str]], str | None]:
    """A command runner: the answer keyed by an argument of the command, None (failed) for any other."""
    def run(cmd: Sequence[str]) -> str | None:
        return next((answers[a] for a in cmd if a in answers), None)

    return run


SMI_4090 = {"--query-gpu=name,memory.total": "NVIDIA GeForce RTX 4090, 24564\n"}


def fake(tmp: Path, kind: str) -> Host:
    """A fake host of each kind the issue names, probed by probe_host from fake /sys, PATH and commands."""
    root = tmp / kind
    root.mkdir()
    env: dict[str, str] = {}
    if kind == "no-gpu":
        card(root, "card0", "0x1a03")  # a server's ASPEED BMC display is no GPU
        return host.probe_host(root=root, which=which_of(), run=runner({}), env=env, system="linux",
                               machine="x86_64")
    if kind == "nvidia-nvcc":
        card(root, "card0", "0x10de")
        return host.probe_host(root=root, which=which_of("nvidia-smi", "nvcc"), run=runner(SMI_4090), env=env,
                               system="linux", machine="x86_64")
    if kind == "nvidia":
        card(root, "card0", "0x10de")
        return host.probe_host(root=root, which=which_of("nvidia-smi"), run=runner(SMI_4090), env=env,
                               system="linux", machine="x86_64")
    if kind == "amd":
        card(root, "card0", "0x1002", product_name="AMD Radeon RX 7800 XT", mem_info_vram_total=str(16 * GIB))
        return host.probe_host(root=root, which=which_of(), run=runner({}), env=env, system="linux",
                               machine="x86_64")
    if kind == "intel-arm64":
        card(root, "card0", "0x8086")
        return host.probe_host(root=root, which=which_of(), run=runner({}), env=env, system="linux",
                               machine="aarch64")
    if kind == "apple":
        return host.probe_host(root=root, which=which_of(), env=env, system="darwin", machine="arm64",
                               run=runner({"machdep.cpu.brand_string": "Apple M2 Pro\n", "hw.memsize": str(32 * GIB)}))
    if kind == "mac-intel":
        return host.probe_host(root=root, which=which_of(), run=runner({}), env=env, system="darwin",
                               machine="x86_64")
    if kind == "windows-nvidia-nvcc":
        return host.probe_host(root=root, which=which_of("nvidia-smi", "nvcc"), run=runner(SMI_4090), env=env,
                               system="windows", machine="AMD64")
    if kind == "windows-nvidia":
        return host.probe_host(root=root, which=which_of("nvidia-smi"), run=runner(SMI_4090), env=env,
                               system="windows", machine="AMD64")
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def mirror() -> Iterator[ReleasesServer]:
    """The pinned release's archive names (b11312's set), served as GitHub's releases API serves them."""
    server = ReleasesServer(TAG, {name: b"placeholder" for name in UPSTREAM})
    yield server
    server.close()


def picked(mirror: ReleasesServer, machine: Host, choice: Choice, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The archive(s) the install would download for ``choice`` on ``machine``, from the mirror."""
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_RELEASES_URL", mirror.base_url)
    with httpx.Client(timeout=10) as client:  # a local mirror: the whole test ~0.2 s under 2 hogs + a build; 50x
        release = prebuilt.fetch_release(client, TAG)
    target = prebuilt.Host(machine.system, machine.machine, choice.backend)
    return [a.name for a in prebuilt.choose_assets(release, target)]


# kind → (backend, method, the archive(s) it takes from the release; None: llama.cpp publishes none, the build)
CASES: dict[str, tuple[str, str, list[str] | None]] = {
    "no-gpu": ("cpu", "either", ["ubuntu-x64.tar.gz"]),
    "nvidia-nvcc": ("cuda", "source", None),  # no Linux CUDA archive upstream: the source build
    "nvidia": ("vulkan", "prebuilt", ["ubuntu-vulkan-x64.tar.gz"]),
    "amd": ("vulkan", "prebuilt", ["ubuntu-vulkan-x64.tar.gz"]),
    "intel-arm64": ("vulkan", "prebuilt", ["ubuntu-vulkan-arm64.tar.gz"]),
    "apple": ("metal", "either", ["macos-arm64.tar.gz"]),
    "mac-intel": ("cpu", "either", ["macos-x64.tar.gz"]),
    "windows-nvidia-nvcc": ("cuda", "either", ["win-cuda-12.4-x64.zip", "cudart-llama-bin-win-cuda-12.4-x64.zip"]),
    "windows-nvidia": ("vulkan", "prebuilt", ["win-vulkan-x64.zip"]),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_machine_gets_its_backend_and_archive(kind: str, tmp_path: Path, mirror: ReleasesServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    machine = fake(tmp_path, kind)
    choice = host.choose(machine)
    want_backend, want_method, want_assets = CASES[kind]
    assert (choice.backend, choice.method) == (want_backend, want_method)
    if want_assets is None:
        with pytest.raises(PrebuiltInstallError) as err:
            picked(mirror, machine, choice, monkeypatch)
        assert err.value.reason == "no-asset"
    else:
        names = [n if n.startswith("cudart") else f"llama-{TAG}-bin-{n}" for n in want_assets]
        assert picked(mirror, machine, choice, monkeypatch) == names
    line = host.describe(choice, machine)
    assert line.startswith(f"llama-server: {host.BACKEND_NAMES[want_backend]}") and "\n" not in line


def test_the_lines_name_the_gpu_the_reason_and_the_fix(tmp_path: Path) -> None:
    machines = {kind: fake(tmp_path, kind) for kind in ("no-gpu", "nvidia", "nvidia-nvcc", "amd", "apple",
                                                        "mac-intel", "windows-nvidia")}
    lines = {kind: host.describe(host.choose(m), m) for kind, m in machines.items()}
    assert lines["no-gpu"] == "llama-server: CPU — no GPU found"
    assert lines["nvidia"] == ("llama-server: Vulkan (NVIDIA GeForce RTX 4090, 24 GiB) — NVIDIA GPU found, no CUDA "
                               "toolkit; `gguf-provider server install --backend cuda` after installing one")
    assert lines["nvidia-nvcc"] == (
        "llama-server: CUDA (NVIDIA GeForce RTX 4090, 24 GiB) — NVIDIA GPU and CUDA toolkit found; llama.cpp "
        "publishes no CUDA archive for Linux x64, so it is built from source")
    assert lines["amd"] == "llama-server: Vulkan (AMD Radeon RX 7800 XT, 16 GiB) — AMD GPU found"
    assert lines["apple"] == "llama-server: Metal (Apple M2 Pro GPU, 32 GiB) — Apple silicon"
    assert lines["mac-intel"].startswith("llama-server: CPU — Intel Mac: llama.cpp's macOS x64 archive is built "
                                         "without Metal; `gguf-provider server install --backend metal --from source`")
    assert "llama.cpp's CUDA archive (it brings its own runtime)" in lines["windows-nvidia"]
    windows = host.choose(Host("windows", "x64"))  # AMD and Intel GPUs are not seen there: the way to Vulkan is said
    assert windows.backend == "cpu" and windows.fix is not None and "--backend vulkan" in windows.fix


def test_vulkan_from_source_where_there_is_no_archive_but_an_sdk(tmp_path: Path) -> None:
    """Vulkan without an archive (Linux on another CPU) is built from source where glslc and the headers are,
    else the CPU build with the reason and the fix; with both, either way (the archive first)."""
    root = tmp_path / "root"
    card(root, "card0", "0x1002")
    bare = host.probe_host(root=root, which=which_of(), run=runner({}), env={}, system="linux", machine="riscv64")
    assert bare.gpus == (GPU("amd", "AMD GPU", None),) and not bare.vulkan_sdk
    choice = host.choose(bare)
    assert choice.backend == "cpu" and "no Vulkan archive for Linux riscv64" in choice.reason
    assert choice.fix is not None and "glslc" in choice.fix and "--backend vulkan" in choice.fix
    headers = root / "usr" / "include" / "vulkan"
    headers.mkdir(parents=True)
    (headers / "vulkan.hpp").write_text("")
    with_sdk = host.probe_host(root=root, which=which_of("glslc"), run=runner({}), env={}, system="linux",
                               machine="riscv64")
    assert with_sdk.vulkan_sdk and host.choose(with_sdk) == Choice("vulkan", "source", "AMD GPU found")
    x64 = host.probe_host(root=root, which=which_of("glslc"), run=runner({}), env={}, system="linux",
                          machine="x86_64")
    assert host.choose(x64).method == "either"


# --- the probes ---------------------------------------------------------------------------------------------------


def test_drm_cards_skip_connectors_render_nodes_duplicates_and_other_vendors(tmp_path: Path) -> None:
    amd = card(tmp_path, "card1", "0x1002", product_name="AMD Radeon RX 7800 XT", mem_info_vram_total=str(16 * GIB))
    card(tmp_path, "card0", "0x8086")
    card(tmp_path, "card2", "0x1a03")  # ASPEED
    card(tmp_path, "card10", "0x10de")
    drm = tmp_path / "sys" / "class" / "drm"
    (drm / "card1-DP-1").mkdir()  # a connector
    (drm / "renderD128").mkdir()
    (drm / "renderD128" / "device").symlink_to(amd)
    (drm / "card3").mkdir()  # a second node of the same device (render-only duplicate)
    (drm / "card3" / "device").symlink_to(amd)
    (drm / "card4").mkdir()  # simpledrm/efifb: no PCI vendor
    assert host.drm_gpus(tmp_path) == [GPU("intel", "Intel GPU"), RX7800, GPU("nvidia", "NVIDIA GPU")]
    assert host.drm_gpus(tmp_path / "nothing") == []


def test_nvidia_smi_names_the_cards_and_their_memory(tmp_path: Path) -> None:
    card(tmp_path, "card0", "0x10de")
    card(tmp_path, "card1", "0x10de")
    card(tmp_path, "card2", "0x8086")
    smi = {"--query-gpu=name,memory.total": "NVIDIA GeForce RTX 3090, 24576\nNVIDIA GeForce RTX 3090, 24576\n"}
    machine = host.probe_host(root=tmp_path, which=which_of("nvidia-smi"), run=runner(smi), env={}, system="linux",
                              machine="x86_64")
    rtx3090 = GPU("nvidia", "NVIDIA GeForce RTX 3090", 24 * GIB)
    assert machine.gpus == (rtx3090, rtx3090, GPU("intel", "Intel GPU"))
    assert host.describe(host.choose(machine), machine).startswith(
        "llama-server: Vulkan (2x NVIDIA GeForce RTX 3090, 24 GiB each; Intel GPU) — NVIDIA GPU found, no CUDA")
    # nvidia-smi failing (driver not loaded): the cards from /sys, unnamed
    silent = host.probe_host(root=tmp_path, which=which_of("nvidia-smi"), run=runner({}), env={}, system="linux",
                             machine="x86_64")
    assert [g.name for g in silent.gpus] == ["NVIDIA GPU", "NVIDIA GPU", "Intel GPU"]
    # a container: no /sys cards, nvidia-smi answers
    boxed = host.probe_host(root=tmp_path / "empty", which=which_of("nvidia-smi"), run=runner(SMI_4090), env={},
                            system="linux", machine="x86_64")
    assert boxed.gpus == (RTX4090,)


def test_a_cuda_toolkit_is_found_off_path_too(tmp_path: Path) -> None:
    none = which_of()
    assert not host.find_nvcc(none, {}, tmp_path)
    assert host.find_nvcc(which_of("nvcc"), {}, tmp_path)
    (tmp_path / "toolkit" / "bin").mkdir(parents=True)
    (tmp_path / "toolkit" / "bin" / "nvcc").write_text("")
    assert host.find_nvcc(none, {"CUDA_HOME": str(tmp_path / "toolkit")}, tmp_path / "x")
    assert host.find_nvcc(none, {"CUDA_PATH": str(tmp_path / "toolkit")}, tmp_path / "x")
    (tmp_path / "usr" / "local" / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "local" / "cuda" / "bin" / "nvcc").write_text("")
    assert host.find_nvcc(none, {}, tmp_path)


def test_the_vulkan_sdk_needs_glslc_and_the_headers(tmp_path: Path) -> None:
    assert not host.find_vulkan_sdk(which_of("glslc"), {}, tmp_path)  # no headers
    sdk = tmp_path / "sdk"
    (sdk / "include" / "vulkan").mkdir(parents=True)
    (sdk / "include" / "vulkan" / "vulkan.hpp").write_text("")
    assert not host.find_vulkan_sdk(which_of(), {"VULKAN_SDK": str(sdk)}, tmp_path)  # no glslc
    (sdk / "bin").mkdir()
    (sdk / "bin" / "glslc").write_text("")
    assert host.find_vulkan_sdk(which_of(), {"VULKAN_SDK": str(sdk)}, tmp_path)


def test_this_machine_has_no_gpu_and_gets_cpu() -> None:
    """Here: /usr/local/bin/nvcc on PATH but no GPU, which is no reason for CUDA."""
    here = host.probe_host()
    if here.gpus:
        pytest.skip(f"this machine has a GPU: {here.gpus}")
    assert host.choose(here).backend == "cpu" and installed.resolve_backend("auto") == "cpu"


# --- several installs -----------------------------------------------------------------------------------------------


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    for var in ("GGUF_PROVIDER_LLAMA_SERVER", "LLAMA_SERVER_PATH"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"


def put(backend_name: str, when: float) -> Path:
    """A fake prebuilt install of ``backend_name`` (marker + an executable llama-server), installed at ``when``."""
    target = installed.prebuilt_dir(TAG, backend_name)
    target.mkdir(parents=True)
    server = target / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 1 (fake)'\n")
    server.chmod(0o755)
    (target / installed.MARKER).write_text(json.dumps({"origin": "prebuilt", "backend": backend_name, "tag": TAG,
                                                       "version": "1", "installed_at": when}))
    return server


def on(monkeypatch: pytest.MonkeyPatch, machine: Host) -> None:
    monkeypatch.setattr(host, "current_host", lambda: machine)


AMD_HOST = Host("linux", "x64", (RX7800,))
NVIDIA_NVCC = Host("linux", "x64", (RTX4090,), nvcc=True)
NO_GPU = Host("linux", "x64")


def test_a_gpu_build_wins_over_a_newer_cpu_build(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vulkan = put("vulkan", 100.0)
    cpu = put("cpu", 200.0)  # newer: before issue 36 it won (`installed("auto") or installed("cpu")`)
    on(monkeypatch, AMD_HOST)
    assert installed.resolve_backend("auto") == "vulkan"
    assert installed.any_installed().server == vulkan  # type: ignore[union-attr]
    assert discovery.locate() == (vulkan, "installed by gguf-provider server install")
    on(monkeypatch, NO_GPU)  # the same installs on a machine without a GPU: the CPU build
    assert installed.any_installed().server == cpu  # type: ignore[union-attr]


def test_the_best_backend_first_then_other_usable_gpus_then_cpu(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, NVIDIA_NVCC)
    assert host.preference(NVIDIA_NVCC) == ["cuda", "vulkan", "cpu", "metal"]
    cpu = put("cpu", 300.0)
    assert installed.any_installed().server == cpu  # type: ignore[union-attr]
    vulkan = put("vulkan", 100.0)
    assert installed.any_installed().server == vulkan  # type: ignore[union-attr]
    cuda = put("cuda", 50.0)
    assert installed.any_installed().server == cuda  # type: ignore[union-attr]
    assert host.preference(NO_GPU) == ["cpu", "cuda", "metal", "vulkan"]
    assert host.preference(Host("darwin", "arm64", (GPU("apple", "Apple M2 GPU"),))) == ["metal", "cpu", "cuda",
                                                                                          "vulkan"]


def test_only_a_gpu_build_for_a_missing_gpu_is_still_used(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, NO_GPU)
    cuda = put("cuda", 1.0)
    assert installed.any_installed().server == cuda  # type: ignore[union-attr]


# --- the one line, once, and the warning ----------------------------------------------------------------------------


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(backend, "_ANNOUNCED", set())
    return []


def test_a_cpu_build_on_a_gpu_machine_is_warned_about_once(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                           fresh: list[str]) -> None:
    cpu = put("cpu", 1.0)
    on(monkeypatch, AMD_HOST)
    with pytest.warns(BackendWarning) as caught:
        backend.announce_once(cpu, say=fresh.append)
    assert fresh == ["llama-server: CPU — a CPU build; AMD Radeon RX 7800 XT, 16 GiB unused (AMD GPU found); "
                     "`gguf-provider server install` installs the Vulkan build"]
    assert [str(w.message) for w in caught] == fresh
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.announce_once(cpu, say=fresh.append)  # once per process and binary
    assert len(fresh) == 1
    assert backend.in_use(cpu).why == "cpu build: a CPU build, AMD Radeon RX 7800 XT, 16 GiB unused"


def test_the_chosen_build_is_said_without_a_warning(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                    fresh: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    vulkan, cpu = put("vulkan", 1.0), put("cpu", 2.0)
    on(monkeypatch, AMD_HOST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.announce_once(vulkan)
        assert capsys.readouterr().err == ("gguf-provider: llama-server: Vulkan (AMD Radeon RX 7800 XT, 16 GiB) — "
                                           "AMD GPU found\n")
        assert backend.in_use(vulkan).why == "vulkan build chosen: AMD GPU found"
        on(monkeypatch, NO_GPU)
        backend.announce_once(cpu, say=fresh.append)  # no GPU: the CPU build is right, and said so
    assert fresh == ["llama-server: CPU — no GPU found"] and backend.in_use(cpu).why == "cpu build: no GPU found"


def test_other_builds_are_said_for_what_they_are(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fresh: list[str], tmp_path: Path) -> None:
    vulkan, cuda = put("vulkan", 1.0), put("cuda", 2.0)
    on(monkeypatch, NVIDIA_NVCC)
    assert backend.in_use(vulkan).why.startswith("vulkan build: the cuda build fits this machine better")
    assert backend.in_use(vulkan).warning is None
    on(monkeypatch, AMD_HOST)  # a CUDA build on an AMD machine computes on the CPU
    verdict = backend.in_use(cuda)
    assert verdict.warning is not None and "a CUDA build and no GPU here runs it" in verdict.warning
    own = tmp_path / "own" / "llama-server"
    own.parent.mkdir()
    own.write_text("")
    backend.announce_once(own, say=fresh.append)
    assert fresh == [f"llama-server: {own} (not installed by gguf-provider: its backends are the ones it was built "
                     "with)"]


def test_server_path_prints_the_bare_path_and_why_on_stderr(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    vulkan = put("vulkan", 1.0)
    put("cpu", 2.0)
    on(monkeypatch, AMD_HOST)
    assert cli.main(["server", "path"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{vulkan}\n" and err == "gguf-provider: vulkan build chosen: AMD GPU found\n"


# --- the install says it, and falls back loudly --------------------------------------------------------------------


def test_a_failed_vulkan_archive_falls_back_to_cpu_loudly(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, AMD_HOST)  # no glslc here: the Vulkan archive is the only way to Vulkan
    tried: list[str] = []

    def fake_prebuilt(backend_name: str, tag: str, **k: object) -> installed.Installation:
        tried.append(backend_name)
        if backend_name == "vulkan":
            raise PrebuiltInstallError("llama-server --version failed: exit code 127: libvulkan.so.1: cannot open "
                                       "shared object file", "smoke")
        return installed.Installation("cpu", put("cpu", 1.0).parent, "1", "prebuilt", fresh=True)

    monkeypatch.setattr(install, "install_prebuilt", fake_prebuilt)
    lines: list[str] = []
    with pytest.warns(BackendWarning, match=r"--backend vulkan --force"):
        inst = install.install(notify=lines.append, build_source=lambda *a, **k: pytest.fail("no Vulkan build"))
    assert inst.backend == "cpu" and tried == ["vulkan", "cpu"]
    assert lines == [f"the Vulkan archive of llama.cpp {TAG} could not be used (smoke: llama-server --version "
                     "failed: exit code 127: libvulkan.so.1: cannot open shared object file) and this machine cannot "
                     "build one from source: the CPU build instead"]
    # asked for explicitly, or with --from prebuilt: no CPU instead of what was asked
    with pytest.raises(PrebuiltInstallError, match="libvulkan"):
        install.install("vulkan", build_source=lambda *a, **k: pytest.fail("no Vulkan build without glslc"))
    with pytest.raises(PrebuiltInstallError, match="libvulkan"):
        install.install(method="prebuilt")


def test_server_install_and_the_first_use_install_say_the_line(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                               fresh: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    on(monkeypatch, AMD_HOST)

    def fake_prebuilt(backend_name: str, tag: str, **k: object) -> installed.Installation:
        return installed.Installation(backend_name, put(backend_name, 1.0).parent, "1", "prebuilt", fresh=True)

    monkeypatch.setattr(install, "install_prebuilt", fake_prebuilt)
    assert cli.main(["server", "install"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"llama-server installed: {installed.prebuilt_dir(TAG, 'vulkan') / 'llama-server'} (")
    assert out[1:] == ["llama-server: Vulkan (AMD Radeon RX 7800 XT, 16 GiB) — AMD GPU found"]
    assert cli.main(["server", "install", "--backend", "cpu"]) == 0  # asked for: said, with what it leaves unused
    assert capsys.readouterr().out.splitlines()[1] == (
        "llama-server: CPU — a CPU build; AMD Radeon RX 7800 XT, 16 GiB unused (AMD GPU found); `gguf-provider "
        "server install` installs the Vulkan build")
    # the first model start that installs says it once on stderr; the manager's own announce_once adds nothing
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(home / "second"))
    monkeypatch.setenv("GGUF_PROVIDER_AUTO_INSTALL", "1")
    server = install.ensure_installed()
    backend.announce_once(server)
    err = capsys.readouterr().err
    assert err.count("llama-server: Vulkan (AMD Radeon RX 7800 XT, 16 GiB) — AMD GPU found") == 1


def test_a_named_backend_is_used_until_server_install_names_none(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`server install --backend vulkan` on a machine whose own choice is the CPU (a GPU it does not detect, such as
    an AMD card on Windows, or lavapipe): the Vulkan build is used afterwards, not the existing CPU build;
    `server install` without --backend goes back to the machine's choice."""
    on(monkeypatch, NO_GPU)
    cpu = put("cpu", 200.0)

    def fake_prebuilt(backend_name: str, tag: str, **k: object) -> installed.Installation:
        return installed.Installation(backend_name, put(backend_name, 100.0).parent, "1", "prebuilt", fresh=True)

    monkeypatch.setattr(install, "install_prebuilt", fake_prebuilt)
    assert cli.main(["server", "install", "--backend", "vulkan"]) == 0
    vulkan = installed.installed("vulkan").server  # type: ignore[union-attr]
    assert installed.named_backend() == "vulkan"
    assert discovery.locate() == (vulkan, "installed by gguf-provider server install")
    assert cli.main(["server", "install", "--backend", "cpu"]) == 0  # already there: named all the same
    assert discovery.locate() == (cpu, "installed by gguf-provider server install")
    assert cli.main(["server", "install", "--backend", "vulkan"]) == 0
    assert discovery.locate() == (vulkan, "installed by gguf-provider server install")
    assert cli.main(["server", "install"]) == 0  # none named: the machine's own choice again
    assert installed.named_backend() is None
    assert discovery.locate() == (cpu, "installed by gguf-provider server install")
    capsys.readouterr()
