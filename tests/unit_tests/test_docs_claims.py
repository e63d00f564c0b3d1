"""The docs' mechanical claims, checked against the code so that they cannot drift (issue 35).

- every error the docs say is importable from ``gguf_provider`` is (code blocks, and docs/errors.md's tree);
- every ``gguf-provider`` flag the docs mention exists in the parser, and every command and flag is documented;
- every variable docs/environment.md lists is read by the code, and every ``GGUF_PROVIDER_*`` the code reads is
  listed there;
- every relative link (and ``#anchor``) in README.md, docs/ and CHANGELOG.md resolves;
- together they stay within their word budget.

Offline and fast: the docs are read as text, the parser is built, nothing runs.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

from gguf_provider import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINKED = [*PAGES, ROOT / "CHANGELOG.md"]

FENCE = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.M | re.S)
INLINE = re.compile(r"(`+)(.+?)\1")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def without_blocks(text: str) -> str:
    return FENCE.sub("", text)


# --- errors ---------------------------------------------------------------------------------------------------------


def test_errors_the_docs_import_from_gguf_provider_are_importable() -> None:
    import gguf_provider

    wrong = []
    for page in PAGES:
        text = page.read_text()
        for block in [*code_blocks(text), *(m.group(2) for m in INLINE.finditer(without_blocks(text)))]:
            for m in re.finditer(r"from gguf_provider import (\([^)]*\)|[^\n]+)", block):
                for name in re.findall(r"\w+", m.group(1).split("#")[0]):
                    if not hasattr(gguf_provider, name):
                        wrong.append(f"{rel(page)}: from gguf_provider import {name}")
    assert not wrong, wrong


def test_errors_md_says_where_each_error_is_importable_from() -> None:
    """Every class in the tree is importable from ``gguf_provider`` unless the text before the tree names it as an
    exception ("except `X`"), and then it is in ``gguf_provider.errors`` and not in ``gguf_provider``; or the text
    names the module it lives in."""
    import gguf_provider

    text = (ROOT / "docs" / "errors.md").read_text()
    intro = text[:text.index("```")]
    tree = code_blocks(text)[0]
    names = re.findall(r"^[\s│├└─]*([A-Z]\w+(?:Error|Exception))\b", tree, re.M)
    assert "GGUFProviderError" in names and len(names) > 10, names
    excepted = {n for m in re.finditer(r"except((?:[\s,]*(?:and\s+)?`\w+`)+)", intro)
                for n in re.findall(r"`(\w+)`", m.group(1))}
    wrong = []
    for name in names:
        if name in excepted:
            if hasattr(gguf_provider, name) or not hasattr(importlib.import_module("gguf_provider.errors"), name):
                wrong.append(f"{name}: said to be in gguf_provider.errors and not in gguf_provider")
        elif not hasattr(gguf_provider, name):
            homes = [m for m in re.findall(r"`(gguf_provider(?:\.\w+)+)`", intro)
                     if name in intro and hasattr(importlib.import_module(m), name)]
            if not homes:
                wrong.append(f"{name}: not importable from gguf_provider, and errors.md names no module for it")
    for name in excepted - set(names):
        wrong.append(f"{name}: excepted in the text but not in the tree")
    assert not wrong, wrong


# --- the command line -----------------------------------------------------------------------------------------------


def parser_commands() -> dict[str, list[tuple[str, ...]]]:
    """``{"serve": [("--port",), ...], "server install": [...], ...}``: every command and its options (each with
    its aliases: ``("-v", "--verbose")``)."""
    found: dict[str, list[tuple[str, ...]]] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path:
            found[path] = [tuple(a.option_strings) for a in parser._actions
                           if a.option_strings and not isinstance(a, argparse._HelpAction)]
        for action in subs:
            for name, child in action.choices.items():
                walk(child, f"{path} {name}".strip())

    walk(cli.build_parser(), "")
    return found


COMMANDS = parser_commands()
TOP_OPTIONS = [tuple(a.option_strings) for a in cli.build_parser()._actions
               if a.option_strings and not isinstance(a, argparse._HelpAction)]  # `gguf-provider -v`, --version
FLAGS = {c: {f for option in options for f in option} | {"-h", "--help"} for c, options in COMMANDS.items()}
TOP = {c.split()[0] for c in COMMANDS}
FLAG = re.compile(r"(?<![\w-])(?:--[a-z][a-z0-9-]*|-[a-zA-Z](?![\w-]))")
GENERIC = {"-h", "--help"}


def _command_of(words: list[str]) -> str | None:
    """The command a mention's first words name ("server install", "serve"), or None (a placeholder)."""
    if not words or words[0] not in TOP:
        return None
    if len(words) > 1 and f"{words[0]} {words[1]}" in COMMANDS:
        return f"{words[0]} {words[1]}"
    return words[0] if words[0] in COMMANDS else None


def mentions(text: str) -> list[tuple[str | None, str]]:
    """``(command, flag)`` for every flag in a ``gguf-provider ...`` mention: a code block line or an inline code
    span. ``a | b`` alternatives switch the command when ``b`` starts with one (``ps [--json] | stop --all``)."""
    spans = [line for block in code_blocks(text) for line in block.splitlines()]
    spans += [m.group(2) for m in INLINE.finditer(without_blocks(text))]
    out: list[tuple[str | None, str]] = []
    for span in spans:
        for m in re.finditer(r"gguf-provider\s+(.*)", span):
            command: str | None = None
            for i, part in enumerate(re.split(r"\s\|\s", m.group(1))):
                words = re.findall(r"[a-z][a-z-]*|\S+", part.strip("[] "))
                named = _command_of(words)
                if named is None and command and command.startswith("server ") and words:
                    named = f"server {words[0]}" if f"server {words[0]}" in COMMANDS else None  # info | path
                if i == 0 or named is not None:
                    command = named
                out += [(command, f) for f in FLAG.findall(part)]
    return out


