"""Devices as llama-server sees them: the GPU-like devices a binary lists (``--list-devices``), with free and total
memory, then the host's RAM.

``llama-server --list-devices`` prints, for every backend the build carries (CUDA, ROCm/HIP, Vulkan, Metal, SYCL,
RPC workers, ...), one line per device after an ``Available devices:`` header (llama.cpp common/arg.cpp)::

    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23665 MiB free)

The CPU is not listed; a CPU-only build prints ``  (none)``. Backend banners ("ggml_cuda_init: ...",
"load_backend: ...") may come before or between the lines and are ignored. The binary runs with the user's
environment, so ``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` and ``GGML_VK_VISIBLE_DEVICES`` are applied by
the GPU runtimes themselves. ``nvidia-smi`` is only the fallback when there is no binary or it cannot list
(:func:`nvidia_smi_devices` applies ``CUDA_VISIBLE_DEVICES`` itself).

Apple silicon shares one memory between CPU and GPU: the Metal device is ``unified`` and
:func:`machine_devices` takes its memory out of the CPU entry, so nothing is counted twice. (Integrated GPUs on
other backends, e.g. a Vulkan iGPU or an AMD APU, share memory too, but ``--list-devices`` does not say so; they
are counted as separate memory.)
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil

from .._common import process
from .._install import discovery
from . import fit

log = logging.getLogger(__name__)

VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES")
LIST_TIMEOUT = 30.0

# llama.cpp's name prefix -> our kind, where the kind is not simply the lower-cased prefix
_KIND_OF_PREFIX = {"mtl": "metal", "hip": "rocm"}
# our kind -> llama.cpp's name prefix (for devices the user names: parse_device_arg / number_devices)
_PREFIX_OF_KIND = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "MTL", "sycl": "SYCL", "rpc": "RPC",
                   "cpu": "CPU"}
_KIND_ALIASES = {"hip": "rocm", "mtl": "metal", "vk": "vulkan", "ram": "cpu"}

# "  NAME: DESCRIPTION (TOTAL MiB, FREE MiB free)"; the description may hold parentheses and colons, the name
# none (an old RPC name is "RPC[host:port]").
_LINE = re.compile(r"^\s+(?P<name>[^\s:\[]+(?:\[[^\]]*\])?):\s(?P<desc>.*?)\s*"
                   r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
_HEADER = "Available devices:"


@dataclass(frozen=True)
class Device:
    """One place a model's layers can go: a GPU-like device llama.cpp lists, or ``CPU`` for the host's RAM."""

    name: str  # llama.cpp's name: "CUDA0", "Vulkan1", "MTL0", "RPC0", or "CPU" for host RAM
    kind: str  # "cuda" | "rocm" | "vulkan" | "metal" | "sycl" | "rpc" | "cpu" | another backend's lower-cased prefix
    description: str  # "NVIDIA GeForce RTX 4090", "127.0.0.1:50052", "host RAM"
    total: int  # bytes
    free: int  # bytes
    unified: bool = False  # memory shared with the host (Apple silicon's Metal device)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def kind_of(name: str) -> str:
    """Our kind for a llama.cpp device name: ``CUDA0`` → cuda, ``MTL0`` → metal, ``HIP0`` → rocm."""
    m = re.match(r"[A-Za-z]+", name)
    prefix = m[0].lower() if m else name.lower()
    return _KIND_OF_PREFIX.get(prefix, prefix)


def _is_macos() -> bool:
    return sys.platform == "darwin"


def parse_list_devices(text: str) -> list[Device]:
    """The devices ``--list-devices`` printed, in order (the CPU is never among them).

    Lines after the last ``Available devices:`` header are read (the whole text when there is none); anything not
    shaped like a device line is skipped. MiB become bytes. A Metal device on macOS is ``unified``. Accelerator
    entries (e.g. ``BLAS: Accelerate (0 MiB, 0 MiB free)``) are kept as printed: :func:`machine_devices` drops
    what has no memory.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == _HEADER]
    if starts:
        lines = lines[starts[-1] + 1:]
    devices = []
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        kind = kind_of(m["name"])
        devices.append(Device(name=m["name"], kind=kind, description=m["desc"], total=int(m["total"]) * fit.MiB,
                              free=int(m["free"]) * fit.MiB, unified=kind == "metal" and _is_macos()))
    return devices


