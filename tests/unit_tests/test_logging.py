"""gguf-provider's log: silent by default, $GGUF_PROVIDER_LOG at import, the CLI's -v/-vv and `%gguf log`."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

import gguf_provider
from gguf_provider import cli, logs

ROOT = Path(__file__).resolve().parents[2]
# A fresh interpreter importing gguf_provider (for the CLI, running `ps` too): ~0.5 s on 2 cores at load 3; 100x.
CHILD_TIMEOUT = 60

SAY = ("import logging, gguf_provider; "
       "logging.getLogger('gguf_provider.runtime._serve.manager').info('hello %s', 'info'); "
       "logging.getLogger('gguf_provider.runtime._serve.manager').debug('hello %s', 'debug'); "
       "logging.getLogger('gguf_provider.runtime._serve.budget').warning('hello %s', 'warning')")


@pytest.fixture(autouse=True)
def _no_handler_left() -> Iterator[None]:
    logger = logging.getLogger(logs.LOGGER)
    level = logger.level
    yield
    logs.enable(None)
    logger.setLevel(level)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != logs.ENV}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT,
                          cwd=ROOT, env={**base, **env})


def test_silent_by_default() -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger(logs.LOGGER).handlers)
    done = _python(SAY)
    assert done.returncode == 0 and done.stderr == ""  # not even the warning: a library stays quiet


@pytest.mark.parametrize(("value", "shown"), [("info", {"info", "warning"}), ("DEBUG", {"info", "debug", "warning"}),
                                              ("warning", {"warning"}), ("off", set())])
def test_the_environment_variable_turns_on_a_stderr_handler_at_import(value: str, shown: set[str]) -> None:
    done = _python(SAY, GGUF_PROVIDER_LOG=value)
    assert done.returncode == 0
    said = {word for word in ("info", "debug", "warning") if f"hello {word}" in done.stderr}
    assert said == shown, done.stderr
    if "info" in shown:
        assert "gguf_provider.runtime._serve.manager INFO: hello info" in done.stderr


def test_a_bad_value_warns_and_logs_nothing() -> None:
    done = _python(SAY, GGUF_PROVIDER_LOG="loud")
    assert done.returncode == 0
    assert "GGUF_PROVIDER_LOG" in done.stderr and "'loud'" in done.stderr and "hello" not in done.stderr


def test_enable_keeps_one_handler_and_writes_to_the_current_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    logs.enable("debug")
    first = logs.handler()
    logs.enable("info")
    logger = logging.getLogger(logs.LOGGER)
    assert [h for h in logger.handlers if h is logs.handler()] and first not in logger.handlers
    logging.getLogger("gguf_provider.engine").debug("not shown")
    logging.getLogger("gguf_provider.engine").info("shown")
    err = capsys.readouterr().err  # capsys replaced sys.stderr after the handler was made
    assert "gguf_provider.engine INFO: shown" in err and "not shown" not in err
    logs.enable("off")
    assert logs.handler() is None
    with pytest.raises(ValueError, match="use one of debug, info, warning, error or off"):
        logs.enable("verbose")


@pytest.mark.parametrize(("argv", "level"), [(["-v", "ps"], logging.INFO), (["ps", "-vv"], logging.DEBUG),
                                             (["-v", "ps", "-v"], logging.DEBUG), (["ps"], None)])
def test_cli_verbose_flags(argv: list[str], level: int | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    h = logs.handler()
    assert (h.level if h else None) == level
    assert "-v" in cli.build_parser().format_help()


def test_cli_verbose_in_a_real_process_logs_to_stderr_only() -> None:
    done = subprocess.run([sys.executable, "-m", "gguf_provider.cli", "-vv", "ps", "--json"], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.lstrip().startswith("{")  # stdout stays JSON


def test_magics_log_command() -> None:
    shell = globalipapp.start_ipython() or globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "gguf_provider")
    shell.run_line_magic("gguf", "log debug")
    h = logs.handler()
    assert h is not None and h.level == logging.DEBUG
    shell.run_line_magic("gguf", "log off")
    assert logs.handler() is None
    with pytest.raises(UsageError, match="log level 'loud'"):
        shell.run_line_magic("gguf", "log loud")
    assert gguf_provider.logs is logs
