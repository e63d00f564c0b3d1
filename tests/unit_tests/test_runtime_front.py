"""The runtime's front door (issue 46.5): ``gguf_provider.runtime`` names a small API, :class:`Runtime` and the
types its methods take and return, and loads nothing behind it until a name is used; a Runtime over a manager with
fake collaborators (test_manager_races.py's world) acquires, shares, cancels and stops as the manager does.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import gguf_provider.runtime as front
from gguf_provider.runtime import Runtime
from gguf_provider.runtime._serve import registry
from tests.unit_tests.test_manager_races import World, world  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[2]


def test_the_front_door_loads_nothing_behind_it_until_a_name_is_used() -> None:
    code = ("import sys, gguf_provider.runtime as r\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('gguf_provider.runtime.'))\n"
            "assert loaded == [], loaded\n"
            "for name in r.__all__:\n"
            "    getattr(r, name)\n"
            "print(len(r.__all__))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(front.__all__)
    assert set(front.__all__) == set(front._HOMES)
    with pytest.raises(AttributeError):
        front.manager  # noqa: B018  (a private module is no attribute of the front door)


def test_a_runtime_acquires_and_shares_through_its_manager(world: World) -> None:  # noqa: F811
    rt = Runtime(world.client())
    a = rt.acquire(world.spec(), keep_alive=0)
    b = rt.acquire(world.spec(), keep_alive=0)
    assert a.info.key == b.info.key and len(world.launcher.spawned) == 1
    assert [s.pid for s in rt.stop("\0")] == []  # an id no server has: nothing stopped
    a.release()
    b.release()  # keep_alive 0: the last release stops it
    assert world.reg.read() == {} and world.procs.stopped == world.launcher.spawned


async def test_aacquire_runs_the_start_off_the_loop_and_a_cancelled_one_leaves_nothing(world: World) -> None:  # noqa: F811
    rt = Runtime(world.client())
    loop = asyncio.get_running_loop()
    threads: list[str] = []
    task: asyncio.Task[object] | None = None

    def cancel_while_loading() -> None:
        """Runs in the start's thread: cancel the awaiting task, and go on once the loop has taken it in (FIFO:
        the task's wake-up is queued before the event's)."""
        threads.append(threading.current_thread().name)
        assert task is not None
        seen = threading.Event()
        loop.call_soon_threadsafe(task.cancel)
        loop.call_soon_threadsafe(lambda: loop.call_soon(seen.set))
        assert seen.wait(10)

    lease = await rt.aacquire(world.spec(), keep_alive=300)
    assert lease.started and lease.info.key in world.reg.read()
    lease.release()
    world.health.while_loading.append(cancel_while_loading)
    task = asyncio.ensure_future(rt.aacquire(world.spec("qwen"), keep_alive=300))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert threads and threads[0] != threading.current_thread().name
    # The qwen server it was starting is stopped and unregistered; the first one lives on for its keep_alive.
    assert list(world.reg.read()) == [lease.info.key]
    assert len(world.launcher.spawned) == 2 and world.procs.stopped == [world.launcher.spawned[1]]


def test_stop_stops_our_servers_by_id_and_removes_stale_entries(world: World,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_default", world.reg)
    rt = Runtime(world.client())
    lease = rt.acquire(world.spec(), keep_alive=300)
    stale = rt.acquire(world.spec("qwen"), keep_alive=300)
    world.procs.die(stale.info.pid)
    stopped = {s.pid: s.running for s in rt.stop()}
    assert stopped == {lease.info.pid: True, stale.info.pid: False}
    assert world.reg.read() == {} and lease.info.pid in world.procs.stopped


def test_plan_on_named_devices_starts_nothing(tmp_path: Path) -> None:
    from tests.support.gguf_bytes import STANDINS

    model = STANDINS["qwen"].write(tmp_path)
    made = Runtime().plan(str(model), devices=["cuda:300MiB"], n_ctx=2048)
    assert made.where == "the devices named"
    assert made.plan.placements[0].device.name == "CUDA0" and made.speculative_extra >= 0
    with pytest.raises(ValueError):
        Runtime().plan(str(model), devices=["nonsense"])
