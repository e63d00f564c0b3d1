"""Issue 15 offline: RPC workers are validated where they are given, reach the command line with every layer
offloaded, count in the fit as devices and only the local share in the budget, and `rpc-worker` refuses a
non-loopback address without the explicit flag. The real workers are in tests/integration_tests/test_rpc.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_provider import ChatGGUF, GGUFEmbeddings, RPCWorkerUnreachableError
from gguf_provider.engine import EngineConfig
from gguf_provider.llama_index import GGUF, GGUFEmbedding
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._memory import fit, rpc
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.budget import fit_memory, local_share
from gguf_provider.runtime._serve.server_options import ServerSpec
from tests.support import gguf_bytes as gb

ROOT = Path(__file__).resolve().parents[2]
CAPS = ServerCapabilities(path="llama-server", version="t", flags={"--jinja": True})


def test_endpoints_are_checked_and_normalized() -> None:
    assert rpc.normalize("10.0.0.2:50052, 10.0.0.3:50053") == ("10.0.0.2:50052", "10.0.0.3:50053")
    assert rpc.normalize(["[::1]:50052", "gpu-box:1"]) == ("[::1]:50052", "gpu-box:1")
    assert rpc.normalize(None) == () == rpc.normalize("")
    for bad in ("10.0.0.2", "host:port", ":50052", "h:0", "h:70000"):
        with pytest.raises(ValueError, match="is not host:port"):
            rpc.normalize([bad])
    with pytest.raises(ValueError, match="names a worker twice"):
        rpc.normalize("h:1,h:1")
    assert rpc.is_loopback("127.0.0.1") and rpc.is_loopback("::1") and rpc.is_loopback("localhost")
    assert not rpc.is_loopback("0.0.0.0") and not rpc.is_loopback("192.168.1.5") and not rpc.is_loopback("box")


@pytest.mark.parametrize("cls", [ChatGGUF, GGUF, GGUFEmbeddings, GGUFEmbedding])
def test_every_adapter_takes_rpc_servers_and_passes_them_on(cls: type) -> None:
    obj = cls(model="m.gguf", rpc_servers="10.0.0.2:50052,10.0.0.3:50052")
    assert obj.engine_config().rpc_servers == ("10.0.0.2:50052", "10.0.0.3:50052")
    with pytest.raises(ValueError, match="is not host:port"):
        cls(model="m.gguf", rpc_servers=["10.0.0.2"])
    with pytest.raises(ValueError, match="is not host:port"):
        EngineConfig(model="m.gguf", rpc_servers=("nowhere",))


def test_workers_get_every_layer_unless_n_gpu_layers_says_otherwise() -> None:
    def argv(**kw: object) -> list[str]:
        spec = ServerSpec(model=Path("/m.gguf"), **kw)  # type: ignore[arg-type]
        return build_argv(spec, Path("/bin/llama-server"), CAPS, "a", 1024, Address(socket="/r/x.sock"), None)

    a = argv(rpc_servers=("h:1", "h:2"))
    assert a[a.index("--rpc") + 1] == "h:1,h:2" and a[a.index("-ngl") + 1] == "999"
    a = argv(rpc_servers=("h:1",), n_gpu_layers=10)
    assert a[a.index("-ngl") + 1] == "10" and a.count("-ngl") == 1
    assert "-ngl" not in argv() and "--rpc" not in argv()


def test_the_fit_counts_worker_devices_and_the_budget_only_the_local_share(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    kvs = {"general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192,
           "llama.embedding_length": 576, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3}
    path.write_bytes(gb.gguf(*(gb.encode(k, v) for k, v in kvs.items())))
    from gguf_provider.runtime._common.gguf import read_header

    header = read_header(path)
    workers = [rpc.WorkerInfo("h:1", "7.0.0", (4 << 30,), (8 << 30,)),
               rpc.WorkerInfo("h:2", "7.0.0", (2 << 30,), (2 << 30,))]
    mem = fit_memory(Path("/bin/llama-server"), workers)
    assert mem.vram_free[-2:] == (4 << 30, 2 << 30) and mem.has_gpu
    assert fit_memory(Path("/bin/llama-server")).vram_free == fit.available_memory().vram_free
    assert local_share(header, None, workers) == 0.0
    assert local_share(header, 10, workers) == pytest.approx(2 / 3)
    assert local_share(header, None, []) == 1.0
    # A model larger than local RAM fits when the workers hold it.
    big = fit.fit_context(header, 5 << 30, memory=fit.MemoryInfo(ram_available=1 << 30, vram_free=(4 << 30, 4 << 30)))
    assert big.fits and big.n_gpu_layers == 30


def test_probe_names_a_worker_nobody_listens_on_within_seconds() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(RPCWorkerUnreachableError, match=rf"127\.0\.0\.1:{port} cannot be reached \(nothing listens"):
        rpc.probe(f"127.0.0.1:{port}")
    # A refusal is immediate (~1 ms): it must not wait out the connect timeout, as a silent host would.
    assert time.monotonic() - t0 < rpc.CONNECT_TIMEOUT


def test_probe_calls_a_silent_listener_busy() -> None:
    """A listener that accepts and never answers HELLO is what a worker serving another llama-server looks like
    (rpc-server accepts one client at a time; the backlog takes the connection)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(RPCWorkerUnreachableError, match="busy serving another llama-server") as ei:
            rpc.probe(f"127.0.0.1:{port}", answer_timeout=0.5)
        assert ei.value.worker == f"127.0.0.1:{port}"


def test_rpc_worker_refuses_a_non_loopback_host_and_a_memory_cap_the_build_lacks() -> None:
    # timeout: a hang guard; the refusal takes ~0.6 s on a loaded 2-core machine (100x)
    out = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "rpc-worker", "--host", "0.0.0.0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert "no authentication and no encryption" in out.stderr and "--i-know-rpc-is-unauthenticated" in out.stderr
    with pytest.raises(ValueError, match="has no memory cap"):
        rpc.worker_argv(Path("/bin/rpc-server"), mem_mib=4096, help_text="-H, --host HOST\n-p, --port PORT\n")
    argv = rpc.worker_argv(Path("/bin/rpc-server"), host="10.0.0.2", port=50060, threads=4, cache=True, mem_mib=4096,
                           help_text="-m, --mem <M>  backend memory size (in MB)\n")
    assert argv == ["/bin/rpc-server", "--host", "10.0.0.2", "--port", "50060", "--threads", "4", "--cache",
                    "--mem", "4096"]
