"""The ``gguf-provider`` command line, every command in this one module: ``server install|info|path|version``,
``pull``, ``models``, ``serve`` (and the gateway), ``chat``, ``embed``, ``ps``, ``devices``, ``stop``. :func:`build_parser` builds the whole
parser; :func:`main` is the entry point."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import __version__, advice, flags, logs
from .errors import GGUFProviderError


def _bar(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, leave=True)


def cmd_server_install(args: argparse.Namespace) -> int:
    from .runtime import default

    bar: Any = None

    def progress(stage: str, done: int, total: int, detail: str = "") -> None:
        nonlocal bar
        if stage != "build":  # a download draws huggingface_hub's byte bar, as model downloads do
            return
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = _bar(total, "building llama-server")
        bar.update(done - bar.n)

    if args.cmake_arg and args.method == "prebuilt":
        print("gguf-provider: error: --cmake-arg applies to the source build only (--from source or auto)",
              file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        # A named backend is the one used from now on, though the machine would pick another; none: the machine's.
        inst = default().install(args.backend or "auto", method=args.method, force=args.force,
                                 cmake_args=args.cmake_arg, progress=progress, tag=args.tag)
    finally:
        if bar is not None:
            bar.close()
    took = time.monotonic() - t0
    what = "installed" if inst.fresh else "already installed"
    print(f"llama-server {what}: {inst.server} ({inst.version}, backend {inst.backend}, {inst.describe()}, "
          f"{took:.1f} s)")
    print(default().backend(inst.server).line)  # which backend and why
    return 0


def cmd_server_update(args: argparse.Namespace) -> int:
    from .runtime import default

    inst = default().update(args.backend or "auto")
    what = "installed" if inst.fresh else "already installed"
    print(f"llama.cpp {inst.marker.get('tag')} {what} and in use from now on: {inst.server} ({inst.version}); "
          "`gguf-provider server install` goes back to the pinned build")
    return 0


def cmd_server_list(args: argparse.Namespace) -> int:
    from .runtime import default

    found = default().installs()
    if args.json:
        print(json.dumps([{"path": str(i.server), "backend": i.backend, "version": i.version, "origin": i.describe(),
                           "tag": i.marker.get("tag"), "in_use": used} for i, used in found], indent=2))
        return 0
    if not found:
        print("nothing installed by gguf-provider (`gguf-provider server install`)")
    for inst, used in found:
        print(f"{'*' if used else ' '} {inst.backend:6}  {inst.describe():48}  {inst.server}")
    if found:
        print("* in use (when no llama-server is named or on PATH: `gguf-provider server info` says which runs)")
    return 0


def cmd_server_info(args: argparse.Namespace) -> int:
    from .runtime import default

    info = default().server_info()
    if info is None:
        print("no llama-server found: run `gguf-provider server install`", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"path:     {info['path']}\nfound by: {info['found_by']}\nruns as:  {' '.join(info['command'])} ARGS\n"
          f"version:  {info['version']}\nbuilt:    {info['built']} (the file's date)\norigin:   {info['origin']}")
    print(f"backend:  {info['backend']['why']}")
    if info["lacks"]:
        print("lacks:    " + "; ".join(f"{flag} ({what})" for flag, what in info["lacks"].items())
              + " (left out; `gguf-provider server install --tag latest` for a newer build)")
    print("tools:    " + (", ".join(f"{name} ({cmd})" for name, cmd in info["tools"].items()) or "none beside it"))
    print("flags:")
    for flag, ok in sorted(info["flags"].items()):
        print(f"  {'yes' if ok else 'no ':3} {flag}")
    return 0


def cmd_server_path(args: argparse.Namespace) -> int:
    from .runtime import default

    path = default().find_binary()
    print(path)  # stdout is the bare path (scripts read it); `server install` installs
    print(f"gguf-provider: {default().backend(path).why}", file=sys.stderr)
    return 0


def cmd_server_version(args: argparse.Namespace) -> int:
    from .runtime import default

    caps = default().capabilities(default().find_binary())
    if args.json:
        print(json.dumps({"path": caps.path, "version": caps.version, "flags": caps.flags}, indent=2))
        return 0
    print(f"{caps.path}\nversion: {caps.version}")
    for flag, ok in sorted(caps.flags.items()):
        print(f"  {'yes' if ok else 'no ':3} {flag}")
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    from .runtime import default

    now_running = default().status(live=True)  # each server's /metrics, all at once, "–" after a bounded wait
    rows, budget = now_running.servers, now_running.budget
    if args.json:
        print(json.dumps({"servers": [dataclasses.asdict(r) for r in rows], "budget": dataclasses.asdict(budget),
                          "gateways": [dataclasses.asdict(g) for g in now_running.gateways]}, indent=2))
        return 0
    if not rows:
        print("no servers running")
    now = time.time()
    for r in rows:
        print(f"{r.id}  pid {r.pid:>7}  ctx {r.ctx:>6}  threads {r.threads or '-':>2}  mem {r.memory / 2**20:6.0f} MiB (charge "
              f"{r.charge / 2**20:.0f}, rss {r.rss / 2**20:.0f})  leases {r.leases}  last used {now - r.last_used:6.0f}s ago  {r.model}  "
              f"{r.address}" + (f"  workers {','.join(r.workers)}" if r.workers else "")
              + (f"  {r.describe_options()}" if r.describe_options() else "")
              + (f"\n    on {r.describe_placement()}" if r.placement else "")
              + (f"\n    held by the gateway at {r.gateway}" if r.gateway else "")
              + (f"\n    API key in {r.key_file}" if r.key_file else "")
              + f"\n    live: {r.describe_metrics()}" + (f"\n    log: {r.log}" if r.log else ""))
    print(budget.describe())
    for g in now_running.gateways:
        print(f"gateway at {g.url} (pid {g.pid}) holds {len(g.servers)} server(s)"
              + (f": {', '.join(g.servers)}" if g.servers else ""))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from .runtime import default
    from .runtime._memory import rpc

    try:
        workers = rpc.normalize(args.rpc)
    except ValueError as exc:
        print(f"gguf-provider: error: --rpc: {exc}", file=sys.stderr)
        return 2
    try:
        seen = default().devices(workers)
    except ValueError as exc:  # a malformed $GGUF_PROVIDER_DEVICE_LIMIT
        print(f"gguf-provider: error: {exc}", file=sys.stderr)
        return 2
    listed, found, workers = seen.devices, seen.seen_by, seen.workers
    if workers and not any(d.kind == "rpc" for d in listed):
        print(f"gguf-provider: warning: no RPC device listed for {','.join(workers)}: is `gguf-provider rpc-worker` "
              "running there and reachable?", file=sys.stderr)
    if args.json:
        print(json.dumps([d.to_json() for d in listed], indent=2))
        return 0
    rows = [("name", "kind", "description", "free / total")]
    rows += [(d.name, d.kind, d.description, f"{d.free / 2**30:.1f} / {d.total / 2**30:.1f} GiB") for d in listed]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]))
    print(f"as seen by {found}" if found else
          "no llama-server found (`gguf-provider server install`): GPUs from nvidia-smi")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .runtime import ModelRef, default

    try:
        made = default().plan(ModelRef(args.spec, quant=args.quant), devices=args.device, rpc=args.rpc,
                              n_ctx=args.ctx, n_gpu_layers=args.n_gpu_layers, kv_cache_type=args.kv_cache_type,
                              speculative=args.speculative)
    except ValueError as exc:
        print(f"gguf-provider: error: {exc}", file=sys.stderr)
        return 2
    placed, where, extra = made.plan, made.where, made.speculative_extra
    if made.choice is not None:  # several quants: each planned, the automatic one marked
        if args.json:
            print(json.dumps({**made.choice.to_json(), "where": where}, indent=2))
        else:
            print(made.choice.describe())
            if made.choice.choice is not None:
                print(placed.describe())
            print(f"(planned for {where}; nothing was downloaded or started. `--quant Q` plans one quant; "
                  f"`gguf-provider plan {args.spec} --quant Q --json` gives its layers per device.)")
        return 0 if made.choice.choice is not None else 1
    if args.json:
        print(json.dumps(placed.to_json(), indent=2))
    else:
        print(placed.describe())
        print(f"(planned for {where}; nothing was started. " + (
            "With speculative decoding's drafted logits on the output device." if args.speculative else
            f"Speculative decoding, the chat adapters' default, holds {extra / 2**20:,.0f} MiB more logits on the "
            f"output device: --speculative plans for it.") + ")")
    return 0 if placed.fits else 1


def cmd_stop(args: argparse.Namespace) -> int:
    from .runtime import default

    if args.all and args.id is not None:
        print(f"gguf-provider: error: give {args.id!r} or --all, not both", file=sys.stderr)
        return 2
    rows = default().status().servers
    if not args.all and args.id is None:
        if not rows:
            print("no servers running")
            return 0
        _print_servers(rows, "running")
        print("gguf-provider: error: name the server to stop: `gguf-provider stop ID` (an id prefix or the model's "
              "name), or `gguf-provider stop --all`", file=sys.stderr)
        return 2
    if args.all:
        ids = [r.id for r in rows]
    else:  # an id prefix, else a model name (the file's stem, or its repo)
        ids = [r.id for r in rows if r.id.startswith(args.id)] or [r.id for r in rows if args.id in _names(r.model)]
        if not ids:
            print(f"gguf-provider: error: no server {args.id!r}" + _did_you_mean(args.id, rows), file=sys.stderr)
            if rows:
                _print_servers(rows, "running")
            return 1
    stopped = [e for key in ids for e in default().stop(key)]
    if args.all:
        stopped += default().stop(None)  # and stale entries ps no longer shows
    for e in stopped:
        if e.running:
            print(f"stopped pid {e.pid} ({e.model})")
        else:  # dead, or a pid now used by a process we did not start: only the entry goes
            print(f"removed the stale entry of pid {e.pid} (not our running server) ({e.model})")
    if not stopped:
        print("no servers running")
    return 0


def _names(model: str) -> set[str]:
    """What a user may call a server's model: its path, file name, stem (the models-dir name)."""
    path = Path(model)
    return {model, path.name, path.stem, path.stem.split("-0000")[0]}


