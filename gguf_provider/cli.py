"""The ``gguf-provider`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from . import __version__
from .errors import GGUFProviderError


def _bar(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, leave=True)


def cmd_server_install(args: argparse.Namespace) -> int:
    from .runtime import install

    bar: Any = None

    def progress(stage: str, done: int, total: int, detail: str = "") -> None:
        nonlocal bar
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = _bar(total, "building llama-server")
        bar.update(done - bar.n)

    t0 = time.monotonic()
    before = install.installed(args.backend)
    try:
        inst = install.install(args.backend, force=args.force, cmake_args=args.cmake_arg, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    took = time.monotonic() - t0
    what = "already installed" if before is not None and not args.force and not args.cmake_arg else "installed"
    print(f"llama-server {what}: {inst.server} ({inst.version}, backend {inst.backend}, {took:.1f} s)")
    return 0


def cmd_server_path(args: argparse.Namespace) -> int:
    from .runtime.discovery import find_llama_server

    print(find_llama_server())
    return 0


def cmd_server_version(args: argparse.Namespace) -> int:
    from .runtime.discovery import find_llama_server, probe

    caps = probe(find_llama_server())
    if args.json:
        print(json.dumps({"path": caps.path, "version": caps.version, "flags": caps.flags}, indent=2))
        return 0
    print(f"{caps.path}\nversion: {caps.version}")
    for flag, ok in sorted(caps.flags.items()):
        print(f"  {'yes' if ok else 'no ':3} {flag}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-provider", description="Local GGUF models on a managed llama-server.")
    p.add_argument("--version", action="version", version=f"gguf-provider {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    server = sub.add_parser("server", help="the llama-server binary: install, path, version")
    ssub = server.add_subparsers(dest="server_command", required=True)
    inst = ssub.add_parser("install", help="build llama-server from a pinned llama.cpp source")
    inst.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "vulkan", "metal"])
    inst.add_argument("--force", action="store_true", help="rebuild even if already installed")
    inst.add_argument("--cmake-arg", action="append", default=[], metavar="ARG",
                      help="an extra cmake configure argument (repeatable)")
    inst.set_defaults(func=cmd_server_install)
    sp = ssub.add_parser("path", help="print the llama-server that discovery would use")
    sp.set_defaults(func=cmd_server_path)
    sv = ssub.add_parser("version", help="print its version and which optional flags it supports")
    sv.add_argument("--json", action="store_true")
    sv.set_defaults(func=cmd_server_version)

    from . import _cli_models

    _cli_models.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
        return rc
    except GGUFProviderError as exc:
        print(f"gguf-provider: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
