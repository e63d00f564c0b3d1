"""The command line as a newcomer meets it, without a server: help on every command, options anywhere, "did you
mean", errors in the CLI's words (advice.py), names found wherever models are, warnings at the user's line.
What needs a running llama-server is in tests/integration_tests/test_cli_newcomer.py."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gguf_provider import advice, cli
from tests.support.gguf_bytes import gguf, string, u32

CLI = [sys.executable, "-m", "gguf_provider.cli"]
PACKAGE = Path(cli.__file__).parent


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...],
                                                                                          argparse.ArgumentParser]]:
    """Every command (and command group) under ``parser``, with its words: ("server", "install"), ...."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(cli.build_parser())


def test_every_command_help_runs_as_a_user_runs_it() -> None:
    """`gguf-provider [COMMAND ...] --help` for each command and group, as a subprocess: exit 0, its usage, and
    each of its flags in the text."""
    for words, parser in COMMANDS:
        out = subprocess.run([*CLI, *words, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and not out.stderr, (words, out.stderr)
        assert out.stdout.startswith(f"usage: gguf-provider {' '.join(words)}".rstrip()), (words, out.stdout[:200])
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in out.stdout, (words, flag)


def test_every_option_and_argument_says_what_it_is() -> None:
    missing = [f"{' '.join(words)} {a.option_strings or a.dest}" for words, parser in COMMANDS
               for a in parser._actions if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not missing


@pytest.mark.parametrize("argv, expected", [
    (["embed", "m", "--json", "hello world"], {"spec": "m", "text": ["hello world"], "json": True}),
    (["embed", "m", "--truncate", "a", "--json", "b"], {"text": ["a", "b"], "truncate": True, "json": True}),
    (["rerank", "m", "how do pandas eat?", "--top-n", "1", "Pandas eat bamboo.", "Cats purr."],
     {"query": "how do pandas eat?", "document": ["Pandas eat bamboo.", "Cats purr."], "top_n": 1}),
    (["plan", "--ctx", "512", "m", "--json"], {"spec": "m", "ctx": 512, "json": True}),
    (["stop", "--all"], {"id": None, "all": True}),
    (["embed", "m"], {"text": []}),
])
def test_options_go_anywhere_among_the_positionals(argv: list[str], expected: dict[str, object]) -> None:
    ns = cli.build_parser().parse_args(argv)
    assert {k: getattr(ns, k) for k in expected} == expected


@pytest.mark.parametrize("argv, said", [
    (["modles"], "no command 'modles': did you mean 'models'?"),
    (["server", "instal"], "no command 'instal': did you mean 'install'?"),
    (["embed", "m", "--jsno", "x"], "gguf-provider embed: error: unrecognized arguments: --jsno x (did you mean "
                                    "--json?)"),
    (["serve", "m", "--ctxx", "5"], "did you mean --ctx?"),
    ([], "give a command: server, ps,"),
    (["server"], "give a command: install, update, list, info, path, version"),
    (["embed"], "the following arguments are required: spec\n"),  # not `text`, which stdin may give
])
def test_a_wrong_command_line_says_what_was_meant(argv: list[str], said: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err, err
    assert "--help` says more" in err and err.count("\n") <= 5  # a short usage, not forty lines of flags


# --- advice in the CLI's words ------------------------------------------------------------------------------


@pytest.mark.parametrize("python, cli_words, magic_words", [
    ("shorten it, or pass truncate=True", "shorten it, or pass `--truncate`", "shorten it, or pass truncate=True"),
    ("Levers: fewer layers (n_gpu_layers), a smaller context (n_ctx), a quantized KV cache (kv_cache_type='q8_0')",
     "Levers: fewer layers (`--n-gpu-layers`), a smaller context (`--ctx`), a quantized KV cache "
     "(`--kv-cache-type q8_0`)", None),
    ("or pass speculative=False", "or pass `--speculative off`", None),
    ("cache_reuse=-1: pass a chunk size", "`--cache-reuse -1`: pass a chunk size", None),
    ("load it with vision=True or mmproj='p.gguf'", "load it with `--vision` or `--mmproj p.gguf`", None),
    ("pass prompt_cache=False", "pass `--no-prompt-cache`", None),
    ("pass a larger max_time, or max_time=None", "pass a larger max_time, or max_time=None",
     "pass a larger `--max-time`, or `--max-time 0`"),
    ("while online, or unset HF_HUB_OFFLINE / pass offline=False", "while online, or unset HF_HUB_OFFLINE", None),
    ("accept its terms and pass token=... (or set HF_TOKEN, or run `hf auth login`).",
     "accept its terms and set HF_TOKEN (or run `hf auth login`).", None),
    ("speculative decoding is off", "speculative decoding is off", None),  # prose is not a keyword
])
def test_advice_names_the_flags_of_where_the_user_is(python: str, cli_words: str, magic_words: str | None) -> None:
    assert advice.render(python, "python") == python
    assert advice.render(python, "cli") == cli_words
    assert advice.render(python, "magic") == (magic_words or cli_words)


# Keywords messages name that have no flag on the CLI or in the magics: kept in Python's words there.
PYTHON_ONLY = {"model", "repo", "model_path", "base_url", "rerank", "query_str", "loop_guard", "media_allow_hosts",
               "cache_dir", "token", "offline", "n_outputs", "finish_reason", "to", "function", "parameter", "path"}
ADVICE = re.compile(r"(?<![\w$.\-`<])([a-z][a-z_]+)=(?!=)")


def _messages() -> list[tuple[str, str]]:
    """Every string of the package that is not a docstring, with where it is."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [(f"{path.name}:{n.lineno}", n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                  and " " in n.value]
    return found


def test_every_keyword_advice_names_has_a_flag_or_is_python_only() -> None:
    """A new message that tells users to pass ``keyword=value`` needs its flag in advice.FLAGS (or the option
    table), or an entry above saying the CLI and the magics have none, so the CLI never prints Python."""
    known = set(advice.table()) | PYTHON_ONLY
    unknown = {f"{where}: {m.group(1)}=" for where, text in _messages() for m in ADVICE.finditer(text)
               if m.group(1) not in known and not text.lstrip().startswith(("-", "<", "{"))}
    assert not unknown, sorted(unknown)


def test_the_cli_prints_warnings_in_its_words(capsys: pytest.CaptureFixture[str]) -> None:
    cli._show_warning(UserWarning("pass a smaller n_ctx"), UserWarning, "lib.py", 1)
    assert capsys.readouterr().err == "gguf-provider: warning: pass a smaller `--ctx`\n"


def test_a_library_warning_points_at_the_users_line() -> None:
    from gguf_provider import ChatGGUF

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ChatGGUF(model="m.gguf", tempreture=0.1)  # the line the warning should name
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


# --- names, quants, projectors ------------------------------------------------------------------------------


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("GGUF_PROVIDER_MODELS", raising=False)
    header = gguf(string("general.architecture", "llama"), u32("llama.context_length", 2048))
    for name, size in (("SmolLM2-135M-Instruct.Q4_1", 2000), ("all-MiniLM-L6-v2.Q8_0", 300_000_000),
                       ("x.Q8_0", 5)):
        (home / "models" / f"{name}.gguf").write_bytes(header + b"\0" * size)
    return home / "models"


def test_models_lines_up_its_columns(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "size", "path"]
    starts = {line.index(str(models_dir)) for line in lines[1:]}
    assert len(lines) == 4 and len(starts) == 1  # every path starts in one column
    assert len({line.index("MiB") for line in lines[1:]}) == 1  # sizes right-aligned


def test_a_misspelled_name_gets_a_did_you_mean(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "SmolLM2-135M-Instrcut"]) == 1
    err = capsys.readouterr().err
    assert "Did you mean 'SmolLM2-135M-Instruct.Q4_1'?" in err


def test_a_missing_quant_names_the_quants_there(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "SmolLM2-135M-Instruct", "--quant", "Q8_0"]) == 1
    err = capsys.readouterr().err
    assert "no Q8_0 quant of 'SmolLM2-135M-Instruct'" in err and "there: Q4_1" in err
    assert "SmolLM2-135M-Instruct:Q8_0" not in err  # a spec the user never typed


def test_plan_refuses_a_projector(models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = tmp_path / "mmproj-x-f16.gguf"
    proj.write_bytes(gguf(string("general.architecture", "clip")))
    assert cli.main(["plan", str(proj)]) == 1
    err = capsys.readouterr().err
    assert "is a multimodal projector (mmproj), not a model" in err and f"`--mmproj {proj}`" in err


def test_stop_with_nothing_running_says_so(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stop"]) == 0
    assert capsys.readouterr().out == "no servers running\n"
    assert cli.main(["stop", "zzz"]) == 1
    assert "no server 'zzz'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, code, said", [
    (["plan", "m.gguf", "--ctx", "-5"], 2, "argument --ctx: -5 is out of range: 1 or more"),
    (["serve", "m.gguf", "--ctx", "0"], 2, "`--ctx 0`: pass a whole number, 1 or more, or leave it out for the "
                                           "model's own context"),
    (["serve", "m.gguf", "--port", "99999"], 2, "`--port 99999`: pass a whole number, 0 to 65535"),
    (["serve", "m.gguf", "--n-parallel", "0"], 2, "`--n-parallel 0`"),
    (["serve", "--port", "99999"], 2, "`--port 99999`: pass a port from 0 to 65535"),
    (["serve", "--api-key-file", "/nonexistent/key"], 2, "the API key file /nonexistent/key: No such file"),
    (["rerank", "m", "q", "--top-n", "0", "d"], 2, "argument --top-n: 0 is out of range: 1 or more"),
    (["rpc-worker", "--port", "0"], 2, "argument --port: 0 is out of range: 1 to 65535"),
    (["stop", "--all", "abc"], 2, "give 'abc' or --all, not both"),
    (["server", "install", "--cmake-arg", "-DX=1"], 2, "a value that starts with '-' is written --cmake-arg=VALUE"),
    (["pull", "some-model"], 1, "'some-model' is not one: a path or a models-dir name is a local model"),
])
def test_wrong_input_is_one_line_in_the_clis_words(argv: list[str], code: int, said: str,
                                                   models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = cli.main(argv)
    except SystemExit as exit_:  # argparse's own errors
        rc = exit_.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert rc == code and said in err and "Traceback" not in err, err