def _did_you_mean(word: str, rows: list[Any]) -> str:
    close = difflib.get_close_matches(word, sorted({n for r in rows for n in _names(r.model) if "/" not in n}), n=1)
    return f": did you mean {close[0]!r}?" if close else ""


def _print_servers(rows: list[Any], what: str) -> None:
    print(f"{what}:", file=sys.stderr)
    for r in rows:
        print(f"  {r.id}  pid {r.pid}  {Path(r.model).name}", file=sys.stderr)


def cmd_pull(args: argparse.Namespace) -> int:
    from .runtime import ModelRef, default

    fetched = [0]

    def progress(stage: str, done: int, total: int, detail: str = "") -> None:
        if stage == "download":
            fetched[0] = max(fetched[0], done)

    resolved = default().pull(ModelRef(args.spec, quant=args.quant, vision=args.vision, progress=progress),
                              force=args.force)
    name = f"{resolved.repo}:{resolved.quant}" if resolved.quant else args.spec
    if resolved.cached:  # the Hub was not asked
        print(f"{name} is already in the Hugging Face cache; nothing was downloaded ({resolved.cached})",
              file=sys.stderr)
    elif fetched[0]:
        print(f"{name}: downloaded {fetched[0] / 2**20:,.0f} MiB", file=sys.stderr)
    else:
        print(f"{name} is up to date in the Hugging Face cache", file=sys.stderr)
    print(resolved.path)  # stdout: the bare path (scripts read it)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .runtime import default

    models = default().models()
    if args.json:
        print(json.dumps([dataclasses.asdict(m) for m in models], indent=2, default=str))
    elif not models:
        print("no local models")
    else:
        rows = [("name", "size", "path")] + [(m.name, f"{m.size_bytes / 2**20:,.0f} MiB", str(m.path)) for m in models]
        name_w, size_w = (max(len(r[i]) for r in rows) for i in (0, 1))
        for name, size, path in rows:
            print(f"{name:<{name_w}}  {size:>{size_w}}  {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.spec is None:
        return cmd_gateway(args)
    from .engine import Engine, EngineConfig
    from .runtime import default

    # A value this build (or the fit) refuses is a ValueError, exit 2 in main() as for every command
    engine = Engine(EngineConfig(model=args.spec, quant=args.quant, keep_alive=0, **flags.values(args)))
    info = engine.load()
    print(f"serving {info.model} (ctx {engine.n_ctx}, speculative {engine.config.speculative}, KV cache "
          f"{engine.config.kv_cache_type}"
          + (f", RPC workers {','.join(engine.config.rpc_servers)}" if engine.config.rpc_servers else "")
          + f") at {info.address.describe()} pid {info.pid}; Ctrl-C stops it", flush=True)
    _said_ctx(args, engine.n_ctx)
    if info.address.api_key:
        key_file = next((r.key_file for r in default().status().servers if r.pid == info.pid), "")
        print(f"clients send the API key in {key_file or 'its key file in the runtime dir'} (0600) as "
              "`Authorization: Bearer KEY`", flush=True)
    _stop_on_signals()  # TERM and HUP unload as Ctrl-C does (after kill -9, the watchdog stops the server)
    try:
        while info.alive():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        engine.unload()
    return 0


def _said_ctx(args: argparse.Namespace, n_ctx: int) -> None:
    asked = getattr(args, "n_ctx", None)
    if asked is not None and asked != n_ctx:
        print(f"gguf-provider: note: --ctx {asked} became {n_ctx}: llama.cpp rounds a context up to a multiple of "
              "256" if n_ctx > asked else f"gguf-provider: note: --ctx {asked} became {n_ctx} (the server's own "
              "answer)", file=sys.stderr, flush=True)


def cmd_chat(args: argparse.Namespace) -> int:
    from . import terminal
    from .engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=args.spec, quant=args.quant, **flags.values(args)))
    try:
        engine.load()
        _said_ctx(args, engine.n_ctx)
        return terminal.run(engine, system=args.system)
    finally:
        engine.unload()


