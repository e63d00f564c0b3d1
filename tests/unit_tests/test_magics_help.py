"""The %gguf / %%gguf magics as a newcomer meets them, in a real IPython shell and without a server: help for every
command, a prompt sent as typed, wrong input as one UsageError line that says what to do, and errors and warnings in
the magics' words (``--ctx``, not ``n_ctx``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from gguf_provider import chat
from gguf_provider.errors import GenerationTimeWarning, GGUFProviderError, ServerError
from gguf_provider.events import TextDelta
from gguf_provider.jupyter import commands

SUBCOMMANDS = ["load", "ps", "devices", "plan", "list", "unload", "use", "reset", "history", "config", "log"]
# What each subcommand's --help must name: its arguments and options.
OPTIONS = {"load": ["SPEC", "--quant", "--as", "--reasoning", "--ctx", "--kv-cache-type"], "ps": [],
           "devices": ["--rpc"], "plan": ["SPEC", "--quant", "--ctx", "--device", "--json"], "list": [], "unload": ["NAME", "--all"], "use": ["NAME"], "reset": ["NAME"],
           "history": ["NAME"], "config": ["--system", "--temperature", "--max-tokens", "--max-time"],
           "log": ["LEVEL"]}
CELL_OPTIONS = ["NAME", "--system", "--temperature", "--max-tokens", "--max-time", "--no-history", "--output",
                "--format", "--think", "--effort", "--no-think", "--no-interpolate", "--image", "--tools",
                "--tool-choice", "--tool-result"]


@pytest.fixture
def ip() -> Iterator[Any]:
    """The shared test shell with the extension, no model loaded (the state of other tests put aside)."""
    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # type: ignore[no-untyped-call]
    shell.run_line_magic("load_ext", "gguf_provider")
    m = shell.magics_manager.registry["GGUFMagics"]
    saved = m.models, m.current, m.settings
    m.models, m.current, m.settings = {}, None, dict(saved[2])
    yield shell
    m.models, m.current, m.settings = saved


class _Engine:
    def unload(self) -> None:
        pass


@pytest.fixture
def sent(ip: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Models "smol" and "qwen" loaded (fake engines); the chat requests the magics make, answered "ok"."""
    m = ip.magics_manager.registry["GGUFMagics"]
    for name in ("smol", "qwen"):
        m.models[name] = commands._Model(name, _Engine())  # type: ignore[arg-type]
    m.current = "smol"
    requests: list[Any] = []

    def stream(engine: Any, request: Any) -> Iterator[Any]:
        requests.append(request)
        yield TextDelta("ok")

    monkeypatch.setattr(chat, "stream", stream)
    return requests


def _error(ip: Any, line: str, cell: str | None = None) -> str:
    with pytest.raises(UsageError) as info:
        if cell is None:
            ip.run_line_magic("gguf", line)
        else:
            ip.run_cell_magic("gguf", line, cell)
    return str(info.value)


