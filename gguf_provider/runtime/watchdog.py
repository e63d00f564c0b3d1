"""``python -m gguf_provider.runtime.watchdog KEY [ENTRY_JSON]``: stops a shared server when its clients are gone.

Polls the registry once a second: prunes leases of dead clients, and once none is left and ``keep_alive`` has run
out, stops the server (after proving it is ours) and exits. Exits too when the server is gone.

It remembers the last entry it saw: if the registry loses it (a corrupted file was reset, or the key now names
another server) while the server still runs, the watchdog goes on from that copy, pruning leases by whether their
client processes are alive, so the server is not orphaned.
"""

from __future__ import annotations

import copy
import json
import sys
import time

from . import registry


def main(argv: list[str]) -> int:
    key = argv[0]
    last: registry.Entry | None = json.loads(argv[1]) if len(argv) > 1 else None
    while True:
        try:
            with registry.locked() as data:
                entry = data.get(key)
                if entry is not None and last is not None and not registry.same_server(entry, last):
                    entry = None  # the key names a newer server now; ours lost its entry
                if entry is None:
                    if last is None or not registry.server_alive(last):
                        return 0
                    if registry.sweep_entry(last, time.time()):  # on our own copy, outside the registry
                        entry = last
                    else:
                        entry = None
                elif registry.sweep_entry(entry, time.time()):
                    data.pop(key)
                else:
                    last = copy.deepcopy(entry)
                    entry = None
        except Exception:  # a transient lock or file error: try again next tick
            entry = None
        if entry is not None:
            registry.stop_entry(entry)
            return 0
        time.sleep(1.0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
