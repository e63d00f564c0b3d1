"""This machine's GPUs and toolchains, and the llama.cpp backend that fits them (docs/install.md#which-backend).

The rules (:func:`choose`): an NVIDIA GPU with a CUDA toolkit → CUDA; an NVIDIA, AMD or Intel GPU without one →
Vulkan (llama.cpp's release archive, or a source build where glslc and the Vulkan headers are here); Apple silicon
→ Metal; no GPU → CPU. Every probe is injectable (a root for ``/sys`` and ``/usr``, a ``which``, a command runner,
the environment), so tests build fake hosts without touching this one. :mod:`.backend` says the choice in one
line; :mod:`.installed` resolves ``backend="auto"`` with it. This module imports nothing else of the runtime.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# PCI vendor ids in /sys/class/drm/card*/device/vendor; other vendors (server BMCs such as ASPEED, virtual
# displays) are no GPU llama.cpp can use.
PCI_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel", "apple": "Apple"}
BACKEND_NAMES = {"cpu": "CPU", "cuda": "CUDA", "vulkan": "Vulkan", "metal": "Metal"}

# (system, arch, backend) → the asset name after "llama-<tag>-bin-", as llama.cpp's release.yml names them. Here,
# below the installer, because the choice depends on what is published; prebuilt._ASSETS is this table.
ASSETS: dict[tuple[str, str, str], str] = {
    ("linux", "x64", "cpu"): "ubuntu-x64.tar.gz",
    ("linux", "arm64", "cpu"): "ubuntu-arm64.tar.gz",
    ("linux", "s390x", "cpu"): "ubuntu-s390x.tar.gz",
    ("linux", "x64", "vulkan"): "ubuntu-vulkan-x64.tar.gz",
    ("linux", "arm64", "vulkan"): "ubuntu-vulkan-arm64.tar.gz",
    ("darwin", "arm64", "metal"): "macos-arm64.tar.gz",
    ("darwin", "arm64", "cpu"): "macos-arm64.tar.gz",
    ("darwin", "x64", "cpu"): "macos-x64.tar.gz",  # upstream builds it with Metal off
    ("windows", "x64", "cpu"): "win-cpu-x64.zip",
    ("windows", "arm64", "cpu"): "win-cpu-arm64.zip",
    ("windows", "x64", "vulkan"): "win-vulkan-x64.zip",
    ("windows", "x64", "cuda"): "win-cuda-{cuda}-x64.zip",  # several CUDA versions; plus a cudart zip
}

Which = Callable[[str], "str | None"]
Runner = Callable[[Sequence[str]], "str | None"]  # a command's stdout, or None when it cannot run or fails


def system_name(sys_platform: str) -> str:
    """``sys.platform`` as llama.cpp's archives name systems: "linux", "darwin", "windows" (else unchanged)."""
    if sys_platform.startswith("linux"):
        return "linux"
    return {"darwin": "darwin", "win32": "windows", "cygwin": "windows"}.get(sys_platform, sys_platform)


def arch_name(machine: str) -> str:
    """``platform.machine()`` as llama.cpp's archives name CPUs: "x64", "arm64" (else lower-cased)."""
    machine = machine.lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _size(n: int) -> str:
    return f"{n / 2**30:.0f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class GPU:
    vendor: str  # "nvidia" | "amd" | "intel" | "apple"
    name: str  # "NVIDIA GeForce RTX 4090"; "AMD GPU" where the driver names none
    memory: int | None = None  # bytes of VRAM (Apple: the unified memory), None when unknown

    def describe(self) -> str:
        return f"{self.name}, {_size(self.memory)}" if self.memory else self.name


