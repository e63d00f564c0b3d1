"""Integration fixtures: a local Hugging Face-compatible endpoint serving repos built from the real test models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_provider.runtime._common.process import free_port
from tests.integration_tests.test_rpc import Worker
from tests.support.hf_endpoint import FixtureFiles, HFEndpoint, ensure_fixture_files
from tests.support.hf_repos import AUTO, BROKEN, FLAKY, MAIN, ODD, PRIVATE, SPLIT, TOKEN, TRICKY
from tests.support.runtime import RuntimeEnv
from tests.support.tools import tool_path


@pytest.fixture(scope="session")
def files() -> FixtureFiles:
    for tool in ("llama-quantize", "llama-gguf-split"):
        assert tool_path(tool) is not None, f"{tool} is not built: run `gguf-provider server install`"
    return ensure_fixture_files()


@pytest.fixture(scope="session")
def endpoint(files: FixtureFiles) -> Iterator[HFEndpoint]:
    q = files.quants
    hub = HFEndpoint()
    hub.add_repo(MAIN, {
        "README.md": b"---\nlibrary_name: gguf\n---\n# SmolLM2 test repo\n",
        "SmolLM2-135M-Instruct-IQ4_XS.gguf": q["IQ4_XS"],
        "SmolLM2-135M-Instruct-Q4_K_M.gguf": q["Q4_K_M"],
        "SmolLM2-135M-Instruct-Q8_0.gguf": q["Q8_0"],
        "mmproj-model-f16.gguf": files.source,  # a real (small) GGUF standing in for a projector
        "mmproj-model-Q4_K_M.gguf": q["IQ4_XS"],
    })
    hub.add_repo(AUTO, {f"SmolLM2-135M-Instruct-{k}.gguf": q[k] for k in ("Q2_K", "Q4_K_M", "Q6_K", "Q8_0", "F16")})
    # Names where a substring match picks the wrong file (IQ4_K_M sorts before Q4_K_M, BF16 before F16).
    hub.add_repo(TRICKY, {
        "tricky-BF16.gguf": q["Q8_0"],
        "tricky-F16.gguf": files.source,
        "tricky-IQ4_K_M.gguf": q["IQ4_XS"],
        "tricky-Q4_K_M.gguf": q["Q4_K_M"],
    })
    split = {f"Q4_1/{p.name}": p for p in files.split}
    hub.add_repo(SPLIT, {**split, "SmolLM2-135M-Instruct-Q8_0.gguf": q["Q8_0"]})
    hub.add_repo(ODD, {"odd-Q6_K.gguf": q["Q8_0"], "odd-Q5_0.gguf": q["IQ4_XS"], "odd-Q5_1.gguf": q["Q4_K_M"]})
    hub.add_repo(FLAKY, {"flaky-Q4_K_M.gguf": q["Q4_K_M"]})
    hub.add_repo(BROKEN, {"broken-Q4_K_M.gguf": q["Q4_K_M"]})
    hub.add_repo(PRIVATE, {"private-Q4_K_M.gguf": q["Q4_K_M"]}, token=TOKEN)
    with hub:
        yield hub


@pytest.fixture
def hub(endpoint: HFEndpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HFEndpoint:
    """Point huggingface_hub at the local endpoint and an empty cache (its constants are read at import)."""
    from huggingface_hub import constants

    hf_home = tmp_path / "hf"
    cache = hf_home / "hub"
    monkeypatch.setenv("HF_ENDPOINT", endpoint.url)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
    endpoint.requests.clear()
    return endpoint


@pytest.fixture
def worker(rt: RuntimeEnv) -> Iterator[Worker]:
    """A local `gguf-provider rpc-worker` (a real non-CPU device to llama.cpp, RPC0) for one test."""
    w = Worker(free_port())
    try:
        w.wait_listening()
        yield w
    finally:
        w.stop()