def commands_mentioned(text: str) -> set[str]:
    found = set()
    spans = [*code_blocks(text), *(m.group(2) for m in INLINE.finditer(without_blocks(text)))]
    for span in spans:
        for m in re.finditer(r"gguf-provider\s+(.*)", span):
            for part in re.split(r"\s\|\s|\|", m.group(1)):
                words = re.findall(r"[a-z][a-z-]*", part)
                named = _command_of(words)
                if named is not None:
                    found.add(named)
            server = re.match(r"server\s+(\w+(?:\s*\|\s*\w+)*)", m.group(1))
            if server:
                found |= {f"server {w}" for w in re.findall(r"\w+", server.group(1)) if f"server {w}" in COMMANDS}
    return found


def test_every_flag_the_docs_mention_exists() -> None:
    every = set().union(*FLAGS.values(), *TOP_OPTIONS)
    wrong = []
    for page in PAGES:
        for command, flag in mentions(page.read_text()):
            if flag in GENERIC:
                continue
            if command is None:
                ok = flag in every
            else:
                ok = flag in FLAGS[command]
            if not ok:
                wrong.append(f"{rel(page)}: gguf-provider {command or '...'} {flag}")
    assert not wrong, sorted(set(wrong))


def sections(text: str) -> list[str]:
    """The page split at its headings (outside code blocks)."""
    parts, current = [], []
    in_block = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
        if not in_block and line.startswith("#"):
            parts.append("\n".join(current))
            current = []
        current.append(line)
    parts.append("\n".join(current))
    return parts


def documented_flags() -> dict[str | None, set[str]]:
    """Per command, the flags the docs give it: in a ``gguf-provider COMMAND ... --flag`` mention, or in code (a
    block or an inline span) in a section that mentions ``gguf-provider COMMAND`` (an options table under it).
    Under None: every flag in any ``gguf-provider`` mention."""
    documented: dict[str | None, set[str]] = defaultdict(set)
    for page in PAGES:
        for section in sections(page.read_text()):
            for command, flag in mentions(section):
                documented[command].add(flag)
                documented[None].add(flag)
            code = " ".join([*code_blocks(section), *(m.group(2) for m in INLINE.finditer(without_blocks(section)))])
            flags = set(FLAG.findall(code))
            for command in commands_mentioned(section):
                documented[command] |= flags & FLAGS[command]
    return documented


def test_every_command_and_flag_is_documented() -> None:
    """A command's own option under it; an option every command has (``-v``), once with any command."""
    text = "\n".join(p.read_text() for p in PAGES)
    named = commands_mentioned(text)
    documented = documented_flags()
    missing = [f"gguf-provider {c}" for c in COMMANDS if c not in named and f"{c} " not in " ".join(COMMANDS)]
    common = set.intersection(*(set(options) for options in COMMANDS.values()))
    for option in TOP_OPTIONS:
        if not set(option) & documented[None]:
            missing.append(f"gguf-provider {'/'.join(option)}")
    for command, options in COMMANDS.items():
        for option in options:
            where = documented[None] if option in common else documented.get(command, set())
            if not set(option) & where:
                missing.append(f"gguf-provider {command} {'/'.join(option)}")
    assert not missing, sorted(set(missing))


# --- environment variables ------------------------------------------------------------------------------------------


def code_env_vars() -> set[str]:
    """Every ``GGUF_PROVIDER_*`` string literal in the package (how the code names a variable it reads)."""
    found = set()
    for path in (ROOT / "gguf_provider").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"GGUF_PROVIDER_[A-Z0-9_]+", node.value):
                    found.add(node.value)
    return found


def documented_env_vars() -> set[str]:
    text = (ROOT / "docs" / "environment.md").read_text()
    return set(re.findall(r"`(GGUF_PROVIDER_[A-Z0-9_]+)`", text))


def test_every_variable_in_environment_md_is_read() -> None:
    unread = documented_env_vars() - code_env_vars()
    assert not unread, f"docs/environment.md lists variables the code never reads: {sorted(unread)}"


def test_every_variable_the_code_reads_is_in_environment_md() -> None:
    undocumented = code_env_vars() - documented_env_vars()
    assert not undocumented, f"read by gguf_provider/ but not in docs/environment.md: {sorted(undocumented)}"


# --- links ----------------------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = defaultdict(int)
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", without_blocks(path.read_text()), re.M):
        base = slug(m.group(1))
        out.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    out |= set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", path.read_text()))
    return out


@pytest.mark.parametrize("page", LINKED, ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    text = without_blocks(page.read_text())
    text = INLINE.sub("", text)
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert not broken, broken


WORD_BUDGET = 17_000  # issue 35, raised by issue 61 for the gateway, LoRA, audio and distributed pages: README + docs/ + CHANGELOG a reader gets through; method and history: bench/NOTES.md


def test_the_docs_stay_within_their_word_budget() -> None:
    """Counted as `wc -w` counts (whitespace-separated), over README.md, docs/*.md and CHANGELOG.md."""
    counts = {rel(p): len(p.read_text().split()) for p in LINKED}
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    assert total <= WORD_BUDGET, f"{total} words > {WORD_BUDGET}; the largest pages: {largest}"
