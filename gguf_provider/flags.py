"""The llama-server options as command-line flags: ``gguf-provider serve``, ``embed``, ``rerank``, ``%gguf load``.

Made from :data:`gguf_provider.runtime._serve.OPTIONS` by group, as the adapters' fields are, so an option
declared there is a flag of these commands too: ``--name-with-dashes`` (a few keep the short names they had), its
type and help from the declaration. A flag not given is left out and the
:class:`~gguf_provider.engine.EngineConfig` default holds; a misspelled one is argparse's error.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable
from typing import Any

from .runtime import OPTIONS, ServerOption

GROUPS = ("server", "chat")  # a chat server's options: what `serve` and `%gguf load` start
NAMES = {"n_ctx": ("--ctx", "--n-ctx"), "rpc_servers": ("--rpc",), "server_args": ("--server-arg",)}
METAVARS = {"n_ctx": "TOKENS", "rpc_servers": "HOST:PORT,...", "server_args": "ARG",
            "speculative": "auto|off|TYPE|DRAFT", "kv_cache_type": "TYPE", "llama_server": "PATH", "mmproj": "PATH",
            "chat_template_file": "PATH"}
COMMA_LISTS = {"rpc_servers"}  # one flag, the items comma-separated (the option's normalizer splits them)


def options(groups: Iterable[str] = GROUPS) -> list[ServerOption]:
    wanted = set(groups)
    return [o for o in OPTIONS if o.group in wanted]


def names(o: ServerOption) -> tuple[str, ...]:
    return NAMES.get(o.name, ("--" + o.name.replace("_", "-"),))


def label(o: ServerOption) -> str:
    """The flag as docs/reference.md shows it: ``--ctx``, ``--no-prompt-cache`` (a switch that is on by default)."""
    first = names(o)[0]
    return f"--no-{first[2:]}" if o.default is True else first


def _kind(annotation: Any) -> tuple[Any, list[Any] | None]:
    """The flag's value type and its choices, from the declared annotation (``int | None``, ``Literal[...]``)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        if str in args:  # bool | str (speculative): the option's own normalizer reads "off", "auto", a type
            return str, None
        return _kind(args[0])
    if typing.get_origin(annotation) is typing.Literal:
        return str, list(typing.get_args(annotation))
    return annotation, None


def add_to(parser: argparse.ArgumentParser, groups: Iterable[str] = GROUPS) -> None:
    """Add a flag for each server option of ``groups`` to ``parser``."""
    for o in options(groups):
        help_ = o.description.replace("%", "%%")
        kind, choices = _kind(o.type)
        if kind is bool:
            parser.add_argument(*names(o), dest=o.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_)
        elif typing.get_origin(kind) is list and o.name not in COMMA_LISTS:  # one flag per item
            parser.add_argument(*names(o), dest=o.name, action="append", metavar=METAVARS.get(o.name, "VALUE"),
                                default=argparse.SUPPRESS, help=help_ + " One flag each (`--server-arg=--flag`).")
        else:
            parser.add_argument(*names(o), dest=o.name, type=kind if kind in (int, float) else str, choices=choices,
                                metavar=METAVARS.get(o.name, "N" if kind is int else "VALUE"),
                                default=argparse.SUPPRESS, help=help_)


def values(ns: argparse.Namespace, groups: Iterable[str] = GROUPS) -> dict[str, Any]:
    """The server options given on the command line, as EngineConfig keyword arguments."""
    given = vars(ns)
    return {o.name: tuple(given[o.name]) if isinstance(given[o.name], list) else given[o.name]
            for o in options(groups) if o.name in given}
