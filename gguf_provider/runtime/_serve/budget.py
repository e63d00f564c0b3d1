"""The memory all our servers share: a budget across processes, and who gives memory back when a new server needs it.

Before a server starts (under one machine-wide admission lock, so racing processes decide one at a time), the
manager asks :func:`admit`: idle servers (no live lease) are stopped least recently used first until the new one
fits the count limit (``$GGUF_PROVIDER_MAX_MODELS``) and the memory budget; a server that a live process holds is
never stopped. The budget is ``$GGUF_PROVIDER_MEMORY_LIMIT`` when set (our servers' charges must stay under it),
else the free RAM/VRAM the fit reads, with idle servers counted as reclaimable. What does not fit then gets a
smaller automatic context (down to :data:`BUDGET_MIN_CONTEXT`, with a warning) or an
:class:`InsufficientMemoryError` that names every server holding memory and how to free it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import filelock
import psutil

from ..._warn import warn
from ...errors import InsufficientMemoryError, MemoryBudgetWarning
from .._common import paths
from .._common.gguf import GGUFHeader
from .._install import installed
from .._memory import devices, fit, plan, rpc
from . import registry

LIMIT_ENV = "GGUF_PROVIDER_MEMORY_LIMIT"
MAX_MODELS_ENV = "GGUF_PROVIDER_MAX_MODELS"
BUDGET_MIN_CONTEXT = 2048
log = logging.getLogger(__name__)
"""The smallest automatic context the budget shrinks a model to (its native context if smaller); below it the
start is refused: a chat model squeezed to a few hundred tokens surprises more than a clear error."""
ADMISSION_TIMEOUT = 120.0


def memory_limit() -> int | None:
    raw = os.environ.get(LIMIT_ENV, "").strip()
    if not raw:
        return None
    try:
        return fit.parse_size(raw)
    except ValueError as exc:
        raise ValueError(f"${LIMIT_ENV}: {exc}") from None


def max_models() -> int | None:
    raw = os.environ.get(MAX_MODELS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${MAX_MODELS_ENV} must be a whole number of servers, 1 or more (got {raw!r})")
    return int(raw)


def admission_lock() -> filelock.FileLock:
    """Held while one server is admitted (evictions, fit, spawn, registration): one decision at a time."""
    d = paths.home() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(d / "admission.lock"), timeout=ADMISSION_TIMEOUT)


MiB = 1 << 20
LLAMA_CACHE_RAM = 8192 * MiB
"""llama-server's host-RAM prompt cache when no ``--cache-ram`` is given (common.h ``cache_ram_mib``): the bound of
what it may grow to, per server, and what an explicit ``--cache-ram -1`` (no limit) is charged."""
SERVER_OVERHEAD = 48 * MiB
"""What a llama-server process holds beside its buffers: code, heap, thread stacks, the prompt cache's bookkeeping.
Measured here (SmolLM2): resident memory 5 MiB over its buffers after the load, 6 MiB over buffers and a full prompt
cache after a dozen distinct long prompts (tests/integration_tests/test_memory_real.py)."""
PROMPT_RAM_CONTEXTS = 2
PROMPT_RAM_SHARE = 8


def prompt_ram(header: GGUFHeader, n_ctx: int, *, cache_type: str = fit.DEFAULT_CACHE_TYPE, pool: int) -> int:
    """The host-RAM prompt cache a chat server gets (``--cache-ram``), in whole MiB: its KV cache of
    :data:`PROMPT_RAM_CONTEXTS` full contexts (saved prompts are KV state: two contexts keep the last few long
    prompts, or many short ones, for a switch back), at most an eighth of ``pool`` (the budget's limit, else the
    machine's RAM) and at most llama.cpp's own bound. The budget charges it, so a server's memory adds up."""
    per = fit.cache_type_bytes(cache_type)
    kv = fit.kv_cache_bytes(header, n_ctx, type_k_bytes=per, type_v_bytes=per) + fit.recurrent_state_bytes(header)
    return min(PROMPT_RAM_CONTEXTS * kv, pool // PROMPT_RAM_SHARE, LLAMA_CACHE_RAM) // MiB * MiB


def ram_pool() -> int:
    """What :func:`prompt_ram` takes its share of: the memory limit, else the machine's RAM."""
    return memory_limit() or int(psutil.virtual_memory().total)


def charge(header: GGUFHeader, file_bytes: int, n_ctx: int, *, cache_type: str = fit.DEFAULT_CACHE_TYPE,
           draft: GGUFHeader | None = None) -> int:
    """What a server is charged: its files (weights, mmproj, draft model) and, for the model and its draft, the KV
    cache at ``n_ctx`` in ``cache_type``, the recurrent state and the compute buffers (as on a CPU, which errs
    high beside a GPU); and the process itself (:data:`SERVER_OVERHEAD`)."""
    per = fit.cache_type_bytes(cache_type)
    return file_bytes + SERVER_OVERHEAD + sum(fit.kv_cache_bytes(h, n_ctx, type_k_bytes=per, type_v_bytes=per)
                            + fit.recurrent_state_bytes(h) + plan.host_compute_bytes(h, n_ctx)
                            for h in (header, draft) if h is not None)


def rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


@dataclass(frozen=True)
class Holder:
    """A running server of ours and the memory it holds."""

    key: str
    model: str
    pid: int
    charge: int  # what it was charged at start (0 for entries older than the budget)
    rss: int  # resident memory now
    holders: tuple[int, ...]  # pids of the client processes holding a lease
    last_used: float

    @property
    def idle(self) -> bool:
        return not self.holders

    @property
    def held(self) -> int:
        """The memory counted against the budget: the charge, or the measured RSS when that is larger."""
        return max(self.charge, self.rss)

    def describe(self) -> str:
        who = f"held by pid {', '.join(map(str, self.holders))}" if self.holders else "idle"
        return (f"{os.path.basename(self.model)} (pid {self.pid}, {_mib(self.held)}, {who}; "
                f"`gguf-provider stop {self.key[:12]}`)")


def holders(data: dict[str, registry.Entry], *, reg: registry.Registry | None = None) -> list[Holder]:
    """The live servers of a registry snapshot (dead leases pruned), least recently used first."""
    reg = reg or registry.default()
    out = []
    for key, e in data.items():
        if not reg.server_alive(e):
            continue
        leases = reg.live_leases(e)
        last = e.last_used or e.idle_since or e.started_at or 0.0
        out.append(Holder(key=key, model=e.model, pid=e.pid, charge=e.charge, rss=rss(e.pid),
                          holders=tuple(sorted(int(p) for p in leases)), last_used=last))
    return sorted(out, key=lambda h: h.last_used)


@dataclass(frozen=True)
class Admission:
    n_ctx: int
    charge: int  # the prompt RAM cache included
    evicted: tuple[Holder, ...]
    cache_ram: int = 0  # the host-RAM prompt cache charged (bytes): what `--cache-ram` gets


def admit(header: GGUFHeader, file_bytes: int, *, requested: int | None, n_gpu_layers: int | None,
          memory: Callable[[], fit.MemoryInfo], cache_type: str = fit.DEFAULT_CACHE_TYPE,
          draft: GGUFHeader | None = None, local_share: float = 1.0,
          reg: registry.Registry | None = None, cache_ram: Callable[[int], int] | None = None) -> Admission:
    """Make room for a new server and choose its context (call under :func:`admission_lock`).

    ``memory`` reads the free memory now (after evictions). ``file_bytes`` counts every file the server loads (a
    ``draft`` model's too); the KV cache is charged at ``cache_type`` for the model and its draft.
    ``local_share`` is the part of both that stays on this machine (the rest is on RPC workers, which ``memory``
    reports as devices): only that part is charged to the budget. ``reg``: the registry of the servers that count
    (default: this user's). ``cache_ram(n_ctx)``: the host-RAM prompt cache the server will hold at that context
    (charged whole: it is in this machine's RAM); none when None.
    """
    per = fit.cache_type_bytes(cache_type)

    def fit_to(mem: fit.MemoryInfo, requested: int | None) -> fit.FitResult:
        return fit.fit_context(header, file_bytes, requested=requested, n_gpu_layers=n_gpu_layers, memory=mem,
                               type_k_bytes=per, type_v_bytes=per, draft=draft)

    limit, count = memory_limit(), max_models()
    # Without ``reg``, the module-level registry functions (which the budget's unit tests replace).
    running = holders(registry.read()) if reg is None else holders(reg.read(), reg=reg)
    evicted: list[Holder] = []

    def evict_one(why: str) -> bool:
        """Stop the least recently used idle server; False when none is idle."""
        for h in running:
            if h.idle and h not in evicted and stop_idle(h.key, reg=reg):
                log.info("budget: stopped idle server pid %d (%s), the least recently used, to make room for %s "
                         "(%s)", h.pid, os.path.basename(h.model), header.path.name, why)
                evicted.append(h)
                return True
        return False

    def need(n_ctx: int) -> int:
        return (int(charge(header, file_bytes, n_ctx, cache_type=cache_type, draft=draft) * local_share)
                + (cache_ram(n_ctx) if cache_ram else 0))

    def admitted(n_ctx: int) -> Admission:
        return Admission(n_ctx, need(n_ctx), tuple(evicted), cache_ram(n_ctx) if cache_ram else 0)

    def refuse(what: str) -> InsufficientMemoryError:
        kept = [h for h in running if h not in evicted]
        listing = "; ".join(h.describe() for h in kept) or "none"
        log.warning("budget: %s cannot start: %s (servers holding memory: %s)", header.path.name, what, listing)
        return InsufficientMemoryError(
            f"{header.path.name} cannot start: {what}. Servers holding memory: {listing}. Free memory by "
            f"stopping one (`gguf-provider stop ID`), by unloading it in the process that holds it (`.unload()`, "
            f"`%gguf unload`), or let idle servers stop at once with keep_alive=0")

    if count is not None:
        while len(running) - len(evicted) >= count:
            if not evict_one(f"${MAX_MODELS_ENV}={count}"):
                raise refuse(f"${MAX_MODELS_ENV}={count} servers are running and every one is in use")

    native = header.context_length or fit.DEFAULT_CONTEXT
    target = requested if requested else native
    floor = min(BUDGET_MIN_CONTEXT, native)

    if limit is None:
        # The free memory decides: evict idle servers, LRU first, while the model would not get its target
        # context otherwise (what they give back shows in the next reading).
        def fits_free() -> bool:
            return fit_to(memory(), target).fits

        if not fits_free():
            while evict_one(f"it needs free memory for n_ctx {target}"):
                _wait_freed(evicted[-1])
                if fits_free():
                    break
        mem = memory()
        try:
            result = fit_to(mem, requested)
        except InsufficientMemoryError as exc:
            raise refuse(str(exc)) from None
        log.info("budget: %s admitted at n_ctx %d by free memory (%s charged; %d idle server(s) stopped)",
                 header.path.name, result.n_ctx, _mib(need(result.n_ctx)), len(evicted))
        return admitted(result.n_ctx)

    def used() -> int:
        return sum(h.held for h in running if h not in evicted)

    while need(target) > limit - used() and evict_one(f"${LIMIT_ENV} leaves {_mib(limit - used())}"):
        _wait_freed(evicted[-1])
    room = limit - used()
    n_ctx = target
    if need(target) > room:
        if requested:
            raise refuse(f"n_ctx={requested} needs {_mib(need(requested))} but {_mib(max(room, 0))} of the "
                         f"{_mib(limit)} budget (${LIMIT_ENV}) is left")
        fitted = _largest_context(need, room, floor, native)
        if fitted is None:
            raise refuse(f"even its floor context of {floor} tokens needs {_mib(need(floor))} but "
                         f"{_mib(max(room, 0))} of the {_mib(limit)} budget (${LIMIT_ENV}) is left")
        n_ctx = fitted
        said = (f"{header.path.name}: automatic context shrunk from {native} to {n_ctx} tokens to fit the memory "
                f"budget ({_mib(room)} left of {_mib(limit)}, ${LIMIT_ENV}); pass n_ctx, raise the limit or stop "
                f"other servers for more")
        log.warning("budget: %s", said)
        warn(said, MemoryBudgetWarning)
    # The real free memory still bounds it (the fit's margins apply).
    if not requested:
        try:
            real = fit_to(memory(), None)
        except InsufficientMemoryError as exc:
            raise refuse(str(exc)) from None
        n_ctx = min(n_ctx, real.n_ctx)
    log.info("budget: %s admitted at n_ctx %d (%s charged, %s of the %s limit used by others; %d idle server(s) "
             "stopped)", header.path.name, n_ctx, _mib(need(n_ctx)), _mib(used()), _mib(limit), len(evicted))
    return admitted(n_ctx)


def stop_idle(key: str, *, reg: registry.Registry | None = None) -> bool:
    """Stop server ``key`` if no live process holds it (checked again under the registry lock)."""
    reg = reg or registry.default()
    with reg.locked() as data:
        entry = data.get(key)
        if entry is None or reg.live_leases(entry):
            return False
        del data[key]
    log.info("evicting idle server pid %d (%s); its log: %s", entry.pid, os.path.basename(entry.model),
             entry.log or "none")
    reg.stop_entry(entry)
    return True


def _largest_context(need: Callable[[int], int], room: int, floor: int, native: int) -> int | None:
    if need(floor) > room:
        return None
    step = fit.CONTEXT_STEP
    lo, hi = max(floor // step, 1), max(native // step, 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid * step) <= room else (lo, mid)
    return max(lo * step, floor)


def _wait_freed(h: Holder, timeout: float = 10.0) -> None:
    """Wait until a stopped server's process is gone, so the memory read next counts what it gave back."""
    deadline = time.monotonic() + timeout
    while psutil.pid_exists(h.pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(h.pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.Error:
            return
        time.sleep(0.05)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def summary() -> dict[str, int | None]:
    """What ``ps`` shows: memory held by our servers, the limit (None: free memory decides), the count limit."""
    running = holders(registry.read())
    return {"used": sum(h.held for h in running), "limit": memory_limit(), "servers": len(running),
            "max_models": max_models()}


# -- this machine's memory, as the manager's budget collaborator sees it -------------------------------------------


def fit_memory(binary: Path, workers: Sequence[rpc.WorkerInfo] = ()) -> fit.MemoryInfo:
    """The memory ``binary`` can use: free RAM, plus free VRAM unless it is our CPU-only build (a GPU host without a
    CUDA toolkit gets one, and sizing its context by VRAM would overshoot RAM), plus what RPC ``workers`` report
    (llama.cpp treats each worker's device like a GPU: the offloaded layers and their KV cache go there)."""
    memory = fit.available_memory()
    if memory.has_gpu and installed.backend_of(binary) == "cpu":
        memory = fit.MemoryInfo(ram_available=memory.ram_available)
    devices = tuple(f for w in workers for f in w.free)
    return fit.MemoryInfo(memory.ram_available, memory.vram_free + devices) if devices else memory


def local_share(header: GGUFHeader, n_gpu_layers: int | None, workers: Sequence[rpc.WorkerInfo]) -> float:
    """The part of a model's weights and KV cache that stays in this machine's memory: 1 without RPC workers; with
    them, the layers not offloaded (all are, unless ``n_gpu_layers`` says otherwise)."""
    if not workers:
        return 1.0
    n_layer = max(header.block_count or 1, 1)
    offloaded = n_layer if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, n_layer)
    return 1 - offloaded / n_layer


class MemoryBudget:
    """runtime/_serve/budget.py over this machine's free memory."""

    def admission_lock(self) -> filelock.FileLock:
        return admission_lock()

    def admit(self, header: GGUFHeader, file_bytes: int, *, requested: int | None, n_gpu_layers: int | None,
              memory: Callable[[], fit.MemoryInfo], cache_type: str, draft: GGUFHeader | None,
              local_share: float, reg: registry.Registry,
              cache_ram: Callable[[int], int] | None = None) -> Admission:
        return admit(header, file_bytes, requested=requested, n_gpu_layers=n_gpu_layers, memory=memory,
                     cache_type=cache_type, draft=draft, local_share=local_share, reg=reg, cache_ram=cache_ram)

    def memory(self, binary: Path, workers: Sequence[rpc.WorkerInfo]) -> fit.MemoryInfo:
        return fit_memory(binary, workers)

    def devices(self, binary: Path, rpc: Sequence[str]) -> list[devices.Device]:
        devices.clear_cache()  # free memory now, not at the last listing
        return devices.machine_devices(binary, rpc=rpc)

    def rss(self, pid: int) -> int:
        return rss(pid)
