"""Install the real coding tools the gateway is tested with, pinned, into the user cache dir.

``<home>/tools/<name>-<version>/`` (home: ``$GGUF_PROVIDER_HOME`` or platformdirs' user cache dir,
``~/.cache/gguf-provider`` on Linux), one directory per pinned version, marked done (``.installed``, holding its
``--version``) only once its executable runs, so a half-done install is never taken for one:

- Claude Code (npm ``@anthropic-ai/claude-code``), speaking Anthropic's Messages API;
- opencode (npm ``opencode-ai``), speaking OpenAI chat completions through ``@ai-sdk/openai-compatible``;
- aider (PyPI ``aider-chat``, in its own venv: it pins litellm and many others), OpenAI chat completions via litellm;
- Codex CLI (npm ``@openai/codex``), speaking only OpenAI's Responses API.

Idempotent: a second run checks four directories and returns at once. `make setup-test` runs it; the tests in
tests/integration_tests/test_tools_live.py find the tools with :func:`tool_path`. Needs ``npm`` (Node 18+) on PATH.

Usage: ``python scripts/test_tools.py [claude|opencode|aider|codex|all] ...`` (prints each tool's path; exit 1 if one cannot
be installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_provider.runtime._common import paths


@dataclass(frozen=True)
class Tool:
    key: str
    kind: str  # "npm" or "pip"
    package: str
    version: str
    executable: str  # relative to the tool's directory

    @property
    def dirname(self) -> str:
        return f"{self.key}-{self.version}"


TOOLS = {
    t.key: t
    for t in (
        Tool("claude", "npm", "@anthropic-ai/claude-code", "2.1.197", "node_modules/.bin/claude"),
        Tool("opencode", "npm", "opencode-ai", "1.18.33", "node_modules/.bin/opencode"),
        Tool("aider", "pip", "aider-chat", "0.86.2", "venv/bin/aider"),
        # the OpenAI Agents SDK: it needs openai 3, which the test extra's llama-index-llms-openai refuses
        Tool("agents", "pip", "openai-agents", "0.24.0", "venv/bin/python"),
        Tool("codex", "npm", "@openai/codex", "0.171.0", "node_modules/.bin/codex"),
    )
}
MARKER = ".installed"  # holds the tool's `--version` output, written last


def tools_dir() -> Path:
    return paths.home() / "tools"


def tool_path(key: str) -> Path | None:
    """The installed tool's executable, or None if it is not installed (nothing is installed here)."""
    tool = TOOLS[key]
    root = tools_dir() / tool.dirname
    exe = root / tool.executable
    if (root / MARKER).is_file() and exe.is_file() and os.access(exe, os.X_OK):
        return exe
    return None


def _check(exe: Path) -> str:
    """The tool's `--version` (raises if it does not run): a home of its own, so nothing is written to the user's."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "HOME": home, "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120, env=env,
                             stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"{exe} --version exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout.strip()


def ensure(key: str) -> Path:
    """The tool's executable, installed first if missing."""
    found = tool_path(key)
    if found is not None:
        return found
    tool = TOOLS[key]
    root = tools_dir() / tool.dirname
    if root.exists():  # an earlier half-done install (no marker)
        shutil.rmtree(root)
    root.mkdir(parents=True)
    print(f"installing {tool.package}=={tool.version} into {root} ...", flush=True)
    if tool.kind == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not on PATH (Node.js 18 or newer is needed for the npm tools)")
        subprocess.run([npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", "--save-exact",
                        "--loglevel=error", f"{tool.package}@{tool.version}"], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
        subprocess.run([str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", f"{tool.package}=={tool.version}"], check=True)
    exe = root / tool.executable
    (root / MARKER).write_text(_check(exe) + "\n")  # last: the marker says the install is whole
    return exe


def main(argv: list[str]) -> int:
    keys = argv or ["all"]
    if "all" in keys:
        keys = list(TOOLS)
    unknown = [k for k in keys if k not in TOOLS]
    if unknown:
        print(f"unknown tool(s) {unknown}: choose from {sorted(TOOLS)} or all", file=sys.stderr)
        return 2
    failed = []
    for key in keys:
        try:
            print(ensure(key), flush=True)
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            print(f"{key}: cannot install {TOOLS[key].package}=={TOOLS[key].version}: {e}", file=sys.stderr)
            failed.append(key)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