_cache: dict[tuple[object, ...], list[Device] | None] = {}
_cache_lock = threading.Lock()


def clear_cache() -> None:
    """Forget the listings :func:`list_devices` cached (e.g. to read free memory again)."""
    with _cache_lock:
        _cache.clear()


def _listed(binary: Path, rpc: tuple[str, ...], timeout: float) -> list[Device] | None:
    """The binary's devices, or None when it could not list them; cached per process (see list_devices)."""
    env = process.clean_env()  # the environment a server gets, GGML_NO_BACKTRACE included
    try:
        st = binary.stat()
        key: tuple[object, ...] = (str(binary.resolve()), st.st_mtime_ns, rpc,
                                   *(env.get(name) for name in VISIBILITY_ENV))
    except OSError as exc:
        log.debug("cannot list devices of %s: %s", binary, exc)
        return None
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    argv = [*discovery.command(binary), *(["--rpc", ",".join(rpc)] if rpc else []), "--list-devices"]
    found: list[Device] | None = None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                             stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.SubprocessError) as exc:  # not executable, or still running after `timeout`
        log.debug("%s failed: %s", " ".join(argv), exc)
    else:
        text = out.stdout if _HEADER in out.stdout else out.stderr
        if out.returncode != 0 or _HEADER not in text:
            log.debug("%s exited with %s and no device list: %s", " ".join(argv), out.returncode,
                      (out.stderr or out.stdout)[-500:])
        else:
            found = parse_list_devices(text)
    if found is not None or not rpc:  # a worker that is down now may be up later: that failure is not kept
        with _cache_lock:
            _cache[key] = found
    return found


def list_devices(binary: Path, *, rpc: Sequence[str] = (), timeout: float = LIST_TIMEOUT) -> list[Device]:
    """The devices ``binary [--rpc a,b] --list-devices`` prints, run with our environment (so the
    ``*_VISIBLE_DEVICES`` variables apply).

    A binary that cannot be run, exits non-zero (llama-server aborts when an RPC worker is unreachable), prints no
    device list or runs past ``timeout`` seconds gives ``[]`` and a debug log line: the caller falls back
    (:func:`machine_devices` to nvidia-smi). The answer is cached for the process per binary (path and mtime),
    RPC list and the three visibility variables, so free memory is as of the first call (:func:`clear_cache`);
    failures with RPC workers are not cached.
    """
    return list(_listed(binary, tuple(rpc), timeout) or [])


def nvidia_smi_devices() -> list[Device]:
    """NVIDIA GPUs from nvidia-smi as a CUDA build would name them (``CUDA0``, ...), ``CUDA_VISIBLE_DEVICES``
    applied (indices or ``GPU-`` UUIDs; empty = none; see :func:`~gguf_provider.runtime._memory.fit.cuda_visible`);
    ``[]`` without nvidia-smi."""
    return [Device(name=f"CUDA{i}", kind="cuda", description=g.name, total=g.total, free=g.free)
            for i, g in enumerate(fit.nvidia_gpus())]


def host_device() -> Device:
    """``CPU``: the RAM available now (psutil, capped by the cgroup limit) out of the machine's total RAM."""
    total = psutil.virtual_memory().total
    return Device(name="CPU", kind="cpu", description="host RAM", total=total, free=min(fit.ram_available(), total))


def machine_devices(binary: Path | None, *, rpc: Sequence[str] = ()) -> list[Device]:
    """What a server started from ``binary`` (with ``rpc`` workers) can use: its GPU-like devices, then the host's
    RAM as ``CPU``, last.

    The devices come from :func:`list_devices`; when ``binary`` is None or cannot list them, from nvidia-smi. When
    listing with ``rpc`` fails (a worker is down), the binary is asked again without them, so the local GPUs are
    still seen. Entries with no memory (``BLAS``, other accelerators) are left out: they hold no layers; free is
    capped at total (a CUDA build that mistakes a card for unified memory reports the host's free RAM,
    llama.cpp issue #17536). A binary
    that lists nothing (a CPU build) gives the CPU alone, even on a machine with a GPU: that build cannot use it.
    Unified memory (Apple's Metal device) is counted once: the CPU entry's free and total are reduced by the
    unified devices'.
    """
    gpus: list[Device] | None = None
    if binary is not None:
        gpus = _listed(binary, tuple(rpc), LIST_TIMEOUT)
        if gpus is None and rpc:
            gpus = _listed(binary, (), LIST_TIMEOUT)
    if gpus is None:
        gpus = nvidia_smi_devices()
    gpus = [replace(d, free=min(d.free, d.total)) for d in gpus if d.total > 0]
    host = host_device()
    shared_total = sum(d.total for d in gpus if d.unified)
    shared_free = sum(d.free for d in gpus if d.unified)
    if shared_total or shared_free:
        host = replace(host, total=max(host.total - shared_total, 0), free=max(host.free - shared_free, 0))
    return apply_limits([*gpus, host])


