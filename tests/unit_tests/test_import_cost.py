"""Import hygiene, offline: importing the package or an adapter loads what the import needs, not what the first call
needs (starting a server: the manager, installing, model lookup on the Hub). Checked by module names in a fresh
interpreter, not by timing; bench P3 measures the time (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Needed at the first call, not at import: the server manager and what only it imports.
CALL_TIME = (
    "gguf_provider.runtime._serve.manager", "gguf_provider.runtime._install.install", "gguf_provider.runtime._install.prebuilt",
    "gguf_provider.runtime._models", "gguf_provider.runtime._serve.budget", "gguf_provider.runtime._memory.plan",
    "gguf_provider.runtime._serve.registry", "gguf_provider.runtime._memory.devices",
    "huggingface_hub", "filelock", "tarfile", "tqdm",
    "httpx",  # only once a server is asked something (with its CLI's click/rich/pygments when installed)
)


def _loaded(statement: str) -> set[str]:
    """The modules loaded after ``statement`` in a fresh interpreter."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_package_import_loads_only_errors_and_logging() -> None:
    loaded = _loaded("import gguf_provider")
    ours = {m for m in loaded if m.startswith("gguf_provider.")}
    assert ours <= {"gguf_provider.errors", "gguf_provider.logs"}, sorted(ours)
    third_party = ("httpx", "pydantic", "psutil", "platformdirs", "langchain_core", "llama_index", "IPython",
                   *CALL_TIME)
    assert not [m for m in third_party if m in loaded]


@pytest.mark.parametrize(("statement", "framework", "others"), [
    ("from gguf_provider import ChatGGUF", "from langchain_core.language_models import BaseChatModel",
     ("gguf_provider.langchain.embeddings", "gguf_provider.langchain.rerank", "llama_index")),
    ("from gguf_provider.llama_index import GGUF", "from llama_index.core.llms.function_calling import FunctionCallingLLM",
     ("gguf_provider.llama_index.embeddings", "gguf_provider.llama_index.postprocessor", "langchain_core")),
])
def test_adapter_import_defers_what_the_first_call_needs(statement: str, framework: str,
                                                         others: tuple[str, ...]) -> None:
    pytest.importorskip(framework.split()[1])
    theirs = _loaded(framework)  # what the framework loads itself is not ours to defer
    loaded = _loaded(f"{statement}; import gguf_provider.options as o; "
                     "assert not o.ChatOptions.__pydantic_complete__, 'an option group built its schema at import'")
    assert not [m for m in (*CALL_TIME, *others) if m in loaded and m not in theirs]


def test_adapters_still_build_their_schema_at_import() -> None:
    """The option groups defer their pydantic schemas; an adapter does not (its first instance costs no build)."""
    _loaded("from gguf_provider import ChatGGUF; assert ChatGGUF.__pydantic_complete__, 'ChatGGUF deferred its schema'")
