"""Record the loop-guard corpora (tests/unit_tests/data/loops/) from the real test models.

``loops/``: replies of SmolLM2-135M and Qwen2.5-Coder-0.5B at temperature 0 that fell into a cycle (generated with
the guard off, then cut at ``MAX_TOKENS``; a loop prompt whose reply ended by itself goes to ``wanted/``). ``wanted/``: replies that repeat on purpose (numbered lists, tables,
counting, identical JSON objects the prompt asks for) and must never be cut. Each file is the raw reply text; the
first line of the prompts below is the file name. Re-run after a llama.cpp update:
``python scripts/capture_loops.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gguf_provider.engine import Engine, EngineConfig  # noqa: E402
from scripts.test_models import ensure  # noqa: E402

OUT = ROOT / "tests" / "unit_tests" / "data" / "loops"
MAX_TOKENS = 700

LOOP_PROMPTS: dict[str, dict[str, Any]] = {
    "smollm2": {
        "story": "Write a long story about a cat who lives in a lighthouse.",
        "facts": "List facts about the moon.",
        "poem": "Write a poem about the sea.",
        "json_people": "Return a JSON list of people with name and age.",
        "explain": "Explain recursion.",
        "list_fruits": "List fruits, one per line.",
        "json_schema_people": ("Give me people.", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "people", "schema": {"type": "object", "properties": {"people": {"type": "array", "items": {
                "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"]}}}, "required": ["people"]}}}}),
    },
    "qwen": {
        "story": "Write a long story about a cat who lives in a lighthouse.",
        "json_people": "Return a JSON list of people with name and age.",
        "explain": "Explain recursion in detail.",
        "sql": "Write SQL to create tables for a library.",
        "numbered_b_words": "Give a numbered list of 40 English words that start with the letter b.",
    },
}
WANTED_PROMPTS: dict[str, dict[str, Any]] = {
    "qwen": {
        "count_1_200": "Print the numbers from 1 to 200, separated by commas, and nothing else.",
        "table": "Write a markdown table of the multiplication table of 7 from 1 to 30 (columns: n, 7 × n).",
        "same_objects": 'Return a JSON array with exactly 12 identical objects {"status": "ok", "code": 200}. '
                        "Only the JSON.",
        "repeated_code": "Write a Python function that prints each of the 20 numbers 1 to 20 with its own "
                         "print call, one call per line, no loop.",
    },
}


def run(model_key: str, prompts: dict[str, str | tuple[str, dict[str, Any]]], folder: str) -> None:
    engine = Engine(EngineConfig(model_path=str(ensure(model_key)), n_ctx=4096, keep_alive=0))
    try:
        for name, spec in prompts.items():
            prompt, extra = spec if isinstance(spec, tuple) else (spec, {})
            payload = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                       "max_tokens": MAX_TOKENS if folder == "loops" else 2000, **extra}
            reply = engine.chat(payload, loop_guard=False)
            # A loop prompt whose reply ended by itself did not loop: it joins the replies never to cut.
            where = "loops" if folder == "loops" and reply.finish_reason == "length" else "wanted"
            text = reply.content
            path = OUT / where / f"{model_key}_{name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"{path.relative_to(ROOT)}: {len(text)} chars")
    finally:
        engine.unload()


def main() -> None:
    """``capture_loops.py [loops|wanted] [NAME ...]``: all, one folder, or only the named prompts."""
    args = sys.argv[1:]
    folders = [a for a in args if a in ("loops", "wanted")] or ["loops", "wanted"]
    names = {a for a in args if a not in ("loops", "wanted")}
    groups: dict[str, dict[str, dict[str, Any]]] = {"loops": LOOP_PROMPTS, "wanted": WANTED_PROMPTS}
    for folder in folders:
        for model_key, prompts in groups[folder].items():
            chosen = {k: v for k, v in prompts.items() if not names or k in names}
            if chosen:
                run(model_key, chosen, folder)


if __name__ == "__main__":
    main()