def cmd_gateway(args: argparse.Namespace) -> int:
    from . import gateway
    from .runtime import default

    key = gateway.read_key_file(args.api_key_file) if args.api_key_file else None
    aliases = gateway.Aliases.parse(args.alias, args.aliases)
    options = flags.values(args)
    port = options.pop("port", None)  # with no model, --port is the gateway's (its servers get private sockets)
    settings = gateway.Settings(host=args.host, port=gateway.DEFAULT_PORT if port is None else port, api_key=key,
                                allow_origins=tuple(args.allow_origin), max_body=args.max_body,
                                keep_alive=args.keep_alive, server_options=options, aliases=aliases,
                                keepalive=args.stream_keepalive, key_file=args.api_key_file or "",
                                responses_max=args.responses_max,
                                responses_dir=str(default().home() / "responses") if args.responses_on_disk else None)

    def ready(url: str) -> None:
        print(f"gateway at {url} (OpenAI {url}/v1, Anthropic {url}, Ollama {url}); models from "
              f"`gguf-provider models` or any org/repo[:QUANT]; Ctrl-C stops it", flush=True)
        if key:
            print(f"clients send the API key in {args.api_key_file}", flush=True)

    gateway.serve(settings, on_ready=ready)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from . import launch

    return launch.run(launch.Request(args.tool, model=args.model, small_model=args.small_model, url=args.url,
                                     api_key_file=args.api_key_file, print_env=args.print_env,
                                     write_config=args.write_config, args=getattr(args, "tool_args", [])))


