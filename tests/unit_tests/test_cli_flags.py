"""The llama-server options as flags of `serve`, `embed`, `rerank` and `%gguf load` (gguf_provider/flags.py): each
declared option is one, with the adapters' meaning, and reaches the engine config; a wrong one is refused."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from IPython.core.error import UsageError

from gguf_provider import cli, flags
from gguf_provider.engine import EngineConfig
from gguf_provider.jupyter.commands import _load_parser, load_config
from gguf_provider.runtime._serve import server_options


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _dests(p: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in p._actions}


COMMANDS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("serve", lambda: _subparser("serve"), ("server", "chat")),
    ("embed", lambda: _subparser("embed"), ("server", "embedding")),
    ("rerank", lambda: _subparser("rerank"), ("server",)),
    ("%gguf load", _load_parser, ("server", "chat")),
]


@pytest.mark.parametrize(("name", "parser", "groups"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_declared_option_of_the_adapters_is_a_flag(name: str, parser: Any, groups: tuple[str, ...]) -> None:
    """The adapters' server fields come from the same groups (options.py): a new ServerOption is a flag too."""
    wanted = {o.name for o in server_options.OPTIONS if o.group in groups}
    assert wanted and wanted <= _dests(parser())
    others = {o.name for o in server_options.OPTIONS} - wanted  # e.g. pooling on a chat server, embedding itself
    assert not others & _dests(parser())


SERVE = ["--ctx", "2048", "--n-gpu-layers", "3", "--n-parallel", "2", "--chat-template", "chatml",
         "--reasoning-format", "none", "--rpc", "127.0.0.1:50052,127.0.0.1:50053", "--server-arg=--threads",
         "--server-arg", "1", "--port", "0", "--speculative", "off", "--kv-cache-type", "q8_0", "--no-prompt-cache",
         "--cache-reuse", "0", "--llama-server", "/opt/llama-server", "--mmproj", "p.gguf", "--vision"]
EXPECTED = dict(n_ctx=2048, n_gpu_layers=3, n_parallel=2, chat_template="chatml", reasoning_format="none",
                rpc_servers=("127.0.0.1:50052", "127.0.0.1:50053"), server_args=("--threads", "1"), port=0,
                speculative="off", kv_cache_type="q8_0", prompt_cache=False, cache_reuse=0,
                llama_server="/opt/llama-server", mmproj="p.gguf", vision=True)


def test_serve_flags_reach_the_engine_config_as_the_keywords_would() -> None:
    ns = cli.build_parser().parse_args(["serve", "m.gguf", *SERVE])
    assert EngineConfig(model="m.gguf", **flags.values(ns)) == EngineConfig(model="m.gguf", **EXPECTED)


def test_load_flags_reach_the_engine_config_as_the_keywords_would() -> None:
    ns = _load_parser().parse_args(["m.gguf", "--quant", "Q8_0", "--as", "m", *SERVE])
    assert load_config(ns) == EngineConfig(model="m.gguf", quant="Q8_0", **EXPECTED)


def test_no_flag_leaves_every_default_to_the_engine_config() -> None:
    """A flag not given is not passed, so the defaults are EngineConfig's (the adapters' too), not the parser's."""
    assert flags.values(cli.build_parser().parse_args(["serve", "m.gguf"])) == {}
    assert load_config(_load_parser().parse_args(["m.gguf"])) == EngineConfig(model="m.gguf")


def test_embed_and_rerank_take_their_groups() -> None:
    ns = cli.build_parser().parse_args(["embed", "m.gguf", "a", "--pooling", "cls", "--ctx", "512"])
    assert flags.values(ns, ("server", "embedding")) == {"pooling": "cls", "n_ctx": 512}
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["embed", "m.gguf", "a", "--pooling", "max"])  # not a pooling type
    ns = cli.build_parser().parse_args(["rerank", "m.gguf", "q", "d", "--n-gpu-layers", "0"])
    assert flags.values(ns, ("server",)) == {"n_gpu_layers": 0}


def test_a_misspelled_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "m.gguf", "--cach-reuse", "0"])
    assert "unrecognized arguments: --cach-reuse" in capsys.readouterr().err
    with pytest.raises(UsageError, match="unrecognized arguments: --cach-reuse"):
        _load_parser().parse_args(["m.gguf", "--cach-reuse", "0"])


def test_a_wrong_value_is_refused_by_the_options_check_before_a_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "m.gguf", "--cache-reuse", "-1"]) == 2
    assert "`--cache-reuse -1`: pass a chunk size" in capsys.readouterr().err  # the CLI's words (advice.py)
    assert cli.main(["embed", "m.gguf", "a", "--rpc", "nohost"]) == 2
    assert "gguf-provider: error:" in capsys.readouterr().err
    with pytest.raises(UsageError, match="%gguf load: `--cache-reuse -1`"):
        load_config(_load_parser().parse_args(["m.gguf", "--cache-reuse", "-1"]))
