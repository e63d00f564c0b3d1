"""``python -m gguf_provider.runtime.watchdog KEY``: stops a shared server when its clients are gone.

Polls the registry once a second: prunes leases of dead clients, and once none is left and ``keep_alive`` has run
out, stops the server (after proving it is ours) and exits. Exits too when the entry or the server is gone.
"""

from __future__ import annotations

import sys
import time

from . import registry


def main(argv: list[str]) -> int:
    key = argv[0]
    while True:
        time.sleep(1.0)
        try:
            with registry.locked() as data:
                entry = data.get(key)
                if entry is None:
                    return 0
                if registry.sweep_entry(entry, time.time()):
                    data.pop(key)
                else:
                    continue
        except Exception:  # a transient lock or file error: try again next tick
            continue
        registry.stop_entry(entry)
        return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
