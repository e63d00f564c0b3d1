"""CLI commands about models and running servers: pull, models, ps, stop, serve."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def cmd_ps(args: argparse.Namespace) -> int:
    import psutil

    from .runtime import registry

    registry.sweep()
    rows = []
    for key, e in registry.read().items():
        try:
            rss = psutil.Process(int(e["pid"])).memory_info().rss
        except psutil.Error:
            rss = 0
        idle = time.time() - e["idle_since"] if e.get("idle_since") else 0.0
        rows.append({"id": key[:12], "pid": e["pid"], "model": e["model"], "ctx": e["n_ctx"],
                     "address": f"unix:{e['socket']}" if e.get("socket") else e.get("url"), "rss": rss,
                     "leases": len(e.get("leases", {})), "idle_s": round(idle, 1), "shared": e.get("shared", True)})
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no servers running")
    else:
        for r in rows:
            print(f"{r['id']}  pid {r['pid']:>7}  ctx {r['ctx']:>6}  rss {r['rss'] / 2**20:7.0f} MiB  leases "
                  f"{r['leases']}  idle {r['idle_s']:>6.0f}s  {r['model']}  {r['address']}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from .runtime import registry

    stopped = []
    with registry.locked() as data:
        for key in list(data):
            if args.all or key.startswith(args.id or "\0"):
                stopped.append(data.pop(key))
    for e in stopped:
        if registry.server_alive(e):
            registry.stop_entry(e)
            print(f"stopped pid {e['pid']} ({e['model']})")
        else:  # dead, or a pid now used by a process we did not start: only the entry goes
            registry.stop_entry(e)
            print(f"removed the stale entry of pid {e['pid']} (not our running server) ({e['model']})")
    if not stopped:
        print("nothing to stop")
        return 1 if args.id else 0
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .runtime.models import pull

    resolved = pull(args.spec, quant=args.quant, vision=args.vision)
    print(resolved.path)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .runtime.models import list_local_models

    models = list_local_models()
    if args.json:
        print(json.dumps([_as_dict(m) for m in models], indent=2, default=str))
    elif not models:
        print("no local models")
    else:
        for m in models:
            d = _as_dict(m)
            print(f"{d.get('name')}  {int(d.get('size_bytes', 0)) / 2**20:8.0f} MiB  {d.get('path')}")
    return 0


def _as_dict(m: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(m) if dataclasses.is_dataclass(m) and not isinstance(m, type) else dict(m)


def cmd_serve(args: argparse.Namespace) -> int:
    from .engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=args.spec, port=args.port, n_ctx=args.ctx, keep_alive=0))
    info = engine.load()
    print(f"serving {info.model} (ctx {info.n_ctx}) at {info.address.describe()} pid {info.pid}; Ctrl-C stops it",
          flush=True)
    if info.address.api_key:
        print("the API key is in the server's key file in the runtime dir (0600)", flush=True)
    try:
        while info.alive():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        engine.unload()
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("ps", help="list the servers gguf-provider started")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ps)
    p = sub.add_parser("stop", help="stop a server by id (prefix) or all of them")
    p.add_argument("id", nargs="?")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("pull", help="download a model (org/repo[:QUANT]) into the HF cache")
    p.add_argument("spec")
    p.add_argument("--quant")
    p.add_argument("--vision", action="store_true")
    p.set_defaults(func=cmd_pull)
    p = sub.add_parser("models", help="list local GGUF models (models dirs and HF cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("serve", help="run a model in the foreground (shared with other clients)")
    p.add_argument("spec")
    p.add_argument("--port", type=int)
    p.add_argument("--ctx", type=int)
    p.set_defaults(func=cmd_serve)