# --- help -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", ["--help", "-h", "help"])
def test_overview_names_every_subcommand_the_prompt_and_the_cell(ip: Any, line: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gguf", line) is None
    out = capsys.readouterr().out
    for cmd in SUBCOMMANDS:
        assert f"%gguf {cmd}" in out, cmd
    assert "%gguf PROMPT" in out and "%%gguf [NAME] [options]" in out and "--help" in out


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
@pytest.mark.parametrize("form", ["{} --help", "{} -h", "help {}"])
def test_every_subcommand_prints_its_options(ip: Any, cmd: str, form: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gguf", form.format(cmd)) is None  # printed, not raised, and no model needed
    out = capsys.readouterr().out
    assert out.startswith(f"usage: %gguf {cmd} ") and "show this help message" in out
    for option in OPTIONS[cmd]:
        assert option in out, option


@pytest.mark.parametrize(("line", "cell"), [("--help", "Hi"), ("-h", "Hi"), ("smol --help", "Hi"), ("help cell", None),
                                           ("--help cell", None)])
def test_the_cell_prints_its_options(ip: Any, line: str, cell: str | None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """On a cell's line (IPython refuses a %%magic without a body), or `%gguf help cell`."""
    assert (ip.run_line_magic("gguf", line) if cell is None else ip.run_cell_magic("gguf", line, cell)) is None
    out = capsys.readouterr().out
    assert out.startswith("usage: %%gguf ")
    for option in CELL_OPTIONS:
        assert option in out, option


def test_every_argument_has_help() -> None:
    parsers = [commands._command_parser(cmd) for cmd in SUBCOMMANDS] + [commands._cell_parser()]
    assert [(p.prog, a.dest) for p in parsers for a in p._actions if not a.help] == []


# --- the one-shot prompt ------------------------------------------------------------------------------------------


def test_a_prompt_with_an_apostrophe_is_not_parsed(ip: Any) -> None:
    assert _error(ip, "What's up?") == "%gguf: no model loaded: run %gguf load SPEC first"


def test_a_prompt_is_sent_as_typed(ip: Any, sent: list[Any]) -> None:
    for prompt in ("""What's "this" {x} -- a test?""", "help me write a haiku"):  # `help` alone is help
        ip.run_line_magic("gguf", prompt)
        assert sent[-1].messages == [{"role": "user", "content": prompt}]


def test_a_subcommand_with_an_open_quote_says_how_to_quote(ip: Any) -> None:
    msg = _error(ip, "load 'my model")
    assert msg.startswith("%gguf load: No closing quotation: quote") and "%%gguf cell" in msg


def test_an_option_on_a_prompt_points_at_the_cell(ip: Any, sent: list[Any]) -> None:
    msg = _error(ip, "--temperature 0 What is 2+2?")
    assert msg.startswith("%gguf: --temperature is not a subcommand")
    assert "%gguf help cell" in msg and "%gguf config" in msg
    assert sent == []


# --- wrong names --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "cell", "where", "close"), [
    ("use smoll", None, "%gguf use", "smol"), ("unload qwn", None, "%gguf unload", "qwen"),
    ("reset smol2", None, "%gguf reset", "smol"), ("history qwen3", None, "%gguf history", "qwen"),
    ("smoll", "Hi", "%%gguf", "smol")])
def test_a_wrong_name_lists_the_loaded_and_the_closest(ip: Any, sent: list[Any], line: str, cell: str | None,
                                                       where: str, close: str) -> None:
    name = line.split()[-1]
    assert _error(ip, line, cell) == (f"{where}: no model named {name!r} is loaded (loaded: smol, qwen); "
                                      f"did you mean {close!r}?")


def test_a_prompt_on_the_cell_line_is_pointed_below(ip: Any, sent: list[Any]) -> None:
    msg = _error(ip, "zzz", "Hi")
    assert msg.startswith("%%gguf: no model named 'zzz' is loaded (loaded: smol, qwen)") and "in the cell" in msg
    msg = _error(ip, "Translate this", "Bonjour")
    assert msg.startswith("%%gguf: unrecognized arguments: this") and "write the message in the cell below" in msg


# --- wrong input --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "cell", "expected"), [
    ("", None, "%gguf: give a subcommand (load, ps, devices, plan, list, unload, use, reset, history, config, log) or a "
               "prompt; %gguf --help says more"),
    ("load", None, "%gguf load: the following arguments are required: SPEC (see %gguf load --help)"),
    ("load a.gguf b.gguf", None, "%gguf load: unrecognized arguments: b.gguf; one SPEC per %gguf load (see %gguf "
                                 "load --help)"),
    ("ps extra", None, "%gguf ps: unrecognized arguments: extra; for a prompt that starts with 'ps', write it in a "
                       "%%gguf cell (see %gguf ps --help)"),
    ("log loud quietly", None, "%gguf log: unrecognized arguments: quietly; for a prompt that starts with 'log', "
                               "write it in a %%gguf cell (see %gguf log --help)"),
    ("config --temperature hot", None, "%gguf config: argument --temperature: give a number >= 0, not 'hot' (see "
                                       "%gguf config --help)"),
    ("config --max-tokens -1", None, "%gguf config: argument --max-tokens: give a whole number >= 1, not '-1' (see "
                                     "%gguf config --help)"),
    ("config --temprature 1", None, "%gguf config: unrecognized arguments: --temprature 1; did you mean "
                                    "--temperature? (see %gguf config --help)"),
    ("load m.gguf --cach-reuse 0", None, "%gguf load: unrecognized arguments: --cach-reuse 0; did you mean "
                                         "--cache-reuse? (see %gguf load --help)"),
    ("unload", None, "%gguf unload: no model is loaded: nothing to unload"),
    ("use", None, "%gguf use: give the name of a loaded model (loaded: none)"),
    ("history", None, "%gguf history: no model loaded: run %gguf load SPEC first"),
    ("", "   ", "%%gguf: the cell is empty: write your message below the %%gguf line"),
])
def test_wrong_input_without_a_model(ip: Any, line: str, cell: str | None, expected: str) -> None:
    assert _error(ip, line, cell) == expected