RPC_WARNING = ("the RPC protocol has no authentication and no encryption: anyone who can reach {where} can run "
               "computations on this machine and read what it holds. Listen only on a trusted network")


def cmd_rpc_worker(args: argparse.Namespace) -> int:
    from .runtime import default
    from .runtime._common.process import dies_with_parent, stop_child
    from .runtime._memory import rpc

    if not rpc.is_loopback(args.host) and not args.unauthenticated_ok:
        print(f"gguf-provider: error: --host {args.host} is not loopback and "
              + RPC_WARNING.format(where=f"{args.host}:{args.port}")
              + "; pass --i-know-rpc-is-unauthenticated to listen there anyway (docs/distributed.md)",
              file=sys.stderr)
        return 2
    binary = rpc.find_rpc_server(default().binary())
    if binary is None:
        print("gguf-provider: error: no rpc-server found (beside llama-server, in our install or on PATH); "
              "`gguf-provider server install` builds one", file=sys.stderr)
        return 1
    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30).stderr
    try:
        argv = rpc.worker_argv(binary, host=args.host, port=args.port, threads=args.threads, cache=args.cache,
                               mem_mib=args.mem, help_text=help_text)
    except ValueError as exc:
        print(f"gguf-provider: error: {exc}", file=sys.stderr)
        return 2
    print(f"gguf-provider: warning: {RPC_WARNING.format(where=f'{args.host}:{args.port}')}", file=sys.stderr,
          flush=True)
    local = "127.0.0.1" if args.host in ("0.0.0.0", "") else "::1" if args.host == "::" else args.host
    endpoint = f"[{local}]:{args.port}" if ":" in local else f"{local}:{args.port}"
    _stop_on_signals()
    proc: subprocess.Popen[str] | None = None
    try:
        # Forked from the main thread, which lives as long as we do: on Linux the worker dies with us even on kill -9.
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", preexec_fn=dies_with_parent())
        threading.Thread(target=_echo, args=(proc,), daemon=True).start()
        info = _greet(proc, endpoint)
        if info is None:
            print(f"gguf-provider: error: rpc-server exited with status {proc.wait()} before it listened on "
                  f"{args.host}:{args.port} (its output is above)", file=sys.stderr)
            return 1
        print(f"rpc-worker: {binary} pid {proc.pid} listening on {args.host}:{args.port} (RPC v{info.version}); "
              f"offers {info.offer()}", flush=True)
        print(f"use it with rpc_servers=['{args.host}:{args.port}'] or --rpc {args.host}:{args.port}; Ctrl-C stops it",
              flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if proc is not None:
            stop_child(proc)


def _stop_on_signals() -> None:
    """SIGTERM (kill, systemd, docker stop) and SIGHUP (the terminal closed) end the command like Ctrl-C does, so
    its ``finally`` stops the child; by default they would end Python at once and leave the child running."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for name in ("SIGTERM", "SIGHUP"):  # Windows has no SIGHUP
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), stop)


def _echo(proc: subprocess.Popen[str]) -> None:
    """rpc-server's own lines (its banner arrives with the first client: it does not flush before)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"rpc-server: {line.rstrip()}", flush=True)


def _greet(proc: subprocess.Popen[str], endpoint: str, timeout: float = 30.0) -> Any:
    """The worker's own answer (memory it offers) once it listens; None if it exited first."""
    from .errors import RPCWorkerUnreachableError
    from .runtime._memory import rpc

    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        try:
            return rpc.probe(endpoint, connect_timeout=1.0)
        except RPCWorkerUnreachableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return None


def cmd_embed(args: argparse.Namespace) -> int:
    from .engine import Engine, EngineConfig

    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        print("gguf-provider: error: give texts as arguments or one per line on stdin", file=sys.stderr)
        return 2
    engine = Engine(EngineConfig(model=args.spec, embedding=True, keep_alive=args.keep_alive,
                                 **flags.values(args, ("server", "embedding"))))
    _hint_chat_model(args.spec, getattr(args, "pooling", None))
    try:
        vectors = engine.embed(texts, truncate=args.truncate)
    finally:
        engine.unload()
    if args.json:
        print(json.dumps({"model": engine.model_name, "dimensions": len(vectors[0]),
                          "data": [{"index": i, "text": t, "embedding": v}
                                   for i, (t, v) in enumerate(zip(texts, vectors, strict=True))]}))
    else:
        for v in vectors:
            print(json.dumps(v))
    return 0


def _hint_chat_model(spec: str, pooling: str | None) -> None:
    """A chat model serves embeddings too, but poor ones for search: say so before the user indexes with it."""
    from .runtime import default

    try:
        header = default().describe(spec)
    except (GGUFProviderError, OSError, ValueError):
        return  # the engine's own load says what is wrong
    if header.get("chat_template") and not header.get("pooling") and pooling is None:
        print(f"gguf-provider: warning: {spec} is a chat model ({header.get('architecture')}): its vectors are poor "
              "for search and similarity; an embedding model (all-MiniLM-L6-v2, bge, nomic-embed, Qwen3-Embedding) "
              "gives better ones (docs/embeddings.md)", file=sys.stderr)


def cmd_rerank(args: argparse.Namespace) -> int:
    from .engine import Engine, EngineConfig

    docs = args.document or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not docs:
        print("gguf-provider: error: give documents as arguments or one per line on stdin", file=sys.stderr)
        return 2
    engine = Engine(EngineConfig(model=args.spec, rerank=True, keep_alive=args.keep_alive,
                                 **flags.values(args, ("server",))))
    try:
        ranked = engine.rerank(args.query, docs, top_n=args.top_n)
    finally:
        engine.unload()
    if args.json:
        print(json.dumps({"model": engine.model_name, "query": args.query,
                          "results": [{"rank": n, "index": r.index, "score": r.score, "document": docs[r.index]}
                                      for n, r in enumerate(ranked, 1)]}))
    else:
        for n, r in enumerate(ranked, 1):
            print(f"{n:>3}  {r.score:10.4f}  {docs[r.index]}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Options anywhere among a command's positionals (``embed MODEL --json "text"``: argparse's intermixed
    parsing), each error under the command's own usage, and "did you mean" for a misspelled flag or command."""

    _inside = False  # parse_known_intermixed_args calls parse_known_args: the second call is the plain one

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._inside or self._subparsers is not None:  # a command group: its command parses the rest
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            parsed, extras = super().parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False
        if extras:  # this command's error, not the top-level usage's
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._did_you_mean(extras)}")
        return parsed, extras

    def _did_you_mean(self, words: list[str]) -> str:
        flags_ = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for word in words:
            close = difflib.get_close_matches(word.split("=", 1)[0], flags_, n=1, cutoff=0.7) \
                if word.startswith("-") else []
            if close:
                return f" (did you mean {close[0]}?)"
        return ""

    def error(self, message: str) -> Any:
        bad = re.match(r"argument (\w+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:  # a command: the close one, and where the list of commands is
            choices = re.findall(r"'([^']*)'", bad.group(3))
            close = difflib.get_close_matches(bad.group(2), choices, n=1, cutoff=0.6)
            message = (f"no command {bad.group(2)!r}" + (f": did you mean {close[0]!r}?" if close else "")
                       + f" (the commands: {', '.join(choices)})")
        one = re.match(r"argument (--[\w-]+): expected one argument", message)
        if one:
            message += f" (a value that starts with '-' is written {one.group(1)}=VALUE)"
        missing = re.match(r"the following arguments are required: (.*)", message)
        if missing:  # intermixed parsing names optional positionals (nargs "*") too
            optional = {a.dest for a in self._get_positional_actions() if a.nargs in ("*", "?")}
            names = [n for n in missing.group(1).split(", ") if n not in optional]
            commands = {a.dest for a in self._actions if isinstance(a, argparse._SubParsersAction)}
            message = (f"give a command: {', '.join(self._commands())}" if set(names) & commands else
                       f"the following arguments are required: {', '.join(names)}")
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` says more)\n")

    def _commands(self) -> list[str]:
        return [c for a in self._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices]

    def format_usage(self) -> str:
        usage = super().format_usage()
        if usage.count("\n") <= 3:
            return usage
        # A command with many flags: the positionals, and the flags under --help (not forty lines before an error)
        positionals = " ".join(a.metavar if isinstance(a.metavar, str) else a.dest if a.nargs is None
                               else f"[{a.dest} ...]" if a.nargs == "*" else f"[{a.dest}]"
                               for a in self._get_positional_actions())
        return f"usage: {self.prog} [options] {positionals}\n"


def _command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str,
             json_flag: bool = False) -> argparse.ArgumentParser:
    """Add command ``name`` to ``sub``, run by ``func(args)``; ``json_flag`` gives it ``--json``."""
    cmd: argparse.ArgumentParser = sub.add_parser(name, help=help)
    _verbose(cmd, "verbose_cmd")
    if json_flag:
        cmd.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of text")
    cmd.set_defaults(func=func)
    return cmd


def _verbose(parser: argparse.ArgumentParser, dest: str) -> None:
    parser.add_argument("-v", "--verbose", dest=dest, action="count", default=0,
                        help="log what gguf-provider does to stderr: -v info, -vv debug (docs/logging.md)")


def _number(low: float, high: float | None = None, kind: type = int) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` in ``[low, high]``, else argparse's one-line error."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: {low:g} to {high:g}" if high is not None
                                             else f"{text} is out of range: {low:g} or more")
        return value
    return parse