LIMIT_ENV = "GGUF_PROVIDER_DEVICE_LIMIT"


def device_limits(text: str | None = None) -> dict[str, int]:
    """``$GGUF_PROVIDER_DEVICE_LIMIT`` (``CUDA0=6GiB,CPU=16GiB``): the most of each device a plan may fill, by
    llama.cpp's device name (case-insensitive). ValueError names a malformed entry."""
    raw = os.environ.get(LIMIT_ENV, "") if text is None else text
    limits: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, size = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"${LIMIT_ENV}: {part!r} is not NAME=SIZE (e.g. CUDA0=6GiB,CPU=16GiB)")
        try:
            limits[name.strip().upper()] = fit.parse_size(size)
        except ValueError as exc:
            raise ValueError(f"${LIMIT_ENV}: {exc}") from None
    return limits


def apply_limits(devices: Sequence[Device], limits: dict[str, int] | None = None) -> list[Device]:
    """``devices`` with each one named in :func:`device_limits` capped at its limit (a GPU shared with other
    work, a desktop that must keep some VRAM)."""
    caps = device_limits() if limits is None else limits
    return [replace(d, total=min(d.total, caps[d.name.upper()]), free=min(d.free, caps[d.name.upper()]))
            if d.name.upper() in caps else d for d in devices]


def parse_device_arg(text: str) -> Device:
    """A device the user names as ``KIND:MEMORY`` (``cuda:8GiB``, ``vulkan:2GiB``, ``metal:24GiB``,
    ``cpu:64GiB``; the size as :func:`~gguf_provider.runtime._memory.fit.parse_size` reads it), free = total = MEMORY.

    Its name is the kind's llama.cpp prefix, unnumbered (``CUDA``; ``CPU`` for RAM): :func:`number_devices`
    numbers a list of them. A ``metal`` device is unified (Apple silicon). ValueError says what to write.
    """
    kinds = ", ".join(_PREFIX_OF_KIND)
    kind_text, sep, size_text = text.partition(":")
    if not sep or not size_text.strip():
        raise ValueError(f"a device is KIND:MEMORY (e.g. cuda:8GiB, vulkan:2GiB, cpu:32GiB), not {text!r}; "
                         f"kinds: {kinds}")
    kind = kind_text.strip().lower()
    kind = _KIND_ALIASES.get(kind, kind)
    if kind not in _PREFIX_OF_KIND:
        raise ValueError(f"unknown device kind {kind_text.strip()!r} in {text!r}; kinds: {kinds} "
                         "(e.g. cuda:8GiB)")
    try:
        size = fit.parse_size(size_text)
    except ValueError as exc:
        raise ValueError(f"device {text!r}: {exc}") from None
    if size <= 0:
        raise ValueError(f"device {text!r} has no memory; give its size, e.g. {kind}:8GiB")
    return Device(name=_PREFIX_OF_KIND[kind], kind=kind, description=f"as given: {text.strip()}", total=size,
                  free=size, unified=kind == "metal")


def number_devices(devices: Sequence[Device]) -> list[Device]:
    """Name devices as llama.cpp would: per kind, in order (``CUDA0``, ``CUDA1``, ``Vulkan0``), the CPU entry as
    ``CPU`` and last. ValueError when RAM is given twice."""
    cpus = [d for d in devices if d.kind == "cpu"]
    if len(cpus) > 1:
        raise ValueError("give the host RAM once (one cpu:MEMORY)")
    counts: dict[str, int] = {}
    named = []
    for d in devices:
        if d.kind == "cpu":
            continue
        n = counts.get(d.kind, 0)
        counts[d.kind] = n + 1
        named.append(replace(d, name=f"{_PREFIX_OF_KIND.get(d.kind, d.kind.upper())}{n}"))
    return named + [replace(c, name="CPU") for c in cpus]