@pytest.mark.parametrize(("line", "cell", "expected"), [
    ("unload smol --all", None, "%gguf unload: give NAME or --all, not both (unload smol or every model?)"),
    ("use", None, "%gguf use: give the name of a loaded model (loaded: smol, qwen)"),
    ("-n -5", "Hi", "%%gguf: argument -n/--max-tokens: give a whole number >= 1, not '-5' (see %%gguf --help)"),
    ("--max-time -1", "Hi", "%%gguf: argument --max-time: give a number >= 0, not '-1' (see %%gguf --help)"),
    ("-t warm", "Hi", "%%gguf: argument -t/--temperature: give a number >= 0, not 'warm' (see %%gguf --help)"),
    ("--no-histroy", "Hi", "%%gguf: unrecognized arguments: --no-histroy; did you mean --no-history? (see %%gguf "
                           "--help)"),
    ("-o 1st", "Hi", "%%gguf -o: '1st' is not a variable name: give one such as reply"),
    ("-o class", "Hi", "%%gguf -o: 'class' is not a variable name: give one such as reply"),
    ('-s "Be brief', "Hi", """%%gguf: No closing quotation: quote an option's value with spaces or quotes in it as """
                           """a whole ("...")"""),
])
def test_wrong_input_with_models(ip: Any, sent: list[Any], line: str, cell: str | None, expected: str) -> None:
    assert _error(ip, line, cell) == expected
    assert sent == []


def test_unload_several_and_the_current_moves(ip: Any, sent: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("gguf", "unload smol smol")
    m = ip.magics_manager.registry["GGUFMagics"]
    assert capsys.readouterr().out == "unloaded smol\n" and list(m.models) == ["qwen"] and m.current == "qwen"


# --- the magics' words --------------------------------------------------------------------------------------------


class _Runtime:
    def models(self) -> Any:
        raise GGUFProviderError("the prompt does not fit the context (n_ctx): raise n_ctx=8192 or pass "
                                "truncate=True\nmore lines")

    def status(self, live: bool = False) -> Any:
        raise ServerError("llama-server exited: kv_cache_type='q8_0' needs flash attention", log_tail="error: ...",
                          log_path=Path("/tmp/s.log"))


def test_errors_name_the_magic_flags(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "runtime", _Runtime)
    assert _error(ip, "list") == ("%gguf list: the prompt does not fit the context (`--ctx`): raise `--ctx 8192` or "
                                  "pass truncate=True")
    assert _error(ip, "ps") == ("%gguf ps: llama-server exited: `--kv-cache-type q8_0` needs flash attention — "
                                "server log: /tmp/s.log")
    assert _error(ip, "load m.gguf --kv-cache-type zz").startswith("%gguf load: `--kv-cache-type zz` is not a KV "
                                                                   "cache type")


def test_warnings_name_the_magic_flags_at_the_users_line(ip: Any, sent: list[Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def cut(engine: Any, request: Any) -> Iterator[Any]:
        yield TextDelta("Once upon")
        # stacklevel=2: at a line of the magics, as a library warning without the user's frame would be.
        warnings.warn("the reply was cut by max_time=2 s (finish_reason 'length'); pass a larger max_time, or "
                      "max_time=None for no time bound", GenerationTimeWarning, stacklevel=2)

    monkeypatch.setattr(chat, "stream", cut)
    calls: list[Callable[[], Any]] = [lambda: ip.run_cell_magic("gguf", "--max-time 2", "Tell a story."),
                                      lambda: ip.run_line_magic("gguf", "Tell a story.")]
    for call in calls:
        with pytest.warns(GenerationTimeWarning) as caught:
            call()
        (w,) = caught
        assert str(w.message) == ("the reply was cut by `--max-time 2` s (finish_reason 'length'); pass a larger "
                                  "`--max-time`, or `--max-time 0` for no time bound")
        assert w.filename == __file__  # this test's line, which ran the magic
