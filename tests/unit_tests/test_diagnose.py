"""Issue 30: one table from llama-server failures to typed errors (gguf_provider/runtime/_serve/diagnose.py).

Modelled on httpx's test that every lower-level exception is mapped: every entry of ``TABLE`` has a sample here and
each sample is diagnosed by its own entry. The log lines and error bodies are llama-server's own (the strings come
from llama.cpp: ggml-rpc.cpp's aborts, common/arg.cpp, llama-model-loader.h, server-context.cpp). A failure no entry
knows becomes the generic error of its kind and keeps the server's log tail.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gguf_provider.client import EngineClient, StreamParser
from gguf_provider.errors import (
    APIError,
    ContextOverflowError,
    GGUFFormatError,
    GGUFProviderError,
    RPCWorkerLostError,
    RPCWorkerUnreachableError,
    ServerCrashedError,
    ServerStartError,
    ServerTimeoutError,
)
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._serve import diagnose
from gguf_provider.runtime._serve.diagnose import TABLE, Failure

W1, W2 = "127.0.0.1:50052", "127.0.0.1:50053"
DATA = Path(__file__).parent / "data"
MODEL = Path("/home/me/models/SmolLM2-135M-Instruct-Q8_0.gguf")
BINARY = Path("/home/me/.local/share/gguf-provider/llama.cpp/b7100-cpu/bin/llama-server")
LOG = Path("/run/user/1000/gguf-provider/0f3c9a1e2b7d4c55-8e1f2a.log")
RPC_SRC = "/home/runner/work/llama.cpp/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp"

START = [
    f"# gguf-provider: {BINARY} -m {MODEL} --alias gguf-provider-0f3c9a1e2b7d4c55 -c 2048 --jinja --no-webui "
    f"--offline --host /run/user/1000/gguf-provider/0f3c9a1e2b7d4c55-8e1f2a.sock --rpc {W1},{W2} -ngl 999",
    "load_backend: loaded CPU backend from /home/me/.local/share/gguf-provider/llama.cpp/b7100-cpu/bin/libggml-cpu.so",
]
BACKTRACE = [
    "/home/me/.local/share/gguf-provider/llama.cpp/b7100-cpu/bin/libggml-base.so(+0x16f3b)[0x7f2e1c5a4f3b]",
    "/home/me/.local/share/gguf-provider/llama.cpp/b7100-cpu/bin/libggml-base.so(ggml_abort+0x11f)[0x7f2e1c5a52af]",
]
SERVING = [
    "srv  update_slots: all slots are idle",
    "srv  params_from_: Chat format: Content-only",
    "slot launch_slot_: id  0 | task 12 | processing task",
    "slot update_slots: id  0 | task 12 | new prompt, n_ctx_slot = 2048, n_keep = 0, n_prompt_tokens = 31",
]


def log(*lines: str) -> str:
    return "\n".join(lines)


@dataclass
class Sample:
    failure: Failure
    says: tuple[str, ...]  # in the message
    attrs: dict[str, Any] = field(default_factory=dict)  # attributes of the error


SAMPLES: dict[str, list[Sample]] = {
    "rpc-not-built": [
        Sample(Failure("start", log(*START, 'error while handling argument "--rpc": RPC not supported in this build',
                                    "", "usage:", "--rpc SERVERS                           comma-separated list of "
                                    "RPC servers (host:port)", "", "to show complete usage, run with -h"),
                       LOG, model=MODEL, binary=BINARY, workers=(W1, W2)),
               (f"{BINARY} was built without llama.cpp's RPC backend", "GGML_RPC=ON", "RPC not supported")),
        Sample(Failure("start", log(*START, 'error while handling argument "--rpc": failed to find RPC backend', "",
                                    "usage:", "--rpc SERVERS"), LOG, model=MODEL, binary=BINARY, workers=(W1,)),
               ("built without llama.cpp's RPC backend",)),
    ],
    "rpc-worker-unreachable": [
        Sample(Failure("start", log(*START, f"{RPC_SRC}:547: Failed to connect to {W2}", *BACKTRACE), LOG,
                       model=MODEL, binary=BINARY, workers=(W1, W2)),
               (f"llama-server could not use RPC worker {W2}", "stopped answering"), {"worker": W2}),
        Sample(Failure("start", log(*START, f"{RPC_SRC}:550: RPC handshake failed for {W1}", *BACKTRACE), LOG,
                       model=MODEL, binary=BINARY, workers=(W1, W2)),
               (f"RPC worker {W1}",), {"worker": W1}),
    ],
    "out-of-device-memory": [
        # Captured on an NVIDIA H200 (this project's CUDA build, -c 60000000 --fit off): the KV cache alone
        # asked for 343 GiB (tests/unit_tests/data/logs/cuda-oom-h200.log, the log's last 40 lines).
        Sample(Failure("start", (DATA / "logs" / "cuda-oom-h200.log").read_text(), LOG, model=MODEL, binary=BINARY),
               ("ran out of CUDA0 memory", "351,562 MiB", "n_gpu_layers", "kv_cache_type", "gguf-provider plan"),
               {"device": "CUDA0", "needed": int(351562.50 * 2**20)}),
        # Vulkan (ggml-vulkan.cpp's messages as in llama.cpp's issue reports) and Metal: the device comes from
        # ggml-alloc's line.
        Sample(Failure("start", log(
            *START[:1],
            "ggml_vulkan: Device memory allocation of size 4294967296 failed.",
            "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
            "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 4294967296",
            "llama_model_load: error loading model: unable to allocate Vulkan0 buffer"), LOG, model=MODEL,
            binary=BINARY), ("ran out of Vulkan0 memory", "4,096 MiB"), {"device": "Vulkan0", "needed": 4 * 2**30}),
        Sample(Failure("start", log(
            *START[:1], "ggml_metal_buffer_init: error: failed to allocate buffer, size = 30000.00 MiB"), LOG,
            model=MODEL, binary=BINARY), ("ran out of device memory",), {"device": None, "needed": None}),
    ],
    "truncated-model": [
        Sample(Failure("start", log(
            *START[:1],
            f"llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors from {MODEL} (version "
            f"GGUF V3 (latest))",
            "llama_model_load: error loading model: tensor 'blk.17.ffn_down.weight' data is not within the file "
            "bounds, model is corrupted or incomplete",
            "llama_model_load_from_file_impl: failed to load model",
            f"common_init_from_params: failed to load model '{MODEL}'",
            f"srv    load_model: failed to load model, '{MODEL}'",
            "srv   operator(): operator(): cleaning up before exit...",
            "main: exiting due to model loading error"), LOG, model=MODEL, binary=BINARY),
               (f"{MODEL} is truncated or corrupted (llama-server: tensor 'blk.17.ffn_down.weight' data is not "
                f"within the file bounds, model is corrupted or incomplete); download it again (log: {LOG})",)),
    ],
    "rpc-worker-gone": [
        Sample(Failure("crash", log(*SERVING), LOG, exc=httpx.RemoteProtocolError("Server disconnected"), pid=4711,
                       workers=(W1, W2), gone=(W2,)),
               (f"llama-server (pid 4711) died during the request: RPC worker {W2} went away", "Restart it",
                "gguf-provider rpc-worker", "drop it from rpc_servers"), {"workers": (W2,)}),
        Sample(Failure("crash", log(*SERVING), LOG, pid=4711, workers=(W1, W2), gone=(W1, W2)),
               (f"RPC workers {W1}, {W2} went away", "Restart the workers", "drop them"), {"workers": (W1, W2)}),
    ],
    "rpc-server-crashed": [
        Sample(Failure("crash", log(*SERVING, f"{RPC_SRC}:35: Remote RPC server crashed or returned malformed "
                                              f"response", *BACKTRACE), LOG, pid=4711, workers=(W1, W2)),
               ("died during the request: an RPC worker broke off", "the next call starts a new server"),
               {"workers": ()}),
    ],
    "context-overflow": [
        Sample(Failure("answer", status=400, body={"error": {
            "code": 400, "message": "request (3000 tokens) exceeds the available context size (2048 tokens), try "
            "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 3000, "n_ctx": 2048}}),
               ("the prompt (3000 tokens) does not fit the context window (2048 tokens)", "larger n_ctx"),
               {"n_prompt_tokens": 3000, "n_ctx": 2048, "status_code": 400}),
        # The type alone (server-context.cpp's "larger than the max context size" error carries no counts).
        Sample(Failure("answer", status=400, body={"error": {
            "code": 400, "message": "input (3000 tokens) is larger than the max context size (2048 tokens). "
            "skipping", "type": "exceed_context_size_error"}}), ("does not fit",), {"n_ctx": None}),
        # The words alone, as an in-stream event (tests/reliability/sse_capture.py's ERROR_LINES).
        Sample(Failure("answer", body={"error": {"message": "the request exceeds the available context size"}}),
               ("does not fit",)),
    ],
    "embedding-batch-too-small": [
        Sample(Failure("answer", status=500, body={"error": {
            "code": 500, "message": "input (700 tokens) is too large to process. increase the physical batch size "
            "(current batch size: 512)", "type": "server_error"}}),
               ("an input of 700 tokens is longer than the 512 tokens", "truncate=True"),
               {"n_prompt_tokens": 700, "n_ctx": 512}),
    ],
    "context-filled": [
        Sample(Failure("answer", status=500, body={"error": {"code": 500, "message": "Context size has been exceeded.",
                                                             "type": "server_error"}}),
               ("context filled up while generating", "max_tokens")),
    ],
    "timeout": [
        Sample(Failure("transport", exc=httpx.ReadTimeout("timed out")),
               ("llama-server did not answer in time (ReadTimeout)", "raise `timeout`")),
        Sample(Failure("transport", exc=httpx.ConnectTimeout("timed out")), ("(ConnectTimeout)",)),
    ],
}


def test_every_entry_has_a_sample() -> None:
    names = [rule.name for rule in TABLE]
    assert len(names) == len(set(names)), names
    missing = [n for n in names if not SAMPLES.get(n)]
    assert not missing, f"entries of diagnose.TABLE without a sample here: {missing}"
    assert set(SAMPLES) <= set(names), sorted(set(SAMPLES) - set(names))


@pytest.mark.parametrize("rule", TABLE, ids=lambda r: r.name)
def test_each_entry_diagnoses_its_samples(rule: diagnose.Rule) -> None:
    for sample in SAMPLES.get(rule.name) or pytest.fail(f"no sample for {rule.name}"):
        found = diagnose.find(sample.failure)
        assert found is not None, f"{rule.name}: no entry knows {sample.failure}"
        assert found[0] is rule, f"{rule.name}'s sample was diagnosed by {found[0].name}"
        err = found[1]
        assert isinstance(err, rule.error)
        for words in sample.says:
            assert words in str(err), (words, str(err))
        for name, value in sample.attrs.items():
            assert getattr(err, name) == value, (name, getattr(err, name))
        if isinstance(err, ServerStartError | ServerCrashedError):  # what the server said stays in the error
            assert err.log_tail == sample.failure.log_tail and err.log_path == LOG


# --- what no entry knows -------------------------------------------------------------------------------------------


def test_a_start_failure_no_entry_knows_is_raised_as_it_was_with_its_log_tail() -> None:
    tail = log(*START[:1], "error: invalid argument: --no-such-flag", "", "usage:", "...")
    exc = ServerStartError("llama-server exited with code 1 while starting. Check the model file and the server "
                           "arguments", tail, LOG)
    assert diagnose.start_failure(exc, model=MODEL, binary=BINARY, workers=(W1,)) is exc
    assert "--no-such-flag" in str(exc) and exc.log_tail == tail


def test_an_rpc_line_is_diagnosed_only_for_the_servers_own_workers() -> None:
    other = ServerStartError("exited", log(*START, f"{RPC_SRC}:547: Failed to connect to 10.0.0.9:50052"), LOG)
    assert diagnose.start_failure(other, model=MODEL, binary=BINARY, workers=(W1, W2)) is other
    no_rpc = ServerStartError("exited", SAMPLES["rpc-not-built"][0].failure.log_tail, LOG)
    assert diagnose.start_failure(no_rpc, model=MODEL, binary=BINARY) is no_rpc
    crashed = SAMPLES["rpc-server-crashed"][0].failure
    assert diagnose.diagnose(Failure("crash", crashed.log_tail, LOG, pid=4711)) is None


def test_an_rpc_failure_wins_over_a_truncated_model_in_one_log() -> None:
    tail = log(SAMPLES["truncated-model"][0].failure.log_tail, f"{RPC_SRC}:547: Failed to connect to {W1}")
    exc = ServerStartError("exited", tail, LOG)
    err = diagnose.start_failure(exc, model=MODEL, binary=BINARY, workers=(W1,))
    assert isinstance(err, RPCWorkerUnreachableError) and err.worker == W1
    assert isinstance(diagnose.start_failure(exc, model=MODEL, binary=BINARY), GGUFFormatError)


@dataclass
class Server:
    """The part of a ``manager.ServerInfo`` the diagnosis reads."""

    pid: int
    log_path: Path
    tail: str

    def log_tail(self) -> str:
        return self.tail


def test_a_crash_no_entry_knows_is_a_server_crash_with_its_log_tail() -> None:
    server = Server(4711, LOG, log(*SERVING, "Segmentation fault (core dumped)"))
    err = diagnose.crash(server, httpx.RemoteProtocolError("Server disconnected without sending a response"))
    assert type(err) is ServerCrashedError
    assert err.log_tail == server.tail and err.log_path == LOG
    assert str(err).startswith("llama-server (pid 4711) died during the request (RemoteProtocolError); the next "
                               "call starts a new one")
    assert "Segmentation fault" in str(err)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_crash_names_the_worker_that_no_longer_listens() -> None:
    """The looked-up fact behind ``rpc-worker-gone``: a worker whose port refuses connections."""
    with socket.socket() as alive:
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        up, down = f"127.0.0.1:{alive.getsockname()[1]}", f"127.0.0.1:{_closed_port()}"
        err = diagnose.crash(Server(4711, LOG, log(*SERVING)), httpx.ReadError("EOF"), (up, down))
        assert isinstance(err, RPCWorkerLostError) and err.workers == (down,)
        assert diagnose.gone_workers((up,), patience=0.1) == ()


def test_an_answer_no_entry_knows_is_an_api_error_with_its_message() -> None:
    err = diagnose.error_from_body(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    assert type(err) is APIError and err.status_code == 503 and str(err) == "llama-server error 503: Loading model"
    text = diagnose.error_from_body(502, "<html><body>502 Bad Gateway</body></html>")
    assert type(text) is APIError and str(text) == "llama-server error 502: <html><body>502 Bad Gateway</body></html>"
    deep: Any = {"message": 1}
    for _ in range(50):
        deep = {"error": deep}
    assert len(str(diagnose.error_from_body(None, deep))) < 400  # bounded, however nested


def test_other_transport_errors_are_left_to_the_engine() -> None:
    """The engine tells a crashed server from an unreachable one (it knows whether the server still runs)."""
    assert diagnose.transport_error(httpx.ConnectError("refused")) is None
    assert diagnose.transport_error(httpx.RemoteProtocolError("disconnected")) is None


# --- the callers go through the table ------------------------------------------------------------------------------


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> EngineClient:
    return EngineClient(Address(url="http://127.0.0.1:8080", injected=httpx.MockTransport(handler)))


def test_the_client_raises_the_tables_errors() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ServerTimeoutError, match=r"did not answer in time \(ReadTimeout\)"):
        _client(hang).tokenize("hi")

    def too_long(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json=SAMPLES["context-overflow"][0].failure.body)

    with pytest.raises(ContextOverflowError) as ei:
        list(_client(too_long).stream_chat({"messages": [{"role": "user", "content": "hi"}]}))
    assert (ei.value.n_prompt_tokens, ei.value.n_ctx) == (3000, 2048)
    with pytest.raises(ContextOverflowError, match="filled up"):
        StreamParser().feed_line('error: {"code":500,"message":"Context size has been exceeded.","type":"server_error"}')


def test_every_error_class_the_table_names_is_ours() -> None:
    assert all(issubclass(rule.error, GGUFProviderError) for rule in TABLE)
