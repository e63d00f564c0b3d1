"""How many CPU threads a server gets, so that servers computing at the same time do not oversubscribe the cores.

llama.cpp's threads wait for each other at a spinning barrier after every operation: a server with more threads
than it has cores to itself spends the CPU spinning while the thread it waits for is not scheduled. Two servers
each sized for the whole machine (llama.cpp's default: one thread per physical core) generating at once slowed to
0.01-0.25 of their speed alone on the 2-core reference machine (bench/NOTES.md, "P19: threads that add up").

The rule (docs/runtime.md): a server that computes on the CPU (a CPU-only machine, or the part of a GPU/RAM
split left in RAM; not a model the plan offloads whole) gets the physical cores divided among our CPU servers
alive when it starts, itself included: ``max(1, cores // (1 + others))``, for generation (``-t``) and batches
(``-tb``). The first server gets every core, as llama.cpp's default would. A server keeps its count until it
stops (llama-server cannot change it while it runs); servers started by others (attached, foreign) are never
changed and not counted. A user's ``threads=`` or ``-t``/``-tb`` in ``server_args`` win.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import psutil

THREAD_FLAGS = ("-t", "--threads", "-tb", "--threads-batch")
# The spin of llama.cpp's barrier in an OpenMP build (our source build, Linux releases): libgomp spins 300,000
# rounds before it sleeps, milliseconds of a core at each barrier whose other thread is not running, which is
# what collapses servers that share cores. 700 rounds, with the split: two at once keep 0.34 and 0.53 of their
# speed alone (bench P19; 300,000: 0.00-0.01 for the first; 3,000: 0.20), one alone 0.89 of the default in P19's
# band 0.87-1.09 (1.03 on raw servers with an idle client). bench/NOTES.md, "P19"; set by process.clean_env.
GOMP_SPINCOUNT = 700


def physical_cores() -> int:
    """The physical cores this process may run on (llama.cpp's default thread count counts physical cores)."""
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    logical = psutil.cpu_count(logical=True) or physical
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        allowed = logical
    # An affinity mask narrower than the machine (a container's cpuset): its share of the physical cores.
    return max(1, min(physical, physical * allowed // max(logical, 1)))


def share(cores: int, others: int) -> int:
    """The threads of a server started while ``others`` CPU servers of ours are alive."""
    return max(1, cores // (1 + max(0, others)))


def int_flag(server_args: Sequence[str], *names: str) -> int | None:
    """The number the first of ``names`` found in ``server_args`` is given (``-t 4`` or ``--threads=4``), if any."""
    for i, arg in enumerate(server_args):
        for name in names:
            value = server_args[i + 1] if arg == name and i + 1 < len(server_args) else (
                arg.split("=", 1)[1] if arg.startswith(name + "=") else None)
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return None
    return None


def user_threads(server_args: Sequence[str]) -> int | None:
    """The generation threads (``-t``/``--threads``) the user set in ``server_args``, if any."""
    return int_flag(server_args, "-t", "--threads")


def sets_threads(server_args: Iterable[str]) -> bool:
    """Whether ``server_args`` choose the threads themselves (then no ``-t``/``-tb`` of ours is written)."""
    return any(a in THREAD_FLAGS or a.split("=", 1)[0] in THREAD_FLAGS for a in server_args)


def argv(threads: int | None) -> list[str]:
    """``-t N -tb N`` (nothing for None: a server the plan offloads whole, or the user's own)."""
    return [] if threads is None else ["-t", str(threads), "-tb", str(threads)]
