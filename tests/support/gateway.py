"""A real gateway for the tests: ``gguf-provider serve --port 0`` in a subprocess, with a private home and runtime
dir, the test models' directory as its models dir, and the installed llama-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support.runtime import ROOT


@dataclass
class GatewayProc:
    url: str
    proc: subprocess.Popen[str]
    home: Path
    run_dir: Path
    env: dict[str, str]
    output: list[str] = field(default_factory=list)

    def servers(self) -> list[psutil.Process]:
        """The llama-servers this gateway's runtime started (their sockets are in its runtime dir)."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.name().startswith("llama-server") and p.status() != psutil.STATUS_ZOMBIE \
                        and str(self.run_dir) in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def log(self) -> str:
        return "".join(self.output[-60:])


@contextmanager
def gateway(models_dir: Path, *args: str, env: dict[str, str] | None = None,
            ready_timeout: float = 60.0) -> Iterator[GatewayProc]:
    """A running gateway; on exit it gets SIGTERM and must leave no llama-server behind."""
    from gguf_provider.runtime._install import discovery

    binary = discovery.find_llama_server()
    home = Path(tempfile.mkdtemp(prefix="gw-home-"))
    run_dir = Path(tempfile.mkdtemp(prefix="gpw-", dir="/tmp"))  # short: Unix socket paths are limited
    full = {**os.environ, "GGUF_PROVIDER_HOME": str(home), "GGUF_PROVIDER_RUNTIME_DIR": str(run_dir),
            "GGUF_PROVIDER_LLAMA_SERVER": str(binary), "GGUF_PROVIDER_MODELS": str(models_dir),
            "GGUF_PROVIDER_KEEP_ALIVE": "0", "GGUF_PROVIDER_AUTO_INSTALL": "0", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full, cwd=ROOT,
                            start_new_session=True)
    gw = GatewayProc("", proc, home, run_dir, full)
    assert proc.stdout is not None
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        gw.output.append(line)
        if line.startswith("gateway at "):
            gw.url = line.split()[2]
            break
    if not gw.url:
        proc.kill()
        raise AssertionError(f"the gateway did not start: {''.join(gw.output)}")
    pump = threading.Thread(target=lambda: gw.output.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    pump.start()
    try:
        yield gw
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        pump.join(10)  # the pipe's end once the gateway is gone; then its file is closed (no ResourceWarning later)
        if proc.stdout is not None:
            proc.stdout.close()
        left = gw.servers()
        for p in left:
            p.kill()
        assert not left, f"the gateway left {len(left)} llama-server(s) running: {gw.log()}"
