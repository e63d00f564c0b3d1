"""Model aliases: names clients ask for that no model on this machine has (Claude Code's ``claude-*``, a tool's
hard-coded ``gpt-*``), mapped to a local model by the user, never guessed.

A rule is ``PATTERN=MODEL``: ``PATTERN`` a model name or a shell-style pattern (``claude-*``, ``*haiku*``), ``MODEL``
any model the gateway serves. Rules come from ``--alias`` (repeatable) and then from ``--aliases FILE`` (one
``PATTERN=MODEL`` per line, as the flag takes it; ``#`` starts a comment); the first rule that matches wins. A name
no rule matches is the model's own name. Replies carry the name the client asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path


@dataclass(frozen=True)
class Aliases:
    """The alias rules, in order: ``(pattern, model)``."""

    rules: tuple[tuple[str, str], ...] = ()

    def resolve(self, name: str) -> str:
        """The model ``name`` stands for: the first matching rule's, else ``name``."""
        for pattern, model in self.rules:
            if fnmatchcase(name, pattern):
                return model
        return name

    @classmethod
    def parse(cls, specs: list[str] | tuple[str, ...] = (), file: str | Path | None = None) -> Aliases:
        """The rules of ``--alias PATTERN=MODEL`` flags, then of a file of such lines (ValueError naming a bad
        one)."""
        rules = [_rule(spec, "--alias") for spec in specs]
        if file is not None:
            try:
                lines = Path(file).read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"the aliases file {file}: {exc.strerror}") from None
            rules += [_rule(text, f"{file}:{n}") for n, line in enumerate(lines, 1)
                      if (text := line.split("#", 1)[0].strip())]
        return cls(tuple(rules))


def _rule(spec: str, where: str) -> tuple[str, str]:
    pattern, sep, model = spec.partition("=")
    if not sep or not pattern.strip() or not model.strip():
        raise ValueError(f"{where}: {spec!r} is no alias rule: write PATTERN=MODEL, e.g. "
                         "'claude-*=Qwen2.5-Coder-7B-Instruct'")
    return pattern.strip(), model.strip()
