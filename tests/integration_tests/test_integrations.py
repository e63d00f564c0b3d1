"""The integration scripts in integrations/, run as a user would: a subprocess, offline, default model.

Each must print its result and leave no llama-server behind (they run with keep_alive=0).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _script_env() -> dict[str, str]:
    """A private gguf-provider home and runtime dir per script (the models and the build found as usual), so a
    script's server is its own, never one that this test session's objects happen to share."""
    from gguf_provider.runtime._common import paths
    from gguf_provider.runtime._install import discovery

    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env["PYTHONPATH"] = str(ROOT)
    env["HF_HUB_OFFLINE"] = "1"
    env["GGUF_PROVIDER_LLAMA_SERVER"] = str(discovery.find_llama_server())
    env["GGUF_PROVIDER_MODELS"] = str(paths.models_dir())
    env["GGUF_PROVIDER_HOME"] = tempfile.mkdtemp(prefix="gguf-script-home-")
    env["GGUF_PROVIDER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="gps-", dir="/tmp")
    return env


def _run(script: str, *args: str) -> tuple[str, dict[str, str]]:
    """The script's output; each test's timeout marker bounds it (pytest-timeout's exception kills the child)."""
    env = _script_env()
    proc = subprocess.run([sys.executable, str(ROOT / "integrations" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout, env


def _assert_no_server_left(out: str, env: dict[str, str]) -> None:
    m = re.search(r"pid (\d+)", out)
    assert m, out
    pid = int(m.group(1))
    ps = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "ps", "--json"], cwd=ROOT, capture_output=True,
                        text=True, check=True, env=env)
    assert pid not in [row["pid"] for row in json.loads(ps.stdout)["servers"]], "the script's server is still registered"
    deadline = time.monotonic() + 10  # the script stopped it before exiting: gone at the first look under load
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"llama-server pid {pid} still running after the script ended"
        time.sleep(0.1)


@pytest.fixture(scope="module", autouse=True)
def _models() -> None:
    from scripts.test_models import ensure

    ensure("smollm2")
    ensure("qwen")


# Each script's timeout: 10x its run on a loaded 2-core machine (both cores busy beside it), given per test.
@pytest.mark.timeout(120)  # ~11 s under load
def test_langchain_chat_script() -> None:
    out, env = _run("langchain_chat.py", "Say hello.", "--max-tokens", "24")
    assert re.search(r"[\d.]+ tokens/s", out), out
    assert "SmolLM2-135M-Instruct" in out
    _assert_no_server_left(out, env)


@pytest.mark.timeout(300)  # ~21 s under load
def test_langchain_agent_script() -> None:
    """--require-tool: the first step's call is constrained, so it happens on any CPU; the city and the answer's
    words are the model's, so the output is checked for its structure: each call's line shows the tool's own
    result for its arguments, and the run ends with a text answer that is no call written as text."""
    from gguf_provider.tools import heal_tool_calls

    out, env = _run("langchain_agent.py", "--require-tool")
    calls = re.findall(r"^\[step (\d+)\] tool call (\w+)\((\{.*\})\) -> (.*)$", out, re.M)
    assert calls and calls[0][0] == "1" and all(name == "get_weather" for _, name, _, _ in calls), out
    for _, _, args, result in calls:
        city = ast.literal_eval(args)["city"]
        assert isinstance(city, str) and result == f"It is sunny and 21 degrees Celsius in {city}.", out
    m = re.search(r"\n\n(.*)\n\n\[(\d+) tool call\(s\), \d+ messages\]\n*$", out, re.S)
    assert m and int(m.group(2)) == len(calls), out
    answer = m.group(1).rsplit("[step", 1)[-1].split("\n", 1)[-1]
    assert answer.strip() and heal_tool_calls(answer, {"get_weather"}) is None, out
    _assert_no_server_left(out, env)


@pytest.mark.timeout(1100)  # ~108 s under load
def test_langchain_structured_script() -> None:
    """json_schema (the default method): the grammar guarantees the keys and their types; the values are the
    model's reading of the text, which differs between CPUs."""
    out, env = _run("langchain_structured.py")
    data = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert {k: type(v) for k, v in data.items()} == {"name": str, "age": int, "job": str, "city": str}, data
    assert "tokens/s" in out
    _assert_no_server_left(out, env)


def _script_servers(env: dict[str, str]) -> set[int]:
    """The llama-servers started under the script's private home (they inherit its environment); other work on the
    machine (a benchmark alongside) may start and stop llama-servers of its own meanwhile."""
    pids = set()
    for p in psutil.process_iter():
        try:
            if p.name().startswith("llama-server") and p.status() != psutil.STATUS_ZOMBIE \
                    and p.environ().get("GGUF_PROVIDER_HOME") == env["GGUF_PROVIDER_HOME"]:
                pids.add(p.pid)
        except psutil.Error:
            pass
    return pids


def _assert_no_script_server(env: dict[str, str]) -> None:
    deadline = time.monotonic() + 10  # the script stopped them before exiting: none at the first look under load
    while _script_servers(env):
        assert time.monotonic() < deadline, f"llama-servers left behind: {_script_servers(env)}"
        time.sleep(0.1)


@pytest.mark.timeout(650)  # ~62 s under load
def test_llamaindex_agent_script() -> None:
    """The first step's call is constrained (initial_tool_choice), so it happens on any CPU; the fruit it names is
    the model's: the tool's line and the final answer (return_direct) are the tool's own output for it."""
    from integrations.llamaindex_agent import fruit_price

    out, env = _run("llamaindex_agent.py")
    m = re.search(r"^\[call\] fruit_price\((\{.*\})\)$", out, re.M)
    assert m, out
    fruit = ast.literal_eval(m.group(1))["fruit"]
    assert isinstance(fruit, str), out
    assert f"[tool] fruit_price({m.group(1)}) -> {fruit_price(fruit)}" in out, out
    assert out.rstrip().endswith(f"final answer: {fruit_price(fruit)}"), out
    _assert_no_script_server(env)


@pytest.mark.timeout(450)  # ~42 s under load
def test_llamaindex_query_engine_script() -> None:
    """The default run on three pages of docs/ (all of docs/ takes minutes to embed on 2 cores): index them with
    GGUFEmbedding, stream the answer of GGUF, list the sources."""
    pages = [a for name in ("index.md", "runtime.md", "vision.md") for a in ("--docs", str(ROOT / "docs" / name))]
    out, env = _run("llamaindex_query_engine.py", "--max-tokens", "48", *pages)
    assert re.search(r"indexing \d+ documents with all-MiniLM-L6-v2", out), out
    assert "context window 4096 tokens" in out, out
    answer = out.split("> How does gguf-provider start and share llama-server?", 1)[1].split("sources:", 1)[0]
    assert answer.strip(), out
    # The retriever's top two (--top-k 2 by default), best first, each a passage of the page it names. Which pages
    # rank first is MiniLM's reading of the docs' current wording: not pinned here.
    sources = re.findall(r"^  \[(-?\d\.\d+)\] (\S+\.md): (.*)\.\.\.$", out, re.M)
    assert len(sources) == 2, out
    scores = [float(score) for score, _, _ in sources]
    assert scores == sorted(scores, reverse=True) and all(-1 <= x <= 1 for x in scores), out
    for _, name, snippet in sources:
        assert name in ("index.md", "runtime.md", "vision.md"), out
        page = " ".join((ROOT / "docs" / name).read_text().split())  # the script prints a chunk's first 90 characters
        assert " ".join(snippet.split()) in page, (name, snippet)
    _assert_no_script_server(env)