@dataclass(frozen=True)
class Host:
    system: str  # "linux" | "darwin" | "windows" | another sys.platform
    machine: str  # "x64" | "arm64" | ... (arch_name of platform.machine())
    gpus: tuple[GPU, ...] = ()
    nvcc: bool = False  # a CUDA toolkit: nvcc on PATH, under $CUDA_HOME/$CUDA_PATH or /usr/local/cuda
    vulkan_sdk: bool = False  # glslc and the Vulkan C++ headers: what a -DGGML_VULKAN=ON build needs

    @property
    def vendors(self) -> set[str]:
        return {g.vendor for g in self.gpus}

    def describe(self) -> str:
        name = {"linux": "Linux", "darwin": "macOS", "windows": "Windows"}.get(self.system, self.system)
        return f"{name} {self.machine}"

    def to_json(self) -> dict[str, object]:
        return {"system": self.system, "machine": self.machine, "nvcc": self.nvcc, "vulkan_sdk": self.vulkan_sdk,
                "gpus": [{"vendor": g.vendor, "name": g.name, "memory": g.memory} for g in self.gpus]}


def has_archive(host: Host, backend: str) -> bool:
    """Whether llama.cpp publishes a release archive for ``backend`` on this system and CPU."""
    return (host.system, host.machine, backend) in ASSETS


# --- probing ---------------------------------------------------------------------------------------------------


def _run(cmd: Sequence[str]) -> str | None:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=10, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def drm_gpus(root: Path = Path("/")) -> list[GPU]:
    """GPUs from ``/sys/class/drm/card<N>/device`` (Linux): NVIDIA, AMD and Intel by PCI vendor id. Connector
    entries (``card0-DP-1``), render nodes and a second card of the same device are skipped; names from the
    driver's ``product_name`` where it has one (amdgpu on some cards), VRAM from amdgpu's ``mem_info_vram_total``."""
    found: dict[str, GPU] = {}
    drm = root / "sys" / "class" / "drm"
    try:
        cards = sorted((c for c in drm.iterdir() if re.fullmatch(r"card\d+", c.name)),
                       key=lambda c: int(c.name[4:]))
    except OSError:
        return []
    for card in cards:
        device = card / "device"
        vendor = PCI_VENDORS.get((_read(device / "vendor") or "").lower())
        if vendor is None:
            continue
        try:
            key = str(device.resolve())
        except OSError:
            key = str(device)
        if key in found:
            continue
        vram = _read(device / "mem_info_vram_total")
        found[key] = GPU(vendor, _read(device / "product_name") or f"{VENDOR_NAMES[vendor]} GPU",
                         int(vram) if vram and vram.isdigit() and int(vram) > 0 else None)
    return list(found.values())


def nvidia_smi_gpus(which: Which = shutil.which, run: Runner = _run) -> list[GPU]:
    """NVIDIA GPUs with name and total memory from ``nvidia-smi`` (all of them: the choice of backend ignores
    ``CUDA_VISIBLE_DEVICES``; the devices llama-server sees honour it)."""
    smi = which("nvidia-smi")
    if not smi:
        return []
    out = run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    gpus = []
    for line in (out or "").splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip():
            mem = mib.strip()
            gpus.append(GPU("nvidia", name.strip(), int(mem) << 20 if mem.isdigit() else None))
    return gpus


def apple_gpu(run: Runner = _run) -> GPU:
    """Apple silicon's GPU: the chip's name and the unified memory it shares with the CPU."""
    brand = (run(["sysctl", "-n", "machdep.cpu.brand_string"]) or "").strip()
    mem = (run(["sysctl", "-n", "hw.memsize"]) or "").strip()
    return GPU("apple", f"{brand} GPU" if brand.startswith("Apple") else "Apple GPU",
               int(mem) if mem.isdigit() else None)


def find_nvcc(which: Which = shutil.which, env: Mapping[str, str] | None = None, root: Path = Path("/")) -> bool:
    """A CUDA toolkit: ``nvcc`` on PATH, under ``$CUDA_HOME``/``$CUDA_PATH``, or in /usr/local/cuda (where CMake
    finds it without PATH)."""
    env = os.environ if env is None else env
    if which("nvcc"):
        return True
    homes = [Path(env[v]) for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)] + [root / "usr" / "local" / "cuda"]
    return any((h / "bin" / n).is_file() for h in homes for n in ("nvcc", "nvcc.exe"))


