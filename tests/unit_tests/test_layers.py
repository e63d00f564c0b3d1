"""The layers point one way (docs/architecture.md): runtime → client/events → engine → chat → options → adapters.

Read from the source with ``ast``: a module may import its own layer and those below it, never one above, and
``runtime/`` imports no framework.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "gguf_provider"

# Lower number = lower layer. A module imports only modules of a layer <= its own.
LAYERS = {"errors": 0, "tools": 0, "loops": 0, "runtime": 1, "events": 2, "client": 2, "media": 2.5, "engine": 3,
          "chat": 4, "status": 4,
          "options": 5, "langchain": 6, "llama_index": 6, "jupyter": 6, "magics": 6, "cli": 6, "__init__": 7}
FRAMEWORKS = ("langchain_core", "langchain", "llama_index", "IPython", "pydantic", "ipywidgets")


def _layer(parts: tuple[str, ...]) -> int:
    return LAYERS[parts[0].removesuffix(".py")]


def _imports(path: Path) -> list[tuple[str, int]]:
    """(absolute dotted module, line) of every import in ``path``, relative imports resolved."""
    package = path.relative_to(PKG.parent).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, node.module)) if node.module else ".".join(base)
            out.append((module, node.lineno))
            if not node.module:  # from . import x: each name may be a module
                out += [(f"{module}.{a.name}", node.lineno) for a in node.names]
    return out


SOURCES = sorted(p for p in PKG.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path: Path) -> None:
    rel = path.relative_to(PKG).parts
    own = _layer(rel)
    for module, line in _imports(path):
        parts = module.split(".")
        if parts[0] != "gguf_provider" or len(parts) == 1:
            continue
        if parts[1] not in {p.removesuffix(".py") for p in LAYERS}:
            continue
        assert _layer(tuple(parts[1:])) <= own, f"{path.relative_to(PKG)}:{line} imports {module} (a layer above)"


@pytest.mark.parametrize("path", sorted((PKG / "runtime").rglob("*.py")), ids=lambda p: p.name)
def test_runtime_imports_no_framework(path: Path) -> None:
    for module, line in _imports(path):
        assert module.split(".")[0] not in FRAMEWORKS, f"runtime/{path.name}:{line} imports {module}"


def test_every_module_has_a_layer() -> None:
    tops = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in SOURCES}
    assert tops <= set(LAYERS), sorted(tops - set(LAYERS))
