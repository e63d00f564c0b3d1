"""The layers point one way and nothing imports in a circle.

The contracts live in pyproject.toml's ``[tool.importlinter]`` (the package's layers, the runtime's own order, no
framework in ``runtime/``, no cycle between the modules of a package); ``make lint`` and ``make test`` run them
with import-linter's ``lint-imports``, and this test runs it too so ``make unit`` checks them. What import-linter
has no contract for is checked here from its import graph: a module importing its own package while that package
imports it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # ~0.8 s under 2 hogs + a build; 150x
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_import_cycle_anywhere() -> None:
    """Every direct import ``a -> b`` with no way back from ``b`` to ``a``, packages' ``__init__`` included."""
    graph = grimp.build_graph("gguf_provider", cache_dir=None)
    back = sorted((a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                  if graph.chain_exists(importer=b, imported=a))
    assert back == [], f"imports that are part of a cycle: {back}"
