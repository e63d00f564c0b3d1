"""Without an extra, every way in says which `pip install` to run: the top-level lazy names and the subpackages.

Each case runs in a fresh interpreter where a ``sys.meta_path`` finder makes the framework unimportable, as it is
where the extra was never installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BLOCK = textwrap.dedent("""
    import sys

    class Missing:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    try:
        {statement}
    except ImportError as exc:
        assert type(exc) is ImportError, type(exc)  # not the bare ModuleNotFoundError
        print(exc)
    else:
        raise SystemExit("imported without the framework")
""")


@pytest.mark.parametrize(("statement", "blocked", "extra"), [
    ("from gguf_provider.llama_index import GGUF", ("llama_index",), "llama-index"),
    ("from gguf_provider.llama_index import GGUFEmbedding", ("llama_index",), "llama-index"),
    ("from gguf_provider.langchain import ChatGGUF", ("langchain_core",), "langchain"),
    ("from gguf_provider.jupyter import GGUFMagics", ("IPython",), "jupyter"),
    ("from gguf_provider import GGUF", ("llama_index",), "llama-index"),
    ("from gguf_provider import GGUFEmbeddings", ("langchain_core",), "langchain"),
])
def test_a_missing_framework_names_the_pip_install(statement: str, blocked: tuple[str, ...], extra: str) -> None:
    code = BLOCK.format(blocked=set(blocked), statement=statement)
    # ~0.2 s under 2 hogs and a build on 2 cores; 300x.
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"pip install 'gguf-provider[{extra}]'" in proc.stdout, proc.stdout
