"""docs/gpu.md and the pages it touches stay true (issue 36, point 6): its `gguf-provider plan` examples are what the
command prints, the commands and flags it names exist, the links between the docs resolve (anchors included), the
error tree of docs/errors.md is the one in gguf_provider/errors.py, and every GGUF_PROVIDER_* variable the code
reads is in docs/environment.md. Offline: the plan runs on Qwen2.5-Coder-0.5B's real tensor table
(tests/support/gguf_tables.py)."""

from __future__ import annotations

import argparse
import re
import shlex
import textwrap
from pathlib import Path

import pytest

from gguf_provider import cli, errors
from gguf_provider.runtime._memory import devices
from tests.support.gguf_tables import QWEN_FILE, QWEN_META, qwen_tensors, write_gguf

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GPU = DOCS / "gpu.md"
QWEN_VOCAB = 151936  # len(tokenizer.ggml.tokens) of the real Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
# The pages issue 36 wrote or changed; their links are checked.
PAGES = [ROOT / "README.md", *(DOCS / n for n in ("gpu.md", "runtime.md", "errors.md", "environment.md",
                                                  "troubleshooting.md", "distributed.md", "magics.md", "index.md",
                                                  "architecture.md", "install.md"))]


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _plan_examples() -> list[tuple[list[str], str]]:
    """Each ``$ gguf-provider plan ...`` block of docs/gpu.md: the arguments and the output shown under them."""
    found = []
    for block in _blocks(GPU.read_text()):
        first, _, rest = block.partition("\n")
        if first.startswith("$ gguf-provider plan "):
            found.append((shlex.split(first)[2:], rest))
    return found


@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The stand-in has no token list; the real file's 151,936 tokens size the logits the plan counts.
    meta = {**QWEN_META, "qwen2.vocab_size": QWEN_VOCAB}
    return write_gguf(tmp_path_factory.mktemp("qwen") / QWEN_FILE, meta, qwen_tensors())


def test_gpu_md_has_the_issues_plan_example() -> None:
    args = [a for a, _ in _plan_examples()]
    assert ["plan", "Qwen2.5-Coder-0.5B-Instruct", "--device", "vulkan:1260MiB", "--device", "cpu:64GiB"] in args
    assert any(a.count("cuda:8GiB") == 2 for a in args)  # "would this fit two 8 GiB cards?"


@pytest.mark.parametrize("args, shown", _plan_examples(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_plan_examples_are_what_the_command_prints(args: list[str], shown: str, qwen_file: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert args[1] == "Qwen2.5-Coder-0.5B-Instruct"  # the examples' model, here as its real tensor table
    rc = cli.main([args[0], str(qwen_file), *args[2:]])
    assert capsys.readouterr().out == shown, "docs/gpu.md's plan example is out of date: paste the real output"
    assert rc == (0 if "— fits:" in shown else 1)


def test_commands_and_flags_named_in_gpu_md_exist() -> None:
    (commands,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    text = GPU.read_text()
    for command, flags in re.findall(r"^gguf-provider (\w[\w-]*)((?: [^\n]*)?)$", _blocks(text)[0], re.MULTILINE):
        sub = commands.choices[command]
        known = {o for a in sub._actions for o in a.option_strings}
        for flag in re.findall(r"--[\w-]+", flags):
            assert flag in known, f"docs/gpu.md names `gguf-provider {command} {flag}`, which does not exist"
    assert f"`${devices.LIMIT_ENV}`" in text or f"`{devices.LIMIT_ENV}" in text
    for name in devices.VISIBILITY_ENV:
        assert name in text


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower-cased, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name} links to {target}: no such heading in {dest.name}"


def _tree(text: str) -> list[tuple[int, str]]:
    """(depth, class name) of each line of an error tree drawn with box characters."""
    lines = re.findall(r"^((?:[│ ]   )*)(├── |└── )?([A-Z]\w+Error)\b", text, re.MULTILINE)
    return [(len(indent) // 4 + bool(branch), name) for indent, branch, name in lines]


def test_errors_md_tree_is_the_one_in_errors_py() -> None:
    doc = _blocks((DOCS / "errors.md").read_text())[0]
    assert errors.__doc__
    code = textwrap.dedent(errors.__doc__.split("::", 1)[1].split("\n\n", 2)[1])
    assert _tree(doc) == _tree(code)
    assert ("DeviceOutOfMemoryError" in doc) and issubclass(errors.DeviceOutOfMemoryError,
                                                             errors.InsufficientMemoryError)


def test_every_gguf_provider_variable_is_documented() -> None:
    env_doc = (DOCS / "environment.md").read_text()
    read = set()
    for f in (ROOT / "gguf_provider").rglob("*.py"):
        read |= set(re.findall(r"\"(GGUF_PROVIDER_[A-Z_]+)\"", f.read_text()))
    missing = sorted(v for v in read if f"`{v}`" not in env_doc)
    assert not missing, f"docs/environment.md lacks {missing}"