def _keep_alive(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-alive", type=_number(-1, kind=float), metavar="SECONDS",
                        help="how long the server stays loaded after this command, for the next one (default: "
                             "$GGUF_PROVIDER_KEEP_ALIVE or 300; 0 stops it when the command ends, -1 only `stop` does)")


DEFAULT_GATEWAY_PORT = 11480  # gateway.DEFAULT_PORT (the gateway loads only when it runs)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gguf-provider`` parser: every command and flag is declared here."""
    p = _Parser(prog="gguf-provider", description="Local GGUF models on a managed llama-server.")
    p.add_argument("--version", action="version", version=f"gguf-provider {__version__}")
    _verbose(p, "verbose")  # before or after the command: `gguf-provider -v ps`, `gguf-provider ps -v`
    sub = p.add_subparsers(dest="command", required=True)

    server = sub.add_parser("server", help="the llama-server binary: install, update, list, info, path, version")
    _verbose(server, "verbose_group")  # `gguf-provider server -v info`, as on every command
    ssub = server.add_subparsers(dest="server_command", required=True)
    inst = _command(ssub, "install", cmd_server_install,
                    "install llama-server: llama.cpp's pinned release archive, else a build from the pinned source")
    inst.add_argument("--backend", choices=["auto", "cpu", "cuda", "vulkan", "metal"],
                      help="the backend to install and use from now on (default: auto, the one that fits this "
                           "machine, which a later `server install` without --backend also goes back to)")
    inst.add_argument("--from", dest="method", default="auto", choices=["auto", "prebuilt", "source"],
                      help="auto (default): an existing install, else the release archive, else the source build")
    inst.add_argument("--tag", metavar="bNNNN|latest|pin",
                      help="the llama.cpp release to install and use from now on (default: pin, the one gguf-provider "
                           "is tested with; installs of other releases stay beside it)")
    inst.add_argument("--force", action="store_true", help="reinstall even if already installed")
    inst.add_argument("--cmake-arg", action="append", default=[], metavar="ARG",
                      help="an extra cmake configure argument (repeatable; implies the source build)")
    upd = _command(ssub, "update", cmd_server_update, "install the newest llama.cpp release whose archive passes "
                   "the smoke run, and use it from now on (`server install` goes back to the pinned one)")
    upd.add_argument("--backend", choices=["auto", "cpu", "cuda", "vulkan", "metal"],
                     help="the backend (default: the one that fits this machine)")
    _command(ssub, "list", cmd_server_list, "every llama-server gguf-provider installed, the one in use marked",
             json_flag=True)
    _command(ssub, "info", cmd_server_info,
             "the llama-server discovery finds: path, version, where it came from, the flags it supports",
             json_flag=True)
    _command(ssub, "path", cmd_server_path, "print the llama-server that discovery would use")
    _command(ssub, "version", cmd_server_version, "print its version and which optional flags it supports",
             json_flag=True)

    _command(sub, "ps", cmd_ps, "list the servers gguf-provider started", json_flag=True)
    devs = _command(sub, "devices", cmd_devices,
                    "the devices llama-server can use (its --list-devices) and the host RAM, with free memory",
                    json_flag=True)
    devs.add_argument("--rpc", default="", metavar="HOST:PORT,...", help="RPC workers to list as devices too")
    plan = _command(sub, "plan", cmd_plan, "where a model's layers, KV cache and context would go, without starting "
                    "anything (exit status 1 when it does not fit)", json_flag=True)
    plan.add_argument("spec", help="a model: path, name in the models dir, or org/repo[:QUANT]")
    plan.add_argument("--quant", help="the quantization to pick from a repo or the models dir (as :QUANT)")
    plan.add_argument("--ctx", type=_number(1), help="the context to plan for (default: chosen as a start would)")
    plan.add_argument("--n-gpu-layers", type=_number(-1), metavar="N", help="layers on the GPUs (default: as many as fit)")
    plan.add_argument("--kv-cache-type", default="f16", metavar="TYPE", help="the KV cache's type (default f16; "
                      "q8_0 halves it)")
    plan.add_argument("--device", action="append", default=[], metavar="KIND:MEMORY",
                      help="plan for this device instead of this machine's (repeatable): cuda:8GiB, vulkan:1260MiB, "
                           "metal:24GiB, cpu:64GiB for RAM (without a cpu: entry, this machine's free RAM)")
    plan.add_argument("--rpc", default="", metavar="HOST:PORT,...", help="RPC workers to plan over")
    plan.add_argument("--speculative", action="store_true",
                      help="count speculative decoding's drafted logits on the output device (ChatGGUF's and GGUF's "
                           "default speculative='auto' does it; a start always counts what it runs)")
    stop = _command(sub, "stop", cmd_stop, "stop a server `ps` lists, by its id (a prefix will do) or its model's name")
    stop.add_argument("id", nargs="?", help="the server's id or its model's name (none: the servers are listed)")
    stop.add_argument("--all", action="store_true", help="stop every server gguf-provider started for this user")
    pull = _command(sub, "pull", cmd_pull, "download a model (org/repo[:QUANT]) into the HF cache, or bring it up to "
                    "date; prints its path")
    pull.add_argument("spec", help="a Hugging Face repo: org/repo[:QUANT]")
    pull.add_argument("--quant", help="the quantization to pick from the repo (as :QUANT; default: Q4_K_M, else the "
                      "first of Q4_K_S, Q5_K_M, Q8_0, else the smallest)")
    pull.add_argument("--vision", action="store_true", help="the multimodal projector (mmproj) too")
    pull.add_argument("--force", action="store_true", help="download again what is already in the cache")
    _command(sub, "models", cmd_models, "list local GGUF models (models dirs and HF cache)", json_flag=True)
    serve = _command(sub, "serve", cmd_serve, "run a model in the foreground (shared with other clients); with no "
                     "model, a gateway that serves every model over OpenAI, Anthropic and Ollama's APIs (its port: "
                     f"--port, default {DEFAULT_GATEWAY_PORT})")
    serve.add_argument("spec", nargs="?", help="a model: path, name in the models dir, or org/repo[:QUANT] (none: the "
                       "gateway)")
    serve.add_argument("--quant", help="the quantization to pick from a repo (as :QUANT)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="the gateway's address (default: loopback only; another needs --api-key-file)")
    serve.add_argument("--api-key-file", metavar="PATH",
                       help="a file (mode 600) holding the key clients must send (Authorization: Bearer or x-api-key)")
    serve.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="a web page origin the gateway answers (CORS; repeatable; default: none)")
    serve.add_argument("--max-body", type=_number(1), default=64 * 2**20, metavar="BYTES",
                       help="the largest request body taken (default 64 MiB)")
    serve.add_argument("--keep-alive", type=_number(-1, kind=float), metavar="SECONDS",
                       help="how long a model the gateway started stays loaded once idle (default: "
                            "$GGUF_PROVIDER_KEEP_ALIVE or 300)")
    serve.add_argument("--stream-keepalive", type=_number(0.01, kind=float), default=10.0, metavar="SECONDS",
                       help="a streamed reply whose first token takes longer (a long prompt) gets its head and a "
                            "keep-alive every SECONDS until it comes (default 10; clients give up after minutes of "
                            "silence)")
    serve.add_argument("--responses-on-disk", action="store_true",
                       help="keep stored Responses API responses (store: true) on disk under the home, across "
                            "restarts (default: in memory)")
    serve.add_argument("--responses-max", type=_number(1), default=1024, metavar="N",
                       help="stored Responses API responses kept at most (default 1024; then the least recently "
                            "used goes first; 64 MiB in all)")
    serve.add_argument("--alias", action="append", default=[], metavar="PATTERN=MODEL",
                       help="answer requests for PATTERN (a name or a pattern such as 'claude-*') with MODEL "
                            "(repeatable; the first match wins)")
    serve.add_argument("--aliases", metavar="FILE", help="alias rules from a file: one PATTERN=MODEL per line, # "
                       "comments (after the --alias ones)")
    flags.add_to(serve)  # every llama-server option of a chat model, as ChatGGUF and GGUF take it
    launch = _command(sub, "launch", cmd_launch, "run a coding agent (Claude Code, Codex, opencode) on a local model "
                      "through the gateway, set up for this run only; `-- ARGS` go to the tool")
    launch.add_argument("tool", choices=["claude", "codex", "opencode"], help="the agent to run")
    launch.add_argument("model", nargs="?", help="the model (default: the largest local model whose chat template "
                        "takes tools, whose context holds the tool's first request and a reply, and that fits "
                        "this machine; none: launch says why each was passed over)")
    launch.add_argument("--small-model", metavar="MODEL", help="the tool's small/fast model (Claude Code's and "
                        "opencode's side requests; default: the same model, so no second one is loaded)")
    launch.add_argument("--url", help="the gateway to use (default: the one running for this user, else one started "
                        "for this run and stopped after it)")
    launch.add_argument("--api-key-file", metavar="PATH", help="the key file of the gateway --url names")
    launch.add_argument("--print-env", action="store_true",
                        help="print the shell lines that set the tool up, and run nothing")
    launch.add_argument("--write-config", action="store_true", help="write the tool's own config (Claude Code's "
                        "~/.claude/settings.json, Codex's ~/.codex/config.toml profile 'gguf', opencode's "
                        "opencode.json) for later runs without launch, and run nothing")
    talk = _command(sub, "chat", cmd_chat, "chat with a model in the terminal (streamed replies, /help for commands)")
    talk.add_argument("spec", help="a model: path, name in the models dir, or org/repo[:QUANT]")
    talk.add_argument("--quant", help="the quantization to pick from a repo (as :QUANT)")
    talk.add_argument("--system", metavar="TEXT", help="a system prompt (/system changes it in the chat)")
    flags.add_to(talk)  # the same server options as `serve`: the same server is shared
    worker = _command(sub, "rpc-worker", cmd_rpc_worker,
                      "run a llama.cpp RPC worker (rpc-server) in the foreground for another machine's llama-server")
    worker.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: loopback only; another needs the flag below)")
    worker.add_argument("--port", type=_number(1, 65535), default=50052, help="port to listen on (default 50052)")
    worker.add_argument("--mem", type=_number(1), metavar="MiB", help="memory to offer (builds with rpc-server --mem)")
    worker.add_argument("--threads", type=_number(1), metavar="N", help="CPU threads (default: rpc-server's)")
    worker.add_argument("--cache", action="store_true", help="keep received tensors in a local file cache")
    worker.add_argument("--i-know-rpc-is-unauthenticated", dest="unauthenticated_ok", action="store_true",
                        help="listen on a non-loopback address although anyone who reaches it can use the worker")
    embed = _command(sub, "embed", cmd_embed, "embed texts (arguments, or lines of stdin): one JSON vector per line",
                     json_flag=True)
    embed.add_argument("spec", help="an embedding model: path, name in the models dir, or org/repo[:QUANT]")
    embed.add_argument("text", nargs="*", help="the texts (none: one per line of stdin)")
    embed.add_argument("--truncate", action="store_true",
                       help="embed the first tokens of a text longer than the model's context instead of failing")
    _keep_alive(embed)
    flags.add_to(embed, ("server", "embedding"))  # as GGUFEmbeddings and GGUFEmbedding take them
    rerank = _command(sub, "rerank", cmd_rerank, "rank documents (arguments, or lines of stdin) by a reranker model's "
                      "relevance score to a query: rank, score, document per line, best first", json_flag=True)
    rerank.add_argument("spec", help="a reranker model (e.g. bge-reranker-v2-m3): path, name in the models dir, or "
                        "org/repo[:QUANT]")
    rerank.add_argument("query", help="what the documents are ranked against")
    rerank.add_argument("document", nargs="*", help="the documents (none: one per line of stdin)")
    rerank.add_argument("--top-n", type=_number(1), help="print only the best N (default: all)")
    _keep_alive(rerank)
    flags.add_to(rerank, ("server",))
    return p


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """A warning as the CLI's own line, in its words (the library line it came from means nothing here)."""
    print(f"gguf-provider: warning: {advice.render(str(message), 'cli')}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    head, tail = (given[:given.index("--")], given[given.index("--") + 1:]) if "--" in given else (given, [])
    args = build_parser().parse_args(head) if tail else None
    if args is None or args.command != "launch":  # `-- ARGS` are launch's tool's; elsewhere argparse's own `--`
        args = build_parser().parse_args(given)
    else:
        args.tool_args = tail
    level = logs.verbosity(args.verbose + getattr(args, "verbose_group", 0) + getattr(args, "verbose_cmd", 0))
    if level is not None:  # else $GGUF_PROVIDER_LOG, applied at import, stands
        logs.enable(level)
    warnings.showwarning = _show_warning
    try:
        rc: int = args.func(args)
        return rc
    except GGUFProviderError as exc:
        print(f"gguf-provider: error: {advice.render(str(exc), 'cli')}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an option's value, refused by its check (or the build's) before anything runs
        print(f"gguf-provider: error: {advice.render(str(exc), 'cli')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gguf-provider ps | head`: the reader left; no traceback (Python's documented way)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
