"""gguf-provider's log records for what users debug: a start, an attach to the shared server and an eviction (the
count limit, as tests/integration_tests/test_runtime_budget.py uses it), each naming the model and the server's log
file; never an API key. Real servers and models."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.runtime._serve import budget
from tests.support.runtime import RuntimeEnv, pid_alive

pytestmark = pytest.mark.slow


def _engine(path: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(model_path=str(path), **{"n_ctx": 1024, "keep_alive": 300, **kw}))  # type: ignore[arg-type]


def _records(caplog: pytest.LogCaptureFixture, name: str, level: int, *needles: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == name and r.levelno == level
            and all(n in r.getMessage() for n in needles)]


def test_start_attach_and_eviction_are_logged_with_the_server_log(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, smollm2_path: Path,
        gemma_path: Path) -> None:
    caplog.set_level(logging.INFO, logger="gguf_provider")
    first = _engine(smollm2_path)
    info = first.load()
    log_path = str(info.log_path)
    assert Path(log_path).is_file()
    # The model's resolution, then the start and its readiness, each with the server's log file.
    assert _records(caplog, "gguf_provider.runtime._models.resolve", logging.INFO, smollm2_path.name, "resolved to")
    assert _records(caplog, "gguf_provider.runtime._serve.manager", logging.INFO, "starting llama-server",
                    smollm2_path.name, log_path)
    assert _records(caplog, "gguf_provider.runtime._serve.manager", logging.INFO, f"pid {info.pid}", "is ready",
                    log_path)
    assert _records(caplog, "gguf_provider.runtime._serve.budget", logging.INFO, "admitted", smollm2_path.name)

    caplog.clear()
    second = _engine(smollm2_path)  # the shared server: attached, not started
    assert second.load().pid == info.pid
    assert _records(caplog, "gguf_provider.runtime._serve.manager", logging.INFO, "attached to the running server",
                    f"pid {info.pid}", smollm2_path.name, log_path)
    assert not _records(caplog, "gguf_provider.runtime._serve.manager", logging.INFO, "starting llama-server")
    second.unload()
    first.unload()  # idle now, kept alive for 300 s

    caplog.clear()
    monkeypatch.setenv(budget.MAX_MODELS_ENV, "1")
    other = _engine(gemma_path, port=0)  # a TCP server with a generated API key: the key is never logged
    other_info = other.load()
    assert not pid_alive(info.pid)  # the eviction stopped it (SIGTERM, SIGKILL after a grace) before load returned
    assert _records(caplog, "gguf_provider.runtime._serve.budget", logging.INFO, "evicting idle server", f"pid {info.pid}",
                    smollm2_path.name, log_path)
    assert _records(caplog, "gguf_provider.runtime._serve.budget", logging.INFO, "stopped idle server", f"pid {info.pid}",
                    "to make room for", gemma_path.name, budget.MAX_MODELS_ENV)
    assert _records(caplog, "gguf_provider.runtime._serve.registry", logging.INFO, "stopping server", f"pid {info.pid}",
                    log_path)
    key = other_info.address.api_key
    assert key and len(key) > 16
    assert not [r for r in caplog.records if key in r.getMessage()]
    other.unload()