def find_vulkan_sdk(which: Which = shutil.which, env: Mapping[str, str] | None = None,
                    root: Path = Path("/")) -> bool:
    """What a ``-DGGML_VULKAN=ON`` source build needs: the ``glslc`` shader compiler and the Vulkan C++ headers
    (``vulkan/vulkan.hpp``; Debian: glslc and libvulkan-dev), system-wide or under ``$VULKAN_SDK``."""
    env = os.environ if env is None else env
    sdk = Path(env["VULKAN_SDK"]) if env.get("VULKAN_SDK") else None
    glslc = bool(which("glslc")) or (sdk is not None and any((sdk / "bin" / n).is_file()
                                                             for n in ("glslc", "glslc.exe")))
    includes = [root / "usr" / "include", root / "usr" / "local" / "include"] + ([sdk / "include"] if sdk else [])
    return glslc and any((d / "vulkan" / "vulkan.hpp").is_file() for d in includes)


def probe_host(*, root: Path = Path("/"), which: Which = shutil.which, run: Runner = _run,
               env: Mapping[str, str] | None = None, system: str | None = None,
               machine: str | None = None) -> Host:
    """This machine (or, with the arguments, a fake one): its system and CPU, its GPUs, and the toolchains a
    GPU source build needs. Linux: ``/sys/class/drm`` plus ``nvidia-smi`` (which names NVIDIA cards and sees
    them in containers without /sys); Windows: ``nvidia-smi`` only (AMD and Intel GPUs are not detected there);
    macOS on Apple silicon: its GPU."""
    system = system or system_name(sys.platform)
    machine = arch_name(machine or platform.machine())
    gpus: list[GPU] = []
    if system == "darwin":
        if machine == "arm64":
            gpus.append(apple_gpu(run))
    else:
        drm = drm_gpus(root) if system == "linux" else []
        smi = nvidia_smi_gpus(which, run)
        # nvidia-smi names NVIDIA cards and knows their memory: its list replaces /sys's unnamed ones.
        gpus = (smi + [g for g in drm if g.vendor != "nvidia"]) if smi else drm
    return Host(system, machine, tuple(gpus), find_nvcc(which, env, root), find_vulkan_sdk(which, env, root))


@functools.cache
def current_host() -> Host:
    """:func:`probe_host` of this machine, probed once per process."""
    return probe_host()


# --- the choice --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    backend: str  # "cpu" | "cuda" | "vulkan" | "metal"
    # "either": llama.cpp's release archive, else the source build (install's order); "prebuilt": only the
    # archive (no toolchain here to build this backend); "source": only the build (no archive published).
    method: str
    reason: str  # why, in a few words: "NVIDIA GPU found, no CUDA toolkit"
    fix: str | None = None  # what gets a better backend, when something would


def methods(host: Host, backend: str) -> str:
    """How ``backend`` can be installed on ``host``: "either", "prebuilt" or "source" (see :class:`Choice`)."""
    archive = has_archive(host, backend)
    source = {"cuda": host.nvcc, "vulkan": host.vulkan_sdk, "metal": host.system == "darwin"}.get(backend, True)
    return "either" if archive and source else "prebuilt" if archive else "source"


def _gpu_words(host: Host, vendors: Sequence[str]) -> str:
    names = [VENDOR_NAMES[v] for v in ("nvidia", "amd", "intel", "apple") if v in vendors]
    return f"{' and '.join(names)} GPU" if names else "GPU"


