"""The kill matrix (docs/reliability.md): `rpc-worker`, `serve`, a script and a Jupyter kernel holding a model, each
a real process killed with each signal once it serves, and `server install` killed mid-build; nothing it started may
go on listening or running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from gguf_provider.runtime._common.process import free_port
from gguf_provider.runtime._memory import rpc
from gguf_provider.runtime._serve import registry
from tests.integration_tests.test_rpc import Worker
from tests.support.runtime import ROOT, RuntimeEnv, pid_alive, serving_line, wait_until
from tests.support.timing import REACT

# Each test takes <= ~12 s on a loaded 2-core machine (both cores busy with a CPU hog); 25x.
pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

# SIGSEGV stands for a crash of the command itself (no handler, no finally runs).
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL, signal.SIGSEGV]
GONE_WITHIN = REACT  # seconds: a killed process, and what it takes down with it, is gone


def _kill_all(proc: subprocess.Popen[str], rt: RuntimeEnv) -> None:
    """After a failed test: the command's process group and this test's servers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(GONE_WITHIN)
    if proc.stdout is not None:
        proc.stdout.close()
    for p in rt.servers():
        p.kill()


def _gone(p: psutil.Process) -> bool:
    return not pid_alive(p.pid) or not p.is_running()  # a reused pid is another process


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_rpc_worker_leaves_no_rpc_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    worker = Worker(free_port())  # its own session: the signal reaches the command only, not its child
    try:
        worker.wait_listening()
        child = worker.rpc_server()
        os.kill(worker.proc.pid, sig)
        worker.proc.wait(GONE_WITHIN)
        wait_until(lambda: _gone(child), GONE_WITHIN)
        wait_until(lambda: not rpc.reachable(worker.endpoint, timeout=GONE_WITHIN), GONE_WITHIN)
    finally:
        worker.stop()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_serve_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "serve", str(rt.model), "--ctx", "1024",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        line = serving_line(proc.stdout)
        assert line.startswith("serving"), line
        (server,) = rt.servers()
        os.kill(proc.pid, sig)
        proc.wait(GONE_WITHIN)
        # after kill -9 or a crash the watchdog notices the dead lease within its 1 s tick (keep_alive 0)
        wait_until(lambda: _gone(server), GONE_WITHIN)
        wait_until(lambda: not rpc.reachable(f"127.0.0.1:{port}", timeout=GONE_WITHIN), GONE_WITHIN)
        wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
    finally:
        _kill_all(proc, rt)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_the_gateway_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    """`serve` with no model, holding a model it started for a request: `ps` names it as the holder; killed with
    any signal, the server goes (its lease ends; keep_alive 0), and so does its line in `ps`."""
    import httpx

    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", GGUF_PROVIDER_MODELS=str(rt.model.parent))
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "serve", "--port", str(port), "--ctx", "1024"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("gateway at"), line
        url = line.split()[2]
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": rt.model.stem, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        (server,) = rt.servers()
        shown = json.loads(rt.gguf_cli("ps", "--json").stdout)
        assert [g["url"] for g in shown["gateways"]] == [url]
        assert [s["gateway"] for s in shown["servers"]] == [url]
        os.kill(proc.pid, sig)
        proc.wait(GONE_WITHIN)
        wait_until(lambda: _gone(server), GONE_WITHIN)
        wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
        assert json.loads(rt.gguf_cli("ps", "--json").stdout)["gateways"] == []
    finally:
        _kill_all(proc, rt)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "private"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_script_holding_a_model_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals, shared: bool) -> None:
    """A script (tests/support/runtime_child.py: an Engine, as a ChatGGUF holds one) killed while it holds its
    server: a private server dies with it (PR_SET_PDEATHSIG), a shared one is stopped by its watchdog once
    keep_alive (0 here) has run out."""
    child = rt.child(chat=False, shared=shared, keep_alive=0)
    r = child.read_json()
    assert "error" not in r, r
    server = psutil.Process(r["server_pid"])
    os.kill(child.proc.pid, sig)
    child.wait(GONE_WITHIN)
    wait_until(lambda: _gone(server), GONE_WITHIN)
    wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
    if not shared and sig not in (signal.SIGINT,):  # nobody was left to remove a private server's entry
        assert [e.pid for e in registry.sweep()] == [r["server_pid"]]  # the next start's sweep does
    assert rt.registry() == {}


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_jupyter_kernel_with_a_loaded_model_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals) -> None:
    """A real ipykernel after `%gguf load`: killed, its server is stopped by the watchdog (keep_alive 0 here).
    SIGINT is Jupyter's "interrupt": the kernel lives on and keeps its model."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive(f"%load_ext gguf_provider\n%gguf load {rt.model} --ctx 1024", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        (server,) = rt.servers()
        kernel = psutil.Process(km.provisioner.pid)  # type: ignore[union-attr]
        os.kill(kernel.pid, sig)
        if sig == signal.SIGINT:
            ok = kc.execute_interactive("%gguf ps", timeout=60)
            assert ok["content"]["status"] == "ok" and not _gone(server) and kernel.is_running()
            return
        wait_until(lambda: _gone(kernel), GONE_WITHIN)
        wait_until(lambda: _gone(server), GONE_WITHIN)
        wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
        assert rt.registry() == {}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _building_in(build_dir: Path) -> list[psutil.Process]:
    """The processes working in ``build_dir`` (ninja and the compilers it runs there)."""
    found = []
    for p in psutil.process_iter():
        try:
            if Path(p.cwd()).is_relative_to(build_dir):
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


BUILD_TOOLS = {"cmake", "ninja", "make", "gmake"}


def _hold_compilers(build_dir: Path) -> list[psutil.Process]:
    """SIGSTOP every process compiling in ``build_dir`` (not cmake or ninja), until none is left running: a stopped
    compiler driver starts no assembler, and stopped compilers let ninja start no new ones."""
    held: list[psutil.Process] = []
    seen: set[psutil.Process] = set()
    while True:
        new = [p for p in _building_in(build_dir) if p not in seen]
        if not new:
            return held
        for p in new:
            seen.add(p)
            try:
                if p.name() not in BUILD_TOOLS:
                    p.suspend()
                    held.append(p)
            except psutil.NoSuchProcess:
                pass


def _object_file(p: psutil.Process, build_dir: Path) -> Path | None:
    """The object file a compiler driver (or assembler) writes: its ``-o`` argument."""
    try:
        argv = p.cmdline()
    except psutil.Error:
        return None
    for i, arg in enumerate(argv[:-1]):
        if arg == "-o" and argv[i + 1].endswith(".o"):
            return build_dir / argv[i + 1]
    return None


_STOP_BITS = sum(1 << (s - 1) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))


def _signalled(p: psutil.Process) -> bool:
    """Gone, or a stop signal is pending for it (a stopped process receives it once continued)."""
    try:
        if _gone(p) or p.status() == psutil.STATUS_ZOMBIE:
            return True
        status = Path(f"/proc/{p.pid}/status").read_text()
    except (psutil.Error, OSError):
        return True
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & _STOP_BITS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_an_install_killed_mid_build_leaves_no_compiler_behind(tmp_path: Path, sig: signal.Signals) -> None:
    """`server install --from source` killed while ninja compiles: cmake, ninja and every compiler stop with it
    (runtime/_common/guard.py), no install appears, and the install lock is free for the next run.

    The compilers at work are held still (SIGSTOP) from before the kill until the stop signal is pending for each,
    so none can finish its file in between on any machine: each is ended by that signal, and its object file never
    appears. Without the guard nobody signals them (ninja would only die at its next write to the dead installer's
    pipe, after they finished)."""
    from gguf_provider.runtime._install import install

    src = install.fetch_source()  # the pinned tree (cached by `make test`'s set-up), linked into a fresh home
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "src" / src.name).symlink_to(src)
    build_dir = home / "build" / f"{install.SOURCE_PIN}-cpu"
    env = dict(os.environ, GGUF_PROVIDER_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("GGUF_PROVIDER_LLAMA_SERVER", None)
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "server", "install", "--backend", "cpu",
                             "--from", "source"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env=env, start_new_session=True)
    held: list[psutil.Process] = []
    try:
        log = home / "logs" / f"build-{install.SOURCE_PIN}-cpu.log"

        def compiling() -> bool:  # past configure, in the build step: ninja (or make) and a compiler at work
            if "$ cmake --build" not in (log.read_text(errors="replace") if log.exists() else ""):
                return False
            names = {p.name() for p in _building_in(build_dir) if p.is_running()}
            return bool(names & {"ninja", "make", "gmake"}) and bool(names & {"cc1plus", "cc1", "c++", "g++", "gcc"})

        wait_until(compiling, 300, interval=0.2)  # the configure: typical ~2.5 s on a loaded 2-core machine
        held = _hold_compilers(build_dir)
        objects = {o for o in (_object_file(p, build_dir) for p in held) if o is not None and not o.exists()}
        assert objects, f"no compiler at work on an object file: {[p.cmdline() for p in held]}"
        os.kill(proc.pid, sig)
        wait_until(lambda: all(_signalled(p) for p in held), GONE_WITHIN)
        for p in held:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
        proc.wait(GONE_WITHIN)
        wait_until(lambda: all(_gone(p) for p in held), GONE_WITHIN)
        wait_until(lambda: not _building_in(build_dir), GONE_WITHIN)
        assert not [o for o in objects if o.exists()], "a compiler at work finished its file"
        assert not (home / "bin" / f"{install.SOURCE_PIN}-cpu" / "installed.json").exists()
        import filelock

        with filelock.FileLock(str(home / "locks" / "install.lock"), timeout=0):  # not held by a leftover
            pass
    finally:
        for p in held:
            with contextlib.suppress(psutil.Error):
                p.resume()
        for p in _building_in(build_dir):
            with contextlib.suppress(psutil.Error):
                p.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(GONE_WITHIN)


def _slots(rt: RuntimeEnv, key: str) -> list[dict[str, Any]]:
    """The server's /slots, asked as a client of ours would (its socket, or its URL and key)."""
    from gguf_provider.runtime._serve import manager as mgr

    info = mgr._info(key, registry.read()[key])
    with info.address.client(timeout=5.0) as client:
        slots: list[dict[str, Any]] = client.get("/slots").json()
    return slots


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "private"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_script_killed_while_its_server_loads_leaves_no_server_behind(rt: RuntimeEnv, sig: signal.Signals,
                                                                         shared: bool) -> None:
    """The script is killed while it waits for its server's model to load. The load is held still with SIGSTOP
    from the moment the server appears (as a large model's load would take minutes), so the kill lands before
    /health answers on any machine; the server is let go on right after the kill. A private server dies with the
    script; a shared one is stopped by its watchdog, which runs from the moment the server is registered (it was
    started only once the server was healthy: a script killed during the load left it running for good)."""
    child = rt.child(chat=False, shared=shared, keep_alive=0)
    server: psutil.Process | None = None

    def appeared() -> bool:
        nonlocal server
        found = rt.servers()
        if found:
            server = found[0]
            server.suspend()
        return bool(found)

    try:
        wait_until(appeared, 60, interval=0.005)
        assert server is not None
        wait_until(lambda: any(e["pid"] == server.pid for e in rt.registry().values()), GONE_WITHIN)
        assert child.proc.poll() is None and child._lines.empty(), "the script was no longer waiting for the load"
        os.kill(child.proc.pid, sig)
        server.resume()
        child.wait(GONE_WITHIN)
        wait_until(lambda: _gone(server), GONE_WITHIN)
        wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
        if shared or sig == signal.SIGINT:
            assert rt.registry() == {}
        else:  # nobody was left to remove a private server's entry: the next start's sweep does
            assert [e.pid for e in registry.sweep()] == [server.pid] and rt.registry() == {}
    finally:
        if server is not None and not _gone(server):
            server.resume()


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "private"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_script_killed_mid_request_stops_its_generation(rt: RuntimeEnv, sig: signal.Signals, shared: bool) -> None:
    """The script is killed while a reply streams to it (EOS ignored: 4096 tokens to go). Its generation stops: a
    shared server (held by a second script) frees the slot within 5 s and goes on serving; once the holder exits,
    the server goes too (keep_alive 0). A private server dies with the script."""
    holder = rt.child(chat=False, shared=shared, keep_alive=0) if shared else None
    streamer = rt.child(chat=False, shared=shared, keep_alive=0, stream=True)
    r = streamer.read_json()
    assert "error" not in r, r
    assert "streaming" in streamer.read_json(timeout=120)
    server = psutil.Process(r["server_pid"])
    if holder is not None:
        assert holder.read_json()["server_pid"] == server.pid
        assert any(s.get("is_processing") for s in _slots(rt, r["key"]))
    os.kill(streamer.proc.pid, sig)
    streamer.wait(GONE_WITHIN)
    if holder is None:
        wait_until(lambda: _gone(server), GONE_WITHIN)
        return
    wait_until(lambda: not any(s.get("is_processing") for s in _slots(rt, r["key"])), GONE_WITHIN)
    from gguf_provider.runtime._serve import manager as mgr

    info = mgr._info(r["key"], registry.read()[r["key"]])
    with info.address.client(timeout=60.0) as client:
        answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi."}],
                                                           "max_tokens": 4})
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    # the killed script's lease is given back at exit (SIGINT) or pruned by the watchdog's next tick
    wait_until(lambda: list(rt.registry()[r["key"]]["leases"]) == [str(holder.proc.pid)], GONE_WITHIN)
    assert holder.finish() == 0
    wait_until(lambda: _gone(server), GONE_WITHIN)
    wait_until(lambda: not rt.watchdogs(), GONE_WITHIN)
