"""Write docs/models.md: the model-family table, from gguf_provider/families.py (so it cannot drift).

Usage: ``python scripts/gen_models.py`` (the unit tests compare docs/models.md with ``render()``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gguf_provider import families  # noqa: E402

TARGET = ROOT / "docs" / "models.md"

THINKING = {"switch": "on/off", "effort": "always, at an effort", "always": "always", "none": "none"}
OFF = {"switch": '`reasoning_effort: "none"`', "effort": "low effort, warns", "always": "nothing, warns",
       "none": "nothing"}

HEAD = """# Model families

gguf-provider recognises a model's family from the chat template its server runs (`/props`), and decides from it
what `reasoning=` sends and how tool calls and results are passed. Each row was tested through our pinned
llama-server, with SmolLM2 loaded under the family's template from llama.cpp's `models/templates/`
(`tests/integration_tests/test_families.py`): a call in the family's format arrives as `tool_calls` in `ChatGGUF`,
`GGUF` and `%%gguf` (streamed and whole, arguments intact), reasoning arrives as reasoning, the thinking switch
changes the prompt the server renders, and a tool result is rendered by the template. A 135M model does not write
these formats itself: the server parses a prefilled reply, or (gpt-oss) generates the call under its own tool
grammar. A template outside the table gets llama-server's general switches.

| family | template tested | thinking | `reasoning=False` sends | tool calls |
|---|---|---|---|---|
"""

TAIL = """
- `reasoning=True` sends `enable_thinking`; `"low"`/`"medium"`/`"high"` are gpt-oss's effort, elsewhere a thinking
  budget of 1024/4096/unbounded tokens. `reasoning_budget=N` ends thinking after N tokens where llama-server knows
  the end tag (tested on {budget}; DeepSeek's templates ignore it). What a family cannot do raises a
  `ReasoningWarning` once.
- *healed*: the server leaves the call as text and gguf-provider's healing makes it a tool call; such templates
  also get calls back as text, and Gemma's results come back as user turns (its roles must alternate).
- Mistral's templates refuse tool call ids that are not 9 alphanumerics: ids are mapped on the way out.
- Mistral Small 3.2: the pinned server's parser for its template expects `[ARGS]` twice, so a call as the model
  writes it is refused (HTTP 500); the test is an expected failure until upstream fixes it.
- {same}
"""


def render() -> str:
    rows = []
    for f in families.FAMILIES:
        calls = (f.fmt + ("" if f.parsed else ", *healed*")).replace("|", "\\|")  # a pipe would split the cell
        rows.append(f"| {f.name} | `{f.template}` | {THINKING[f.thinking]} | {OFF[f.thinking]} | {calls} |")
    budget = ", ".join(f.name for f in families.FAMILIES if f.budget)
    same = "; ".join(f"`{t}` is tested as {n}" for t, n in families.TESTED_AS.items())
    return HEAD + "\n".join(rows) + "\n" + TAIL.format(budget=budget, same=same)


if __name__ == "__main__":
    TARGET.write_text(render())