def choose(host: Host) -> Choice:
    """The backend for ``host``, how it is installed, why, and what would get a better one (issue 36, point 1)."""
    vendors = host.vendors
    if host.system == "darwin":
        if host.machine == "arm64":
            return Choice("metal", methods(host, "metal"), "Apple silicon")
        return Choice("cpu", methods(host, "cpu"), "Intel Mac: llama.cpp's macOS x64 archive is built without Metal",
                      "`gguf-provider server install --backend metal --from source` builds one with Metal")
    if not host.gpus:
        fix = ("`gguf-provider server install --backend vulkan` for an AMD or Intel GPU (only NVIDIA GPUs are "
               "detected on Windows)" if host.system == "windows" else None)
        return Choice("cpu", methods(host, "cpu"), "no GPU found", fix)
    if "nvidia" in vendors and host.nvcc:
        reason = "NVIDIA GPU and CUDA toolkit found"
        if not has_archive(host, "cuda"):
            reason += f"; llama.cpp publishes no CUDA archive for {host.describe()}, so it is built from source"
        return Choice("cuda", methods(host, "cuda"), reason)
    if "nvidia" in vendors:
        reason = "NVIDIA GPU found, no CUDA toolkit"
        fix = ("`gguf-provider server install --backend cuda` for llama.cpp's CUDA archive (it brings its own "
               "runtime)" if has_archive(host, "cuda") else
               "`gguf-provider server install --backend cuda` after installing one")
    else:
        reason, fix = f"{_gpu_words(host, sorted(vendors))} found", None
    how = methods(host, "vulkan")
    if how != "source" or host.vulkan_sdk:
        return Choice("vulkan", how, reason, fix)
    return Choice("cpu", methods(host, "cpu"),
                  f"{_gpu_words(host, sorted(vendors))} found, but llama.cpp publishes no Vulkan archive for "
                  f"{host.describe()} and glslc or the Vulkan headers are missing for a source build",
                  "install glslc and the Vulkan headers (Debian: glslc, libvulkan-dev), then `gguf-provider server "
                  "install --backend vulkan`")


def usable(host: Host, backend: str) -> bool:
    """Whether a build of ``backend`` can use a GPU of ``host`` (cpu: always usable, on the CPU)."""
    return {"cpu": True, "cuda": "nvidia" in host.vendors, "metal": "apple" in host.vendors,
            "vulkan": bool(host.vendors - {"apple"})}.get(backend, False)


def preference(host: Host) -> list[str]:
    """The backends in the order an install of each is preferred on ``host``: :func:`choose`'s first, then the
    other builds that can use a GPU here, then cpu, then builds for GPUs this machine does not have."""
    best = choose(host).backend
    order = [best] + [b for b in ("cuda", "metal", "vulkan") if b != best and usable(host, b)]
    order += [b for b in ("cpu", "cuda", "metal", "vulkan") if b not in order]
    return order


def gpus_for(host: Host, backend: str) -> list[GPU]:
    """The GPUs of ``host`` that a ``backend`` build runs on."""
    keep = {"cuda": {"nvidia"}, "metal": {"apple"}, "vulkan": {"nvidia", "amd", "intel"}}.get(backend, set())
    return [g for g in host.gpus if g.vendor in keep]


def gpu_list(gpus: Sequence[GPU]) -> str:
    """"NVIDIA GeForce RTX 3090, 24 GiB" or "2x NVIDIA GeForce RTX 3090, 24 GiB each" or several, joined by "; "."""
    counts: dict[GPU, int] = {}
    for g in gpus:
        counts[g] = counts.get(g, 0) + 1
    return "; ".join(g.describe() if n == 1 else f"{n}x {g.describe()}" + (" each" if g.memory else "")
                     for g, n in counts.items())


def describe(choice: Choice, host: Host) -> str:
    """The one line: "llama-server: Vulkan (AMD Radeon RX 7800 XT, 16 GiB) — AMD GPU found", with "; " and the
    fix when there is one."""
    name = BACKEND_NAMES.get(choice.backend, choice.backend)
    gpus = gpu_list(gpus_for(host, choice.backend))
    line = f"llama-server: {name}" + (f" ({gpus})" if gpus else "") + f" — {choice.reason}"
    return line + (f"; {choice.fix}" if choice.fix else "")
