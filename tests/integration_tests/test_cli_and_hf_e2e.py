"""The CLI (pull, models, serve, ps, stop) and a model named by Hugging Face repo answering through ChatGGUF,
against the local HF endpoint and the real llama-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from gguf_provider import ChatGGUF
from gguf_provider.runtime._serve import registry
from tests.support.hf_endpoint import HFEndpoint
from tests.support.hf_repos import MAIN, SPLIT
from tests.support.runtime import reap, serving_line

CLI = [sys.executable, "-m", "gguf_provider.cli"]
# The slowest here: the Hub fixture's first set-up (~25 s) and two servers (~15 s under 2 hogs on 2 cores); 15x.
pytestmark = pytest.mark.timeout(600)


def _env(hub: HFEndpoint) -> dict[str, str]:
    """The environment a user would set: huggingface_hub reads these at import in the CLI's process."""
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_XET", "GGUF_PROVIDER_HOME",
            "GGUF_PROVIDER_KEEP_ALIVE")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update({k: os.environ[k] for k in keys if k in os.environ})
    return env


def test_chatgguf_from_a_hf_repo_and_a_split_set(hub: HFEndpoint) -> None:
    for spec in (f"{MAIN}:Q8_0", SPLIT + ":Q4_1"):
        llm = ChatGGUF(model=spec, n_ctx=1024, temperature=0, max_tokens=8)
        msg = llm.invoke("Say hello.")
        assert isinstance(msg.content, str) and msg.content
        props = llm.engine.client.get_json("/props")
        assert "/snapshots/" in props["model_path"]  # served from the standard HF cache
        llm.unload()


def test_cli_pull_then_models_lists_it(hub: HFEndpoint) -> None:
    env = _env(hub)
    out = subprocess.run([*CLI, "pull", f"{MAIN}:Q8_0"], capture_output=True, text=True, env=env, check=True)
    path = Path(out.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.name == "SmolLM2-135M-Instruct-Q8_0.gguf"
    listed = json.loads(subprocess.run([*CLI, "models", "--json"], capture_output=True, text=True, env=env,
                                       check=True).stdout)
    assert any(m.get("repo") == MAIN and m.get("quant") == "Q8_0" for m in listed)
    bad = subprocess.run([*CLI, "pull", f"{MAIN}:Q3_K_S"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "Q8_0" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_serve_ps_stop(smollm2_path: Path) -> None:
    """`serve` on a TCP port: listed by `ps --json`, refuses requests without the key, stopped by `stop`. Server
    options given as flags (gguf_provider/flags.py) reach the server's command line and `ps`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    serve = subprocess.Popen([*CLI, "serve", str(smollm2_path), "--port", "0", "--ctx", "1024", "--n-parallel", "2",
                              "--cache-reuse", "0", "--no-prompt-cache", "--server-arg=--threads", "--server-arg",
                              "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert serve.stdout is not None
        line = serving_line(serve.stdout)
        assert line.startswith("serving"), line
        rows = json.loads(subprocess.run([*CLI, "ps", "--json"], capture_output=True, text=True,
                                         check=True).stdout)["servers"]
        row = next(r for r in rows if r["model"] == str(smollm2_path) and str(r["address"]).startswith("http"))
        url = row["address"]
        assert row["pid"] > 0 and row["ctx"] == 1024 and row["rss"] > 0 and row["leases"] == 1
        assert row["idle_s"] >= 0 and row["shared"] is True
        given = {"n_parallel": 2, "cache_reuse": 0, "prompt_cache": False, "server_args": ["--threads", "1"]}
        assert {k: row["options"].get(k) for k in given} == given, row["options"]
        argv = psutil.Process(row["pid"]).cmdline()
        assert argv[argv.index("-np") + 1] == "2" and argv[-2:] == ["--threads", "1"]
        assert "--cache-reuse" not in argv and "--slot-save-path" not in argv
        # Local requests: milliseconds, under load too; 5 s is 100x.
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
        entry = next(e for e in registry.read().values() if e.url == url)
        assert entry.api_key_file and row["key_file"] == entry.api_key_file  # `ps --json` names it
        key_line = serve.stdout.readline()  # and `serve` says where it is
        assert entry.api_key_file in key_line and "Bearer" in key_line, key_line
        key = Path(entry.api_key_file).read_text().strip()
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
        stop = subprocess.run([*CLI, "stop", row["id"]], capture_output=True, text=True, check=True)
        assert f"stopped pid {row['pid']}" in stop.stdout
        # `stop` returned once the server had exited (SIGKILL past its grace): nothing listens on the port now.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=5)
        t0 = time.monotonic()
        serve.wait(timeout=60)  # serve sees its server gone at its 1 s poll (cli.py), then exits: <0.1 s, loaded too
        print(f"serve exited {time.monotonic() - t0:.1f} s after the stop")
        assert serve.returncode == 0
    finally:
        reap(serve)


def test_cli_stop_unknown_id_fails() -> None:
    out = subprocess.run([*CLI, "stop", "doesnotexist"], capture_output=True, text=True)
    assert out.returncode == 1 and "no server 'doesnotexist'" in out.stderr
