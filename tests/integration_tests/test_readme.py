"""Every example in README.md runs as written after `make demo`: each ```python block in a fresh interpreter, the
```ipython blocks (the Jupyter magics) one after another in one IPython shell, each in a subprocess.

The environment is what `make demo` leaves: the installed llama-server and SmolLM2 in the models dir, no network
(``HF_HUB_OFFLINE=1``). A private gguf-provider home and runtime dir per run keep each run's server its own, and
``GGUF_PROVIDER_KEEP_ALIVE=0`` stops it when the example ends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import speed

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
# What an example makes SmolLM2 do, for tests/support/speed.py's bound: server starts and tokens (generated, and
# prompts processed: no faster under load), with the interpreter's start and imports counted in both. The most of
# any python block: two servers (a chat and an embedding one) or a stream and a tool call of 64 tokens each. Under
# 2 hogs on 2 cores (measured: 4 tokens/s, start 1.1 s) block 1 took 154 s and the ipython blocks 133 s: bounds of
# 613 s and 413 s.
PYTHON_WORK = {"tokens": 600, "starts": 3}
IPYTHON_WORK = {"tokens": 400, "starts": 3}  # one server, a 64-token reply


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def test_the_readme_has_examples() -> None:
    assert len(blocks("python")) >= 2 and blocks("ipython")


def _env() -> dict[str, str]:
    from gguf_provider.runtime._common import paths
    from gguf_provider.runtime._install import discovery

    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env.update({
        "HF_HUB_OFFLINE": "1",
        "GGUF_PROVIDER_LLAMA_SERVER": str(discovery.find_llama_server()),
        "GGUF_PROVIDER_MODELS": str(paths.models_dir()),
        "GGUF_PROVIDER_HOME": tempfile.mkdtemp(prefix="gguf-readme-home-"),
        "GGUF_PROVIDER_RUNTIME_DIR": tempfile.mkdtemp(prefix="gpr-", dir="/tmp"),
        "GGUF_PROVIDER_KEEP_ALIVE": "0",
        "PYTHONPATH": str(ROOT),
    })
    return env


def _run(args: list[str], what: str, work: dict[str, int]) -> str:
    """``work``'s bound for the run; the test's own (speed_timeout) has one start more."""
    t0 = time.monotonic()
    bound = speed.measure("smollm2").bound(**work)
    proc = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=bound)
    took = time.monotonic() - t0
    assert proc.returncode == 0, f"{what} failed after {took:.0f} s:\n{proc.stdout}\n{proc.stderr}"
    print(f"{what}: {took:.1f} s")
    return proc.stdout


@pytest.fixture(scope="module", autouse=True)
def _demo_model() -> None:
    from scripts.test_models import ensure

    ensure("smollm2")  # what `make demo` fetches


@pytest.mark.speed_timeout("smollm2", tokens=PYTHON_WORK["tokens"], starts=PYTHON_WORK["starts"] + 1)
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs(index: int) -> None:
    code = blocks("python")[index]
    out = _run([sys.executable, "-c", code], f"README python block {index + 1}", PYTHON_WORK)
    assert out.strip(), "the example printed nothing"


# The ipython blocks as cells of one shell (a cell magic must start its cell); a failed cell fails the run.
SHELL = """
import sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
try:
    for cell in CELLS:
        result = shell.run_cell(cell)
        if not result.success:
            sys.exit(f"cell failed: {cell!r}")
    answer = shell.user_ns.get("answer")
    print("ANSWER", type(answer).__name__, bool(isinstance(answer, str) and answer.strip()))
finally:
    shell.run_line_magic("gguf", "unload --all")
"""


@pytest.mark.speed_timeout("smollm2", tokens=IPYTHON_WORK["tokens"], starts=IPYTHON_WORK["starts"] + 1)
def test_ipython_blocks_run() -> None:
    out = _run([sys.executable, "-c", f"CELLS = {blocks('ipython')!r}\n{SHELL}"], "README ipython blocks",
               IPYTHON_WORK)
    assert re.search(r"^ANSWER str True$", out, re.M), out  # `%%gguf -o answer` kept the reply: a non-empty str
