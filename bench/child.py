"""P3 child: one short request from a fresh process, timed from process start (``$BENCH_T0``, epoch seconds).

``python bench/child.py raw URL API_KEY``: httpx only, the baseline.
``python bench/child.py engine MODEL_PATH N_CTX N_PARALLEL PORT [SERVER_ARGS...]``: ``gguf_provider`` attaching to the running
shared server through the registry (same spec, same key), then the same request.

Prints one JSON line: total wall from ``$BENCH_T0`` and the split (imports, attach, request).
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = float(os.environ.get("BENCH_T0") or time.time())
MESSAGES = [{"role": "user", "content": "Say hi."}]
BODY = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "seed": 42, "ignore_eos": True}


def main() -> None:
    mode = sys.argv[1]
    t_start = time.time()
    if mode == "raw":
        import httpx

        url, key = sys.argv[2], sys.argv[3]
        t_import = time.time()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
            t_attach = time.time()
            r = c.post("/v1/chat/completions", json=BODY)
            r.raise_for_status()
    elif mode == "engine":
        from gguf_provider.engine import Engine, EngineConfig

        t_import = time.time()
        model, n_ctx, n_par, port = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        engine = Engine(EngineConfig(model_path=model, n_ctx=n_ctx, n_parallel=n_par, port=port,
                                     server_args=tuple(sys.argv[6:]), speculative=False))
        engine.load()
        t_attach = time.time()
        engine.chat(dict(BODY))
    else:
        raise SystemExit(f"unknown mode {mode}")
    t_end = time.time()
    print(json.dumps({"total": t_end - T0, "startup": t_start - T0, "import": t_import - t_start,
                      "attach": t_attach - t_import, "request": t_end - t_attach}))


if __name__ == "__main__":
    main()
