"""Write notebooks/quickstart.ipynb's cells and execute it with nbclient, saving the real outputs.

    python tests/support/make_notebook.py [--no-execute]
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"

CELLS = [
    ("md", "# gguf-provider in a notebook\n\nLoad a local GGUF model once, then chat with it cell by cell. The "
           "reply streams into the cell output; history is kept per model."),
    ("code", "%load_ext gguf_provider"),
    ("code", "%gguf load SmolLM2-135M-Instruct --ctx 2048"),
    ("md", "A `%%gguf` cell is one user message. `-t` sets the temperature, `-n` the maximum tokens."),
    ("code", "%%gguf -t 0 -n 60\nWhat is the capital of France? Answer in one sentence."),
    ("md", "`{name}` is filled from the notebook's variables (`{{` and `}}` are literal braces); `-o VAR` stores "
           "the reply text."),
    ("code", 'topic = "rainbows"'),
    ("code", "%%gguf -o answer -t 0 -n 60\nExplain {topic} in one sentence."),
    ("code", "print(len(answer) > 0, answer[:200])"),
    ("code", "%gguf history"),
    ("md", "`-f code` puts the code of the reply into a new cell below."),
    ("code", "%%gguf -f code -t 0 -n 120 --no-history\nWrite a Python function add(a, b) that returns a + b, "
             "in a ```python code block."),
    ("code", "%gguf ps"),
    ("code", "%gguf unload"),
]


def build(cells: list[tuple[str, str]] = CELLS) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    return nb


def checked_fresh(path: Path, fresh: nbformat.NotebookNode, script: str) -> nbformat.NotebookNode:
    """``fresh`` (the cells as the generator writes them), after checking that the committed notebook at ``path``
    has the same cells and shows real outputs."""
    committed = nbformat.read(path, as_version=4)
    assert [c.source for c in committed.cells] == [c.source for c in fresh.cells], \
        f"{path.relative_to(ROOT)} is stale: run python {script}"
    assert any(c.get("outputs") for c in committed.cells), "the committed notebook must show real outputs"
    return fresh


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 300) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def main(argv: list[str]) -> int:
    nb = build()
    if "--no-execute" not in argv:
        execute(nb, ROOT / "notebooks")
    NOTEBOOK.parent.mkdir(exist_ok=True)
    nbformat.write(nb, NOTEBOOK)
    print(NOTEBOOK)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
