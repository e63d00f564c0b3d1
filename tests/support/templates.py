"""The chat templates of the family table (copies from the pinned llama.cpp tree, tests/unit_tests/data/templates)."""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "unit_tests" / "data" / "templates"


def template_path(name: str) -> Path:
    return TEMPLATES / f"{name}.jinja"


def template_source(name: str) -> str:
    return template_path(name).read_text(encoding="utf-8")
