"""Threads that add up (runtime/_common/threads.py): the cores split among our CPU servers at each start, the user's
choice kept, none written for a model offloaded whole, the count in the registry (what `ps` shows), and the
OpenMP spin of llama.cpp's barrier kept short in every server we start. The speeds: bench P19, and
tests/integration_tests/test_threads_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.engine import EngineConfig
from gguf_provider.runtime._common import process, threads
from gguf_provider.runtime._memory.devices import Device
from tests.unit_tests.test_manager_races import World

GiB = 1 << 30


@pytest.mark.parametrize(("cores", "others", "expected"), [
    (2, 0, 2), (2, 1, 1), (2, 5, 1), (8, 0, 8), (8, 1, 4), (8, 2, 2), (8, 3, 2), (1, 0, 1), (1, 3, 1)])
def test_the_cores_are_split_among_the_servers(cores: int, others: int, expected: int) -> None:
    assert threads.share(cores, others) == expected


def test_physical_cores_is_at_least_one_and_at_most_the_logical_cpus() -> None:
    import os

    assert 1 <= threads.physical_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize(("args", "expected"), [
    ((), None), (("-t", "3"), 3), (("--threads=5",), 5), (("-c", "4", "--threads", "x"), None), (("-tb", "2"), None)])
def test_the_users_threads_are_read_from_server_args(args: tuple[str, ...], expected: int | None) -> None:
    assert threads.user_threads(args) == expected
    assert threads.sets_threads(args) == any(a.split("=")[0] in threads.THREAD_FLAGS for a in args)


def _t(argv: list[str]) -> int | None:
    return int(argv[argv.index("-t") + 1]) if "-t" in argv else None


def _world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("GGUF_PROVIDER_RUNTIME_DIR", str(tmp_path / "run"))
    return World(tmp_path)


def test_each_start_gets_its_share_of_the_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(tmp_path, monkeypatch)
    m = w.client()
    m._cores = lambda: 4
    first = m.acquire(w.spec("smollm2"))
    argv = w.launcher.argvs[-1]
    assert argv[argv.index("-t"):argv.index("-t") + 4] == ["-t", "4", "-tb", "4"]  # alone: every core
    second = m.acquire(w.spec("qwen"))
    assert _t(w.launcher.argvs[-1]) == 2  # beside one: half
    assert (w.entry(first).threads, w.entry(second).threads) == (4, 2)  # the registry (and `ps`) say so
    third = m.acquire(w.spec("qwen", n_ctx=4096))
    assert _t(w.launcher.argvs[-1]) == 1
    third.release()
    second.release()
    first.release()


def test_a_dead_servers_threads_are_not_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(tmp_path, monkeypatch)
    m = w.client()
    m._cores = lambda: 4
    first = m.acquire(w.spec("smollm2"))
    w.procs.die(first.info.pid)
    m.acquire(w.spec("qwen"))
    assert _t(w.launcher.argvs[-1]) == 4


def test_the_users_threads_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(tmp_path, monkeypatch)
    m = w.client()
    m._cores = lambda: 4
    from dataclasses import replace

    lease = m.acquire(replace(w.spec("smollm2"), threads=3))
    assert _t(w.launcher.argvs[-1]) == 3 and w.entry(lease).threads == 3
    lease = m.acquire(replace(w.spec("qwen"), server_args=("--threads", "5")))
    argv = w.launcher.argvs[-1]
    assert argv.count("-t") == 0 and "-tb" not in argv and argv[-2:] == ["--threads", "5"]
    assert w.entry(lease).threads == 5
    lease = m.acquire(replace(w.spec("qwen", n_ctx=4096), server_args=("-t", "-1")))  # llama.cpp's default
    assert w.entry(lease).threads == 4  # every physical core: a CPU server all the same, counted by later starts


def test_a_model_offloaded_whole_gets_no_threads_and_is_not_counted(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(tmp_path, monkeypatch)
    w.budget.devices = lambda binary, rpc: [Device("CUDA0", "cuda", "big GPU", 64 * GiB, 64 * GiB),  # type: ignore
                                            Device("CPU", "cpu", "host RAM", 64 * GiB, 64 * GiB)]
    m = w.client()
    m._cores = lambda: 4
    gpu = m.acquire(w.spec("smollm2"))
    assert "-t" not in w.launcher.argvs[-1] and w.entry(gpu).threads == 0
    w.budget.devices = lambda binary, rpc: [Device("CPU", "cpu", "host RAM", 64 * GiB, 64 * GiB)]  # type: ignore
    m.acquire(w.spec("qwen"))
    assert _t(w.launcher.argvs[-1]) == 4  # the GPU server computes nothing on the CPU


def test_threads_is_declared_once_and_checked() -> None:
    assert EngineConfig(threads=2).threads == 2
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads="):
            EngineConfig(threads=bad)  # type: ignore[arg-type]


def test_every_server_we_start_spins_briefly_at_llama_cpps_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert process.clean_env()["GOMP_SPINCOUNT"] == str(threads.GOMP_SPINCOUNT)
    monkeypatch.setenv("GOMP_SPINCOUNT", "12345")  # the user's own setting wins
    assert process.clean_env()["GOMP_SPINCOUNT"] == "12345"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # and so does a wait policy of theirs
    assert "GOMP_SPINCOUNT" not in process.clean_env()
